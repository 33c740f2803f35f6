package bench

// Measurements 7 (the host's resident set) and 8 (submit → worker
// attached) run the real engine, bin/host-example, against the sandbox.
// Its stdout is a story, one line per thing that happened; each line is
// stamped here as it arrives.

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/provision/internal/sandboxtest"
)

// storyLine is one line of host-example's stdout and when it arrived.
type storyLine struct {
	text string
	at   time.Time
}

type hostProc struct {
	name    string
	port    int
	cmd     *exec.Cmd
	started time.Time
	stderr  *syncBuffer
	done    chan struct{}
	// onLine, when set before run, is handed each story line as it
	// arrives, on the reader's goroutine: a harness that waits on
	// thousands of lines counts them there rather than rescanning the
	// story for each.
	onLine func(storyLine)

	mu      sync.Mutex
	lines   []storyLine
	changed chan struct{}
}

// hostConfig is a config.hcl for one Slurm provisioner against the
// sandbox whose worker is host-example itself.
func (e benchEnv) hostConfig(name string, port int) string {
	return e.EngineConfig(port, filepath.Dir(e.SlurmBin), name, []string{e.HostBin, "worker"}, fmt.Sprintf(`  profile "cpu" {
    cpus   = 1
    ram_mb = 100
    sbatch = ["--partition=%s", "--time=00:05:00", "--output=/dev/null"]
  }
`, e.Partition))
}

// startHost runs host-example run with the given extra arguments, and
// stops it (SIGTERM, then a kill) when the test ends.
func startHost(tb testing.TB, e benchEnv, what string, args ...string) *hostProc {
	tb.Helper()
	return startHostWith(tb, e, what, e.hostConfig, args...)
}

// startHostWith is startHost with the configuration config writes.
func startHostWith(tb testing.TB, e benchEnv, what string, config func(name string, port int) string, args ...string) *hostProc {
	tb.Helper()
	h := newHostProc(tb, what)
	tb.Cleanup(func() { e.cancelJobs(tb, h.name) })
	h.run(tb, e.HostBin, config(h.name, h.port), nil, args...)
	return h
}

// newHostProc is an engine not yet started, with a name of this run
// and a free loopback port.
func newHostProc(tb testing.TB, what string) *hostProc {
	tb.Helper()
	return &hostProc{name: uniqueName(what), port: sandboxtest.FreePort(tb), stderr: &syncBuffer{}, done: make(chan struct{}), changed: make(chan struct{})}
}

// run starts bin (host-example) as run -config with config and the given
// extra arguments, env added to the harness's environment, and stops it
// (SIGTERM, then a kill) when the test ends.
func (h *hostProc) run(tb testing.TB, bin, config string, env []string, args ...string) {
	tb.Helper()
	dir, err := os.MkdirTemp("", "fxb-host-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	cfg := filepath.Join(dir, "config.hcl")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		tb.Fatal(err)
	}
	h.cmd = exec.Command(bin, append([]string{"run", "-config", cfg}, args...)...)
	if env != nil {
		h.cmd.Env = append(os.Environ(), env...)
	}
	h.cmd.Stderr = h.stderr
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	stdout, err := h.cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	h.started = time.Now()
	if err := h.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			h.add(sc.Text())
		}
		h.cmd.Wait()
		close(h.done)
	}()
	tb.Cleanup(func() { h.stop(tb) })
}

func (h *hostProc) add(text string) {
	l := storyLine{text, time.Now()}
	if h.onLine != nil {
		h.onLine(l)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lines = append(h.lines, l)
	close(h.changed)
	h.changed = make(chan struct{})
}

// wait returns the first story line containing substr.
func (h *hostProc) wait(tb testing.TB, substr string, timeout time.Duration) storyLine {
	tb.Helper()
	return h.waitNth(tb, substr, 1, timeout)
}

func (h *hostProc) story() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var b strings.Builder
	for _, l := range h.lines {
		b.WriteString(l.text + "\n")
	}
	return b.String()
}

// stop sends SIGTERM (the engine then shuts its provisioners down) and
// waits, killing it if it does not exit in time.
func (h *hostProc) stop(tb testing.TB) {
	select {
	case <-h.done:
		return
	default:
	}
	h.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-h.done:
	case <-time.After(stopTimeout):
		tb.Logf("host-example did not exit after SIGTERM; killing it")
		h.cmd.Process.Kill()
		<-h.done
	}
}

// exited waits for the engine to exit on its own.
func (h *hostProc) exited(tb testing.TB, timeout time.Duration) {
	tb.Helper()
	select {
	case <-h.done:
	case <-time.After(timeout):
		tb.Fatalf("host-example still running after %s", timeout)
	}
}

