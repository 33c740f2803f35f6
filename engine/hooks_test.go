package engine

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

// hookEngine is taskEngine with the run loop's intervals (the pass's
// and Reconcile's) set to every: with an hour, no pass comes from those
// timers within a test. stop ends the loop and the engine, once;
// cleanup calls it too.
func hookEngine(t *testing.T, cfg Config, every time.Duration) (e *Engine, stop func()) {
	t.Helper()
	return runTaskEngine(t, cfg, every)
}

// TestHookQueue: hooks run in the order they were put; a put into a full
// queue waits until the hook running returns and there is room, one that
// must not wait goes beyond the bound; stop runs what is queued, and a
// put after it runs on the caller.
func TestHookQueue(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var ran []int
	record := func(i int) func() {
		return func() {
			mu.Lock()
			ran = append(ran, i)
			mu.Unlock()
		}
	}
	idle := make(chan struct{}, 100)
	q := newHookQueue(2, func() { idle <- struct{}{} })
	release := make(chan struct{})
	running := make(chan struct{})
	q.put(func() { close(running); <-release; record(0)() }, true)
	<-running
	q.put(record(1), true)
	q.put(record(2), true)
	// Full: a put that waits does not return while the first hook runs.
	put := make(chan struct{})
	go func() {
		q.put(record(3), true)
		close(put)
	}()
	waitFor(t, "the put to wait for room", func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.waiting == 1
	})
	q.put(record(4), false)
	q.mu.Lock()
	queued := len(q.q)
	q.mu.Unlock()
	if queued != 3 {
		t.Errorf("%d hooks queued with a put that must not wait; want 3, one beyond the bound of 2", queued)
	}
	select {
	case <-put:
		t.Fatal("a put into the full queue returned while the queue was full")
	default:
	}
	close(release)
	<-put
	q.stop()
	q.put(record(5), true)
	mu.Lock()
	defer mu.Unlock()
	// 3 waited for room, 4 did not: 4 runs before 3.
	if want := []int{0, 1, 2, 4, 3, 5}; !slices.Equal(ran, want) {
		t.Errorf("hooks ran in the order %v; want %v", ran, want)
	}
	if len(idle) == 0 {
		t.Error("the queue never said it was empty")
	}
}

// TestHooksOffThePass: a TaskEnded hook that does not return holds up
// no task: while it blocks on the first task's end, a worker is handed
// and reports every other task, each one pass after the last; once it
// returns, it hears every end, in the order the tasks ended.
func TestHooksOffThePass(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var mu sync.Mutex
	var heard []string
	e, _ := hookEngine(t, Config{Hooks: Hooks{TaskEnded: func(r TaskResult) {
		<-release
		mu.Lock()
		heard = append(heard, r.ID)
		mu.Unlock()
	}}}, time.Hour)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	const n = 20
	var ids []string
	for i := range n {
		id, err := e.Submit(commandTask(fmt.Sprintf("off-%02d", i)))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	w := joinWorker(t, e, "slurm-off", worker.FeatureCommand)
	zero := 0
	var order []string
	for range n {
		task := w.take()
		w.report(worker.ResultRequest{TaskID: task.ID, State: worker.StateSucceeded, ExitCode: &zero})
		order = append(order, task.Name)
	}
	for _, id := range ids {
		waitTask(t, e, id, id+"'s end", ended)
	}
	mu.Lock()
	early := len(heard)
	mu.Unlock()
	if early != 0 {
		t.Errorf("the hook, blocked, heard %d tasks' ends", early)
	}
	close(release)
	waitFor(t, "the hook to hear every end", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(heard) == n
	})
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(heard, order) {
		t.Errorf("the hook heard %v; want the order the tasks ended, %v", heard, order)
	}
}

// TestPassWokenByTaskEnd: with the run loop's timers an hour away, a
// worker that reports its task and polls once is handed the next waiting
// task: the result wakes the pass that assigns it. Passes are counted,
// not timed: none that a timer woke runs between the report and the
// task.
func TestPassWokenByTaskEnd(t *testing.T) {
	t.Parallel()
	e, _ := hookEngine(t, Config{}, time.Hour)
	w := joinWorker(t, e, "slurm-woken", worker.FeatureCommand)
	for _, id := range []string{"first", "second"} {
		if _, err := e.Submit(commandTask(id)); err != nil {
			t.Fatal(err)
		}
	}
	task := w.take()
	if task.Name != "first" {
		t.Fatalf("first handed %q", task.Name)
	}
	// The one timer left, the Reconcile that tells a plugin of an
	// attach (arrivalReconcileDelay), fires first.
	waitFor(t, "the attach's Reconcile", func() bool { return e.timed.Load() == 1 })
	passes := e.passes.Load()
	zero := 0
	w.report(worker.ResultRequest{TaskID: task.ID, State: worker.StateSucceeded, ExitCode: &zero})
	// One poll, open far longer than the test: it answers the task or
	// nothing.
	resp, got := w.do("GET", "/v1/work?wait=30", nil, nil)
	if resp.StatusCode != 200 || !strings.Contains(string(got), `"second"`) {
		t.Fatalf("the poll after the report answered %d %s; want the second task", resp.StatusCode, got)
	}
	// The pass the result woke settled it too: the first has ended.
	waitTask(t, e, "first", "the first task's end", ended)
	if n := e.timed.Load(); n != 1 {
		t.Errorf("%d passes woken by a timer by the time the second task came; want none after the attach's", n-1)
	}
	t.Logf("the second task came %d pass(es) after the first's report, none woken by a timer", e.passes.Load()-passes)
}

