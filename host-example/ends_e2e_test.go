package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/worker"
)

// jobPIDs lists this machine's processes of a Slurm job, read from each
// process's environment as the job gave it (SLURM_JOB_ID, or for an array
// task "A_T" SLURM_ARRAY_JOB_ID and SLURM_ARRAY_TASK_ID): the worker and
// its command, not Slurm's own slurmstepd. The test runs as root, which
// reads the environ of the worker, undumpable as it makes itself.
func jobPIDs(t *testing.T, job string) []int {
	t.Helper()
	want := [][]byte{[]byte("SLURM_JOB_ID=" + job)}
	if array, task, ok := strings.Cut(job, "_"); ok {
		want = [][]byte{[]byte("SLURM_ARRAY_JOB_ID=" + array), []byte("SLURM_ARRAY_TASK_ID=" + task)}
	}
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", d.Name(), "environ"))
		if err != nil {
			continue
		}
		vars := bytes.Split(env, []byte{0})
		all := true
		for _, w := range want {
			found := false
			for _, v := range vars {
				if bytes.Equal(v, w) {
					found = true
					break
				}
			}
			all = all && found
		}
		if all {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestE2EJobKilledUnderItsTask: every process of a busy worker's job is
// killed with SIGKILL (the worker and its command), as a crashed node or
// the OOM killer would. The plugin reads the attached worker's job in its
// next poll cycle (poll_interval 2 s), the engine drops the worker on
// worker_job_ended and places its task again at once, on the machine of
// another task that has ended. Before, the engine waited out its liveness
// rule for a busy worker (61 s).
func TestE2EJobKilledUnderItsTask(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("killing a job's processes needs root, as CI runs")
	}
	e := newE2E(t, "e2e-killed")
	cfg := e.taskConfig(t, 1, `  poll_interval = "2s"`)
	results := filepath.Join(t.TempDir(), "results")
	tasks := filepath.Join(t.TempDir(), "tasks.jsonl")
	lines := `{"id": "victim", "cpus": 1, "command": ["sleep", "20"], "attempts": 2}
{"id": "other", "cpus": 1, "command": ["true"]}
`
	if err := os.WriteFile(tasks, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	p := e.startEngine(t, "-config", cfg, "-tasks", tasks, "-results", results, "-timeout", "4m")
	var first engine.TaskResult
	poll(t, 2*time.Minute, "victim running and other done", func() bool {
		first, _ = e.taskStatus(t, "victim")
		other, _ := e.taskStatus(t, "other")
		return first.State == engine.TaskRunning && len(first.Attempts) == 1 && first.Attempts[0].JobID != "" &&
			other.State == worker.StateSucceeded
	})
	job := first.Attempts[0].JobID
	killed := time.Now()
	n := 0
	for pids := jobPIDs(t, job); len(pids) > 0; pids = jobPIDs(t, job) {
		for _, pid := range pids {
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				n++
			}
		}
		if time.Since(killed) > 10*time.Second {
			t.Fatalf("job %s's processes %v outlive SIGKILL", job, pids)
		}
	}
	if n < 2 {
		t.Fatalf("killed %d process(es) of job %s; want its worker and its command", n, job)
	}
	var again engine.TaskResult
	took := poll(t, 90*time.Second, "victim running again", func() bool {
		again, _ = e.taskStatus(t, "victim")
		return len(again.Attempts) == 2 && again.Attempts[1].JobID != ""
	})
	t.Logf("killed %d processes of job %s; victim runs again in job %s %.1f s later", n, job, again.Attempts[1].JobID, took.Seconds())
	// The liveness rule for a busy worker takes three poll periods (60 s):
	// well within them, the end was heard from the queue.
	if took > 20*time.Second {
		t.Errorf("victim ran again %.1f s after its job was killed; want within a poll cycle or two (2 s each)", took.Seconds())
	}
	code := p.wait(t, 4*time.Minute)
	exitedAt := time.Now()
	t.Logf("story:\n%s", p.stdout)
	if code != 0 {
		t.Errorf("exit %d\nstderr:\n%s", code, p.stderr)
	}
	r := readResult(t, results, "victim")
	if r.State != worker.StateSucceeded || len(r.Attempts) != 2 {
		t.Fatalf("victim: %+v; want succeeded after 2 attempts", r)
	}
	if a, b := r.Attempts[0], r.Attempts[1]; a.State != engine.TaskLostState || a.JobID != job || b.JobID == job ||
		!strings.Contains(a.Error, "its job ended under it: job "+job+" is ") {
		t.Errorf("attempts: %+v; want the first in job %s lost as its job ended, the second in another job", r.Attempts, job)
	}
	if !strings.Contains(p.stdout.String(), "ended under worker") {
		t.Errorf("the story does not tell the job's end")
	}
	e.assertCleanedUp(t, exitedAt)
}

// TestE2EWalltime: jobs of one minute (--time=00:01:00) and four tasks
// that sleep 30 s with a 40 s timeout, under max_workers = 2. Each worker
// knows its job's end (SLURM_JOB_END_TIME from 23.02, else the script's
// start and FLUKSIO_WALLTIME), takes one task, is given no second (30 s
// left is less than 40 s and worker.EndMargin) and leaves before the
// walltime; while it runs its task, its provisioner is asked for its
// replacement, which the cap would refuse if the leaving worker counted.
// No task is killed by a walltime, and every job ends COMPLETED.
func TestE2EWalltime(t *testing.T) {
	e := newE2E(t, "e2e-wall")
	cfg := e.env.EngineConfig(e.port, filepath.Dir(e.plugin), e.name, []string{e.host, "worker"}, fmt.Sprintf(`  max_workers = 2
  profile "p1" {
    cpus   = 1
    ram_mb = 200
    sbatch = ["--partition=%s", "--time=00:01:00"]
  }
`, e.env.Partition))
	path := filepath.Join(t.TempDir(), "config.hcl")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	results := filepath.Join(t.TempDir(), "results")
	tasks := filepath.Join(t.TempDir(), "tasks.jsonl")
	var lines string
	for i := range 4 {
		lines += fmt.Sprintf(`{"id": "t%d", "cpus": 1, "command": ["sleep", "30"], "timeout": "40s"}`+"\n", i)
	}
	if err := os.WriteFile(tasks, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	p := e.startEngine(t, "-config", path, "-tasks", tasks, "-results", results, "-timeout", "5m")
	code := p.wait(t, 5*time.Minute)
	makespan := time.Since(start)
	exitedAt := time.Now()
	t.Logf("story:\n%s", p.stdout)
	if code != 0 {
		t.Errorf("exit %d\nstderr:\n%s", code, p.stderr)
	}
	for i := range 4 {
		r := readResult(t, results, fmt.Sprintf("t%d", i))
		if r.State != worker.StateSucceeded || len(r.Attempts) != 1 {
			t.Errorf("t%d: %s after %d attempt(s) (%+v); want succeeded at once", i, r.State, len(r.Attempts), r.Attempts)
		}
	}
	// The replacements were asked for while the first workers still
	// ran their tasks: before any worker left.
	var firstLeft, lastAsked time.Time
	asked := 0
	for _, l := range p.stdout.Lines() {
		switch {
		case strings.Contains(l.text, ": asked for a \"p1\" machine: job "):
			asked++
			lastAsked = l.at
		case strings.Contains(l.text, " left (job ") && firstLeft.IsZero():
			firstLeft = l.at
		}
	}
	if asked != 4 || firstLeft.IsZero() || !lastAsked.Before(firstLeft) {
		t.Errorf("%d machines asked for, the last at %s, the first worker left at %s; want 4, all asked for before any left",
			asked, lastAsked.Format(time.StampMilli), firstLeft.Format(time.StampMilli))
	}
	e.waitQueueEmpty(t, exitedAt, 60*time.Second, "the run's end", p.stdout.String())
	ids := map[string]bool{}
	for _, m := range workerAttachedJobRe.FindAllStringSubmatch(p.stdout.String(), -1) {
		array, _, _ := strings.Cut(m[1], "_")
		ids[array] = true
	}
	timeouts := 0
	for array := range ids {
		for _, rec := range strings.Split(strings.TrimSpace(e.env.Slurm(t, "scontrol", "-o", "show", "job", array)), "\n") {
			state := field(rec, "JobState")
			t.Logf("job %s_%s: %s, RunTime=%s", field(rec, "ArrayJobId"), field(rec, "ArrayTaskId"), state, field(rec, "RunTime"))
			if state == "TIMEOUT" {
				timeouts++
			}
			if state != "COMPLETED" {
				t.Errorf("job %s ended %s; want COMPLETED, before its walltime", field(rec, "JobId"), state)
			}
		}
	}
	t.Logf("4 tasks of 30 s in jobs of 1 minute under max_workers 2: makespan %.1f s, %d TIMEOUT jobs", makespan.Seconds(), timeouts)
}
