package engine

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

// runWith has w take one task, upload outputs (by name) and report
// state, with the outputs as uploaded.
func runWith(t *testing.T, w *testWorker, state TaskState, outputs map[string][]byte) Task {
	t.Helper()
	task := w.take()
	var files []worker.File
	for name, data := range outputs {
		if status, body := w.putOutput(task.ID, name, data); status != http.StatusNoContent {
			t.Fatalf("PUT %s: %d %s", name, status, body)
		}
		files = append(files, worker.File{Name: name, Size: int64(len(data)), SHA256: sha(data)})
	}
	code := 0
	if state != worker.StateSucceeded {
		code = 1
	}
	w.report(worker.ResultRequest{TaskID: task.ID, State: state, ExitCode: &code, Outputs: files})
	return task
}

// TestTaskAfterTakesAnOutput: a task that runs after two others waits
// without a machine until both have succeeded, then takes one's output
// as its input (the engine's copy: the size and digest the first task
// brought back, the bytes served from it); Wait returns the three
// results in the order named, and Ended sends each end once.
func TestTaskAfterTakesAnOutput(t *testing.T) {
	t.Parallel()
	e := taskEngine(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ends := e.Ended(ctx)

	m1 := commandTask("map-1")
	m1.Outputs = []string{"counts.txt"}
	m2 := commandTask("map-2")
	reduce := commandTask("reduce")
	reduce.After = []string{"map-2"}
	reduce.Inputs = []Input{{Name: "in/c1.txt", FromTask: "map-1", Path: "counts.txt"}}
	for _, s := range []TaskSpec{m1, m2, reduce} {
		if _, err := e.Submit(s); err != nil {
			t.Fatal(err)
		}
	}
	if needs := e.router.needCounts(); needs.Waiting != 2 {
		t.Errorf("the router holds %d waiting needs; want 2, the reduce held back until the maps succeed", needs.Waiting)
	}
	w := joinWorker(t, e, "slurm-after", worker.FeatureCommand)
	counts := []byte("apple 3\npear 1\n")
	first := runWith(t, w, worker.StateSucceeded, map[string][]byte{"counts.txt": counts})
	second := runWith(t, w, worker.StateSucceeded, nil)
	if got := []string{first.Name, second.Name}; !slices.Equal(got, []string{"map-1", "map-2"}) {
		t.Fatalf("the worker ran %v first; want map-1 and map-2 before the reduce", got)
	}
	third := w.take()
	if third.Name != "reduce" || len(third.Inputs) != 1 || third.Inputs[0].Name != "in/c1.txt" ||
		third.Inputs[0].Size != int64(len(counts)) || third.Inputs[0].SHA256 != sha(counts) {
		t.Fatalf("the reduce's task %+v; want input in/c1.txt of %d bytes, sha256 %s", third, len(counts), sha(counts))
	}
	if status, got := w.input(third.ID, "in/c1.txt"); status != http.StatusOK || !bytes.Equal(got, counts) {
		t.Fatalf("the reduce's input: %d %q; want 200 %q", status, got, counts)
	}
	zero := 0
	w.report(worker.ResultRequest{TaskID: third.ID, State: worker.StateSucceeded, ExitCode: &zero})

	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	res, err := e.Wait(wctx, "reduce", "map-1", "map-2")
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 3 || res[0].ID != "reduce" || res[1].ID != "map-1" || res[2].ID != "map-2" || res[0].State != worker.StateSucceeded {
		t.Errorf("Wait: %+v; want reduce, map-1 and map-2, succeeded", res)
	}
	var heard []string
	for len(heard) < 3 {
		select {
		case r := <-ends:
			heard = append(heard, r.ID+" "+string(r.State))
		case <-wctx.Done():
			t.Fatalf("Ended sent %v; want the three ends", heard)
		}
	}
	if want := []string{"map-1 succeeded", "map-2 succeeded", "reduce succeeded"}; !slices.Equal(heard, want) {
		t.Errorf("Ended sent %v; want %v", heard, want)
	}
	select {
	case r := <-ends:
		t.Errorf("Ended sent %s again", r.ID)
	case <-time.After(50 * time.Millisecond):
	}
}

// TestTaskAfterAFailure: a task after one that failed is not run and
// ends cancelled, naming it, and so does one after that one; a task
// submitted after the failure ends at once the same way. No machine is
// asked for any of them: the router never holds them.
func TestTaskAfterAFailure(t *testing.T) {
	t.Parallel()
	e := taskEngine(t, Config{})
	b := commandTask("b")
	b.After = []string{"a"}
	c := commandTask("c")
	c.Inputs = []Input{{Name: "x", FromTask: "b", Path: "out"}}
	a := commandTask("a")
	b.Outputs = []string{"out"}
	for _, s := range []TaskSpec{a, b, c} {
		if _, err := e.Submit(s); err != nil {
			t.Fatal(err)
		}
	}
	w := joinWorker(t, e, "slurm-fail", worker.FeatureCommand)
	runWith(t, w, worker.StateFailed, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := e.Wait(ctx, "a", "b", "c")
	if err != nil {
		t.Fatal(err)
	}
	if res[0].State != worker.StateFailed {
		t.Errorf("a: %s; want failed", res[0].State)
	}
	for i, after := range map[int]string{1: "a", 2: "b"} {
		if r := res[i]; r.State != worker.StateCancelled || !strings.Contains(r.Error, "not run: it runs after task "+after+", which ended") || len(r.Attempts) != 0 {
			t.Errorf("%s: %s %q, %d attempts; want cancelled, naming %s, never run", r.ID, r.State, r.Error, len(r.Attempts), after)
		}
	}
	d := commandTask("d")
	d.After = []string{"c"}
	if _, err := e.Submit(d); err != nil {
		t.Fatal(err)
	}
	if r, _ := e.Task("d"); r.State != worker.StateCancelled || !strings.Contains(r.Error, "task c, which ended cancelled") {
		t.Errorf("d, submitted after c ended: %s %q; want cancelled at once, naming c", r.State, r.Error)
	}
	if n := e.router.needCounts(); n.Waiting != 0 {
		t.Errorf("the router holds %d waiting needs; want none", n.Waiting)
	}
	w.pollNone(0.2)
}

// TestTaskAfterRefusals: Submit refuses a task after one it does not
// hold, after itself, and an input from an output the task does not
// bring back; a task whose dependency succeeded without bringing the
// output back fails, saying which.
func TestTaskAfterRefusals(t *testing.T) {
	t.Parallel()
	e := taskEngine(t, Config{})
	p := commandTask("p")
	p.Outputs = []string{"out", "dir"}
	if _, err := e.Submit(p); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(*TaskSpec)
		want string
	}{
		{"unknown", func(s *TaskSpec) { s.After = []string{"nope"} }, "runs after task nope, which the engine does not hold"},
		{"itself", func(s *TaskSpec) { s.After = []string{"q"} }, "runs after itself"},
		{"own output", func(s *TaskSpec) { s.Inputs = []Input{{Name: "x", FromTask: "q", Path: "out"}} }, "task q's own output"},
		{"no such output", func(s *TaskSpec) { s.Inputs = []Input{{Name: "x", FromTask: "p", Path: "other"}} }, `task p has no output "other" (its outputs: out, dir)`},
		{"not plain", func(s *TaskSpec) { s.Inputs = []Input{{Name: "x", FromTask: "p", Path: "../out"}} }, `has a ".." element`},
		{"data too", func(s *TaskSpec) { s.Inputs = []Input{{Name: "x", FromTask: "p", Path: "out", Data: []byte("y")}} }, "both a Path and Data"},
	} {
		s := commandTask("q")
		tc.edit(&s)
		if _, err := e.Submit(s); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error saying %q", tc.name, err, tc.want)
		}
		if _, held := e.Task("q"); held {
			t.Fatalf("%s: the refused task is held", tc.name)
		}
	}
	// Under an output directory is an output too.
	q := commandTask("q")
	q.Inputs = []Input{{Name: "x", FromTask: "p", Path: "out"}, {Name: "y", FromTask: "p", Path: "dir/y.txt"}}
	if _, err := e.Submit(q); err != nil {
		t.Fatal(err)
	}
	w := joinWorker(t, e, "slurm-missing", worker.FeatureCommand)
	runWith(t, w, worker.StateSucceeded, map[string][]byte{"out": []byte("o")})
	r := waitTask(t, e, "q", "q's end", ended)
	if r.State != worker.StateFailed || !strings.Contains(r.Error, `input "y": task p did not bring back its output "dir/y.txt"`) {
		t.Errorf("q: %s %q; want failed, naming the output p did not bring back", r.State, r.Error)
	}
}

