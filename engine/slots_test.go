package engine

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

// startSlotWorker runs the fluksio-worker binary against e as worker
// name (job job) with --cpus cpus and --gpus gpus, its credential
// allowing that shape, with args and env added; cleanup kills it and
// logs what it said.
func startSlotWorker(t *testing.T, e *Engine, name, job string, cpus, gpus string, args, env []string) *lockedBuffer {
	t.Helper()
	bin := sandboxtest.Binary(t, "worker/fluksio-worker", "fluksio-worker")
	provisioned(e.books, name, job)
	token, _, err := host.NewSigner(testSecret).Sign(host.CredentialClaims{Worker: name, Provisioner: testProvisioner, CPUs: 8, GPUs: 2, RAMMB: 8000}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	argv := append([]string{"--url", strings.TrimSuffix(e.URL(), "/"), "--cpus", cpus, "--gpus", gpus, "--max-idle", "600"}, args...)
	cmd := exec.Command(bin, argv...)
	cmd.Env = append(append(os.Environ(), shared.WorkerTokenEnv+"="+token, "SLURM_JOB_ID="+job), env...)
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		t.Logf("%s said:\n%s", name, out)
	})
	return out
}

// interval is a task's time on its worker, as the engine recorded it:
// from its start (assigned) to its end (its result recorded). The
// engine holds a task's room from before the one to after the other.
type interval struct {
	start, end time.Time
	cpus       int
}

// mostAtOnce is the largest sum of cpus over intervals that overlap,
// and the most intervals that overlap.
func mostAtOnce(ivs []interval) (cpus, tasks int) {
	type edge struct {
		at   time.Time
		cpus int
	}
	var edges []edge
	for _, iv := range ivs {
		edges = append(edges, edge{iv.start, iv.cpus}, edge{iv.end, -iv.cpus})
	}
	// An end before a start at the same instant: touching is not
	// overlapping.
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.cpus - b.cpus
	})
	c, n := 0, 0
	for _, e := range edges {
		c += e.cpus
		if e.cpus > 0 {
			n++
		} else {
			n--
		}
		cpus, tasks = max(cpus, c), max(tasks, n)
	}
	return cpus, tasks
}

// runAll submits specs, waits for each to end, and returns each one's
// interval; every one must succeed.
func runAll(t *testing.T, e *Engine, specs []TaskSpec) []interval {
	t.Helper()
	var ids []string
	for _, s := range specs {
		id, err := e.Submit(s)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	var ivs []interval
	for i, id := range ids {
		res := waitTask(t, e, id, "task "+id+" to end", ended)
		if res.State != worker.StateSucceeded {
			t.Errorf("task %s: %s %q; want succeeded", id, res.State, res.Error)
		}
		ivs = append(ivs, interval{res.Started, res.Ended, max(1, specs[i].Need.CPUs)})
	}
	return ivs
}

// watchHeld samples, until stop, the most CPUs the books hold on any
// worker at once (tasks assigned and not yet collected): the engine's
// own word on what it gave, beside what the worker ran. stop waits for
// the sampler and returns what it saw.
func watchHeld(e *Engine) (stop func() int) {
	done, out := make(chan struct{}), make(chan int)
	go func() {
		most := 0
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			e.books.mu.Lock()
			for _, ws := range e.books.workers {
				cpus, _, _ := ws.freeLocked()
				most = max(most, ws.info.CPUs-cpus)
			}
			e.books.mu.Unlock()
			select {
			case <-done:
				out <- most
				return
			case <-tick.C:
			}
		}
	}()
	return func() int {
		close(done)
		return <-out
	}
}

// makespan is from the first start to the last end.
func makespan(ivs []interval) time.Duration {
	first, last := ivs[0].start, ivs[0].end
	for _, iv := range ivs {
		if iv.start.Before(first) {
			first = iv.start
		}
		if iv.end.After(last) {
			last = iv.end
		}
	}
	return last.Sub(first)
}

func sleepTask(id string, cpus int, secs string) TaskSpec {
	return TaskSpec{ID: id, Need: shared.Need{CPUs: cpus}, Command: []string{"sleep", secs}}
}

