package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/internal/sandboxtest"
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
	p := e.startEngine(t, "-config", cfg, "-v", "-tasks", tasks, "-results", results, "-timeout", "4m")
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
	r, exitedAt := e.ranAgain(t, p, results, job)
	if !strings.Contains(r.Attempts[0].Error, "its job ended under it: job "+job+" is ") {
		t.Errorf("the first attempt's error %q does not say its job ended", r.Attempts[0].Error)
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
	// Most of its minute is spent waiting out walltimes: it runs beside
	// the package's other long waits.
	t.Parallel()
	e := newE2E(t, "e2e-wall")
	path := e.writeConfig(t, fmt.Sprintf(`  max_workers = 2
  profile "p1" {
    cpus   = 1
    ram_mb = 200
    sbatch = ["--partition=%s", "--time=00:01:00"]
  }
`, e.env.Partition))
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
	p := e.startEngine(t, "-config", path, "-v", "-tasks", tasks, "-results", results, "-timeout", "5m")
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
	var ids []string
	for _, m := range workerAttachedJobRe.FindAllStringSubmatch(p.stdout.String(), -1) {
		ids = append(ids, m[1])
	}
	timeouts := 0
	for id, rec := range e.env.JobRecords(t, ids...) {
		t.Logf("job %s: %s, RunTime=%s", id, rec.State, sandboxtest.ShowField(rec.Line, "RunTime"))
		if rec.State == "TIMEOUT" {
			timeouts++
		}
		if rec.State != "COMPLETED" {
			t.Errorf("job %s ended %s; want COMPLETED, before its walltime", id, rec.State)
		}
	}
	t.Logf("4 tasks of 30 s in jobs of 1 minute under max_workers 2: makespan %.1f s, %d TIMEOUT jobs", makespan.Seconds(), timeouts)
}

// TestE2EPendingReasonShown: a machine that Slurm holds shows Slurm's
// reason in /status (the provisioner's outstanding job, contract 2.6, and
// the waiting need's words) and in fluksio_machines_pending{reason}. A
// job of root's takes both of the sandbox's nodes whole, so the run's
// job pends for Resources until it is cancelled; then the need is served.
func TestE2EPendingReasonShown(t *testing.T) {
	e := newE2E(t, "e2e-pending")
	blocker := strings.TrimSpace(e.env.Slurm(t, "sbatch", "--parsable", "--exclusive", "--nodes=2", "--partition="+e.env.Partition,
		"--job-name=fluksio-test-blocker", "--output=/dev/null", "--wrap=sleep 300"))
	t.Cleanup(func() { e.env.Slurm(t, "scancel", blocker) })
	poll(t, time.Minute, "the blocker running", func() bool {
		return strings.TrimSpace(e.env.Slurm(t, "squeue", "-h", "-j", blocker, "-o", "%T")) == "RUNNING"
	})
	cfg := e.taskConfig(t, 1, `  poll_interval = "2s"`)
	p := e.startEngine(t, "-config", cfg, "-need", "cpus=1,count=1,work=1s", "-timeout", "3m")
	type status struct {
		Provisioners []struct {
			Status *struct {
				Outstanding []struct {
					Job, State, Reason string
				}
			}
		}
		Needs []struct {
			Detail string `json:"detail"`
		}
	}
	var st status
	var reason, detail string
	var last []byte
	defer func() {
		if t.Failed() {
			t.Logf("the last /status:\n%s", last)
		}
	}()
	// The provisioner's status says it from its next poll; the need's
	// words from the router's next ask of it, up to a minute later.
	poll(t, 2*time.Minute, "/status saying why Slurm holds the job", func() bool {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/status", e.port))
		if err != nil {
			return false
		}
		last, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		st = status{}
		if json.Unmarshal(last, &st) != nil || len(st.Provisioners) == 0 || st.Provisioners[0].Status == nil ||
			len(st.Provisioners[0].Status.Outstanding) == 0 || len(st.Needs) == 0 {
			return false
		}
		o := st.Provisioners[0].Status.Outstanding[0]
		reason, detail = o.Reason, st.Needs[0].Detail
		return o.State == "PENDING" && reason != "" && strings.Contains(detail, "held by Slurm for "+reason)
	})
	squeueReason := strings.TrimSpace(e.env.Slurm(t, "squeue", "-h", "--name="+e.jobName(), "-o", "%r"))
	t.Logf("/status: reason %q, the need: %q; squeue says %q", reason, detail, squeueReason)
	if reason != squeueReason || (reason != "Resources" && reason != "Priority") {
		t.Errorf("/status says Slurm holds the job for %q; squeue says %q, want Resources or Priority", reason, squeueReason)
	}
	if !strings.Contains(detail, "held by Slurm for "+reason) {
		t.Errorf("the waiting need says %q; want it to say the reason %q", detail, reason)
	}
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", e.port))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := fmt.Sprintf(`fluksio_machines_pending{provisioner=%q,reason=%q} 1`, e.name, reason)
	if !strings.Contains(string(body), want) {
		t.Errorf("/metrics has no %s", want)
	}
	e.env.Slurm(t, "scancel", blocker)
	if code := p.wait(t, 2*time.Minute); code != 0 {
		t.Errorf("exit %d once the blocker was cancelled\nstderr:\n%s", code, p.stderr)
	}
	e.assertCleanedUp(t, time.Now())
}

