package bench

// Measurements 15 (dispatch), 16 (transfer) and 17 (queued): the engine
// running real tasks (issue 40, item 7). They ask nothing of Slurm. The
// engine is the real product, bin/host-example run -tasks FILE -results
// DIR, a process of its own, with the reference plugin (examples/
// testplugin, kind memory), which "starts" a machine by recording it and
// is capped by its max_workers at the pool's size; for each machine it
// recorded (host-example's story names each: job and worker) the harness
// starts a real worker process, bin/fluksio-worker, with a credential it
// signs under the engine's secret (secret_env), as measurement 10 does
// for its HTTP workers, and the job in SLURM_JOB_ID as a batch script
// gives it. The workers fetch the inputs, run the commands (real ones:
// true, sha256sum), report, and leave when the engine stops.
//
// 15, dispatch: 10,000 tasks of `true` over 50 workers, beside xargs -P
// 50 running the same 10,000 `true` on this machine. Ours is timed from
// the first worker's attach (the story's line) to the engine's summary
// line, which it prints once the last task has ended; xargs from its
// start to its exit. The engine's CPU is its utime+stime from
// /proc/PID/stat from just before the workers start to the summary,
// divided by the tasks, beside what a plain Go net/http server spends
// on one keep-alive request on this machine (httpFloor): a task costs
// the engine two requests at the least.
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
	// workerPIDs are the workers startWorkers started.
	workerPIDs []int
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
		args = []string{"-tasks", tasksFile, "-results", filepath.Join(dir, "results")}
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
		go func() { cmd.Wait(); close(d) }()
		done, cmds = append(done, d), append(cmds, cmd)
		te.mu.Lock()
		te.workerPIDs = append(te.workerPIDs, cmd.Process.Pid)
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
	// ours is the first attach to the summary; xargs its run.
	ours, xargs time.Duration
	// cpu is the engine's utime+stime from the workers' start to the
	// summary; submitCPU from its start until its tasks were submitted
	// (the tasks file read, every Submit, the plugin started).
	cpu, submitCPU time.Duration
	// attaching is the workers' start to the last one's attach.
	attaching time.Duration
	// floor is a plain Go net/http server's CPU a request (httpFloor).
	floor time.Duration
}

func (r dispatchResult) rate() float64  { return dispatchTasks / max(r.ours.Seconds(), 1e-9) }
func (r dispatchResult) xrate() float64 { return dispatchTasks / max(r.xargs.Seconds(), 1e-9) }

// xargsTrue runs n `true` through xargs -P p and returns how long it
// took.
func xargsTrue(tb testing.TB, n, p int) time.Duration {
	tb.Helper()
	cmd := exec.Command("xargs", "-P", strconv.Itoa(p), "-n", "1", "true")
	cmd.Stdin = strings.NewReader(strings.Repeat("x\n", n))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	t0 := time.Now()
	if err := cmd.Run(); err != nil {
		tb.Fatalf("xargs -P %d true: %v\n%s", p, err, out.String())
	}
	return time.Since(t0)
}

func measureDispatch(tb testing.TB, e benchEnv) dispatchResult {
	tb.Helper()
	bin := workerBin(tb)
	dir := tempDir(tb, "fxb-dispatch-")
	file := writeTasks(tb, dir, dispatchTasks, func(i int) string {
		return fmt.Sprintf(`{"id": "d%05d", "command": ["true"], "attempts": 1}`, i)
	})
	var r dispatchResult
	r.xargs = xargsTrue(tb, dispatchTasks, dispatchWorkers)
	r.floor = httpFloor(tb)

	te := startTaskEngine(tb, e, "dispatch", dispatchWorkers, file)
	te.waitSubmitted(tb, 2*time.Minute)
	pid := te.h.cmd.Process.Pid
	r.submitCPU = cpuTime(tb, pid)
	cpu0 := r.submitCPU
	t0 := time.Now()
	te.startWorkers(tb, bin, nil)
	sum := te.waitSummary(tb, 10*time.Minute)
	r.cpu = cpuTime(tb, pid) - cpu0
	if want := fmt.Sprintf("%d task(s): %d succeeded", dispatchTasks, dispatchTasks); !strings.Contains(sum.text, want) {
		tb.Fatalf("not every task succeeded: %s\nstderr (tail):\n%s", sum.text, tail(te.h.stderr.String(), 20))
	}
	te.mu.Lock()
	r.ours = sum.at.Sub(te.firstAttach)
	r.attaching = te.lastAttach.Sub(t0)
	attached := te.attached
	te.mu.Unlock()
	if attached != dispatchWorkers {
		tb.Fatalf("%d of %d workers attached", attached, dispatchWorkers)
	}
	return r
}

