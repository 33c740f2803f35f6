package main

// Reliability tests: the engine, its plugin and the sandbox Slurm, with
// something killed or failing on purpose. They build on the end-to-end
// helpers (newE2E, startEngine, pluginPIDs, assertCleanedUp) and need the
// sandbox like them. See docs/reliability.md for what each shows.

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/provision/shared/plugin"
)

// sleeperWorker writes a worker that never attaches: its job stays
// outstanding, running, until it is cancelled. The job user runs it, so
// it lives outside the test's 0700 temporary directory.
func sleeperWorker(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "fluksio-rel-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "sleeper")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n# A worker that never attaches.\nexec sleep 600\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return script
}

// relConfig is e.config with extra lines in the provisioner block (after
// max_idle) and extra profile blocks at its end.
func (e *e2e) relConfig(t *testing.T, attrs, profiles string, workerCommand ...string) string {
	t.Helper()
	path := e.config(t, workerCommand...)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	anchor := []byte("  max_idle       = \"30s\"\n")
	if !bytes.Contains(b, anchor) {
		t.Fatalf("the configuration has no max_idle line to add to:\n%s", b)
	}
	b = bytes.Replace(b, anchor, append(anchor, attrs...), 1)
	end := bytes.LastIndex(b, []byte("}\n"))
	b = append(b[:end:end], append([]byte(profiles), "}\n"...)...)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// killPluginsAtEnd makes sure no plugin process of the test outlives it,
// whatever happened to its engine.
func (e *e2e) killPluginsAtEnd(t *testing.T) {
	t.Cleanup(func() {
		for _, pid := range e.pluginPIDs(t) {
			t.Logf("killing plugin process %d left behind", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}

// mastersOf lists the ssh processes whose command line names one of the
// control directories: a plugin's ssh master ("ssh: DIR/cm0 [mux]") and
// calls through it.
func mastersOf(controlDirs []string) []string {
	var out []string
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range cmdlines {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		line := strings.TrimSpace(string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
		for _, d := range controlDirs {
			if strings.Contains(line, d+"/") {
				out = append(out, filepath.Base(filepath.Dir(f))+": "+line)
			}
		}
	}
	return out
}

// controlDirs lists the control directories an engine's plugins logged
// (at debug level: FLUKSIO_PLUGIN_LOG_LEVEL=debug and -log-level debug).
func (p *engineProc) controlDirs() []string {
	var dirs []string
	for _, m := range controlPathRe.FindAllStringSubmatch(p.stderr.String(), -1) {
		if !slices.Contains(dirs, m[1]) {
			dirs = append(dirs, m[1])
		}
	}
	return dirs
}

// reapMasters stops, when the test ends, the ssh masters the engine's
// plugins left behind (a plugin killed outright cannot tell its master to
// exit, which then lingers for ControlPersist, 120 s), and removes their
// directories.
func reapMasters(t *testing.T, p *engineProc) {
	t.Cleanup(func() {
		dirs := p.controlDirs()
		for _, m := range mastersOf(dirs) {
			var pid int
			fmt.Sscan(m, &pid)
			if pid > 0 {
				_ = syscall.Kill(pid, syscall.SIGTERM)
			}
		}
		for _, d := range dirs {
			os.RemoveAll(d)
		}
	})
}

// controlPathRe finds a plugin's control directory in its debug log line
// "sharing one ssh connection: control_path=/tmp/fxssh-77-123/cm0".
var controlPathRe = regexp.MustCompile(`control_path=(/\S*/fxssh-[0-9-]+)/cm[0-9]+`)

// queuedJob is one of the test's jobs as squeue shows it.
type queuedJob struct {
	id, state, profile string
}

// jobs lists the test's jobs that squeue shows: id, state, and the
// profile read from the worker in the comment's tag
// (fluksio:v2:<engine>:<epoch>:<name>-<profile>-<hex>).
func (e *e2e) jobs(t *testing.T) []queuedJob {
	t.Helper()
	// -r: each array task (one machine of a burst) on a line of its own.
	out := e.env.Slurm(t, "squeue", "-h", "-r", "--name="+e.jobName(), "-o", "%i|%T|%k")
	var jobs []queuedJob
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.SplitN(strings.TrimSpace(line), "|", 3)
		if len(f) != 3 {
			continue
		}
		// The comment ends with the worker's name (fluksio:<worker>, or
		// with the engine's tag fluksio:v2:<engine>:<epoch>:<worker>).
		worker := f[2][strings.LastIndexByte(f[2], ':')+1:]
		profile, _ := strings.CutPrefix(worker, e.name+"-")
		if i := strings.LastIndexByte(profile, '-'); i > 0 {
			profile = profile[:i]
		}
		// An array's tag names the base; the tasks' workers add -<task>.
		jobs = append(jobs, queuedJob{id: f[0], state: f[1], profile: profile})
	}
	return jobs
}

// activeByProfile maps each profile to its PENDING or RUNNING jobs.
func activeByProfile(jobs []queuedJob) map[string][]string {
	m := map[string][]string{}
	for _, j := range jobs {
		if j.state == "PENDING" || j.state == "RUNNING" {
			m[j.profile] = append(m[j.profile], j.id)
		}
	}
	return m
}

// relStatus is the part of GET /status these tests read.
type relStatus struct {
	Provisioners []struct {
		Name    string `json:"name"`
		Process string `json:"process"`
		Status  *struct {
			Outstanding []struct {
				Profile string `json:"profile"`
				Job     string `json:"job"`
				State   string `json:"state"`
			} `json:"outstanding"`
			LastError string `json:"last_error"`
		} `json:"status"`
		Error string `json:"error"`
	} `json:"provisioners"`
}

// status reads GET /status for the test's provisioner: its process line
// and its outstanding jobs by profile. ok is false when the engine did
// not answer.
func (e *e2e) status(t *testing.T) (process string, outstanding map[string]string, ok bool) {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/status", e.port))
	if err != nil {
		return "", nil, false
	}
	defer resp.Body.Close()
	var st relStatus
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&st) != nil {
		return "", nil, false
	}
	jobs, process, ok := e.outstandingIn(st)
	outstanding = map[string]string{}
	for profile, ids := range jobs {
		outstanding[profile] = ids[0]
	}
	return process, outstanding, ok
}

// outstandingJobs is GET /status's outstanding machines of this test's
// provisioner, by profile.
func (e *e2e) outstandingJobs(t *testing.T) (map[string][]string, bool) {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/status", e.port))
	if err != nil {
		return nil, false
	}
	defer resp.Body.Close()
	var st relStatus
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&st) != nil {
		return nil, false
	}
	jobs, _, ok := e.outstandingIn(st)
	return jobs, ok
}

func (e *e2e) outstandingIn(st relStatus) (map[string][]string, string, bool) {
	outstanding := map[string][]string{}
	for _, p := range st.Provisioners {
		if p.Name != e.name {
			continue
		}
		if p.Status != nil {
			for _, o := range p.Status.Outstanding {
				outstanding[o.Profile] = append(outstanding[o.Profile], o.Job)
			}
		}
		for _, ids := range outstanding {
			sort.Strings(ids)
		}
		return outstanding, p.Process, true
	}
	return outstanding, "", true
}

func sortedIDs(m map[string][]string) string {
	var parts []string
	for p, ids := range m {
		parts = append(parts, p+"="+strings.Join(ids, ","))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

// TestReliabilityPluginKilled kills the plugin with SIGKILL while it has
// machines out for each of three profiles (four needs: two of them one
// array of two "small" machines), so it can cancel nothing and tell
// nobody. The supervisor must restart it within seconds (the goal is 2 s),
// and the new process must take up the machines the dead one left instead
// of asking for more: at no moment may a profile of ours have more
// machines queued or running than are wanted of it. A SIGTERM then leaves
// nothing behind.
func TestReliabilityPluginKilled(t *testing.T) {
	e := newE2E(t, "rel-kill")
	e.killPluginsAtEnd(t)
	cfg := e.relConfig(t, "", `  profile "small" {
    cpus   = 1
    ram_mb = 200
    sbatch = ["--partition=`+e.env.Partition+`", "--time=00:10:00"]
  }
`, sleeperWorker(t))
	// At debug level the plugin logs its ssh master's socket, so that the
	// master the killed plugin leaves behind can be stopped at the end.
	t.Setenv(plugin.LogLevelEnv, "debug")
	p := e.startEngine(t, "-config", cfg, "-log-level", "debug",
		"-need", "cpus=2", "-need", "gpus=1,label=cuda", "-need", "cpus=1", "-need", "cpus=1", "-timeout", "5m")
	reapMasters(t, p)

	want := map[string]int{"cpu": 1, "gpu": 1, "small": 2}
	var before map[string][]string
	poll(t, 60*time.Second, "the wanted machines of cpu, gpu and small in squeue", func() bool {
		if p.exited() {
			t.Fatalf("the engine exited early\nstdout:\n%s\nstderr:\n%s", p.stdout, p.stderr)
		}
		before = activeByProfile(e.jobs(t))
		return len(before["cpu"]) == 1 && len(before["gpu"]) == 1 && len(before["small"]) == 2
	})
	pids := e.pluginPIDs(t)
	if len(pids) != 1 {
		t.Fatalf("plugin processes %v, want one", pids)
	}
	t.Logf("in the queue when the plugin is killed: %s", sortedIDs(before))

	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()

	// Sample /status closely for the restart, and squeue all along: no
	// profile may ever have two jobs. Once every profile is outstanding
	// again, keep watching for a few more reconcile cycles.
	var restarted time.Duration
	var settled time.Time
	var samples, doubled int
	var after map[string][]string
	nextQueue := time.Time{}
	for {
		if p.exited() {
			t.Fatalf("the engine exited\nstdout:\n%s\nstderr:\n%s", p.stdout, p.stderr)
		}
		now := time.Now()
		if restarted == 0 && now.Sub(killed) > 10*time.Second {
			t.Fatalf("the plugin was not running again within 10s of SIGKILL\nstderr:\n%s", p.stderr)
		}
		if !settled.IsZero() && now.Sub(settled) > 3*3*time.Second /* three of the engine's reconcile intervals */ {
			break
		}
		if now.Sub(killed) > 90*time.Second {
			t.Fatalf("90s after the kill, the outstanding requests are %v; want one for each of cpu, gpu and small", after)
		}
		process, _, ok := e.status(t)
		outstanding, _ := e.outstandingJobs(t)
		if ok && restarted == 0 && strings.HasPrefix(process, "running (restarts: 1,") {
			restarted = time.Since(killed)
			t.Logf("kill -> running again: %.2fs (%s)", restarted.Seconds(), process)
		}
		if ok && restarted > 0 {
			if strings.Contains(process, "restarts: 2") {
				t.Fatalf("the plugin restarted twice: %s", process)
			}
			after = outstanding
			if settled.IsZero() && len(after["cpu"]) == 1 && len(after["gpu"]) == 1 && len(after["small"]) == 2 {
				settled = time.Now()
			}
		}
		if now.After(nextQueue) {
			samples++
			for profile, ids := range activeByProfile(e.jobs(t)) {
				if len(ids) > want[profile] {
					if doubled == 0 {
						t.Errorf("%.1fs after the kill, profile %s has %d machines pending or running: %v; %d are wanted", time.Since(killed).Seconds(), profile, len(ids), ids, want[profile])
					}
					doubled++
				}
			}
			nextQueue = time.Now().Add(300 * time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if restarted > 2*time.Second {
		t.Logf("NOTE: the restart took %.2fs, over the 2s goal", restarted.Seconds())
	}
	adopted, total := 0, 0
	for profile, ids := range before {
		for _, id := range ids {
			total++
			if slices.Contains(after[profile], id) {
				adopted++
			}
		}
	}
	t.Logf("after the restart: outstanding %v; %d of %d machines of the killed plugin adopted; %d squeue samples, %d profile(s) seen with more than wanted",
		after, adopted, total, samples, doubled)
	if adopted != total {
		t.Errorf("the restarted plugin took up %d of the %d machines the killed one left (outstanding %v, before %s)", adopted, total, after, sortedIDs(before))
	}

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code := p.wait(t, 90*time.Second)
	exitedAt := time.Now()
	t.Logf("story:\n%s", p.stdout)
	if code != 1 {
		t.Errorf("exit %d after SIGTERM with needs unserved, want 1\nstderr:\n%s", code, p.stderr)
	}
	e.assertCleanedUp(t, exitedAt)
}

// TestReliabilityPluginKilledMidBurst kills the plugin with SIGKILL the
// moment a burst of 40 machines (one job array) reaches the queue, before
// it has polled a single task. The restarted plugin must adopt every task
// and ask for none again: at no moment may the profile have more than the
// 40 wanted pending or running, and only one array is ever submitted. A
// SIGTERM then leaves nothing in the queue.
func TestReliabilityPluginKilledMidBurst(t *testing.T) {
	e := newE2E(t, "rel-burst")
	e.killPluginsAtEnd(t)
	cfg := e.relConfig(t, "", `  profile "small" {
    cpus   = 1
    ram_mb = 100
    sbatch = ["--partition=`+e.env.Partition+`", "--time=00:10:00"]
  }
`, sleeperWorker(t))
	t.Setenv(plugin.LogLevelEnv, "debug")
	const burst = 40
	p := e.startEngine(t, "-config", cfg, "-log-level", "debug", "-need", fmt.Sprintf("cpus=1,count=%d", burst), "-timeout", "5m")
	reapMasters(t, p)

	arrays := map[string]bool{} // every array job id ever seen
	sample := func() map[string][]string {
		jobs := e.jobs(t)
		for _, j := range jobs {
			array, _, _ := strings.Cut(j.id, "_")
			arrays[array] = true
		}
		return activeByProfile(jobs)
	}
	var before map[string][]string
	poll(t, 60*time.Second, "the burst in squeue", func() bool {
		if p.exited() {
			t.Fatalf("the engine exited early\nstdout:\n%s\nstderr:\n%s", p.stdout, p.stderr)
		}
		before = sample()
		return len(before["small"]) > 0
	})
	pids := e.pluginPIDs(t)
	if len(pids) != 1 {
		t.Fatalf("plugin processes %v, want one", pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	t.Logf("killed the plugin with %d tasks of the burst in squeue", len(before["small"]))
	if len(before["small"]) != burst {
		t.Errorf("%d tasks in squeue at first sight, want all %d at once (one array)", len(before["small"]), burst)
	}

	var after map[string][]string
	var settled time.Time
	for {
		if p.exited() {
			t.Fatalf("the engine exited\nstdout:\n%s\nstderr:\n%s", p.stdout, p.stderr)
		}
		if time.Since(killed) > 90*time.Second {
			t.Fatalf("90s after the kill, outstanding %v; want the %d tasks of the burst adopted", after, burst)
		}
		if !settled.IsZero() && time.Since(settled) > 3*3*time.Second /* three of the engine's reconcile intervals */ {
			break
		}
		if n := len(sample()["small"]); n > burst {
			t.Fatalf("%.1fs after the kill, %d machines of small are pending or running; %d are wanted", time.Since(killed).Seconds(), n, burst)
		}
		if out, ok := e.outstandingJobs(t); ok {
			after = out
			if settled.IsZero() && len(after["small"]) == burst {
				settled = time.Now()
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	adopted := 0
	for _, id := range before["small"] {
		if slices.Contains(after["small"], id) {
			adopted++
		}
	}
	t.Logf("adopted %d of %d tasks; arrays ever seen: %d", adopted, len(before["small"]), len(arrays))
	if adopted != len(before["small"]) {
		t.Errorf("the restarted plugin took up %d of the %d tasks the killed one left", adopted, len(before["small"]))
	}
	if len(arrays) != 1 {
		t.Errorf("%d arrays submitted, want 1: a task was asked for twice", len(arrays))
	}

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code := p.wait(t, 90*time.Second)
	exitedAt := time.Now()
	if code != 1 {
		t.Errorf("exit %d after SIGTERM with needs unserved, want 1\nstderr:\n%s", code, p.stderr)
	}
	e.assertCleanedUp(t, exitedAt)
}

// TestReliabilityHostKilled kills the engine with SIGKILL, and only the
// engine, while its plugin has jobs out. The plugin must notice (parent
// death signal, and its parent changing) and leave within 5 s, cancelling
// what it can; an engine started again with the same configuration must
// find nothing of the earlier run unaccounted for: each earlier job is
// gone from the queue or adopted. Each adopted job's worker must then
// attach to the new engine and serve a need (the workers wait for the
// test's gate until adoption is done), and the engine, its needs served,
// leaves nothing behind.
func TestReliabilityHostKilled(t *testing.T) {
	e := newE2E(t, "rel-host")
	e.killPluginsAtEnd(t)
	// The workers wait for a gate the test opens once the second engine
	// runs, so that the jobs of the killed engine are adopted before any
	// worker attaches; then each must attach to the second engine and
	// serve a need. A job counted as recovered whose worker cannot attach
	// would be no recovery at all. The secret is fixed so that the first
	// engine's credentials are good with the second.
	gate := filepath.Join(filepath.Dir(sleeperWorker(t)), "open")
	cfg := e.config(t, gatedWorker(t, gate, e.host))
	withSecretEnv(t, cfg, "FLUKSIO_REL_SECRET", strings.Repeat("0123456789abcdef", 4))
	// At debug level the plugin logs where its ssh master's socket is.
	t.Setenv(plugin.LogLevelEnv, "debug")
	p := e.startEngine(t, "-config", cfg, "-need", "cpus=2", "-need", "gpus=1,label=cuda", "-timeout", "5m", "-log-level", "debug")
	reapMasters(t, p)

	before, pids := e.jobsQueued(t, p)
	t.Logf("in the queue when the engine is killed: %s (plugin pid %d)", sortedIDs(before), pids[0])

	controlDirs := p.controlDirs()
	if masters := mastersOf(controlDirs); len(masters) == 0 {
		t.Fatalf("no ssh master of the plugin found (control dirs %v); the check on its shutdown below would prove nothing\nstderr:\n%s", controlDirs, p.stderr)
	}

	if err := p.cmd.Process.Kill(); err != nil { // the engine alone, not its group
		t.Fatal(err)
	}
	killed := time.Now()
	p.waitDone(t, 10*time.Second)
	poll(t, 5*time.Second, "the plugin to exit after its engine was killed", func() bool {
		return len(e.pluginPIDs(t)) == 0
	})
	t.Logf("engine SIGKILL -> plugin gone: %.2fs", time.Since(killed).Seconds())
	// The plugin's way out is a full Shutdown: cancel, then tell its ssh
	// master to exit and remove the master's directory. One that dies on
	// the way (a log line to the dead engine's stderr is enough to raise
	// SIGPIPE) leaves the master behind for ControlPersist, and may not
	// have cancelled anything.
	var sshLeft, dirsLeft []string
	end := time.Now().Add(5 * time.Second)
	for {
		sshLeft, dirsLeft = mastersOf(controlDirs), nil
		for _, d := range controlDirs {
			if _, err := os.Stat(d); err == nil {
				dirsLeft = append(dirsLeft, d)
			}
		}
		if (len(sshLeft) == 0 && len(dirsLeft) == 0) || time.Now().After(end) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(sshLeft) > 0 || len(dirsLeft) > 0 {
		t.Errorf("the plugin did not finish its shutdown: its ssh master outlived it by 5s (%v, control dirs %v)", sshLeft, dirsLeft)
	} else {
		t.Logf("engine SIGKILL -> plugin's ssh master gone and its control directory removed: %.2fs", time.Since(killed).Seconds())
	}

	var earlier []string
	for _, ids := range before {
		earlier = append(earlier, ids...)
	}
	orphans := 0
	for _, j := range e.jobs(t) {
		if slices.Contains(earlier, j.id) && (j.state == "PENDING" || j.state == "RUNNING") {
			orphans++
		}
	}
	t.Logf("jobs of the killed engine still pending or running once its plugin had gone: %d of %d", orphans, len(earlier))

	// A new engine, same configuration and name, with the same needs.
	p2 := e.startEngine(t, "-config", cfg, "-need", "cpus=2", "-need", "gpus=1,label=cuda", "-timeout", "3m")
	start := time.Now()
	var last string
	var held map[string]string
	poll(t, 60*time.Second, "every earlier job to be gone from the queue or adopted", func() bool {
		if p2.exited() {
			t.Fatalf("the second engine exited\nstdout:\n%s\nstderr:\n%s", p2.stdout, p2.stderr)
		}
		_, outstanding, ok := e.status(t)
		if !ok || !strings.Contains(p2.stdout.String(), "provisioner ready") {
			return false
		}
		active := activeByProfile(e.jobs(t))
		last = fmt.Sprintf("queue %s, outstanding %v", sortedIDs(active), outstanding)
		held = outstanding
		for profile, ids := range before {
			for _, id := range ids {
				if slices.Contains(active[profile], id) && outstanding[profile] != id {
					return false
				}
			}
		}
		return true
	})
	t.Logf("second engine: earlier jobs accounted for %.1fs after it started: %s", time.Since(start).Seconds(), last)

	// Open the gate: the adopted jobs' workers attach and serve both
	// needs, and the engine exits 0 on its own.
	servedBy, opened, exitedAt := letWorkersGo(t, gate, p2)
	var adopted []string
	for _, id := range held {
		if slices.Contains(earlier, id) {
			adopted = append(adopted, id)
			if !slices.Contains(servedBy, id) {
				t.Errorf("adopted job %s (of the killed engine) never served a need: its worker did not attach and work (served by %v)", id, servedBy)
			}
		}
	}
	if len(servedBy) != 2 {
		t.Errorf("work done by jobs %v; want both needs served", servedBy)
	}
	t.Logf("adopted jobs %v; needs served by jobs %v, %.1fs after the workers were let go", adopted, servedBy, exitedAt.Sub(opened).Seconds())
	e.assertCleanedUp(t, exitedAt)
}

// gatedWorker writes a worker that waits until the file gate exists and
// then runs the real worker (host worker ...). Like sleeperWorker it
// lives outside the test's 0700 temporary directory.
func gatedWorker(t *testing.T, gate, host string) string {
	t.Helper()
	script := filepath.Join(filepath.Dir(gate), "gated")
	body := fmt.Sprintf("#!/bin/sh\n# Wait for the test to let the worker go.\nwhile [ ! -e %q ]; do sleep 0.2; done\nexec %q worker \"$@\"\n", gate, host)
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return script
}

var (
	askedRe  = regexp.MustCompile(`asked for a "cpu" machine: job (\d+)`)
	failedRe = regexp.MustCompile(`could not get a "cpu" machine: job (\d+) ended (FAILED\S*(?: \([^)]*\))?)`)
)

// TestReliabilityJobFailsAtOnce runs a worker that exits 1 at once
// (/bin/false). The poller must see the job end FAILED and say so, and
// the profile must be asked for again (after its first backoff, 5 s)
// rather than waiting out provision_timeout for a machine that will never
// come.
func TestReliabilityJobFailsAtOnce(t *testing.T) {
	e := newE2E(t, "rel-false")
	e.killPluginsAtEnd(t)
	// poll_interval below 10s draws a warning from validation; it is what
	// makes the failure show within seconds here.
	cfg := e.relConfig(t, "  poll_interval  = \"2s\"\n", "", "/bin/false")
	p := e.startEngine(t, "-config", cfg, "-need", "cpus=2", "-timeout", "3m")

	var asked1, failed, asked2 storyLine
	var failedJob, failedState string
	poll(t, 60*time.Second, "the job to fail and the cpu profile to be asked for again", func() bool {
		if p.exited() {
			t.Fatalf("the engine exited early\nstdout:\n%s\nstderr:\n%s", p.stdout, p.stderr)
		}
		asked1, failed, asked2 = storyLine{}, storyLine{}, storyLine{}
		for _, l := range p.stdout.Lines() {
			switch {
			case asked1.text == "" && askedRe.MatchString(l.text):
				asked1 = l
			case asked1.text != "" && failed.text == "" && failedRe.MatchString(l.text):
				m := failedRe.FindStringSubmatch(l.text)
				failed, failedJob, failedState = l, m[1], m[2]
			case failed.text != "" && asked2.text == "" && askedRe.MatchString(l.text):
				asked2 = l
			}
		}
		return asked2.text != ""
	})
	firstJob := askedRe.FindStringSubmatch(asked1.text)[1]
	if failedJob != firstJob {
		t.Errorf("the failure is for job %s, want the first job %s:\n%s", failedJob, firstJob, p.stdout)
	}
	detect := failed.at.Sub(asked1.at)
	again := asked2.at.Sub(failed.at)
	t.Logf("job %s submitted -> reported %s: %.2fs (poll_interval 2s); failure -> asked again: %.2fs (first backoff 5s)",
		firstJob, failedState, detect.Seconds(), again.Seconds())
	if detect > 20*time.Second {
		t.Errorf("the failure was reported %s after the submission, want within ~20s", detect)
	}
	if again < 4*time.Second {
		t.Errorf("the profile was asked for again %s after the failure, before its 5s backoff", again)
	}

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code := p.wait(t, 90*time.Second)
	exitedAt := time.Now()
	t.Logf("story:\n%s", p.stdout)
	if code != 1 {
		t.Errorf("exit %d after SIGTERM with the need unserved, want 1", code)
	}
	e.assertCleanedUp(t, exitedAt)
}

// TestReliabilityShutdownDuringRestart kills the plugin with SIGKILL right
// after it has submitted its jobs, and shuts the engine down while the
// supervisor waits out its restart delay. The engine must bring a plugin
// back, let it adopt the jobs and have it cancel them: squeue shows no
// job of ours afterwards, and no plugin process is left (/proc).
func TestReliabilityShutdownDuringRestart(t *testing.T) {
	e := newE2E(t, "rel-shutrestart")
	e.killPluginsAtEnd(t)
	cfg := e.relConfig(t, "", "", sleeperWorker(t))
	t.Setenv(plugin.LogLevelEnv, "debug")
	p := e.startEngine(t, "-config", cfg, "-log-level", "debug",
		"-need", "cpus=2", "-need", "gpus=1,label=cuda", "-timeout", "5m")
	reapMasters(t, p)

	before, pids := e.jobsQueued(t, p)
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Wait, closely, until the supervisor has seen the exit and is in its
	// restart delay (a second), then shut the engine down in it.
	deadline := time.Now().Add(5 * time.Second)
	for {
		process, _, ok := e.status(t)
		if ok && strings.HasPrefix(process, "restarting") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the supervisor did not report restarting within 5s of SIGKILL (last %q)", process)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code := p.wait(t, 90*time.Second)
	exitedAt := time.Now()
	t.Logf("in the queue at the kill: %s\nstory:\n%s", sortedIDs(before), p.stdout)
	if code != 1 {
		t.Errorf("exit %d after SIGTERM with needs unserved, want 1\nstderr:\n%s", code, p.stderr)
	}
	if left := e.pluginPIDs(t); len(left) > 0 {
		t.Errorf("plugin processes left after the engine exited: %v", left)
	}
	e.assertCleanedUp(t, exitedAt)
}

// TestReliabilityFailover gives a need a smallest fitting profile that
// cannot work (its partition does not exist, so every sbatch fails and
// the profile backs off) beside a larger fitting profile that works:
// first in the same provisioner, then in a second provisioner. The need
// must be served by the working one, by a real worker in a Slurm job,
// within a bound, not wait on the broken profile.
func TestReliabilityFailover(t *testing.T) {
	for _, tc := range []struct{ name, second string }{
		{"profile", ""},
		{"provisioner", "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newE2E(t, "rel-failover")
			e.killPluginsAtEnd(t)
			broken := `  profile "small" {
    cpus   = 1
    ram_mb = 200
    sbatch = ["--partition=no-such-partition", "--time=00:10:00"]
  }
`
			working := fmt.Sprintf(`  profile "cpu" {
    cpus   = 2
    ram_mb = 500
    sbatch = ["--partition=%s", "--time=00:10:00"]
  }
`, e.env.Partition)
			worker := []string{e.host, "worker"}
			pluginDir := filepath.Dir(e.plugin)
			var cfg string
			if tc.second == "" {
				cfg = e.env.EngineConfig(e.port, pluginDir, e.name, worker, broken+working)
			} else {
				cfg = e.env.EngineConfig(e.port, pluginDir, e.name, worker, broken)
				other := e.env.EngineConfig(e.port, pluginDir, e.name+"-"+tc.second, worker, working)
				cfg += "\n" + other[strings.Index(other, "provisioner "):]
			}
			path := filepath.Join(t.TempDir(), "config.hcl")
			if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
				t.Fatal(err)
			}
			started := time.Now()
			p := e.startEngine(t, "-config", path, "-need", "cpus=1", "-timeout", "90s")
			code := p.wait(t, 3*time.Minute)
			took := time.Since(started)
			story := p.stdout.String()
			t.Logf("story:\n%s", story)
			if code != 0 {
				t.Fatalf("exit %d: the need was not served beside a working profile within 90s\nstderr:\n%s", code, p.stderr)
			}
			m := workDoneRe.FindStringSubmatch(story)
			if m == nil || !strings.Contains(m[1], "-cpu-") {
				t.Errorf("the need was not served by the working cpu profile's worker: %v", m)
			}
			if c := strings.Count(p.stderr.String(), "failed_over_from=small"); tc.second == "" && c != 1 {
				t.Errorf("the failover was logged %d times; want once", c)
			}
			t.Logf("served by %v in %.1fs", m, took.Seconds())
			if took > 60*time.Second {
				t.Errorf("served after %.1fs; want within 60s", took.Seconds())
			}
		})
	}
}

// TestReliabilityHostAndPluginKilled kills the engine and its plugin
// together with SIGKILL while their jobs are queued and running, so that
// nothing is cancelled: the jobs can only be recovered by adoption. An
// engine started again with the same configuration (and secret) must
// adopt both, and a recovered job is one whose worker attaches and
// serves: the workers wait for the test's gate until adoption is done,
// then each adopted job must serve one of the needs, no new job being
// asked for.
func TestReliabilityHostAndPluginKilled(t *testing.T) {
	e := newE2E(t, "rel-hostplug")
	e.killPluginsAtEnd(t)
	gate := filepath.Join(filepath.Dir(sleeperWorker(t)), "open")
	cfg := e.config(t, gatedWorker(t, gate, e.host))
	withSecretEnv(t, cfg, "FLUKSIO_REL_SECRET", strings.Repeat("0123456789abcdef", 4))
	t.Setenv(plugin.LogLevelEnv, "debug")
	needs := []string{"-need", "cpus=2", "-need", "gpus=1,label=cuda"}
	p := e.startEngine(t, append([]string{"-config", cfg, "-timeout", "5m", "-log-level", "debug"}, needs...)...)
	reapMasters(t, p)

	before, pids := e.jobsQueued(t, p)
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	p.waitDone(t, 10*time.Second)
	poll(t, 5*time.Second, "the killed plugin to be gone", func() bool { return len(e.pluginPIDs(t)) == 0 })
	earlier := []string{before["cpu"][0], before["gpu"][0]}
	t.Logf("left in the queue by the killed engine and plugin: %v", earlier)

	p2 := e.startEngine(t, append([]string{"-config", cfg, "-timeout", "3m"}, needs...)...)
	var outstanding map[string]string
	poll(t, 60*time.Second, "the second engine to adopt both jobs", func() bool {
		if p2.exited() {
			t.Fatalf("the second engine exited\nstdout:\n%s\nstderr:\n%s", p2.stdout, p2.stderr)
		}
		var ok bool
		_, outstanding, ok = e.status(t)
		return ok && outstanding["cpu"] == earlier[0] && outstanding["gpu"] == earlier[1]
	})
	servedBy, opened, exitedAt := letWorkersGo(t, gate, p2)
	slices.Sort(servedBy)
	want := slices.Clone(earlier)
	slices.Sort(want)
	if !slices.Equal(servedBy, want) {
		t.Errorf("needs served by jobs %v; want exactly the adopted jobs %v", servedBy, want)
	}
	t.Logf("needs served by jobs %v (adopted: %v) %.1fs after the workers were let go", servedBy, earlier, exitedAt.Sub(opened).Seconds())
	e.assertCleanedUp(t, exitedAt)
}

// jobsQueued waits until the engine has a job for each of cpu and gpu in
// squeue, and returns them by profile with the pid of its one plugin.
func (e *e2e) jobsQueued(t *testing.T, p *engineProc) (map[string][]string, []int) {
	t.Helper()
	var before map[string][]string
	poll(t, 60*time.Second, "a job for each of cpu and gpu in squeue", func() bool {
		if p.exited() {
			t.Fatalf("the engine exited early\nstdout:\n%s\nstderr:\n%s", p.stdout, p.stderr)
		}
		before = activeByProfile(e.jobs(t))
		return len(before["cpu"]) == 1 && len(before["gpu"]) == 1
	})
	pids := e.pluginPIDs(t)
	if len(pids) != 1 {
		t.Fatalf("plugin processes %v, want one", pids)
	}
	return before, pids
}

// withSecretEnv makes the engine configuration at cfg read its signing
// secret from the variable name, and sets that variable to value for the
// test: a fixed secret, so that credentials outlive one engine.
func withSecretEnv(t *testing.T, cfg, name, value string) {
	t.Helper()
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b = bytes.Replace(b, []byte("engine {\n"), []byte("engine {\n  secret_env = \""+name+"\"\n"), 1)
	if err := os.WriteFile(cfg, b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(name, value)
}

// letWorkersGo opens the gate gated workers wait for and waits for the
// engine p to serve its needs and exit 0. It returns the jobs whose
// workers did the work, when the gate opened and when p exited.
func letWorkersGo(t *testing.T, gate string, p *engineProc) (servedBy []string, opened, exitedAt time.Time) {
	t.Helper()
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	opened = time.Now()
	code := p.wait(t, 4*time.Minute)
	exitedAt = time.Now()
	story := p.stdout.String()
	t.Logf("second engine's story:\n%s", story)
	if code != 0 {
		t.Fatalf("exit %d: the adopted jobs' workers did not serve the needs\nstderr:\n%s", code, p.stderr)
	}
	for _, m := range workDoneRe.FindAllStringSubmatch(story, -1) {
		servedBy = append(servedBy, m[2])
	}
	return servedBy, opened, exitedAt
}

// TestLoginRefusedStopsKnocking (in make test on 22.05 only, since it is
// about ssh and takes 2 minutes; its name keeps it out of test-slurm's
// TestReliability pattern): a configuration whose ssh_key the login
// node does not accept, run for two minutes with a need and a 10 s
// poll_interval. The login is tried on the plugin's slow backoff (a
// minute after the refusal), never once a poll: the sandbox sshd's log
// holds at most 3 logins from the plugin's address in the run (the
// plugin binds its ssh to an address of its own, so that its lines are
// told from anybody else's). The need is reported "login needed" in the
// first refusal's words to the end, the run exits 1 for the need that
// timed out, and its shutdown, with nothing ever submitted, says so and
// is not a failure.
func TestLoginRefusedStopsKnocking(t *testing.T) {
	// Its two minutes are a wait on a login that never gets through,
	// which uses no Slurm: it runs beside the package's other long waits.
	t.Parallel()
	e := newE2E(t, "rel-refused")
	dir := t.TempDir()
	key := filepath.Join(dir, "not_authorized")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", key).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	var b [1]byte
	rand.Read(b[:])
	addr := fmt.Sprintf("127.0.0.%d", 2+int(b[0])%250)
	cfg := e.config(t, e.host, "worker")
	data, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(data), fmt.Sprintf("ssh_key        = %q", e.env.Key), fmt.Sprintf(`ssh_key        = %q
  ssh_options    = ["BindAddress=%s"]
  poll_interval  = "10s"`, key, addr), 1)
	if text == string(data) {
		t.Fatalf("the configuration has no ssh_key line to replace:\n%s", data)
	}
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	sshdLog := filepath.Join(e.env.Dir, "log", "sshd.log")
	st, err := os.Stat(sshdLog)
	if err != nil {
		t.Fatal(err)
	}
	from := st.Size()

	p := e.startEngine(t, "-config", cfg, "-need", "cpus=1", "-timeout", "2m")
	code := p.wait(t, 3*time.Minute)
	story, logs := p.stdout.String(), p.stderr.String()
	t.Logf("story:\n%s", story)

	f, err := os.Open(sshdLog)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Seek(from, 0); err != nil {
		t.Fatal(err)
	}
	tail, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	// One connection is one source port; sshd names it on each line.
	ports := map[string]bool{}
	refused := 0
	fromAddr := regexp.MustCompile(` ` + regexp.QuoteMeta(addr) + ` port (\d+)`)
	for _, l := range strings.Split(string(tail), "\n") {
		if m := fromAddr.FindStringSubmatch(l); m != nil {
			ports[m[1]] = true
			if strings.Contains(l, "Connection closed by authenticating user") {
				refused++
			}
		}
	}
	t.Logf("logins from %s in the sandbox sshd's log during the 2 min run: %d (%d refused)", addr, len(ports), refused)
	if refused == 0 {
		t.Errorf("the sshd's log has no refused login from %s: the test does not see the plugin's logins\n%s", addr, tail)
	}
	if len(ports) > 3 {
		t.Errorf("%d logins in 2 minutes, want at most 3 (a minute after the refusal, then doubling)", len(ports))
	}

	if code != 1 || !strings.Contains(story, "timed out after 2m0s; not served: ") {
		t.Errorf("exit %d, want 1 for the need that timed out", code)
	}
	const first = "Permission denied (publickey)"
	for _, l := range strings.Split(story+logs, "\n") {
		if strings.Contains(l, "login needed") && !strings.Contains(l, first) {
			t.Errorf("a line says login needed without the first refusal's words: %s", l)
		}
		if strings.Contains(l, "kex_exchange_identification") || strings.Contains(l, "deadline exceeded") {
			t.Errorf("a line has other words than the refusal's: %s", l)
		}
	}
	if m := regexp.MustCompile(`timed out after .*`).FindString(story); !strings.Contains(m, "login needed") || !strings.Contains(m, first) {
		t.Errorf("the need's last word is %q, want login needed, %s", m, first)
	}
	if strings.Contains(story, "shutdown failed") || strings.Contains(story, "may be left") {
		t.Errorf("the shutdown of a provisioner that submitted nothing failed")
	}
	if !strings.Contains(story, e.name+": shut down, nothing outstanding") {
		t.Errorf("the story does not say the shutdown left nothing outstanding")
	}
	// Nothing reached sbatch, and the counts say so.
	if !regexp.MustCompile(`reached the scheduler|0 machine\(s\) from 0 submission\(s\)`).MatchString(story) ||
		regexp.MustCompile(`[1-9]\d* of \d+ submission\(s\) reached|from [1-9]\d* submission\(s\)`).MatchString(story) {
		t.Errorf("the story counts a submission that reached the scheduler, though none did")
	}
}
