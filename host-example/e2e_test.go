package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/shared"
)

// The end-to-end tests run the host-example binary against the sandbox
// Slurm, the way sandbox/demo.sh does: the engine launches the real
// provisioner-slurm plugin, which submits jobs over ssh; the jobs run the
// host-example binary as a worker, which dials back. They need the
// sandbox (sandbox/up.sh) and skip without it, except in CI.

func TestMain(m *testing.M) {
	// Re-executed as another user, the test binary is the squatter of
	// TestE2ERelayPortSquatted.
	if port := os.Getenv(squatPortEnv); port != "" {
		os.Exit(squat(port))
	}
	os.Exit(sandboxtest.Run(m))
}

// e2e is what every end-to-end test starts from.
type e2e struct {
	env    sandboxtest.Env
	host   string // the host-example binary
	plugin string // provisioner-slurm, next to it
	// name is the provisioner's name, unique to the test, so that its
	// Slurm jobs (fluksio-<name>) are told apart from anybody else's.
	name string
	// mark is put in the engine's environment, which its plugins
	// inherit, so that this test's plugin processes can be found.
	mark string
	port int
}

func newE2E(t *testing.T, prefix string) *e2e {
	t.Helper()
	return newE2EOn(t, prefix, sandboxtest.Require(t))
}

// newE2EOn is newE2E against env, such as a private sandbox.
func newE2EOn(t *testing.T, prefix string, env sandboxtest.Env) *e2e {
	t.Helper()
	host := sandboxtest.Binary(t, "host-example", "host-example")
	plugin := sandboxtest.Binary(t, "plugin", "provisioner-slurm")
	if filepath.Dir(host) != filepath.Dir(plugin) {
		t.Fatalf("the plugin %s is not next to %s", plugin, host)
	}
	var b [4]byte
	rand.Read(b[:])
	e := &e2e{env: env, host: host, plugin: plugin, name: prefix + "-" + hex.EncodeToString(b[:]), port: sandboxtest.FreePort(t)}
	e.mark = "FLUKSIO_E2E_MARK=" + e.name
	// Whatever happens to the test, nothing of ours stays in the queue
	// of a sandbox others use. Registered first, so it runs last, after
	// the engine has been killed.
	t.Cleanup(func() {
		if out := e.queue(t); out != "" {
			t.Logf("cancelling what the test left in the queue:\n%s", out)
			e.env.Slurm(t, "scancel", "--name="+e.jobName())
		}
	})
	return e
}

func (e *e2e) jobName() string { return "fluksio-" + e.name }

// queue is squeue's view of this test's jobs: "id state" lines.
func (e *e2e) queue(t *testing.T) string {
	t.Helper()
	return strings.TrimSpace(e.env.Slurm(t, "squeue", "-h", "--name="+e.jobName(), "-o", "%i %T"))
}

// config writes a configuration like demo.sh's and returns its path. The
// gpu profile has 1 CPU, as in the demo, so its worker cannot take the
// cpus=2 need and which worker does which need is not a race.
func (e *e2e) config(t *testing.T, workerCommand ...string) string {
	t.Helper()
	sbatch := fmt.Sprintf(`["--partition=%s", "--time=00:10:00"]`, e.env.Partition)
	cfg := e.env.EngineConfig(e.port, filepath.Dir(e.plugin), e.name, workerCommand, fmt.Sprintf(`  profile "cpu" {
    cpus   = 2
    ram_mb = 500
    sbatch = %[1]s
  }
  profile "gpu" {
    cpus   = 1
    gpus   = 1
    ram_mb = 500
    labels = ["cuda"]
    sbatch = %[1]s
  }
`, sbatch))
	path := filepath.Join(t.TempDir(), "config.hcl")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// storyLine is one line of the engine's stdout and when it arrived.
type storyLine struct {
	at   time.Time
	text string
}

// storyWriter keeps the engine's stdout line by line, stamped.
type storyWriter struct {
	mu      sync.Mutex
	partial []byte
	lines   []storyLine
}

func (w *storyWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		w.lines = append(w.lines, storyLine{now, string(w.partial[:i])})
		w.partial = w.partial[i+1:]
	}
	return len(p), nil
}

func (w *storyWriter) Lines() []storyLine {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]storyLine(nil), w.lines...)
}

