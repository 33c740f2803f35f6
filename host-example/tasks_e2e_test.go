package main

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/worker"
)

// taskConfig writes a configuration with one profile of cpus CPUs, and
// provisioner attributes extra.
func (e *e2e) taskConfig(t *testing.T, cpus int, extra string) string {
	t.Helper()
	return e.writeConfig(t, fmt.Sprintf(`%s
  profile "p%[2]d" {
    cpus   = %[2]d
    ram_mb = 200
    sbatch = ["--partition=%[3]s", "--time=00:10:00"]
  }
`, extra, cpus, e.env.Partition))
}

// writeConfig writes a configuration of the test's engine and one
// provisioner of the sandbox with body (attributes and profiles) and
// returns its path.
func (e *e2e) writeConfig(t *testing.T, body string) string {
	t.Helper()
	cfg := e.env.EngineConfig(e.port, filepath.Dir(e.plugin), e.name, []string{e.host, "worker"}, body)
	path := filepath.Join(t.TempDir(), "config.hcl")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// taskStatus is GET /v1/tasks/ID on the engine, as its operator on this
// machine asks it.
func (e *e2e) taskStatus(t *testing.T, id string) (engine.TaskResult, int) {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/v1/tasks/%s", e.port, id))
	if err != nil {
		return engine.TaskResult{}, 0
	}
	defer resp.Body.Close()
	var r engine.TaskResult
	if resp.StatusCode == http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			t.Fatalf("GET /v1/tasks/%s: %v", id, err)
		}
	}
	return r, resp.StatusCode
}