// TestSlotsRunEightOneCPUTasksAtOnce: 16 one-CPU tasks of `sleep 1` on
// one worker of 8 CPUs with slots run 8 at a time, never more, all
// succeed, and take well under the 16 s one at a time would.
func TestSlotsRunEightOneCPUTasksAtOnce(t *testing.T) {
	t.Parallel()
	e := taskEngine(t, Config{})
	var specs []TaskSpec
	for i := range 16 {
		specs = append(specs, sleepTask("s"+string(rune('a'+i)), 1, "1"))
	}
	held := watchHeld(e)
	startSlotWorker(t, e, "slurm-eight", "801", "8", "0", nil, nil)
	ivs := runAll(t, e, specs)
	if h := held(); h > 8 {
		t.Errorf("the books held %d cpus' worth of tasks on an 8-cpu worker", h)
	}
	cpus, tasks := mostAtOnce(ivs)
	span := makespan(ivs)
	t.Logf("16 tasks of sleep 1 on 8 cpus: at most %d at once (%d cpus), makespan %s", tasks, cpus, span.Round(time.Millisecond))
	if cpus > 8 {
		t.Errorf("%d cpus' worth of tasks at once on an 8-cpu worker", cpus)
	}
	if tasks < 4 {
		t.Errorf("at most %d tasks at once; want the worker's 8 cpus used together", tasks)
	}
}

// TestSlotsMixedCPUsNeverOverfill: tasks of 3 and 1 CPUs on a worker of
// 8 never hold more than 8 CPUs at once.
func TestSlotsMixedCPUsNeverOverfill(t *testing.T) {
	t.Parallel()
	e := taskEngine(t, Config{})
	var specs []TaskSpec
	for i := range 12 {
		cpus := 1
		if i%2 == 0 {
			cpus = 3
		}
		specs = append(specs, sleepTask("m"+string(rune('a'+i)), cpus, "1"))
	}
	held := watchHeld(e)
	startSlotWorker(t, e, "slurm-mixed", "802", "8", "0", nil, nil)
	ivs := runAll(t, e, specs)
	if h := held(); h > 8 {
		t.Errorf("the books held %d cpus' worth of tasks on an 8-cpu worker", h)
	}
	cpus, tasks := mostAtOnce(ivs)
	t.Logf("6 tasks of 3 cpus and 6 of 1 on 8 cpus: at most %d cpus (%d tasks) at once, makespan %s", cpus, tasks, makespan(ivs).Round(time.Millisecond))
	if cpus > 8 {
		t.Errorf("%d cpus' worth of tasks at once on an 8-cpu worker", cpus)
	}
	if tasks < 2 {
		t.Errorf("at most %d task at once; want several", tasks)
	}
}

// TestSlotsSplitTheJobsGPUs: two one-GPU tasks on a worker of 2 GPUs
// whose job has CUDA_VISIBLE_DEVICES=0,1 run at once, each seeing one
// device of its own; a task of no GPUs sees none.
func TestSlotsSplitTheJobsGPUs(t *testing.T) {
	t.Parallel()
	e := taskEngine(t, Config{TaskDir: filepath.Join(t.TempDir(), "tasks")})
	script := `printf '%s|%s|%s|%s|%s\n' "$CUDA_VISIBLE_DEVICES" "$GPU_DEVICE_ORDINAL" "$FLUKSIO_CPUS" "$FLUKSIO_GPUS" "$OMP_NUM_THREADS" > env.txt; sleep 2`
	gpuTask := func(id string, gpus int) TaskSpec {
		return TaskSpec{ID: id, Need: shared.Need{CPUs: 1, GPUs: gpus}, Command: []string{"sh", "-c", script}, Outputs: []string{"env.txt"}}
	}
	startSlotWorker(t, e, "slurm-gpus", "803", "4", "2", nil, []string{"CUDA_VISIBLE_DEVICES=0,1"})
	ivs := runAll(t, e, []TaskSpec{gpuTask("g1", 1), gpuTask("g2", 1), gpuTask("g0", 0)})
	if _, tasks := mostAtOnce(ivs[:2]); tasks != 2 {
		t.Errorf("the two GPU tasks ran %d at once; want 2", tasks)
	}
	saw := map[string]string{}
	for _, id := range []string{"g1", "g2", "g0"} {
		b, err := os.ReadFile(filepath.Join(e.TaskDir(id), "outputs", "env.txt"))
		if err != nil {
			t.Fatal(err)
		}
		saw[id] = strings.TrimSpace(string(b))
	}
	t.Logf("CUDA|ORDINAL|CPUS|GPUS|OMP each task saw: %v", saw)
	d1, d2 := strings.Split(saw["g1"], "|"), strings.Split(saw["g2"], "|")
	devices := []string{d1[0], d2[0]}
	slices.Sort(devices)
	if !slices.Equal(devices, []string{"0", "1"}) || d1[1] != d1[0] || d2[1] != d2[0] {
		t.Errorf("the GPU tasks saw %q and %q; want devices 0 and 1, one each, GPU_DEVICE_ORDINAL alike", saw["g1"], saw["g2"])
	}
	if d1[2] != "1" || d1[3] != "1" || d1[4] != "1" {
		t.Errorf("a GPU task's share %q; want 1 cpu, 1 gpu, OMP_NUM_THREADS 1", saw["g1"])
	}
	if g0 := strings.Split(saw["g0"], "|"); g0[0] != "" || g0[1] != "" || g0[3] != "0" {
		t.Errorf("the task of no GPUs saw %q; want no device", saw["g0"])
	}
}

