package bench

// Measurements 15 (dispatch), 16 (transfer), 17 (queued) and 18
// (dispatch16): the engine running real tasks (issue 40, item 7; issue
// 50). They ask nothing of Slurm. The engine is the real product,
// bin/host-example run -tasks FILE -results DIR, a process of its own,
// with the reference plugin (examples/testplugin, kind memory), which
// "starts" a machine by recording it and is capped by its max_workers at
// the pool's size; for each machine it recorded (host-example's story
// names each: job and worker) the harness starts a real worker process,
// bin/fluksio-worker, with a credential it signs under the engine's
// secret (secret_env), as measurement 10 does for its HTTP workers, and
// the job in SLURM_JOB_ID as a batch script gives it. The workers fetch
// the inputs, run the commands (real ones: true, sha256sum), report, and
// leave when the engine stops.
//
// 15, dispatch: 10,000 tasks of `true` over 50 workers, beside xargs -P
// 50 running the same 10,000 `true` on this machine. Ours is timed from
// the first worker's attach (the story's line) to the engine's summary
// line, which it prints once the last task has ended; xargs from its
// start to its exit. The engine's CPU is its utime+stime from
// /proc/PID/stat from just before the workers start to the summary,
// divided by the tasks, beside what a plain Go net/http server spends
// on one keep-alive request on this machine (httpFloor): a task costs
// the engine two requests at the least. The notes say where a task's
// CPU goes, from figures of the same run: those two requests,
// host-example's result.json (resultFloor: a directory and a file made
// on the same disk), the story and log lines the engine wrote; and the
// CPU a task on both sides, the workers' and their commands' (wait4's
// as each exits) beside xargs's and its trues', which with the
// machine's cores bounds either rate.
//
// 18, dispatch16: 15's setup at a fleet's size, 1,000 tasks of `true`
// over 16 one-CPU workers, from the first attach to the summary (the
// last result), beside xargs -P 16 running the same 1,000 `true`. Both
// rows give the machine's load average as they began beside the ratio.
//
// 16, transfer: 1 GB of inputs, 100 MB to each of 10 tasks of
// `sha256sum in.bin` on 10 workers, beside the same 10 files fetched
// from a plain Go http.FileServer by 10 concurrent Go clients. What is
// compared is the fetch alone, as the receiving end sees it, since the
// rest of a task's life has no counterpart in a file server: the
// engine's digest of each input at Submit, the command's run, the
// result. Ours is from the first worker's "running" line for its
// input's task (the fetch is next) to the last worker's "started" line
// (its input on disk, size and sha256 checked, its command starting);
// the baseline from its clients' start to the last one's end. Each
// baseline client does with the bytes what the worker does: writes them
// to a file on the same disk and checks their sha256, so that the ratio
// is the engine's serving and the worker's fetching against a plain
// file server and client, not sha256 against nothing. Two barriers keep
// the ten fetches together, as the baseline's are: each worker first
// runs a warm-up task that ends once all ten run one (the workers start
// and attach one after another, and the first would otherwise fetch
// alone), and each input's command waits until every input is fetched
// (so that no sha256sum takes the CPU from a fetch still under way).
// The test binary, started again, is both (barrierEnv). The notes give
// the whole, from the first input's task to the tenth result, and the
// CPU each side used.
//
// 17, queued: 100,000 tasks of `true` submitted, with no worker attached
// (the plugin records its 50 machines; nobody starts them): the engine's
// RSS, beside the same engine idle with no task. The RSS is the largest
// VmRSS of samples every 100 ms over 5 s once the story says the tasks
// are submitted (the run loop passes over them meanwhile, and its
// garbage is resident until collected), and likewise for the idle one
// once its status page is up.

import (
	"bufio"
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/sandboxtest"
)

const (
	dispatchTasks   = 10000
	dispatchWorkers = 50

	transferTasks = 10
	transferSize  = 100_000_000 // bytes an input: 1 GB in all

	queuedTasks = 100000
	// rssWindow and rssEvery are how long and how often an engine's
	// resident set is sampled for measurement 17.
	rssWindow = 5 * time.Second
	rssEvery  = 100 * time.Millisecond
)

// taskSecret signs the workers' credentials; the engine has it from
// secret_env.
var taskSecret = bytes.Repeat([]byte{0x3c}, 32)

// askedRe is host-example's story line for a machine the plugin recorded.
var askedRe = regexp.MustCompile(`: asked for a "[^"]*" machine: job ([^,]+), worker (\S+)$`)

// taskMachine is a machine the plugin recorded: its worker's name and
// its job.
type taskMachine struct{ worker, job string }

// taskEngine is host-example running a tasks file (or none) with the
// reference plugin capped at size machines, and the workers the harness
// started for it. Its fields under mu are what the story has told so
// far.
type taskEngine struct {
	h    *hostProc
	dir  string
	base string
	size int

	mu          sync.Mutex
	machines    []taskMachine
	firstAttach time.Time
	attached    int
	lastAttach  time.Time
	submitted   *storyLine
	ready       *storyLine
	summary     *storyLine
	// workerPIDs are the workers startWorkers started; workerDone
	// closes as each exits, and exitedCPU adds up the CPU of those
	// that exited (wait4's, their commands' included).
	workerPIDs []int
	workerDone []chan struct{}
	exitedCPU  time.Duration
	// poke is signalled on every line that changes the above.
	poke chan struct{}
}

// taskEngineConfig is the engine's configuration: loopback, the secret
// from the environment, one reference-plugin provisioner of at most
// maxWorkers machines.
func taskEngineConfig(port int, plugin string, maxWorkers int) string {
	return fmt.Sprintf(`engine {
  listen     = "127.0.0.1:%d"
  secret_env = "FLUKSIO_BENCH_SECRET"
}
provisioner "memory" "mem" {
  plugin      = %q
  greeting    = "hi"
  max_workers = %d
}
`, port, plugin, maxWorkers)
}