// measureHostRSS runs the engine with the Slurm provisioner and no needs,
// and reads its VmRSS (kB) once it is ready and serving /status.
func measureHostRSS(tb testing.TB, e benchEnv) int64 {
	tb.Helper()
	h := startHost(tb, e, "host")
	h.wait(tb, "provisioner ready", time.Minute)
	url := "http://127.0.0.1:" + strconv.Itoa(h.port) + "/status"
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		cancel()
		if err == nil && resp.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			tb.Fatalf("GET /status never answered 200: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second)
	rss, err := rssKB(h.cmd.Process.Pid)
	if err != nil {
		tb.Fatal(err)
	}
	return rss
}

// attachOnce runs the engine with one need of one CPU and returns the time
// from the job's submission (the "asked for a machine" line, printed when
// the job id arrives) to its worker attaching, and from the engine's start
// to the worker attaching.
func attachOnce(tb testing.TB, e benchEnv) (submitToAttach, startToAttach time.Duration) {
	tb.Helper()
	h := startHost(tb, e, "attach", "-need", "cpus=1", "-timeout", "2m")
	asked := h.wait(tb, "asked for a", 2*time.Minute)
	attached := h.wait(tb, " attached from ", 2*time.Minute)
	h.exited(tb, 2*time.Minute)
	if h.cmd.ProcessState.ExitCode() != 0 {
		tb.Fatalf("host-example exited %v; its stdout:\n%s", h.cmd.ProcessState, h.story())
	}
	return attached.at.Sub(asked.at), attached.at.Sub(h.started)
}

// schedulerRig submits a tiny job through its own ControlMaster that
// writes its start time, to time the scheduler alone: sbatch returned →
// job script running.
type schedulerRig struct {
	e    benchEnv
	m    *master
	dir  string
	name string
}

func newSchedulerRig(tb testing.TB, e benchEnv) *schedulerRig {
	tb.Helper()
	r := &schedulerRig{e: e, m: startMaster(tb, e), name: uniqueName("sched")}
	tb.Cleanup(func() { e.cancelJobs(tb, r.name) })
	dir, err := os.MkdirTemp("", "fxb-sched-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	// The job runs as the sandbox's job user.
	if err := os.Chmod(dir, 0o777); err != nil {
		tb.Fatal(err)
	}
	r.dir = dir
	return r
}

func (r *schedulerRig) once(tb testing.TB) time.Duration {
	tb.Helper()
	script := fmt.Sprintf(`#!/bin/bash
#SBATCH --job-name=fluksio-%s
#SBATCH --partition=%s
#SBATCH --time=00:01:00
#SBATCH --cpus-per-task=1
#SBATCH --mem=100M
#SBATCH --output=/dev/null
date +%%s.%%N > %s/$SLURM_JOB_ID.part && mv %s/$SLURM_JOB_ID.part %s/$SLURM_JOB_ID.start
`, r.name, r.e.Partition, r.dir, r.dir, r.dir)
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	id, err := r.e.sbatch(ctx, r.m.args(), []byte(script))
	if err != nil {
		tb.Fatal(err)
	}
	submitted := time.Now()
	file := filepath.Join(r.dir, id+".start")
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if b, err := os.ReadFile(file); err == nil {
			secs, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
			if err != nil {
				tb.Fatalf("job %s wrote %q", id, b)
			}
			started := time.Unix(0, int64(secs*1e9))
			return started.Sub(submitted)
		}
		if time.Now().After(deadline) {
			tb.Fatalf("job %s did not start within 2m", id)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// BenchmarkAttach is one submit → attach per op, through the engine, and
// the scheduler's own submit → start.
func BenchmarkAttach(b *testing.B) {
	e := setup(b)
	b.Run("host-example", func(b *testing.B) {
		benchOnce(b, func(tb testing.TB) time.Duration { d, _ := attachOnce(tb, e); return d })
	})
	sched := newSchedulerRig(b, e)
	b.Run("scheduler", func(b *testing.B) { benchOnce(b, sched.once) })
}

// BenchmarkRSS reports resident sets: the Slurm plugin idle and the
// trivial plugin idle (right after Configure), and host-example serving.
func BenchmarkRSS(b *testing.B) {
	e := setup(b)
	r := newStartRig(b, e)
	_, slurmRSS := r.slurm(b, time.Second)
	_, testRSS := r.test(b, time.Second)
	host := measureHostRSS(b, e)
	b.ReportMetric(float64(slurmRSS)/1024, "MB-plugin-idle")
	b.ReportMetric(float64(testRSS)/1024, "MB-testplugin-idle")
	b.ReportMetric(float64(host)/1024, "MB-host")
}

// waitNth returns the nth story line containing substr.
func (h *hostProc) waitNth(tb testing.TB, substr string, n int, timeout time.Duration) storyLine {
	tb.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	// find looks, and returns what will be closed when the next line
	// comes, read under the same lock so that no line is missed.
	find := func() (storyLine, bool, chan struct{}) {
		h.mu.Lock()
		defer h.mu.Unlock()
		seen := 0
		for _, l := range h.lines {
			if strings.Contains(l.text, substr) {
				if seen++; seen == n {
					return l, true, nil
				}
			}
		}
		return storyLine{}, false, h.changed
	}
	for {
		l, ok, changed := find()
		if ok {
			return l
		}
		select {
		case <-changed:
		case <-h.done:
			// The reader has finished; look once more, then give up.
			if l, ok, _ := find(); ok {
				return l
			}
			tb.Fatalf("host-example exited (%v) before %q (the %dth); its stdout:\n%s\nits stderr (tail):\n%s", h.cmd.ProcessState, substr, n, h.story(), tail(h.stderr.String(), 20))
		case <-deadline.C:
			tb.Fatalf("no %q (the %dth) from host-example within %s; its stdout:\n%s\nits stderr (tail):\n%s", substr, n, timeout, h.story(), tail(h.stderr.String(), 20))
		}
	}
}