// TestNoSlotsOneTaskAtATime: a worker that does not name the slots
// feature (--slots=false) is given one task at a time, however many
// CPUs it has.
func TestNoSlotsOneTaskAtATime(t *testing.T) {
	t.Parallel()
	e := taskEngine(t, Config{})
	var specs []TaskSpec
	for i := range 4 {
		specs = append(specs, sleepTask("o"+string(rune('a'+i)), 1, "0.5"))
	}
	startSlotWorker(t, e, "slurm-old", "804", "8", "0", []string{"--slots=false"}, nil)
	ivs := runAll(t, e, specs)
	_, tasks := mostAtOnce(ivs)
	t.Logf("4 tasks on an 8-cpu worker without slots: at most %d at once, makespan %s", tasks, makespan(ivs).Round(time.Millisecond))
	if tasks != 1 {
		t.Errorf("%d tasks at once on a worker without slots; want 1", tasks)
	}
	for _, w := range e.books.statuses() {
		if slices.Contains(w.Features, worker.FeatureSlots) {
			t.Errorf("worker %s attached with %v; want no slots", w.Name, w.Features)
		}
	}
}

// TestDemandCountsMachinesByWhatTheyHold: 40 waiting one-CPU needs and
// a target whose workers pack, with a shape of 16 CPUs, are asked as 3
// machines; 0 waiting, 0; a target whose workers do not pack is asked
// one machine a need, as before.
func TestDemandCountsMachinesByWhatTheyHold(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		packs   bool
		waiting int
		want    int
	}{
		{"40 needs, packing", true, 40, 3},
		{"16 needs, packing", true, 16, 1},
		{"none waiting", true, 0, 0},
		{"40 needs, one a machine", false, 40, 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			prov, calls := countingProvisioner(shared.Shape{Profile: "c16", CPUs: 16})
			e, _ := runTaskEngine(t, Config{}, 10*time.Millisecond)
			e.Together(func() {
				e.router.asks.setTarget(target{Name: "slurm", P: prov, Shapes: prov.ShapeList, Packs: tc.packs})
				for range tc.waiting {
					e.Add(shared.Need{CPUs: 1}, time.Second)
				}
			})
			waitFor(t, "two Provision calls", func() bool { return len(calls()) >= 2 })
			c := calls()
			t.Logf("%d needs waiting: the Provision calls asked for %v machines", tc.waiting, c)
			for _, n := range c {
				if n != tc.want {
					t.Errorf("a Provision call asked for %d machines (calls %v); want %d", n, c, tc.want)
				}
			}
		})
	}
}

