package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// reloadStatus is the part of GET /status TestE2EReload reads.
type reloadStatus struct {
	Config struct {
		Generation int    `json:"generation"`
		Digest     string `json:"digest"`
	} `json:"config"`
	Workers []struct {
		Name  string `json:"name"`
		JobID string `json:"job_id"`
	} `json:"workers"`
	Provisioners []struct {
		Status *struct {
			Counts []struct {
				Attached int `json:"attached"`
			} `json:"counts"`
		} `json:"status"`
	} `json:"provisioners"`
}

// pluginAttached is how many workers the plugin counts attached: it
// has heard of their arrival (Reconcile).
func (st reloadStatus) pluginAttached() int {
	n := 0
	for _, p := range st.Provisioners {
		if p.Status != nil {
			for _, c := range p.Status.Counts {
				n += c.Attached
			}
		}
	}
	return n
}

// reloadStatusOf reads GET /status; ok is false when the engine did not
// answer.
func (e *e2e) reloadStatusOf(t *testing.T) (st reloadStatus, ok bool) {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/status", e.port))
	if err != nil {
		return st, false
	}
	defer resp.Body.Close()
	return st, resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&st) == nil
}

// workerNames is the attached workers' names, sorted.
func (st reloadStatus) workerNames() []string {
	var out []string
	for _, w := range st.Workers {
		out = append(out, w.Name)
	}
	slices.Sort(out)
	return out
}

// running is this test's jobs squeue shows RUNNING, by id.
func (e *e2e) running(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, line := range strings.Split(e.queue(t), "\n") {
		if id, state, ok := strings.Cut(line, " "); ok && state == "RUNNING" {
			out[id] = true
		}
	}
	return out
}

// TestE2EReload: SIGHUP to a real host-example run on the sandbox's
// Slurm, under load (6 tasks of sleep 300, max_workers 2, so that two
// machines are busy and four tasks wait). The file rewritten with
// max_workers 4 and a profile added, SIGHUP: the engine asks for more
// machines (4 attached), no job of before is cancelled (squeue shows
// them RUNNING), each worker attached before stays attached, GET
// /status says generation 2 and the new file's digest, and the log says
// each change in a line. Then a broken file, SIGHUP: refused, its
// diagnostic at file:line:col in the log, the generation and the digest
// as they were, the workers and the jobs as they were.
func TestE2EReload(t *testing.T) {
	e := newE2E(t, "e2e-reload")
	profile := func(name string, cpus int) string {
		return fmt.Sprintf("  profile %q {\n    cpus   = %d\n    ram_mb = 200\n    sbatch = [\"--partition=%s\", \"--time=00:10:00\"]\n  }\n", name, cpus, e.env.Partition)
	}
	cfg := e.writeConfig(t, "  max_workers = 2\n"+profile("cpu", 1))
	var lines []string
	for i := 1; i <= 6; i++ {
		lines = append(lines, fmt.Sprintf(`{"id": "s%d", "command": ["sleep", "300"]}`, i))
	}
	tasks := filepath.Join(t.TempDir(), "tasks.jsonl")
	if err := os.WriteFile(tasks, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	results := filepath.Join(t.TempDir(), "results")
	p := e.startEngine(t, "-config", cfg, "-v", "-tasks", tasks, "-results", results, "-timeout", "8m")
	defer func() {
		if t.Failed() || testing.Verbose() {
			t.Logf("stdout:\n%s\nstderr:\n%s", p.stdout, p.stderr)
		}
	}()

	var before reloadStatus
	poll(t, 2*time.Minute, "two workers attached under max_workers 2, and their plugin told so", func() bool {
		st, ok := e.reloadStatusOf(t)
		before = st
		return ok && len(st.Workers) == 2 && st.pluginAttached() == 2
	})
	if before.Config.Generation != 1 || len(before.Config.Digest) != 12 {
		t.Fatalf("at start GET /status says configuration %+v; want generation 1 and a 12-digit digest", before.Config)
	}
	jobsBefore := e.running(t)
	for _, w := range before.Workers {
		if !jobsBefore[w.JobID] {
			t.Fatalf("worker %s's job %s is not RUNNING in squeue: %v", w.Name, w.JobID, jobsBefore)
		}
	}

	// max_workers 2 → 4 and a profile added.
	if err := os.WriteFile(cfg, []byte(strings.Replace(readFile(t, cfg), "  max_workers = 2\n", "  max_workers = 4\n"+profile("big", 2), 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	var after reloadStatus
	poll(t, time.Minute, "generation 2 in GET /status", func() bool {
		st, ok := e.reloadStatusOf(t)
		after = st
		return ok && st.Config.Generation == 2
	})
	if after.Config.Digest == before.Config.Digest || len(after.Config.Digest) != 12 {
		t.Errorf("after the reload the digest is %q (before %q); want the new file's", after.Config.Digest, before.Config.Digest)
	}
	poll(t, 2*time.Minute, "four workers attached under max_workers 4", func() bool {
		st, ok := e.reloadStatusOf(t)
		after = st
		return ok && len(st.Workers) == 4
	})
	for _, name := range before.workerNames() {
		if !slices.Contains(after.workerNames(), name) {
			t.Errorf("worker %s, attached before the reload, is not attached after it: %v", name, after.workerNames())
		}
	}
	jobsAfter := e.running(t)
	for id := range jobsBefore {
		if !jobsAfter[id] {
			t.Errorf("job %s, RUNNING before the reload, is not after it (squeue: %v)", id, e.queue(t))
		}
	}
	log := p.stderr.String()
	for _, want := range []string{"max_workers of " + e.name + " 2 → 4", "profile big added to " + e.name} {
		if !strings.Contains(log, want) {
			t.Errorf("the log does not say %q", want)
		}
	}
	if strings.Contains(p.stdout.String(), "gave up") {
		t.Errorf("a machine was given up after the reload:\n%s", p.stdout)
	}

	// A broken file: refused, nothing changed.
	broken := strings.Replace(readFile(t, cfg), "  max_workers = 4\n", "  max_workers = 4\n  profile \"bad\" {\n    cpus = \n", 1)
	if err := os.WriteFile(cfg, []byte(broken), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	at := regexp.MustCompile(regexp.QuoteMeta(cfg) + `:\d+:\d+: error: `)
	poll(t, time.Minute, "the broken file's diagnostic in the log", func() bool { return at.MatchString(p.stderr.String()) })
	if !strings.Contains(p.stderr.String(), "configuration reload refused") {
		t.Errorf("the log does not say the reload was refused")
	}
	st, ok := e.reloadStatusOf(t)
	if !ok || st.Config != after.Config {
		t.Errorf("after a refused reload GET /status says configuration %+v; want %+v as before", st.Config, after.Config)
	}
	if !slices.Equal(st.workerNames(), after.workerNames()) {
		t.Errorf("after a refused reload the workers are %v; want %v", st.workerNames(), after.workerNames())
	}
	for id := range jobsAfter {
		if !e.running(t)[id] {
			t.Errorf("job %s is not RUNNING after a refused reload", id)
		}
	}

	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	p.wait(t, 2*time.Minute)
	e.assertCleanedUp(t, time.Now())
}