// TestE2ENodeDownUnderATask: the node of a busy worker's job is set DOWN
// (scontrol update state=down), which kills the job (Slurm requeues it,
// or ends it NODE_FAIL). The worker detaches as it is signalled, or the
// plugin hears the job end under it; the engine places the task again
// and it runs in another job; no task is lost for good, and the
// requeued job is cancelled, not run again with a spent credential.
func TestE2ENodeDownUnderATask(t *testing.T) {
	e := newE2E(t, "e2e-down")
	cfg := e.taskConfig(t, 1, `  poll_interval = "2s"`)
	results := filepath.Join(t.TempDir(), "results")
	tasks := filepath.Join(t.TempDir(), "tasks.jsonl")
	if err := os.WriteFile(tasks, []byte(`{"id": "victim", "cpus": 1, "command": ["sleep", "15"], "attempts": 2}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := e.startEngine(t, "-config", cfg, "-v", "-tasks", tasks, "-results", results, "-timeout", "4m", "-log-level", "debug")
	defer func() {
		if t.Failed() {
			t.Logf("story:\n%s\nlog:\n%s", p.stdout, p.stderr)
		}
	}()
	var first engine.TaskResult
	poll(t, 2*time.Minute, "victim running", func() bool {
		first, _ = e.taskStatus(t, "victim")
		return first.State == engine.TaskRunning && len(first.Attempts) == 1 && first.Attempts[0].JobID != ""
	})
	job := first.Attempts[0].JobID
	// The provisioner knows the worker arrived (its request is no longer
	// outstanding) before the node goes down: a job requeued before any
	// poll saw it running or its worker reported is kept as never started
	// (slurm/poll.go's requeued says why).
	poll(t, time.Minute, "the worker's arrival in its provisioner's books", func() bool {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/status", e.port))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var st struct {
			Provisioners []struct {
				OutstandingTotal int `json:"outstanding_total"`
			}
		}
		return json.NewDecoder(resp.Body).Decode(&st) == nil && len(st.Provisioners) == 1 && st.Provisioners[0].OutstandingTotal == 0
	})
	node := strings.TrimSpace(e.env.Slurm(t, "squeue", "-h", "-j", job, "-o", "%N"))
	if node == "" {
		t.Fatalf("no node for job %s", job)
	}
	t.Cleanup(func() {
		// Slurm returns a node set DOWN to service by itself once its
		// slurmd answers (ReturnToService); resume it if it has not.
		if strings.Contains(e.env.Slurm(t, "sinfo", "-h", "-n", node, "-o", "%T"), "down") {
			e.env.Slurm(t, "scontrol", "update", "nodename="+node, "state=resume")
		}
	})
	e.env.Slurm(t, "scontrol", "update", "nodename="+node, "state=down", "reason=fluksio-test")
	var again engine.TaskResult
	took := poll(t, 2*time.Minute, "victim running again", func() bool {
		again, _ = e.taskStatus(t, "victim")
		return len(again.Attempts) == 2 && again.Attempts[1].JobID != ""
	})
	t.Logf("node %s of job %s set DOWN; victim runs again in job %s %.1f s later", node, job, again.Attempts[1].JobID, took.Seconds())
	// Slurm signals the job's processes as it takes the node down: the
	// worker hears SIGTERM and detaches, or, killed, its job's end is
	// heard from the queue. Either way the attempt is lost, not failed.
	_, exitedAt := e.ranAgain(t, p, results, job)
	// Slurm requeues the job (JobRequeue=1): it is cancelled, never run
	// again with its worker's spent name.
	if !strings.Contains(p.stdout.String(), "cancelled job "+job+" ") && !strings.Contains(p.stdout.String(), "job "+job+" is NODE_FAIL") {
		t.Errorf("job %s was neither cancelled once requeued nor ended NODE_FAIL", job)
	}
	e.assertCleanedUp(t, exitedAt)
}

// TestE2ESharesUnderACap: 20 needs of 1 CPU and 10 of 2 CPUs under
// max_workers = 8. The provisioner's room is shared by the profiles'
// demand (slurm/demand.go's sharesLocked), so both have machines in the
// first submission round, instead of all 8 going to the 1-CPU profile
// and the 2-CPU needs waiting for it to drain.
func TestE2ESharesUnderACap(t *testing.T) {
	e := newE2E(t, "e2e-shares")
	path := e.writeConfig(t, fmt.Sprintf(`  max_workers = 8
  profile "c1" {
    cpus   = 1
    ram_mb = 200
    sbatch = ["--partition=%[1]s", "--time=00:10:00"]
  }
  profile "c2" {
    cpus   = 2
    ram_mb = 200
    sbatch = ["--partition=%[1]s", "--time=00:10:00"]
  }
`, e.env.Partition))
	p := e.startEngine(t, "-config", path, "-need", "cpus=1,count=20,work=2s", "-need", "cpus=2,count=10,work=2s", "-timeout", "3m")
	code := p.wait(t, 3*time.Minute)
	exitedAt := time.Now()
	t.Logf("story:\n%s", p.stdout)
	if code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", code, p.stderr)
	}
	// The first round: the requests made before any worker attached.
	asked := map[string]int{}
	re := regexp.MustCompile(`: asked for (\d+) "(c[12])" machine\(s\)`)
	for _, l := range p.stdout.Lines() {
		if strings.Contains(l.text, " attached from ") {
			break
		}
		if m := re.FindStringSubmatch(l.text); m != nil {
			n, _ := strconv.Atoi(m[1])
			asked[m[2]] += n
		}
	}
	t.Logf("first round under max_workers = 8: %d machine(s) of c1, %d of c2", asked["c1"], asked["c2"])
	if asked["c1"] == 0 || asked["c2"] == 0 || asked["c1"]+asked["c2"] > 8 {
		t.Errorf("first round %v; want both profiles, 8 at most", asked)
	}
	e.assertCleanedUp(t, exitedAt)
}