// TestSlotsLostAnswersSentAgain: a worker with slots names what it runs
// on each poll and watch (worker.RunningParam). A task whose poll answer
// was lost (the next poll does not name it) goes out again, and not
// while the worker names it; a cancel whose watch answer was lost (the
// next watch still names the task) is told again, and not once the
// worker stops naming it; a cancelled task the worker says it does not
// run is taken back as cancelled, not sent again.
func TestSlotsLostAnswersSentAgain(t *testing.T) {
	t.Parallel()
	e := taskEngine(t, Config{})
	if _, err := e.Submit(commandTask("lost-answer")); err != nil {
		t.Fatal(err)
	}
	w := joinWorker(t, e, "slurm-slots-lost", worker.FeatureCommand, worker.FeatureSlots)
	poll := func(running string) (int, Task) {
		t.Helper()
		resp, got := w.do("GET", "/v1/work?wait=0.3&"+worker.RunningParam+"="+running, nil, nil)
		var task Task
		if resp.StatusCode == http.StatusOK {
			if err := json.Unmarshal(got, &task); err != nil {
				t.Fatal(err)
			}
		}
		return resp.StatusCode, task
	}
	var first Task
	waitFor(t, "the task on the first poll", func() bool {
		code, task := poll("")
		first = task
		return code == http.StatusOK
	})
	// The answer was lost: the next poll names nothing.
	if code, again := poll(""); code != http.StatusOK || again.ID != first.ID {
		t.Fatalf("a poll that does not name %s: %d %s; want it sent again", first.ID, code, again.ID)
	}
	// It arrived this time: a poll that names it gets nothing.
	if code, task := poll(first.ID); code != http.StatusNoContent {
		t.Fatalf("a poll that names %s: %d %s; want 204", first.ID, code, task.ID)
	}

	if err := e.Cancel("lost-answer"); err != nil {
		t.Fatal(err)
	}
	watch := func(running string) (int, worker.WatchAnswer) {
		t.Helper()
		resp, got := w.do("GET", "/v1/watch?"+worker.RunningParam+"="+running, nil, nil)
		var ans worker.WatchAnswer
		if resp.StatusCode == http.StatusOK {
			json.Unmarshal(got, &ans)
		}
		return resp.StatusCode, ans
	}
	for i := range 2 { // the first answer lost: told again
		if code, ans := watch(first.ID); code != http.StatusOK || ans.Cancel != first.ID {
			t.Fatalf("watch %d naming %s: %d %+v; want its cancel", i+1, first.ID, code, ans)
		}
	}
	// The worker stopped it and says so by not naming it: a poll now
	// takes it back as cancelled rather than sending it again.
	if code, task := poll(""); code != http.StatusNoContent {
		t.Fatalf("a poll after the cancel, not naming %s: %d %s; want 204", first.ID, code, task.ID)
	}
	res := waitTask(t, e, "lost-answer", "cancelled", func(r TaskResult) bool { return r.State == worker.StateCancelled })
	if !strings.Contains(res.Error, "does not run it") {
		t.Errorf("the cancelled task's error %q; want it to say the worker does not run it", res.Error)
	}
}

// TestSlotsShownOnStatus: GET /status shows a worker with slots that
// runs 3 one-CPU tasks of its 4 CPUs as running 3 (every attempt id),
// 3 CPUs busy, in the summary and by provisioner; each of the 3 needs
// stands assigned to it, none said to have ended.
func TestSlotsShownOnStatus(t *testing.T) {
	t.Parallel()
	e := taskEngine(t, Config{})
	for _, id := range []string{"st-a", "st-b", "st-c"} {
		if _, err := e.Submit(commandTask(id)); err != nil {
			t.Fatal(err)
		}
	}
	w := joinWorker(t, e, "slurm-status", worker.FeatureCommand, worker.FeatureSlots)
	var running []string
	waitFor(t, "3 tasks on the worker", func() bool {
		resp, got := w.do("GET", "/v1/work?wait=0.2&"+worker.RunningParam+"="+strings.Join(running, ","), nil, nil)
		if resp.StatusCode == http.StatusOK {
			var task Task
			json.Unmarshal(got, &task)
			running = append(running, task.ID)
		}
		return len(running) == 3
	})
	st := getStatus(t, e, "")
	if len(st.Workers) != 1 {
		t.Fatalf("%d workers on /status; want 1", len(st.Workers))
	}
	ws := st.Workers[0]
	if ws.Running != 3 || ws.CPUsBusy != 3 || ws.CPUs != 4 || len(ws.AttemptIDs) != 3 {
		t.Errorf("the worker on /status: running %d, %d of %d CPUs busy, attempts %v; want 3, 3 of 4, 3", ws.Running, ws.CPUsBusy, ws.CPUs, ws.AttemptIDs)
	}
	sum := st.Summary.Workers
	if sum.CPUs != 4 || sum.CPUsBusy != 3 || sum.ByProvisioner["slurm"] != (ProvisionerWorkers{Attached: 1, Busy: 1, CPUs: 4, CPUsBusy: 3}) {
		t.Errorf("the summary's workers %+v; want 3 of 4 CPUs busy, for provisioner slurm too", sum)
	}
	for _, n := range st.Needs {
		if n.State != NeedAssigned || n.Worker != "slurm-status" || strings.Contains(n.Detail, "ended") {
			t.Errorf("need %s: %s on %q, %q; want assigned to slurm-status", n.ID, n.State, n.Worker, n.Detail)
		}
	}
}