// startTaskEngine runs host-example with tasksFile (none when empty) and
// a pool of size machines; its results go under a directory removed
// when the test ends.
func startTaskEngine(tb testing.TB, e benchEnv, what string, size int, tasksFile string) *taskEngine {
	tb.Helper()
	dir, err := os.MkdirTemp("", "fxb-"+what+"-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	te := &taskEngine{h: newHostProc(tb, what), dir: dir, size: size, poke: make(chan struct{}, 1)}
	te.base = "http://127.0.0.1:" + strconv.Itoa(te.h.port)
	te.h.onLine = te.line
	var args []string
	if tasksFile != "" {
		// -v: the harness reads the machines off the story's lines.
		args = []string{"-v", "-tasks", tasksFile, "-results", filepath.Join(dir, "results")}
	}
	te.h.run(tb, e.HostBin, taskEngineConfig(te.h.port, e.TestBin, size),
		[]string{"FLUKSIO_BENCH_SECRET=" + hex.EncodeToString(taskSecret)}, args...)
	return te
}

// line reads one story line for what the harness waits on.
func (te *taskEngine) line(l storyLine) {
	// "[  12.3s] " comes first.
	text := l.text
	if i := strings.Index(text, "] "); i >= 0 {
		text = text[i+2:]
	}
	te.mu.Lock()
	switch {
	case strings.Contains(text, " attached from "):
		if te.attached == 0 {
			te.firstAttach = l.at
		}
		te.attached++
		te.lastAttach = l.at
	case strings.HasPrefix(text, "summary: "):
		te.summary = &l
	case strings.Contains(text, " task(s) submitted"):
		te.submitted = &l
	case strings.HasPrefix(text, "status page: "):
		te.ready = &l
	default:
		if m := askedRe.FindStringSubmatch(text); m != nil {
			te.machines = append(te.machines, taskMachine{worker: m[2], job: m[1]})
		} else {
			te.mu.Unlock()
			return
		}
	}
	te.mu.Unlock()
	select {
	case te.poke <- struct{}{}:
	default:
	}
}

// waitFor waits until cond, read under te.mu, holds; it fails the test
// when the engine exits first or timeout passes.
func (te *taskEngine) waitFor(tb testing.TB, what string, timeout time.Duration, cond func() bool) {
	tb.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		te.mu.Lock()
		ok := cond()
		te.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-te.poke:
		case <-te.h.done:
			te.mu.Lock()
			ok := cond()
			te.mu.Unlock()
			if ok {
				return
			}
			tb.Fatalf("host-example exited (%v) before %s; its stdout (tail):\n%s\nits stderr (tail):\n%s", te.h.cmd.ProcessState, what, tail(te.h.story(), 20), tail(te.h.stderr.String(), 20))
		case <-deadline.C:
			tb.Fatalf("no %s from host-example within %s; its stdout (tail):\n%s\nits stderr (tail):\n%s", what, timeout, tail(te.h.story(), 20), tail(te.h.stderr.String(), 20))
		}
	}
}

// waitSubmitted waits for the tasks to be submitted and the plugin to
// have recorded the pool's machines.
func (te *taskEngine) waitSubmitted(tb testing.TB, timeout time.Duration) {
	tb.Helper()
	te.waitFor(tb, fmt.Sprintf("submission and %d machines", te.size), timeout, func() bool {
		return te.submitted != nil && len(te.machines) >= te.size
	})
}

// waitSummary waits for the run's summary line and returns it.
func (te *taskEngine) waitSummary(tb testing.TB, timeout time.Duration) storyLine {
	tb.Helper()
	te.waitFor(tb, "summary", timeout, func() bool { return te.summary != nil })
	te.mu.Lock()
	defer te.mu.Unlock()
	return *te.summary
}

// startWorkers starts a fluksio-worker for each machine the plugin
// recorded, with its credential in FLUKSIO_WORKER_TOKEN and its job in
// SLURM_JOB_ID, and its task directories under the engine's directory.
// Each worker's stderr goes to lines when it is set (stamped as each
// line arrives), else to a file beside. When the test ends the engine
// is stopped first, which lets the workers go, and each worker is
// waited for (killed if it outstays).
func (te *taskEngine) startWorkers(tb testing.TB, bin string, lines func(i int, l storyLine)) {
	tb.Helper()
	te.mu.Lock()
	machines := append([]taskMachine(nil), te.machines[:te.size]...)
	te.mu.Unlock()
	work := filepath.Join(te.dir, "work")
	if err := os.MkdirAll(work, 0o700); err != nil {
		tb.Fatal(err)
	}
	signer := host.NewSigner(taskSecret)
	var done []chan struct{}
	var cmds []*exec.Cmd
	tb.Cleanup(func() {
		te.h.stop(tb)
		for i, d := range done {
			select {
			case <-d:
			case <-time.After(30 * time.Second):
				tb.Logf("worker %s still running 30 s after the engine stopped; killing it", machines[i].worker)
				cmds[i].Process.Kill()
				<-d
			}
		}
	})
	for i, m := range machines {
		tok, _, err := signer.Sign(host.CredentialClaims{Worker: m.worker, Provisioner: "mem", CPUs: 1, RAMMB: 1000}, time.Hour)
		if err != nil {
			tb.Fatal(err)
		}
		cmd := exec.Command(bin, "--url", te.base, "--cpus", "1", "--gpus", "0", "--max-idle", "600")
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "TMPDIR=" + work, "SLURM_JOB_ID=" + m.job, "FLUKSIO_WORKER_TOKEN=" + tok}
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if lines != nil {
			cmd.Stderr = &lineStamper{f: func(l storyLine) { lines(i, l) }}
		} else {
			f, err := os.Create(filepath.Join(te.dir, fmt.Sprintf("worker-%02d.log", i)))
			if err != nil {
				tb.Fatal(err)
			}
			defer f.Close()
			cmd.Stderr = f
		}
		if err := cmd.Start(); err != nil {
			tb.Fatal(err)
		}
		d := make(chan struct{})
		go func() {
			cmd.Wait()
			te.mu.Lock()
			te.exitedCPU += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
			te.mu.Unlock()
			close(d)
		}()
		done, cmds = append(done, d), append(cmds, cmd)
		te.mu.Lock()
		te.workerPIDs = append(te.workerPIDs, cmd.Process.Pid)
		te.workerDone = append(te.workerDone, d)
		te.mu.Unlock()
	}
}