// TestWaitEnds: Wait names an unknown task at once, returns ctx's error
// when it ends first and ErrEngineStopped at Stop; Ended's channel is
// closed at Stop.
func TestWaitEnds(t *testing.T) {
	t.Parallel()
	e, stop := runTaskEngine(t, Config{}, 0)
	if _, err := e.Wait(context.Background(), "nope"); !errors.Is(err, ErrNoSuchTask) || !strings.Contains(err.Error(), "task nope") {
		t.Errorf("Wait on an unknown task: %v; want ErrNoSuchTask naming it", err)
	}
	if _, err := e.Submit(TaskSpec{ID: "w", Need: shared.Need{CPUs: 1}, Command: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := e.Wait(ctx, "w"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait past its deadline: %v; want context.DeadlineExceeded", err)
	}
	ends := e.Ended(context.Background())
	waited := make(chan error, 1)
	go func() {
		_, err := e.Wait(context.Background(), "w")
		waited <- err
	}()
	stop()
	if err := <-waited; !errors.Is(err, ErrEngineStopped) {
		t.Errorf("Wait across Stop: %v; want ErrEngineStopped", err)
	}
	if _, open := <-ends; open {
		t.Error("Ended's channel is open after Stop")
	}
	if _, open := <-e.Ended(context.Background()); open {
		t.Error("Ended after Stop gives an open channel")
	}
}

// TestTaskStreamsAlwaysThere: an ended task's directory holds stdout
// and stderr, empty where nothing was written: a task that ran and
// wrote nothing, one cancelled while it waited, one never run because
// the task it ran after failed.
func TestTaskStreamsAlwaysThere(t *testing.T) {
	t.Parallel()
	e := taskEngine(t, Config{})
	quiet := commandTask("quiet")
	waiting := commandTask("waiting")
	waiting.Need = shared.Need{CPUs: 64}
	after := commandTask("after")
	after.After = []string{"waiting"}
	for _, s := range []TaskSpec{quiet, waiting, after} {
		if _, err := e.Submit(s); err != nil {
			t.Fatal(err)
		}
	}
	w := joinWorker(t, e, "slurm-quiet", worker.FeatureCommand)
	runWith(t, w, worker.StateSucceeded, nil)
	if err := e.Cancel("waiting"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.Wait(ctx, "quiet", "waiting", "after"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"quiet", "waiting", "after"} {
		for _, s := range []string{"stdout", "stderr"} {
			if fi, err := os.Stat(filepath.Join(e.TaskDir(id), s)); err != nil || fi.Size() != 0 {
				t.Errorf("%s's %s: %v; want an empty file", id, s, err)
			}
		}
	}
}