func readResult(t *testing.T, results, id string) engine.TaskResult {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(results, id, "result.json"))
	if err != nil {
		t.Fatalf("task %s: %v", id, err)
	}
	var r engine.TaskResult
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("task %s's result.json: %v\n%s", id, err, b)
	}
	return r
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestE2ERunTasks runs real tasks through host-example run -tasks on the
// sandbox's Slurm, one machine at a time (max_workers = 1), so that one
// worker runs them all in turn: a sleep 300 cancelled through POST
// /v1/tasks/ID/cancel, its worker then taking the next task; three
// digests of 1 MB inputs that only the engine's user can read (a
// directory of mode 0700 the job user cannot enter), each brought back
// as stdout and as an output file; exit 3 with its stderr; a timeout.
// The exit status is 1 (not every task succeeded), every task's
// directory holds its stdout, stderr and result.json, and Slurm's queue
// is left empty.
func TestE2ERunTasks(t *testing.T) {
	e := newE2E(t, "e2e-tasks")
	cfg := e.taskConfig(t, 1, "  max_workers = 1\n")
	private := t.TempDir()
	if err := os.Chmod(private, 0o700); err != nil {
		t.Fatal(err)
	}
	results := filepath.Join(t.TempDir(), "results")
	var lines []string
	lines = append(lines, `{"id": "cancel-me", "command": ["sleep", "300"]}`)
	digests := map[string]string{}
	for i := 1; i <= 3; i++ {
		data := make([]byte, 1<<20)
		rand.Read(data)
		path := filepath.Join(private, fmt.Sprintf("in-%d.bin", i))
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		id := fmt.Sprintf("dig-%d", i)
		digests[id] = hex.EncodeToString(sum[:])
		lines = append(lines, fmt.Sprintf(`{"id": %q, "command": ["sh", "-c", "sha256sum in.bin && mkdir out && sha256sum in.bin > out/sum.txt"], "inputs": {"in.bin": %q}, "outputs": ["out/"]}`, id, path))
	}
	lines = append(lines,
		`{"id": "exit3", "command": ["sh", "-c", "echo oops >&2; exit 3"]}`,
		`{"id": "slow", "command": ["sleep", "60"], "timeout": "2s"}`)
	tasks := filepath.Join(t.TempDir(), "tasks.jsonl")
	if err := os.WriteFile(tasks, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	p := e.startEngine(t, "-config", cfg, "-v", "-tasks", tasks, "-results", results, "-timeout", "4m")
	var running engine.TaskResult
	poll(t, 2*time.Minute, "cancel-me running", func() bool {
		running, _ = e.taskStatus(t, "cancel-me")
		return running.State == engine.TaskRunning
	})
	req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d/v1/tasks/cancel-me/cancel", e.port), nil)
	req.Header.Set(engine.OperatorHeader, "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("POST /v1/tasks/cancel-me/cancel: %s", resp.Status)
	}
	code := p.wait(t, 4*time.Minute)
	exitedAt := time.Now()
	story := p.stdout.String()
	t.Logf("story:\n%s", story)
	if code != 1 {
		t.Errorf("exit %d; want 1 (not every task succeeded)\nstderr:\n%s", code, p.stderr)
	}
	if !strings.Contains(story, "summary: 6 task(s): 3 succeeded, 1 failed, 1 timed_out, 1 cancelled") {
		t.Errorf("no summary with the right counts")
	}

	cancelled := readResult(t, results, "cancel-me")
	if cancelled.State != worker.StateCancelled || len(cancelled.Attempts) != 1 {
		t.Errorf("cancel-me: %+v", cancelled)
	}
	w := cancelled.Attempts[0].Worker
	for id, digest := range digests {
		r := readResult(t, results, id)
		if r.State != worker.StateSucceeded || r.ExitCode == nil || *r.ExitCode != 0 {
			t.Errorf("%s: %+v", id, r)
			continue
		}
		if out := readFile(t, filepath.Join(results, id, "stdout")); out != digest+"  in.bin\n" {
			t.Errorf("%s's stdout = %q; want the input's digest %s", id, out, digest)
		}
		if out := readFile(t, filepath.Join(results, id, "outputs", "out", "sum.txt")); out != digest+"  in.bin\n" {
			t.Errorf("%s's output out/sum.txt = %q", id, out)
		}
		if a := r.Attempts[0]; a.Worker != w || a.JobID == "" || a.Started.Before(cancelled.Ended) {
			t.Errorf("%s ran as %+v; want it on %s, the cancelled task's worker, after the cancel (%s)", id, a, w, cancelled.Ended)
		}
	}
	failed := readResult(t, results, "exit3")
	if failed.State != worker.StateFailed || failed.ExitCode == nil || *failed.ExitCode != 3 || failed.Stderr != "oops\n" {
		t.Errorf("exit3: %+v", failed)
	}
	if got := readFile(t, filepath.Join(results, "exit3", "stderr")); got != "oops\n" {
		t.Errorf("exit3's stderr file = %q", got)
	}
	if slow := readResult(t, results, "slow"); slow.State != worker.StateTimedOut {
		t.Errorf("slow: %+v", slow)
	}
	e.assertCleanedUp(t, exitedAt)
}

// TestE2ETaskRunsAgainAfterItsJobIsCancelled: a task of 2 CPUs, whose
// command sees SLURM_CPUS_PER_TASK=2, has its Slurm job scancelled while
// it runs; the task runs again in another job and succeeds, and its
// result.json shows both attempts, the first lost.
func TestE2ETaskRunsAgainAfterItsJobIsCancelled(t *testing.T) {
	e := newE2E(t, "e2e-rerun")
	cfg := e.taskConfig(t, 2, "")
	results := filepath.Join(t.TempDir(), "results")
	tasks := filepath.Join(t.TempDir(), "tasks.jsonl")
	line := `{"id": "victim", "cpus": 2, "command": ["sh", "-c", "echo cpus=$SLURM_CPUS_PER_TASK; sleep 10"], "attempts": 2}` + "\n"
	if err := os.WriteFile(tasks, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	p := e.startEngine(t, "-config", cfg, "-v", "-tasks", tasks, "-results", results, "-timeout", "4m")
	var first engine.TaskResult
	poll(t, 2*time.Minute, "victim running", func() bool {
		first, _ = e.taskStatus(t, "victim")
		return first.State == engine.TaskRunning && len(first.Attempts) == 1 && first.Attempts[0].JobID != ""
	})
	job := first.Attempts[0].JobID
	e.env.Slurm(t, "scancel", job)
	_, exitedAt := e.ranAgain(t, p, results, job)
	// The cancel is said as such, with the task it hit.
	story := p.stdout.String()
	if !strings.Contains(story, "its job "+job+" was cancelled under its task") || !strings.Contains(story, "task victim runs again (attempt 2)") {
		t.Errorf("the story does not say job %s was cancelled and victim runs again:\n%s", job, story)
	}
	if out := readFile(t, filepath.Join(results, "victim", "stdout")); out != "cpus=2\n" {
		t.Errorf("stdout = %q; want cpus=2", out)
	}
	e.assertCleanedUp(t, exitedAt)
}

// ranAgain waits for the run p to end and checks that its task "victim"
// succeeded on its second attempt, in another job than job, after its
// first was lost with job; it returns the result and when p exited.
func (e *e2e) ranAgain(t *testing.T, p *engineProc, results, job string) (engine.TaskResult, time.Time) {
	t.Helper()
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
	if a, b := r.Attempts[0], r.Attempts[1]; a.State != engine.TaskLostState || a.JobID != job || b.JobID == job || b.State != worker.StateSucceeded {
		t.Errorf("attempts: %+v; want the first in job %s lost, the second in another job succeeded", r.Attempts, job)
	}
	return r, exitedAt
}

// TestE2EManyResultsWhole runs 1,000 tasks of `true` on four one-CPU
// machines of the sandbox: the TaskEnded hook writes each result.json on
// the engine's hook goroutine, off the pass that settles it, and when
// run exits (0) every one of the 1,000 is there, whole: it parses, and
// says the task succeeded. No temporary file is left beside them.
func TestE2EManyResultsWhole(t *testing.T) {
	e := newE2E(t, "e2e-many")
	cfg := e.taskConfig(t, 1, "  max_workers = 4\n")
	const n = 1000
	var lines []string
	for i := range n {
		lines = append(lines, fmt.Sprintf(`{"id": "m%04d", "command": ["true"]}`, i))
	}
	tasks := filepath.Join(t.TempDir(), "tasks.jsonl")
	if err := os.WriteFile(tasks, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	results := filepath.Join(t.TempDir(), "results")
	p := e.startEngine(t, "-config", cfg, "-tasks", tasks, "-results", results, "-timeout", "8m")
	if code := p.wait(t, 9*time.Minute); code != 0 {
		t.Fatalf("exit %d; want 0\nstory (tail):\n%s\nstderr (tail):\n%s", code, tail(p.stdout.String(), 2000), tail(p.stderr.String(), 2000))
	}
	exitedAt := time.Now()
	if !strings.Contains(p.stdout.String(), fmt.Sprintf("summary: %d task(s): %d succeeded", n, n)) {
		t.Errorf("no summary of %d succeeded", n)
	}
	for i := range n {
		id := fmt.Sprintf("m%04d", i)
		if r := readResult(t, results, id); r.ID != id || r.State != worker.StateSucceeded {
			t.Errorf("%s's result.json: %+v", id, r)
		}
	}
	left, err := filepath.Glob(filepath.Join(results, "*", ".result-*"))
	if err != nil || len(left) > 0 {
		t.Errorf("temporary result files left: %v %v", left, err)
	}
	e.assertCleanedUp(t, exitedAt)
}