// lineStamper hands each whole line written to it to f, stamped as it
// arrives. Only exec's copying goroutine writes to it.
type lineStamper struct {
	f    func(storyLine)
	part []byte
}

func (s *lineStamper) Write(p []byte) (int, error) {
	at := time.Now()
	s.part = append(s.part, p...)
	for {
		i := bytes.IndexByte(s.part, '\n')
		if i < 0 {
			break
		}
		s.f(storyLine{text: string(s.part[:i]), at: at})
		s.part = s.part[i+1:]
	}
	return len(p), nil
}

// writeTasks writes a tasks file of n lines, line(i) each.
func writeTasks(tb testing.TB, dir string, n int, line func(i int) string) string {
	tb.Helper()
	p := filepath.Join(dir, "tasks.jsonl")
	f, err := os.Create(p)
	if err != nil {
		tb.Fatal(err)
	}
	w := bufio.NewWriter(f)
	for i := range n {
		w.WriteString(line(i) + "\n")
	}
	if err := w.Flush(); err != nil {
		tb.Fatal(err)
	}
	if err := f.Close(); err != nil {
		tb.Fatal(err)
	}
	return p
}

// workerBin is bin/fluksio-worker, built once per test binary.
func workerBin(tb testing.TB) string {
	tb.Helper()
	return sandboxtest.Binary(tb, "worker/fluksio-worker", "fluksio-worker")
}

// tempDir is a directory removed when the test ends.
func tempDir(tb testing.TB, pattern string) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// --- 15, dispatch ---

type dispatchResult struct {
	// tasks and workers are the run's size; load is the machine's load
	// average as it began.
	tasks, workers int
	load           string
	// ours is the first attach to the summary; xargs its run.
	ours, xargs time.Duration
	// cpu is the engine's utime+stime from the workers' start to the
	// summary; submitCPU from its start until its tasks were submitted
	// (the tasks file read, every Submit, the plugin started).
	cpu, submitCPU time.Duration
	// attaching is the workers' start to the last one's attach.
	attaching time.Duration
	// workersCPU is the workers' utime+stime, their commands'
	// included, as they exited after the summary; xargsCPU xargs's and
	// its trues'.
	workersCPU, xargsCPU time.Duration
	// floor is a plain Go net/http server's CPU a request (httpFloor);
	// resultFloor the CPU of a result.json's directory and file made on
	// the same disk (resultFloor).
	floor, resultFloor time.Duration
	// floor50 is the same with as many clients at once as there are
	// workers.
	floor50 time.Duration
	// storyLines and logLines are what the engine wrote over the run:
	// story lines (stdout) and log lines (stderr).
	storyLines, logLines int
}

func (r dispatchResult) rate() float64  { return float64(r.tasks) / max(r.ours.Seconds(), 1e-9) }
func (r dispatchResult) xrate() float64 { return float64(r.tasks) / max(r.xargs.Seconds(), 1e-9) }

// xargsTrue runs n `true` through xargs -P p and returns how long it
// took, and the CPU it and the `true`s it waited for used.
func xargsTrue(tb testing.TB, n, p int) (time.Duration, time.Duration) {
	tb.Helper()
	cmd := exec.Command("xargs", "-P", strconv.Itoa(p), "-n", "1", "true")
	cmd.Stdin = strings.NewReader(strings.Repeat("x\n", n))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	t0 := time.Now()
	if err := cmd.Run(); err != nil {
		tb.Fatalf("xargs -P %d true: %v\n%s", p, err, out.String())
	}
	took := time.Since(t0)
	// wait4's usage of xargs holds that of the children it waited for.
	return took, cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
}

func measureDispatch(tb testing.TB, e benchEnv) dispatchResult {
	return measureDispatchOf(tb, e, dispatchTasks, dispatchWorkers, true)
}

// measureDispatchOf is measurement 15 (floors: with the CPU's floors)
// for n tasks over workers one-CPU workers; measurement 18 is its
// 1,000 over 16.
func measureDispatchOf(tb testing.TB, e benchEnv, n, workers int, floors bool) dispatchResult {
	tb.Helper()
	bin := workerBin(tb)
	dir := tempDir(tb, "fxb-dispatch-")
	file := writeTasks(tb, dir, n, func(i int) string {
		return fmt.Sprintf(`{"id": "d%05d", "command": ["true"], "attempts": 1}`, i)
	})
	r := dispatchResult{tasks: n, workers: workers, load: loadavg()}
	r.xargs, r.xargsCPU = xargsTrue(tb, n, workers)
	if floors {
		r.floor = httpFloor(tb, 1)
		r.floor50 = httpFloor(tb, workers)
		r.resultFloor = resultFloor(tb, dir)
	}

	te := startTaskEngine(tb, e, "dispatch", workers, file)
	te.waitSubmitted(tb, 2*time.Minute)
	pid := te.h.cmd.Process.Pid
	r.submitCPU = cpuTime(tb, pid)
	cpu0 := r.submitCPU
	story0, log0 := te.h.storyLen(), strings.Count(te.h.stderr.String(), "\n")
	t0 := time.Now()
	te.startWorkers(tb, bin, nil)
	sum := te.waitSummary(tb, 10*time.Minute)
	r.cpu = cpuTime(tb, pid) - cpu0
	r.storyLines = te.h.storyLen() - story0
	r.logLines = strings.Count(te.h.stderr.String(), "\n") - log0
	// The run ends at its summary and lets the workers go: their CPU
	// is wait4's as each exits, a detach later than the summary.
	te.mu.Lock()
	workerDone := slices.Clone(te.workerDone)
	te.mu.Unlock()
	exitBy := time.NewTimer(time.Minute)
	defer exitBy.Stop()
	for _, d := range workerDone {
		select {
		case <-d:
		case <-exitBy.C:
			tb.Fatalf("the workers had not all exited a minute after the summary")
		}
	}
	te.mu.Lock()
	r.workersCPU = te.exitedCPU
	te.mu.Unlock()
	if want := fmt.Sprintf("%d task(s): %d succeeded", n, n); !strings.Contains(sum.text, want) {
		tb.Fatalf("not every task succeeded: %s\nstderr (tail):\n%s", sum.text, tail(te.h.stderr.String(), 20))
	}
	te.mu.Lock()
	r.ours = sum.at.Sub(te.firstAttach)
	r.attaching = te.lastAttach.Sub(t0)
	attached := te.attached
	te.mu.Unlock()
	if attached != workers {
		tb.Fatalf("%d of %d workers attached", attached, workers)
	}
	return r
}