func (w *storyWriter) String() string {
	var b strings.Builder
	for _, l := range w.Lines() {
		b.WriteString(l.text)
		b.WriteByte('\n')
	}
	return b.String()
}

// engineProc is a running host-example run.
type engineProc struct {
	cmd     *exec.Cmd
	started time.Time
	stdout  *storyWriter
	stderr  *lockedBuffer
	done    chan struct{} // closed when Wait returned
	err     error         // Wait's error, once done is closed
}

// startEngine starts host-example run with args. It is killed, with
// anything left in its process group, when the test ends if it is still
// running then.
func (e *e2e) startEngine(t *testing.T, args ...string) *engineProc {
	t.Helper()
	p := &engineProc{stdout: &storyWriter{}, stderr: &lockedBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(e.host, append([]string{"run"}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	p.cmd.Env = append(os.Environ(), e.mark)
	// Its own process group, so that cleanup can take its plugins with
	// it should the engine have to be killed.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p.cmd.WaitDelay = 10 * time.Second
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
			return
		default:
		}
		t.Logf("killing engine pid %d and its process group", p.cmd.Process.Pid)
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	})
	return p
}

// wait waits up to limit for the engine to exit and returns its code.
func (p *engineProc) wait(t *testing.T, limit time.Duration) int {
	t.Helper()
	p.waitDone(t, limit)
	return p.code(t)
}

// waitDone waits up to limit for the engine to exit.
func (p *engineProc) waitDone(t *testing.T, limit time.Duration) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(limit):
		t.Fatalf("the engine did not exit within %s\nstdout:\n%s\nstderr:\n%s", limit, p.stdout, p.stderr)
	}
}

// code is the exit code of an engine that has exited normally.
func (p *engineProc) code(t *testing.T) int {
	t.Helper()
	var ee *exec.ExitError
	switch {
	case p.err == nil:
		return 0
	case errors.As(p.err, &ee) && ee.Exited():
		return ee.ExitCode()
	}
	t.Fatalf("the engine did not exit normally: %v\nstdout:\n%s\nstderr:\n%s", p.err, p.stdout, p.stderr)
	return -1
}