func dispatchRows(rep *report, r dispatchResult) {
	v, rt := ratio(r.rate(), r.xrate())
	rep.add(row{fmt.Sprintf("dispatch: %d tasks of `true` over %d attached workers (host-example -tasks, fluksio-worker processes), tasks a second vs xargs -P %d true", dispatchTasks, dispatchWorkers, dispatchWorkers),
		fmt.Sprintf("%.0f/s (%s)", r.rate(), dur(r.ours)), fmt.Sprintf("%.0f/s (%s)", r.xrate(), dur(r.xargs)), rt, "≥ 0.5×", verdict(v, 0.5, false, "×")})
	per := r.cpu / dispatchTasks
	rep.add(row{fmt.Sprintf("dispatch: the engine's CPU per task (utime+stime from /proc over the %d tasks) vs a plain Go net/http server's CPU per keep-alive request", dispatchTasks),
		dur(per), dur(r.floor) + " a request", ratioStr(float64(per), float64(r.floor)), "≤ 100 µs", verdict(float64(per)/1e3, 100, true, "µs")})
	rep.note("Dispatch: ours is timed from the first worker's attach to the engine's summary line (the last task ended), with the other %d workers attaching meanwhile (all %d attached %s after they were started); xargs from its start to its exit. The engine used %s of CPU over the run (%s a task); before it, reading the tasks file, submitting the %d tasks and starting the plugin took %s. The CPU row's baseline is a plain Go net/http server (the test binary started again) answering %d small JSON POSTs on one keep-alive connection, its utime+stime over them: a task costs the engine two requests at the least (the poll that carries it and its result), so %s a task is the floor of any engine that serves tasks over HTTP on this machine, before it keeps any books or writes the task's result.json (host-example does, a directory and a file a task).",
		dispatchWorkers-1, dispatchWorkers, dur(r.attaching), dur(r.cpu), dur(r.cpu/dispatchTasks), dispatchTasks, dur(r.submitCPU), floorRequests, dur(2*r.floor))
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
// serveFloor, floorRequests results' worth of POSTs one after the other
// on one connection, and its utime+stime from /proc over them. A task
// costs the engine two requests at the least (the poll that carries it
// and its result), so twice this is the floor of the engine's CPU a
// task.
func httpFloor(tb testing.TB) time.Duration {
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
	tr := &http.Transport{MaxIdleConnsPerHost: 1}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	body := []byte(`{"task_id": "task-1", "hostname": "bench", "job_id": "1001", "cpus": 1, "state": "succeeded", "exit_code": 0, "stdout": 0, "stderr": 0}`)
	post := func() {
		resp, err := client.Post(url, "application/json", bytes.NewReader(body))
		if err != nil {
			tb.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			tb.Fatalf("the plain HTTP server answered %s", resp.Status)
		}
	}
	post()
	cpu0 := cpuTime(tb, cmd.Process.Pid)
	for range floorRequests {
		post()
	}
	return (cpuTime(tb, cmd.Process.Pid) - cpu0) / floorRequests
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
	// last.
	doneSpread time.Duration
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
	workers := 0
	te.startWorkers(tb, bin, func(i int, l storyLine) {
		mu.Lock()
		defer mu.Unlock()
		// Each worker's second task is its input's: "running" as it has
		// it, "started" once its input is written and checked.
		switch {
		case strings.Contains(l.text, " running task-"):
			if running[i]++; running[i] == 2 {
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

// BenchmarkTasks takes measurements 15, 16 and 17 once per op, reports
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
			logRows(b, 15, func(rep *report) { dispatchRows(rep, r) })
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