// fleetTasks and fleetWorkers are measurement 18's size: a batch of
// small tasks on a fleet of one-CPU machines.
const (
	fleetTasks   = 1000
	fleetWorkers = 16
)

// fleetRows is measurement 18: 1,000 `true` over 16 one-CPU workers,
// from the first attach to the last result, against xargs -P 16.
func fleetRows(rep *report, r dispatchResult) {
	v, rt := ratio(r.ours.Seconds(), r.xargs.Seconds())
	rep.add(row{fmt.Sprintf("dispatch: %d tasks of `true` over %d one-CPU workers (host-example -tasks, fluksio-worker processes), first attach → last result vs xargs -P %d true (load average at the start: %s)", r.tasks, r.workers, r.workers, r.load),
		fmt.Sprintf("%s (%.0f/s)", dur(r.ours), r.rate()), fmt.Sprintf("%s (%.0f/s)", dur(r.xargs), r.xrate()), rt, "≤ 1.5×", verdict(v, 1.5, true, "×")})
	rep.note("Dispatch over %d workers: the engine used %s of CPU (%s a task) from the workers' start to the summary; all %d attached %s after they were started, the first attach starting the clock.",
		r.workers, dur(r.cpu), dur(r.cpu/time.Duration(r.tasks)), r.workers, dur(r.attaching))
}

func dispatchRows(rep *report, r dispatchResult) {
	v, rt := ratio(r.rate(), r.xrate())
	rep.add(row{fmt.Sprintf("dispatch: %d tasks of `true` over %d attached workers (host-example -tasks, fluksio-worker processes), tasks a second vs xargs -P %d true (load average at the start: %s)", dispatchTasks, dispatchWorkers, dispatchWorkers, r.load),
		fmt.Sprintf("%.0f/s (%s)", r.rate(), dur(r.ours)), fmt.Sprintf("%.0f/s (%s)", r.xrate(), dur(r.xargs)), rt, "≥ 0.8×", verdict(v, 0.8, false, "×")})
	per := r.cpu / dispatchTasks
	cpuVerdict := verdict(float64(per)/1e3, 100, true, "µs")
	rep.add(row{fmt.Sprintf("dispatch: the engine's CPU per task (utime+stime from /proc over the %d tasks) vs a plain Go net/http server's CPU per keep-alive request", dispatchTasks),
		dur(per), dur(r.floor) + " a request", ratioStr(float64(per), float64(r.floor)), "≤ 100 µs", cpuVerdict})
	rep.note("Dispatch: ours is timed from the first worker's attach to the engine's summary line (the last task ended), with the other %d workers attaching meanwhile (all %d attached %s after they were started); xargs from its start to its exit. The engine used %s of CPU over the run (%s a task); before it, reading the tasks file, submitting the %d tasks and starting the plugin took %s. The CPU row's baseline is a plain Go net/http server (the test binary started again) answering %d small JSON POSTs on one keep-alive connection, its utime+stime over them: a task costs the engine two requests at the least (the poll that carries it and its result), so %s a task is the floor of any engine that serves tasks over HTTP on this machine, its requests coming one at a time, before it keeps any books or writes the task's result.json (host-example does, a directory and a file a task).",
		dispatchWorkers-1, dispatchWorkers, dur(r.attaching), dur(r.cpu), dur(per), dispatchTasks, dur(r.submitCPU), floorRequests, dur(2*r.floor))

	// Where the rate goes: the CPU a task on both sides, against the
	// machine's cores.
	workers, xargs := r.workersCPU/dispatchTasks, r.xargsCPU/dispatchTasks
	cores := runtime.NumCPU()
	bound := func(d time.Duration) float64 { return float64(cores) / max(d.Seconds(), 1e-9) }
	rateWhy := fmt.Sprintf("Dispatch rate: a task cost %s of CPU in all, the engine's %s and the workers' %s (their polls, forks and execs of true and reports, their commands included, and their attach and detach), where xargs spent %s (a fork and exec of true; xargs and its children); with %d cores that bounds ours at %.0f tasks a second and xargs at %.0f, a ratio of %.2f×, and both shared the cores with whatever else ran on the machine.",
		dur(per+workers), dur(per), dur(workers), dur(xargs), cores, bound(per+workers), bound(xargs), bound(per+workers)/max(bound(xargs), 1e-9))
	if v < 0.8 {
		rateWhy += " The MISS is that bound: the engine's CPU a task (the next row) and the workers' HTTP beside each `true` come on top of the fork and exec that are all of xargs's work."
	}
	rep.note("%s", rateWhy)

	// Where the engine's CPU a task goes, measured in this run.
	http2, http50, res := 2*r.floor, 2*r.floor50, r.resultFloor
	rest := per - http2 - res
	pct := func(d time.Duration) float64 { return 100 * float64(d) / max(float64(per), 1) }
	lines := float64(r.storyLines+r.logLines) / dispatchTasks
	cpuWhy := fmt.Sprintf("Dispatch CPU: of the engine's %s a task, two requests of the plain server (the poll that carries the task, and its result) one after the other on one connection are %s (%.0f%%): the workers' requests come one at a time between their forks and execs (%.0f a second in all), each waking a server gone idle, as the plain server's one client's do; with %d clients sending back to back the plain server spent %s for two, its wake-ups shared among many requests. host-example's result.json for the task, a directory and a file written and renamed into it on the same disk (the harness made %d of them on one thread, kernel time included), is %s (%.0f%%). The rest, %s (%.0f%%), is the engine's own work around them: placing the task and settling its result on its pass, the task's JSON out and the result's JSON in, the credential checked on every request, a long poll parked until the pass has a task for it, and the story and the log (%d story lines and %d log lines over the run, %.1f a task, each a write to a pipe), with the Go runtime scheduling it all on %d cores shared with the workers and their commands. A CPU profile of one such run (host-example under pprof, taken while these rows were written) put net/http's serving of the requests at about 45%% of the engine's CPU, result.json 18%%, the pass 12%% and the story's and log's lines 4%%.",
		dur(per), dur(http2), pct(http2), 2*r.rate(), dispatchWorkers, dur(http50), resultFiles, dur(res), pct(res), dur(rest), pct(rest), r.storyLines, r.logLines, lines, cores)
	if per > 100*time.Microsecond {
		if http2+res > 100*time.Microsecond {
			cpuWhy += fmt.Sprintf(" The MISS is by construction on this machine: two plain requests arriving alone and the result.json come to %s, %.1f× the 100 µs target, before the engine has kept a book.", dur(http2+res), float64(http2+res)/float64(100*time.Microsecond))
		} else {
			cpuWhy += fmt.Sprintf(" The MISS is the rest above: two plain requests arriving alone and the result.json come to %s, under the 100 µs target.", dur(http2+res))
		}
	}
	rep.note("%s", cpuWhy)
}

