package main

import (
	"bytes"
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