func (p *engineProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// poll calls cond until it holds, failing the test after limit. The
// pause between calls only keeps it from spinning; nothing waits on it.
func poll(t *testing.T, limit time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > limit {
			t.Fatalf("timed out after %s waiting for %s", limit, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return time.Since(start)
}

// pluginPIDs lists the running processes of this test's plugin binary
// that descend from one of its engines (they carry its mark).
func (e *e2e) pluginPIDs(t *testing.T) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", ent.Name(), "exe"))
		if err != nil || strings.TrimSuffix(exe, " (deleted)") != e.plugin {
			continue
		}
		environ, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "environ"))
		if err != nil {
			continue // gone meanwhile
		}
		for _, kv := range bytes.Split(environ, []byte{0}) {
			if string(kv) == e.mark {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// assertCleanedUp checks that nothing of the test is left: no job in the
// queue within a minute, and no plugin process.
func (e *e2e) assertCleanedUp(t *testing.T, exitedAt time.Time) {
	t.Helper()
	// scancel returns before a job has ended: a cancelled job shows as
	// COMPLETING until its processes are gone.
	var last string
	start := time.Now()
	for {
		if last = e.queue(t); last == "" {
			break
		}
		if time.Since(start) > 60*time.Second {
			t.Fatalf("60s after the engine exited, squeue --name=%s still shows:\n%s", e.jobName(), last)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("queue empty of %s %.1fs after the engine exited", e.jobName(), time.Since(exitedAt).Seconds())

	if pids := e.pluginPIDs(t); len(pids) > 0 {
		t.Errorf("plugin processes of %s outlived the engine: %v", e.plugin, pids)
	}
}

var workDoneRe = regexp.MustCompile(`work done by (\S+): host \S+, job (\d+), `)

// TestE2ERunServesNeeds runs the demo: two needs, one for a CPU machine
// and one for a GPU machine with a label, each served by a worker that a
// Slurm job started, and nothing left behind.
func TestE2ERunServesNeeds(t *testing.T) {
	e := newE2E(t, "e2e-serve")
	cfg := e.config(t, e.host, "worker")

	p := e.startEngine(t, "-config", cfg, "-need", "cpus=2", "-need", "gpus=1,label=cuda", "-timeout", "2m", "-log-level", "debug")
	code := p.wait(t, 3*time.Minute)
	exitedAt := time.Now()
	story := p.stdout.String()
	t.Logf("story:\n%s", story)
	if code != 0 {
		t.Fatalf("exit %d, want 0\nstderr:\n%s", code, p.stderr)
	}
	assertQuietLog(t, p.stderr.String(), e.name)

	byProfile := map[string][]string{}
	for _, m := range workDoneRe.FindAllStringSubmatch(story, -1) {
		worker, job := m[1], m[2]
		profile, ok := strings.CutPrefix(worker, e.name+"-")
		if !ok {
			t.Errorf("worker %s is not named after the provisioner %s", worker, e.name)
			continue
		}
		profile, _, _ = strings.Cut(profile, "-")
		byProfile[profile] = append(byProfile[profile], job)
	}
	if len(byProfile["cpu"]) != 1 || len(byProfile["gpu"]) != 1 || len(byProfile) != 2 {
		t.Errorf("want one piece of work done by a cpu worker and one by a gpu worker, with Slurm job ids; got %v", byProfile)
	}
	if byProfile["cpu"] != nil && byProfile["gpu"] != nil && byProfile["cpu"][0] == byProfile["gpu"][0] {
		t.Errorf("both pieces of work report Slurm job %s", byProfile["cpu"][0])
	}
	if !strings.Contains(story, "all 2 need(s) served") {
		t.Errorf("the story does not say both needs were served")
	}

	var lastAttach time.Time
	attached := 0
	for _, l := range p.stdout.Lines() {
		if strings.Contains(l.text, " attached from ") {
			attached++
			lastAttach = l.at
		}
	}
	if attached < 2 {
		t.Errorf("%d workers attached, want at least 2", attached)
	} else {
		t.Logf("run -> last worker attached: %.2fs (run exited after %.2fs)",
			lastAttach.Sub(p.started).Seconds(), exitedAt.Sub(p.started).Seconds())
	}

	e.assertCleanedUp(t, exitedAt)
}

var workDoneJobRe = regexp.MustCompile(`work done by \S+: host \S+, job (\S+), `)

// TestE2ECleanStopLetsWorkersGo: a run of three needs ends with a clean
// stop that lets its workers go. Each worker hears "leave" on its poll,
// detaches and exits 0, so Slurm records each job COMPLETED with exit
// code 0:0, and squeue holds none of ours 2 s after the engine exits.
func TestE2ECleanStopLetsWorkersGo(t *testing.T) {
	e := newE2E(t, "e2e-leave")
	cfg := e.config(t, e.host, "worker")
	// Five seconds of work each, so the three tasks run at once, on the
	// machines asked for (two of the demo's two-CPU profile, packed).
	p := e.startEngine(t, "-config", cfg, "-need", "cpus=1,count=3,work=5s", "-timeout", "2m")
	code := p.wait(t, 3*time.Minute)
	exitedAt := time.Now()
	story := p.stdout.String()
	if code != 0 {
		t.Fatalf("exit %d, want 0\nstory:\n%s\nstderr:\n%s", code, story, p.stderr)
	}
	var jobs []string
	for _, m := range workDoneJobRe.FindAllStringSubmatch(story, -1) {
		jobs = append(jobs, m[1])
	}
	if len(jobs) != 3 {
		t.Fatalf("want 3 tasks done in Slurm jobs, got %q\n%s", jobs, story)
	}
	if e.env.AssertCleanStop(t, e.jobName(), exitedAt, "a clean exit") > sandboxtest.CleanStopLimit {
		t.Logf("story:\n%s", story)
	}
	// Every job the run submitted, as Slurm recorded it: scontrol shows
	// a whole array (one line per task) from any of its tasks.
	recs := e.env.JobRecords(t, jobs...)
	records := len(recs)
	for id, rec := range recs {
		t.Logf("job %s: JobState=%s ExitCode=%s", id, rec.State, rec.ExitCode)
		if rec.State != "COMPLETED" || rec.ExitCode != "0:0" {
			t.Errorf("job %s ended JobState=%s ExitCode=%s; want COMPLETED and 0:0", id, rec.State, rec.ExitCode)
		}
	}
	asked := 0
	for _, m := range askedManyRe.FindAllStringSubmatch(story, -1) {
		n, _ := strconv.Atoi(m[1])
		asked += n
	}
	if asked == 0 || records < asked {
		t.Errorf("Slurm recorded %d job(s) of the run; want the %d machine(s) asked for", records, asked)
	}
}

// TestE2ECleanStopLetsABusyWorkerGo: SIGTERM while a worker is in the
// middle of a task of eight minutes. The worker hears it on its watch (GET
// /v1/watch), drops the task and leaves, so its job ends COMPLETED and
// leaves the queue with the engine, rather than run on until its task
// ends and its report fails.
func TestE2ECleanStopLetsABusyWorkerGo(t *testing.T) {
	e := newE2E(t, "e2e-busy-leave")
	// The worker's words are read from its job's log, which a worker
	// that ends well removes (shared.JobLogEnv): this one is not told.
	cfg := e.config(t, "env", "-u", shared.JobLogEnv, e.host, "worker")
	p := e.startEngine(t, "-config", cfg, "-need", "cpus=1,work=8m", "-timeout", "5m")
	poll(t, 90*time.Second, "the worker to start its task", func() bool {
		return strings.Contains(e.jobOutputs(t), "running task-")
	})
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code := p.wait(t, 90*time.Second)
	exitedAt := time.Now()
	story := p.stdout.String()
	if code != 1 {
		t.Errorf("exit %d after SIGTERM with the need under way, want 1\nstory:\n%s\nstderr:\n%s", code, story, p.stderr)
	}
	e.waitQueueEmpty(t, exitedAt, 3*time.Second, "the engine exited with a worker busy", story)
	job := workerAttachedJobRe.FindStringSubmatch(story)
	if job == nil {
		t.Fatalf("no worker attached in the story:\n%s", story)
	}
	if rec := e.env.JobRecords(t, job[1])[job[1]]; rec.State != "COMPLETED" || rec.ExitCode != "0:0" {
		t.Errorf("job %s ended JobState=%s ExitCode=%s; want COMPLETED and 0:0", job[1], rec.State, rec.ExitCode)
	}
	if out := e.jobOutputs(t); !strings.Contains(out, "dropping task-") {
		t.Errorf("the worker's output does not say it dropped its task:\n%s", out)
	}
}

// waitQueueEmpty fails the test unless none of the test's jobs is left
// in squeue limit after since (after what).
func (e *e2e) waitQueueEmpty(t *testing.T, since time.Time, limit time.Duration, after, story string) {
	t.Helper()
	took, left := e.env.QueueDrain(t, e.jobName(), since, limit)
	if left != "" {
		t.Fatalf("%s after %s squeue still holds:\n%s\nstory:\n%s", limit, after, left, story)
	}
	t.Logf("queue empty %.2fs after %s", took.Seconds(), after)
}

// workerAttachedJobRe finds the Slurm job of an attached worker in the
// story.
var workerAttachedJobRe = regexp.MustCompile(`worker \S+ attached from \S+ \(job (\S+),`)

// assertQuietLog checks the engine's log of a run that went well, at
// -log-level debug: the plugin logged at the engine's level (go-plugin's
// "plugin address" is a debug line of the plugin's), every line has one
// timestamp (the engine's), nothing was a warning or an error (a clean
// shutdown included), and a need waiting for its machine was logged when
// its state changed, not on every pass of the placer.
func assertQuietLog(t *testing.T, log, provisioner string) {
	t.Helper()
	pluginDebug := false
	asked := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(log), "\n") {
		if strings.Contains(line, "[WARN]") || strings.Contains(line, "[ERROR]") {
			t.Errorf("a run that went well logged a warning or an error: %s", line)
		}
		if strings.Contains(line, "timestamp=") {
			t.Errorf("a plugin line carries a second timestamp: %s", line)
		}
		if strings.Contains(line, "[DEBUG]") && strings.Contains(line, "plugin."+provisioner+".provisioner-slurm: plugin address") {
			pluginDebug = true
		}
		if _, rest, ok := strings.Cut(line, "asked for a machine: need="); ok {
			need, _, _ := strings.Cut(rest, " ")
			asked[need]++
		}
	}
	if !pluginDebug {
		t.Errorf("no debug line of the plugin's in the log of an engine run with -log-level debug: the level did not reach the plugin\n%s", log)
	}
	for need, n := range asked {
		// requested, then submitting, then queued, then perhaps running:
		// a handful of changes, where a line a pass would be dozens.
		if n > 5 {
			t.Errorf("need %s: %d \"asked for a machine\" lines; want one per change of state", need, n)
		}
	}
}

// TestE2EForgedTokenRefused attaches with credentials the engine never
// issued while it serves with no needs, and checks that they are refused
// and that the log does not repeat them.
func TestE2EForgedTokenRefused(t *testing.T) {
	e := newE2E(t, "e2e-forged")
	cfg := e.config(t, e.host, "worker")
	p := e.startEngine(t, "-config", cfg)

	base := fmt.Sprintf("http://127.0.0.1:%d", e.port)
	client := &http.Client{Timeout: 5 * time.Second}
	poll(t, 60*time.Second, "the engine to be ready and answer GET /status", func() bool {
		if p.exited() {
			t.Fatalf("the engine exited before it was ready\nstdout:\n%s\nstderr:\n%s", p.stdout, p.stderr)
		}
		if !strings.Contains(p.stdout.String(), "provisioner ready") {
			return false
		}
		resp, err := client.Get(base + "/status")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	// One that is not a credential at all, and one that is well formed
	// and names a plausible worker but is signed with another secret.
	other, _, err := host.NewSigner(testSecret).Sign(claims(e.name+"-cpu-0badc0de"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, token := range []string{"forged.token", other} {
		body := `{"hostname":"intruder","job_id":"1","cpus":2,"gpus":0}`
		req, err := http.NewRequest(http.MethodPost, base+"/v1/attach", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("attach with a forged credential: %s, want 401", resp.Status)
		}
		if resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("a 401 without WWW-Authenticate")
		}
	}

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 90*time.Second); code != 0 {
		t.Errorf("exit %d after SIGTERM with no needs, want 0\nstderr:\n%s", code, p.stderr)
	}
	exitedAt := time.Now()

	log := p.stderr.String()
	if n := strings.Count(log, "refused a worker"); n != 2 {
		t.Errorf("the log tells of %d refusals, want 2:\n%s", n, log)
	}
	for _, token := range []string{"forged.token", other} {
		if strings.Contains(log, token) {
			t.Errorf("the log repeats the forged credential %q:\n%s", token, log)
		}
		// The signature alone would be as bad as the whole token.
		if _, sig, ok := strings.Cut(token, "."); ok && len(sig) > 8 && strings.Contains(log, sig) {
			t.Errorf("the log repeats the forged credential's signature:\n%s", log)
		}
	}
	if strings.Contains(p.stdout.String(), " attached from ") {
		t.Errorf("a forged worker attached:\n%s", p.stdout)
	}
	e.assertCleanedUp(t, exitedAt)
}

// TestE2ESigtermCancelsJobs stops the engine while a job it asked for is
// in the queue and its worker will never attach: the engine must cancel
// the job on its way out and leave no plugin behind.
func TestE2ESigtermCancelsJobs(t *testing.T) {
	e := newE2E(t, "e2e-sigterm")

	// A worker that never attaches: its job stays in the queue until
	// cancelled.
	cfg := e.config(t, sleeperWorker(t))

	p := e.startEngine(t, "-config", cfg, "-need", "cpus=2", "-timeout", "5m")
	var queued string
	poll(t, 60*time.Second, "a job named "+e.jobName()+" in squeue", func() bool {
		if p.exited() {
			t.Fatalf("the engine exited early\nstdout:\n%s\nstderr:\n%s", p.stdout, p.stderr)
		}
		queued = e.queue(t)
		return queued != ""
	})
	// Better still if it runs, so that cancelling it has processes to
	// end; but a busy sandbox may keep it pending, which is a fine case
	// too.
	running := false
	start := time.Now()
	for time.Since(start) < 30*time.Second && !p.exited() {
		if queued = e.queue(t); strings.Contains(queued, "RUNNING") || queued == "" {
			running = queued != ""
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("in the queue when the engine is signalled: %q (running: %v)", queued, running)
	if queued == "" || p.exited() {
		t.Fatalf("the job left the queue, or the engine exited, before the signal\nstdout:\n%s\nstderr:\n%s", p.stdout, p.stderr)
	}
	if len(e.pluginPIDs(t)) == 0 {
		t.Errorf("no plugin process found for the running engine; the leftover check below would prove nothing")
	}

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code := p.wait(t, 90*time.Second)
	exitedAt := time.Now()
	story := p.stdout.String()
	t.Logf("story:\n%s", story)
	if code != 1 {
		t.Errorf("exit %d after SIGTERM with a need unserved, want 1\nstderr:\n%s", code, p.stderr)
	}
	if !strings.Contains(story, "signal received") {
		t.Errorf("the story does not tell of the signal")
	}
	job, _, _ := strings.Cut(queued, " ")
	if !regexp.MustCompile(`shut down, cancelled job\(s\) .*\b` + regexp.QuoteMeta(job) + `\b`).MatchString(story) {
		t.Errorf("the story does not say Slurm job %s was cancelled", job)
	}
	e.assertCleanedUp(t, exitedAt)
}

// TestE2ESigtermDuringStartup signals the engine while it is still
// starting its plugins. It must stop them and exit as it does for a
// signal later on (0: there were no needs), telling the story, rather than
// die of the signal.
func TestE2ESigtermDuringStartup(t *testing.T) {
	e := newE2E(t, "e2e-early")

	// A plugin that takes its time to start: a wrapper that waits, then
	// becomes the real plugin. The engine listens before it starts its
	// plugins, so once GET /status answers, the plugin is still on its
	// way for a while.
	dir := t.TempDir()
	wrapper := filepath.Join(dir, "slow-plugin")
	if err := os.WriteFile(wrapper, []byte("#!/bin/sh\nsleep 3\nexec "+e.plugin+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := e.config(t, e.host, "worker")
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b = bytes.Replace(b, []byte("  login "), []byte(fmt.Sprintf("  plugin         = %q\n  login ", wrapper)), 1)
	if err := os.WriteFile(cfg, b, 0o644); err != nil {
		t.Fatal(err)
	}

	p := e.startEngine(t, "-config", cfg)
	client := &http.Client{Timeout: 5 * time.Second}
	poll(t, 30*time.Second, "the engine to answer GET /status", func() bool {
		if p.exited() {
			t.Fatalf("the engine exited before it listened\nstdout:\n%s\nstderr:\n%s", p.stdout, p.stderr)
		}
		resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/status", e.port))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if strings.Contains(p.stdout.String(), "provisioner ready") {
		t.Fatalf("the plugin was ready before the signal; the test proves nothing:\n%s", p.stdout)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.waitDone(t, 90*time.Second)
	exitedAt := time.Now()
	if ee := (*exec.ExitError)(nil); errors.As(p.err, &ee) && !ee.Exited() {
		t.Fatalf("the engine died of the signal (%v) instead of shutting down\nstdout:\n%s\nstderr:\n%s", p.err, p.stdout, p.stderr)
	}
	if code := p.code(t); code != 0 {
		t.Errorf("exit %d after SIGTERM during startup with no needs, want 0\nstdout:\n%s\nstderr:\n%s", code, p.stdout, p.stderr)
	}
	if !strings.Contains(p.stdout.String(), "signal received") {
		t.Errorf("the story does not tell of the signal:\n%s", p.stdout)
	}
	e.assertCleanedUp(t, exitedAt)
}

// TestE2EBurstOneSubmission runs the engine with eight needs of one shape,
// each a task that takes a second: the provisioner asks for the eight
// machines in one sbatch (a job array), eight workers attach, each with
// its own name and the array task it runs as, and each need is served.
// The story says how many machines were asked for in how many
// submissions.
func TestE2EBurstOneSubmission(t *testing.T) {
	e := newE2E(t, "e2e-burst")
	e.killPluginsAtEnd(t)
	cfg := e.relConfig(t, "", `  profile "small" {
    cpus   = 1
    ram_mb = 200
    sbatch = ["--partition=`+e.env.Partition+`", "--time=00:10:00"]
  }
`, e.host, "worker")
	p := e.startEngine(t, "-config", cfg, "-need", "cpus=1,count=8,work=1s", "-timeout", "3m")
	code := p.wait(t, 4*time.Minute)
	exitedAt := time.Now()
	story := p.stdout.String()
	t.Logf("story:\n%s", story)
	if code != 0 {
		t.Fatalf("exit %d, want 0\nstderr:\n%s", code, p.stderr)
	}
	if !strings.Contains(story, `asked for 8 "small" machine(s) in 1 submission(s)`) {
		t.Errorf("the story does not say 8 machines were asked for in one submission")
	}
	if n := strings.Count(story, "(simulated work)"); n != 8 {
		t.Errorf("%d tasks report their simulated work, want 8", n)
	}
	attached := map[string]string{} // worker -> the job it says it runs as
	for _, m := range regexp.MustCompile(`worker (\S+) attached from \S+ \(job (\S+),`).FindAllStringSubmatch(story, -1) {
		attached[m[1]] = m[2]
	}
	arrays := map[string]bool{}
	for w, job := range attached {
		array, task, ok := strings.Cut(job, "_")
		if !ok || !strings.HasSuffix(w, "-"+task) {
			t.Errorf("worker %s attached as job %s; want an array task matching its name", w, job)
		}
		arrays[array] = true
	}
	if len(attached) != 8 || len(arrays) != 1 {
		t.Errorf("%d workers attached from %d arrays, want 8 from 1: %v", len(attached), len(arrays), attached)
	}
	if !strings.Contains(story, "all 8 need(s) served") {
		t.Errorf("the story does not say all 8 needs were served")
	}
	e.assertCleanedUp(t, exitedAt)
}

// TestE2EMultiNode: a profile of nodes = 2 is one job of two nodes, and a
// worker attaches from each node, each under its own name.
func TestE2EMultiNode(t *testing.T) {
	e := newE2E(t, "e2e-nodes")
	if e.env.Nodes < 2 {
		t.Fatalf("the sandbox has %d node(s); this test needs 2 (SANDBOX_NODES=2, the default)", e.env.Nodes)
	}
	e.killPluginsAtEnd(t)
	cfg := e.relConfig(t, "", `  profile "pair" {
    cpus   = 1
    ram_mb = 200
    nodes  = 2
    sbatch = ["--partition=`+e.env.Partition+`", "--time=00:10:00"]
  }
`, e.host, "worker")
	p := e.startEngine(t, "-config", cfg, "-need", "cpus=1,count=2,work=1s", "-timeout", "3m")
	code := p.wait(t, 4*time.Minute)
	exitedAt := time.Now()
	story := p.stdout.String()
	t.Logf("story:\n%s", story)
	if code != 0 {
		t.Fatalf("exit %d, want 0\nstderr:\n%s", code, p.stderr)
	}
	if !strings.Contains(story, `asked for 2 "pair" machine(s) in 1 submission(s)`) {
		t.Errorf("the story does not say 2 machines were asked for in one submission")
	}
	attached := map[string]string{} // worker -> the job it says it runs as
	for _, m := range regexp.MustCompile(`worker (\S+) attached from \S+ \(job (\S+),`).FindAllStringSubmatch(story, -1) {
		attached[m[1]] = m[2]
	}
	jobs := map[string]bool{}
	var nodes []string
	for w, job := range attached {
		jobs[job] = true
		nodes = append(nodes, w[strings.LastIndex(w, "-"):])
	}
	slices.Sort(nodes)
	if len(attached) != 2 || len(jobs) != 1 || !slices.Equal(nodes, []string{"-n0", "-n1"}) {
		t.Fatalf("workers %v: want two, -n0 and -n1, from one job", attached)
	}
	// What Slurm recorded: one job on two nodes.
	for job := range jobs {
		out := e.env.Slurm(t, "scontrol", "show", "job", job)
		if !strings.Contains(out, "NumNodes=2") {
			t.Errorf("scontrol show job %s: want NumNodes=2:\n%s", job, out)
		}
	}
	if !strings.Contains(story, "all 2 need(s) served") {
		t.Errorf("the story does not say both needs were served")
	}
	e.assertCleanedUp(t, exitedAt)
}

// TestE2ENeedNamesProfile: a need whose label is a profile's name (which
// the profile's shape carries, as docs/operators.md says) is served by the
// worker started from that profile, though the worker advertises no such
// label itself: the engine knows its profile from the provisioner.
func TestE2ENeedNamesProfile(t *testing.T) {
	e := newE2E(t, "e2e-byname")
	e.killPluginsAtEnd(t)
	p := e.startEngine(t, "-config", e.config(t, e.host, "worker"), "-need", "cpus=1,label=cpu", "-timeout", "90s")
	code := p.wait(t, 2*time.Minute)
	exitedAt := time.Now()
	if code != 0 || !strings.Contains(p.stdout.String(), "all 1 need(s) served") {
		t.Fatalf("exit %d, want 0 with the need served\nstory:\n%s\nstderr:\n%s", code, p.stdout, p.stderr)
	}
	e.assertCleanedUp(t, exitedAt)
}