// floorServerEnv, set, makes the test binary the plain HTTP server of
// httpFloor (TestMain) rather than run tests.
const floorServerEnv = "FLUKSIO_BENCH_HTTP_FLOOR"

// floorRequests is how many requests httpFloor makes.
const floorRequests = 10000

// serveFloor is a plain Go net/http server on loopback: POST / reads a
// small JSON body and answers 204, as the engine answers a result. It
// prints its address and serves until its stdin closes.
func serveFloor() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(ln.Addr().String())
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})}
	go func() {
		io.Copy(io.Discard, os.Stdin)
		srv.Close()
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// httpFloor is what a plain Go net/http server spends of its CPU on one
// keep-alive request on this machine: the test binary started again as
// serveFloor, floorRequests results' worth of POSTs from clients
// concurrent clients, each on a connection of its own and one request
// after the other, and its utime+stime from /proc over them. A task
// costs the engine two requests at the least (the poll that carries it
// and its result), so twice this is the floor of the engine's CPU a
// task: with one client, a server's least; with as many as the
// dispatch's workers, what the same load costs a plain server.
func httpFloor(tb testing.TB, clients int) time.Duration {
	tb.Helper()
	self, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), floorServerEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	defer func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			tb.Errorf("the plain HTTP server: %v\n%s", err, stderr.String())
		}
	}()
	addr, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		tb.Fatalf("the plain HTTP server said no address: %v\n%s", err, stderr.String())
	}
	url := "http://" + strings.TrimSpace(addr) + "/"
	tr := &http.Transport{MaxIdleConnsPerHost: clients}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	body := []byte(`{"task_id": "task-1", "hostname": "bench", "job_id": "1001", "cpus": 1, "state": "succeeded", "exit_code": 0, "stdout": 0, "stderr": 0}`)
	var (
		errMu sync.Mutex // guards failed
		// failed is the first request that failed.
		failed error
	)
	post := func() {
		resp, err := client.Post(url, "application/json", bytes.NewReader(body))
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusNoContent {
				err = fmt.Errorf("the plain HTTP server answered %s", resp.Status)
			}
		}
		if err != nil {
			errMu.Lock()
			failed = cmp.Or(failed, err)
			errMu.Unlock()
		}
	}
	// Each client's connection is opened before the count begins.
	var wg sync.WaitGroup
	for range clients {
		wg.Go(post)
	}
	wg.Wait()
	cpu0 := cpuTime(tb, cmd.Process.Pid)
	for c := range clients {
		wg.Go(func() {
			for i := c; i < floorRequests; i += clients {
				post()
			}
		})
	}
	wg.Wait()
	cpu := cpuTime(tb, cmd.Process.Pid) - cpu0
	if failed != nil {
		tb.Fatal(failed)
	}
	return cpu / floorRequests
}

// storyLen is how many story lines h has written so far.
func (h *hostProc) storyLen() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.lines)
}

// resultFiles is how many result.json files resultFloor writes.
const resultFiles = 2000

// resultFloor is the CPU that host-example's result.json costs a task,
// as writeResult makes it, on the disk the engine's results go to: a
// directory (mkdir), a temporary file in it (open, write, close) and a
// rename into place, resultFiles times on one locked OS thread, its
// utime+stime (RUSAGE_THREAD), the kernel's work included. The files
// are removed before it returns, outside the measurement.
func resultFloor(tb testing.TB, under string) time.Duration {
	tb.Helper()
	dir, err := os.MkdirTemp(under, "results-")
	if err != nil {
		tb.Fatal(err)
	}
	defer os.RemoveAll(dir)
	body := bytes.Repeat([]byte("x"), 480) // a task's result.json, indented
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	threadCPU := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_THREAD, &ru); err != nil {
			tb.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	cpu0 := threadCPU()
	for i := range resultFiles {
		d := filepath.Join(dir, fmt.Sprintf("d%05d", i))
		if err := os.Mkdir(d, 0o755); err != nil {
			tb.Fatal(err)
		}
		f, err := os.CreateTemp(d, ".result-*.json")
		if err != nil {
			tb.Fatal(err)
		}
		_, werr := f.Write(body)
		if err := errors.Join(werr, f.Close()); err != nil {
			tb.Fatal(err)
		}
		if err := syscall.Rename(f.Name(), filepath.Join(d, "result.json")); err != nil {
			tb.Fatal(err)
		}
	}
	return (threadCPU() - cpu0) / resultFiles
}

// --- 16, transfer ---