// TestSlowHookDoesNotSlowDispatch: 1,000 tasks of `true` over 8 real
// worker processes (fluksio-worker), once with an empty TaskEnded hook
// and once with one that sleeps 50 ms a task. Were the hook on the
// dispatch path, each end would wait for it and the tasks could not end
// faster than it hears them (20 a second); off it, every task has ended
// while the hook has heard fewer than half. The two runs' times are
// logged (the figure; make bench is the speed check).
func TestSlowHookDoesNotSlowDispatch(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 2,000 tasks on real workers")
	}
	t.Parallel()
	bin := sandboxtest.Binary(t, "worker/fluksio-worker", "fluksio-worker")
	const tasks, workers = 1000, 8
	run := func(sleep time.Duration) (time.Duration, int) {
		var mu sync.Mutex
		heard := 0
		// The hook sleeps until the tasks have all ended; then the
		// queue is drained at once, so that Stop need not wait 50 s.
		measured := make(chan struct{})
		e, stop := hookEngine(t, Config{Hooks: Hooks{TaskEnded: func(TaskResult) {
			if sleep > 0 {
				select {
				case <-time.After(sleep):
				case <-measured:
				}
			}
			mu.Lock()
			heard++
			mu.Unlock()
		}}}, passInterval)
		var ids []string
		for i := range tasks {
			id, err := e.Submit(TaskSpec{ID: fmt.Sprintf("t%04d", i), Need: shared.Need{CPUs: 1}, Command: []string{"true"}})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		work := t.TempDir()
		var exited []chan struct{}
		var cmds []*exec.Cmd
		t0 := time.Now()
		for i := range workers {
			name := fmt.Sprintf("slurm-slow-%d-%d", sleep.Milliseconds(), i)
			job := fmt.Sprint(500 + i)
			provisioned(e.books, name, job)
			cmd := exec.Command(bin, "--url", strings.TrimSuffix(e.URL(), "/"), "--cpus", "1", "--gpus", "0", "--max-idle", "600")
			cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "TMPDIR=" + work, "SLURM_JOB_ID=" + job,
				shared.WorkerTokenEnv + "=" + sign(t, e.signer, name, time.Hour)}
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() { cmd.Wait(); close(done) }()
			exited, cmds = append(exited, done), append(cmds, cmd)
		}
		for _, id := range ids {
			res := waitTaskWithin(t, e, id, 5*time.Minute)
			if res.State != worker.StateSucceeded {
				t.Errorf("%s: %+v", id, res)
			}
		}
		took := time.Since(t0)
		mu.Lock()
		told := heard
		mu.Unlock()
		// The engine's Stop lets the workers go (each exits 0); one
		// still there after that is killed.
		close(measured)
		stop()
		for i, done := range exited {
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Errorf("worker %d still running 30 s after the engine stopped", i)
				cmds[i].Process.Kill()
				<-done
			}
		}
		return took, told
	}
	empty, _ := run(0)
	slow, heard := run(50 * time.Millisecond)
	if heard >= tasks/2 {
		t.Errorf("every task had ended when the 50 ms hook had heard %d of %d: the hook held dispatch up", heard, tasks)
	}
	t.Logf("1,000 tasks of true over 8 workers: %s with an empty TaskEnded hook, %s with one that sleeps 50 ms a task (%.2f×); the slow hook had heard %d when the last ended",
		empty.Round(time.Millisecond), slow.Round(time.Millisecond), slow.Seconds()/empty.Seconds(), heard)
}

// waitTaskWithin waits, within limit, for task id to end.
func waitTaskWithin(t *testing.T, e *Engine, id string, limit time.Duration) TaskResult {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		if res, ok := e.Task(id); ok && ended(res) {
			return res
		}
		if time.Now().After(deadline) {
			res, _ := e.Task(id)
			t.Fatalf("%s had not ended within %s: %+v", id, limit, res)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRunAsksDoneWhenHooksCatchUp: a done that reads what a hook
// recorded ends Run once the hook has run, with the run loop's timers an
// hour away and nothing else to wake it: the hooks' queue emptying asks
// done again.
func TestRunAsksDoneWhenHooksCatchUp(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	told := 0
	logger, _ := testLogger(t)
	e, err := New(Config{Secret: testSecret, ID: "test", Listen: "127.0.0.1:0", Logger: logger,
		Hooks: Hooks{TaskEnded: func(TaskResult) {
			mu.Lock()
			told++
			mu.Unlock()
		}}})
	if err != nil {
		t.Fatal(err)
	}
	e.passEvery, e.reconcileEvery = time.Hour, time.Hour
	if err := e.Serve(e.Mux(nil, false)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Stop(context.Background()) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan bool, 1)
	go func() {
		ran <- e.Run(ctx, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return told == 1
		})
	}()
	w := joinWorker(t, e, "slurm-caught-up", worker.FeatureCommand)
	if _, err := e.Submit(commandTask("told")); err != nil {
		t.Fatal(err)
	}
	task := w.take()
	waitFor(t, "the attach's Reconcile", func() bool { return e.timed.Load() == 1 })
	before := e.passes.Load()
	zero := 0
	w.report(worker.ResultRequest{TaskID: task.ID, State: worker.StateSucceeded, ExitCode: &zero})
	select {
	case done := <-ran:
		if !done {
			t.Error("Run returned false; want true, its done")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run had not returned 30 s after the task ended")
	}
	// The result's pass, and no other: the worker, silent since, is
	// given up on after deadAfter, which would wake one.
	if n := e.passes.Load() - before; n > 1 {
		t.Errorf("Run returned after %d passes since the result; want it at the hook's end, one pass at most", n)
	}
}