type transferResult struct {
	// ours is the first worker's "running" to the last one's "started";
	// whole to the summary. base is the plain server's clients, plain
	// the same without the digest.
	ours, whole, base, plain time.Duration
	// workers is how many workers fetched an input; spread is from
	// the first having its input's task to the last.
	workers int
	spread  time.Duration
	// doneSpread is from the first input written and checked to the
	// last; longest is the longest one worker took, from its input's
	// task to its input written and checked.
	doneSpread, longest time.Duration
	// engineCPU and workersCPU are the engine's and the workers'
	// utime+stime from the warm-ups' end to the last input fetched;
	// baseCPU the harness process's over the baseline (its server and
	// its clients).
	engineCPU, workersCPU, baseCPU time.Duration
}

// selfCPU is this process's own user and system time.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func mbps(d time.Duration) float64 {
	return float64(transferTasks*transferSize) / 1e6 / max(d.Seconds(), 1e-9)
}

// makeInputs writes n files of size random bytes and returns their
// paths and sha256 digests.
func makeInputs(tb testing.TB, dir string, n int, size int64) ([]string, []string) {
	tb.Helper()
	var paths, sums []string
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("in%02d.bin", i))
		f, err := os.Create(p)
		if err != nil {
			tb.Fatal(err)
		}
		h := sha256.New()
		src := rand.NewChaCha8([32]byte{byte(i), 'f', 'x', 'b'})
		if _, err := io.CopyN(io.MultiWriter(f, h), src, size); err != nil {
			tb.Fatal(err)
		}
		if err := f.Close(); err != nil {
			tb.Fatal(err)
		}
		paths, sums = append(paths, p), append(sums, hex.EncodeToString(h.Sum(nil)))
	}
	return paths, sums
}

// fetchPlain fetches every file from a plain Go http.FileServer over
// dir, one concurrent client a file, each written to a file under out
// and, with check, digested with sha256 and compared, and returns how
// long it took from the first request to the last byte.
func fetchPlain(tb testing.TB, dir, out string, paths, sums []string, check bool) time.Duration {
	tb.Helper()
	srv := httptest.NewServer(http.FileServer(http.Dir(dir)))
	defer srv.Close()
	tr := &http.Transport{MaxIdleConnsPerHost: len(paths)}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	if err := os.MkdirAll(out, 0o700); err != nil {
		tb.Fatal(err)
	}
	defer os.RemoveAll(out)
	errs := make([]error, len(paths))
	var wg sync.WaitGroup
	t0 := time.Now()
	for i, p := range paths {
		wg.Go(func() {
			errs[i] = func() error {
				resp, err := client.Get(srv.URL + "/" + filepath.Base(p))
				if err != nil {
					return err
				}
				defer resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					return fmt.Errorf("GET %s: %s", filepath.Base(p), resp.Status)
				}
				f, err := os.Create(filepath.Join(out, filepath.Base(p)))
				if err != nil {
					return err
				}
				h := sha256.New()
				var w io.Writer = f
				if check {
					w = io.MultiWriter(f, h)
				}
				n, err := io.Copy(w, resp.Body)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
				switch {
				case err != nil:
					return err
				case n != transferSize:
					return fmt.Errorf("%s: %d bytes", filepath.Base(p), n)
				case check && hex.EncodeToString(h.Sum(nil)) != sums[i]:
					return fmt.Errorf("%s: the digest differs", filepath.Base(p))
				}
				return nil
			}()
		})
	}
	wg.Wait()
	elapsed := time.Since(t0)
	for _, err := range errs {
		if err != nil {
			tb.Fatal(err)
		}
	}
	return elapsed
}

// barrierEnv, set to a URL, makes the test binary a task's command in
// measurement 16 (TestMain): it GETs the URL, which answers once every
// task of its kind is waiting on it, and then runs the rest of its
// argv, if any, in its place.
const barrierEnv = "FLUKSIO_BENCH_BARRIER"

// awaitBarrier waits at the barrier url and then executes argv; with
// no argv, it exits 0.
func awaitBarrier(url string, argv []string) int {
	resp, err := http.Get(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		fmt.Fprintln(os.Stderr, resp.Status)
		return 1
	}
	if len(argv) == 0 {
		return 0
	}
	path, err := exec.LookPath(argv[0])
	if err == nil {
		err = syscall.Exec(path, argv, os.Environ())
	}
	fmt.Fprintln(os.Stderr, err)
	return 1
}

// barrier is an HTTP endpoint that holds each GET until n have come,
// then calls opened (when set) and answers them all 204.
func barrier(tb testing.TB, n int, opened func()) string {
	tb.Helper()
	var mu sync.Mutex
	came := 0
	release := make(chan struct{})
	done := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		if came++; came == n {
			if opened != nil {
				opened()
			}
			close(release)
		}
		mu.Unlock()
		select {
		case <-release:
			w.WriteHeader(http.StatusNoContent)
		case <-done:
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	tb.Cleanup(func() {
		close(done)
		srv.Close()
	})
	return srv.URL
}

func measureTransfer(tb testing.TB, e benchEnv) transferResult {
	tb.Helper()
	bin := workerBin(tb)
	self, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	dir := tempDir(tb, "fxb-transfer-")
	in := filepath.Join(dir, "in")
	if err := os.Mkdir(in, 0o755); err != nil {
		tb.Fatal(err)
	}
	paths, sums := makeInputs(tb, in, transferTasks, transferSize)
	// A warm-up task for each worker first, which ends only once every
	// worker runs one (a barrier): the workers start one at a time, and
	// without it the first would fetch alone while the others attach.
	// The tasks are handed out in the file's order, one a worker. Each
	// input's command, sha256sum in.bin, waits at a barrier of its own
	// until every input is fetched, so that no command's hashing takes
	// the CPU from a fetch still under way, as nothing takes it from
	// the baseline's clients.
	// The engine's and the workers' CPU is read as each barrier opens:
	// over the fetches, and the warm-up tasks' reports before them.
	var (
		cpuMu sync.Mutex // guards te (for the barriers) and cpu
		te    *taskEngine
		// cpu is the engine's and the workers' CPU as each barrier
		// opened.
		cpu [2][2]time.Duration
	)
	poolCPU := func(at int) {
		cpuMu.Lock()
		defer cpuMu.Unlock()
		te.mu.Lock()
		workers := slices.Clone(te.workerPIDs)
		te.mu.Unlock()
		cpu[at][0] = cpuTime(tb, te.h.cmd.Process.Pid)
		for _, pid := range workers {
			cpu[at][1] += cpuTime(tb, pid)
		}
	}
	warm := barrier(tb, transferTasks, func() { poolCPU(0) })
	fetched := barrier(tb, transferTasks, func() { poolCPU(1) })
	file := writeTasks(tb, dir, 2*transferTasks, func(i int) string {
		if i < transferTasks {
			return fmt.Sprintf(`{"id": "w%02d", "command": [%q], "env": {%q: %q}, "attempts": 1}`, i, self, barrierEnv, warm)
		}
		i -= transferTasks
		return fmt.Sprintf(`{"id": "x%02d", "command": [%q, "sha256sum", "in.bin"], "env": {%q: %q}, "inputs": {"in.bin": %q}, "attempts": 1}`,
			i, self, barrierEnv, fetched, paths[i])
	})
	var r transferResult
	self0 := selfCPU()
	r.base = fetchPlain(tb, in, filepath.Join(dir, "plain"), paths, sums, true)
	r.baseCPU = selfCPU() - self0
	r.plain = fetchPlain(tb, in, filepath.Join(dir, "plain"), paths, sums, false)

	eng := startTaskEngine(tb, e, "transfer", transferTasks, file)
	cpuMu.Lock()
	te = eng
	cpuMu.Unlock()
	te.waitSubmitted(tb, 5*time.Minute)
	var mu sync.Mutex
	var first, lastGot, firstDone, last time.Time
	running, started := make([]int, transferTasks), make([]int, transferTasks)
	gotAt := make([]time.Time, transferTasks)
	workers := 0
	te.startWorkers(tb, bin, func(i int, l storyLine) {
		mu.Lock()
		defer mu.Unlock()
		// Each worker's second task is its input's: "running" as it has
		// it, "started" once its input is written and checked.
		switch {
		case strings.Contains(l.text, " running task "):
			if running[i]++; running[i] == 2 {
				gotAt[i] = l.at
				if first.IsZero() || l.at.Before(first) {
					first = l.at
				}
				if l.at.After(lastGot) {
					lastGot = l.at
				}
			}
		case strings.Contains(l.text, ": started "):
			if started[i]++; started[i] == 2 {
				workers++
				if !gotAt[i].IsZero() {
					r.longest = max(r.longest, l.at.Sub(gotAt[i]))
				}
				if firstDone.IsZero() || l.at.Before(firstDone) {
					firstDone = l.at
				}
				if l.at.After(last) {
					last = l.at
				}
			}
		}
	})
	sum := te.waitSummary(tb, 10*time.Minute)
	if want := fmt.Sprintf("%d task(s): %d succeeded", 2*transferTasks, 2*transferTasks); !strings.Contains(sum.text, want) {
		tb.Fatalf("not every task succeeded: %s\nstderr (tail):\n%s", sum.text, tail(te.h.stderr.String(), 20))
	}
	mu.Lock()
	defer mu.Unlock()
	if first.IsZero() || last.IsZero() {
		tb.Fatalf("the workers' logs did not say when they fetched (running %v, started %v)", first, last)
	}
	// Both barriers opened before the last task's result, so before the
	// summary.
	cpuMu.Lock()
	r.engineCPU, r.workersCPU = cpu[1][0]-cpu[0][0], cpu[1][1]-cpu[0][1]
	cpuMu.Unlock()
	r.ours, r.whole, r.workers, r.spread, r.doneSpread = last.Sub(first), sum.at.Sub(first), workers, lastGot.Sub(first), last.Sub(firstDone)
	return r
}

func transferRows(rep *report, r transferResult) {
	v, rt := ratio(mbps(r.ours), mbps(r.base))
	rep.add(row{fmt.Sprintf("transfer: %d inputs of %d MB to %d tasks through the engine (fetched by fluksio-worker, written and sha256-checked), MB a second vs the same files from a plain Go http.FileServer to %d concurrent clients, written and sha256-checked", transferTasks, transferSize/1_000_000, transferTasks, transferTasks),
		fmt.Sprintf("%.0f MB/s (%s)", mbps(r.ours), dur(r.ours)), fmt.Sprintf("%.0f MB/s (%s)", mbps(r.base), dur(r.base)), rt, "≥ 0.7×", verdict(v, 0.7, false, "×")})
	rep.note("Transfer: ours is the fetch as the workers see it, from the first worker's \"running\" line for its input's task to the last worker's \"started\" line (its input written and checked, its command starting); %d workers fetched one input each, had their tasks within %s of each other (each first ran a warm-up task that ended when all ten were running, so that none fetched alone while the others attached) and finished within %s (each command, sha256sum in.bin, waited until all ten had their inputs, so that none hashed while another still fetched). The baseline is its clients' first request to their last byte, each writing its file and checking its sha256 as the worker does, so that both sides do the same with the bytes and the ratio is the engine's serving and the worker's fetching against a plain file server and client; without the check the plain fetch took %s (%.0f MB/s). From the first input's task to the tenth result, sha256sum included, took %s. The engine's digest of the inputs at Submit comes before either window. CPU over the fetches (utime+stime, from the warm-ups' end to the last input's): the engine %s and the workers %s (10 processes); the baseline's server and clients %s (one process).",
		r.workers, dur(r.spread), dur(r.doneSpread), dur(r.plain), mbps(r.plain), dur(r.whole), dur(r.engineCPU), dur(r.workersCPU), dur(r.baseCPU))
	if v < 0.7 {
		rep.note("Transfer MISS: the window holds what the baseline's has not. Its clients start together; the ten workers had their input's tasks over %s (each hears of its task on its own poll, after its warm-up's report), and the longest any one worker took from its task to its input written and checked was %s: the ten fetching together at that pace, as the baseline's clients start, would move the 1 GB at %.0f MB/s, %.2f× the file server. CPU over the fetches: ours %s (the engine, serving with sendfile, and ten worker processes), the baseline's %s (one process), on %d cores shared with other work.",
			dur(r.spread), dur(r.longest), mbps(r.longest), mbps(r.longest)/max(mbps(r.base), 1e-9), dur(r.engineCPU+r.workersCPU), dur(r.baseCPU), runtime.NumCPU())
	}
}

// --- 17, queued ---

type queuedResult struct {
	// rssKB is the engine's largest sampled VmRSS with the tasks
	// queued, idleKB the same with none; hwmKB is VmHWM, the queued
	// engine's peak, submission included.
	rssKB, idleKB, hwmKB int64
	heapKB, idleHeapKB   int64
	submit               time.Duration
}

// peakRSS samples pid's VmRSS every rssEvery for rssWindow and returns
// the largest.
func peakRSS(tb testing.TB, pid int) int64 {
	tb.Helper()
	var most int64
	tick := time.NewTicker(rssEvery)
	defer tick.Stop()
	for end := time.Now().Add(rssWindow); time.Now().Before(end); <-tick.C {
		kb, err := rssKB(pid)
		if err != nil {
			tb.Fatal(err)
		}
		most = max(most, kb)
	}
	return most
}

// statusKB reads one kB field (such as VmHWM) of /proc/PID/status.
func statusKB(tb testing.TB, pid int, field string) int64 {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, field+":"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				if err == nil {
					return kb
				}
			}
		}
	}
	tb.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

func measureQueued(tb testing.TB, e benchEnv) queuedResult {
	tb.Helper()
	var r queuedResult
	idle := startTaskEngine(tb, e, "idle", dispatchWorkers, "")
	idle.waitFor(tb, "status page", 2*time.Minute, func() bool { return idle.ready != nil })
	r.idleKB = peakRSS(tb, idle.h.cmd.Process.Pid)
	idle.h.stop(tb)

	dir := tempDir(tb, "fxb-queued-")
	file := writeTasks(tb, dir, queuedTasks, func(i int) string {
		return fmt.Sprintf(`{"id": "q%06d", "command": ["true"], "attempts": 1}`, i)
	})
	te := startTaskEngine(tb, e, "queued", dispatchWorkers, file)
	te.waitSubmitted(tb, 5*time.Minute)
	te.mu.Lock()
	r.submit = te.submitted.at.Sub(te.h.started)
	te.mu.Unlock()
	pid := te.h.cmd.Process.Pid
	r.rssKB = peakRSS(tb, pid)
	r.hwmKB = statusKB(tb, pid, "VmHWM")
	r.heapKB, _, r.idleHeapKB, _ = engineMemory(tb, te.base)
	te.h.stop(tb)
	return r
}

func queuedRows(rep *report, r queuedResult) {
	v := mb(r.rssKB)
	rep.add(row{fmt.Sprintf("queued: engine RSS with %d tasks submitted and waiting, no worker attached, vs the same engine idle with none", queuedTasks),
		fmt.Sprintf("%.1f MB", v), fmt.Sprintf("%.1f MB", mb(r.idleKB)), ratioStr(v, mb(r.idleKB)), "≤ 200 MB", verdict(v, 200, true, "MB")})
	rep.note("Queued: each RSS is the largest of VmRSS sampled every %s for %s, once the story said the tasks were submitted (%s after the engine's start: the tasks file read and every Submit), or, idle, once the status page was up. With the tasks queued the engine's Go heap in use was %.1f MB and freed heap not yet returned %.1f MB; its peak (VmHWM, submission included) %.1f MB: %.0f bytes of RSS a task over idle.",
		rssEvery, rssWindow, dur(r.submit), mb(r.heapKB), mb(r.idleHeapKB), mb(r.hwmKB), float64(r.rssKB-r.idleKB)*1024/queuedTasks)
}

// BenchmarkTasks takes measurements 15, 16, 17 and 18 once per op, reports
// their figures and logs their rows (go test -bench Tasks -v). It needs
// no sandbox.
func BenchmarkTasks(b *testing.B) {
	e := benchEnv{HostBin: sandboxtest.Binary(b, "host-example", "host-example"),
		TestBin: sandboxtest.Binary(b, "examples/testplugin", "testplugin")}
	logRows := func(b *testing.B, n int, add func(*report)) {
		rep := &report{n: n}
		add(rep)
		b.Log("\n" + rep.table() + "- " + strings.Join(rep.notes, "\n- "))
	}
	b.Run("dispatch", func(b *testing.B) {
		for range b.N {
			r := measureDispatch(b, e)
			b.ReportMetric(r.rate(), "tasks/s")
			b.ReportMetric(r.xrate(), "tasks/s-xargs")
			b.ReportMetric(float64(r.cpu/dispatchTasks)/1e3, "µs-cpu/task")
			b.ReportMetric(float64(r.floor)/1e3, "µs-cpu/request-plain")
			b.ReportMetric(float64(r.floor50)/1e3, "µs-cpu/request-plain-50")
			b.ReportMetric(float64(r.resultFloor)/1e3, "µs-cpu/result.json")
			logRows(b, 15, func(rep *report) { dispatchRows(rep, r) })
		}
	})
	b.Run("dispatch16", func(b *testing.B) {
		for range b.N {
			r := measureDispatchOf(b, e, fleetTasks, fleetWorkers, false)
			b.ReportMetric(r.ours.Seconds()/max(r.xargs.Seconds(), 1e-9), "×-xargs")
			b.ReportMetric(float64(r.cpu/time.Duration(r.tasks))/1e3, "µs-cpu/task")
			logRows(b, 18, func(rep *report) { fleetRows(rep, r) })
		}
	})
	b.Run("transfer", func(b *testing.B) {
		for range b.N {
			r := measureTransfer(b, e)
			b.ReportMetric(mbps(r.ours), "MB/s")
			b.ReportMetric(mbps(r.base), "MB/s-fileserver")
			logRows(b, 16, func(rep *report) { transferRows(rep, r) })
		}
	})
	b.Run("queued", func(b *testing.B) {
		for range b.N {
			r := measureQueued(b, e)
			b.ReportMetric(mb(r.rssKB), "MB-rss")
			b.ReportMetric(mb(r.idleKB), "MB-rss-idle")
			logRows(b, 17, func(rep *report) { queuedRows(rep, r) })
		}
	})
}
