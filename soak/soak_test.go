package soak

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/shared/plugin"
)

func TestMain(m *testing.M) {
	os.Exit(sandboxtest.Run(m))
}

// task is one task of the workload, in the soak's books: its input and
// that input's digest, which engine (generation) has it, and what its
// end was told as.
type task struct {
	n     int
	id    string // its id on every engine it is submitted to: t<n>
	shape string // its need, as POST /soak/tasks takes it: cpus=1
	work  time.Duration
	spec  string // shape and work, for the log and the report
	burst int
	added time.Time
	// input is the path of its input file, in.bin in the task's
	// directory; digest is that file's sha256, as the soak wrote it.
	input, digest string
	gen           int       // the engine generation it was submitted to; 0: none yet
	adds          int       // how many engines it was submitted to
	reg           time.Time // when the engine generation gen took it
	// servedAt is when it ended succeeded, as its engine said.
	servedAt time.Time
	state    string // the engine's phase of its need, last seen
	reason   string
	// result is its end as the TaskEnded hook told it, from the
	// journal of generation resultGen; ends counts every telling.
	result    *engine.TaskResult
	resultGen int
	ends      int
	// missing is when /status was first seen without it while the
	// books say its engine holds it; zero while it is listed.
	missing time.Time
	// withdrawn: a demand-drop fault (or the workflow's end) took it
	// back while it waited; it counts as settled and is never submitted
	// again.
	withdrawn bool
	// withdrawing: a demand-drop fault is asking the engine to take it
	// back; the checker does not count it lost meanwhile.
	withdrawing bool
}

// violation is an invariant's first breach.
type violation struct {
	at   time.Duration
	what string
}

// faultRun is a fault as it happened.
type faultRun struct {
	fault
	start, end time.Time
	note       string
	recovered  time.Duration // from end to the next need served; <0: none
}

// sample is one second's readings.
type sample struct {
	at                 time.Duration
	engineRSS          int64 // kB
	pluginRSS          int64 // kB, sum over the plugin processes
	engineHeap         int64 // kB, the Go heap in use (go_memstats_heap_inuse_bytes)
	engineLive         int64 // kB, the live heap (go_gc_heap_live_bytes)
	pluginLive         int64 // kB, the plugins' live heaps as they report them (fluksio_plugin_heap_live_bytes), summed
	pluginObjects      int64 // kB, their heap objects (fluksio_plugin_heap_objects_bytes), summed
	pluginGoroutines   int   // fluksio_plugin_goroutines, summed
	goroutines         int
	alive, pending     int
	engineUp, ctldUp   bool
	workers, waiting   int
	servedSoFar, needs int
}

type soak struct {
	t     *testing.T
	env   sandboxtest.Env
	plan  plan
	dur   time.Duration
	start time.Time
	dir   string
	name  string // the direct provisioner's name; its jobs are fluksio-<name>
	relay string // the relay provisioner's name
	// commit is the module's git describe when the run began.
	commit string
	cfg    string
	port   int
	px     *proxy

	engineBin, pluginBin, workerBin string
	// race is whether the engine and the plugin are built with -race
	// (SOAK_RACE, default 1; 0 builds them plain).
	race bool
	// pprofDir is where the plugins' heap profiles go (SOAK_PPROF), ""
	// for none.
	pprofDir  string
	secret    string
	engineLog *os.File

	// engMu guards eng, gen, engDone and genOfPID: the engine process
	// now, and which generation each engine process was.
	engMu    sync.Mutex
	eng      *exec.Cmd
	gen      int
	engDone  chan struct{}
	genOfPID map[int]int

	// jmu guards journals: each generation's -results file (index gen)
	// and how far it has been read. It is taken before mu, never after.
	jmu      sync.Mutex
	journals []*journalFile

	// mu guards everything below.
	mu    sync.Mutex
	tasks []*task
	byID  map[string]*task
	byGen map[int]map[string]*task
	// served are when tasks ended succeeded, as their engines said.
	served     []time.Time
	violated   map[string]violation
	faults     []*faultRun
	samples    []sample
	workerJob  map[string]string          // worker name -> its job, as first seen
	jobWorkers map[string]map[string]bool // job -> worker names seen on it
	jobSeen    map[string]time.Time       // our job -> since when it has no need behind it
	// orphanSeen: a plugin process whose parent is not the engine up
	// now -> since when it has been seen so.
	orphanSeen map[int]time.Time
	withdrawn  int
	// withdrawnAtEnd: of withdrawn, those taken back when the workflow
	// ended, after the drain.
	withdrawnAtEnd int
	inFault        int
	// submissions counts every task given to an engine, again after a
	// restart included.
	submissions int
	// listed: generation -> worker -> when the last /status of that
	// generation that listed it attached was asked for.
	listed map[int]map[string]time.Time
	// gone: generation -> worker -> why it left the books (WorkerGone).
	gone map[int]map[string]string
	// queueSeen are our jobs squeue has shown; queueGone when each was
	// first seen no longer there.
	queueSeen map[string]bool
	queueGone map[string]time.Time
	// scancelled are the jobs the nemesis scancelled.
	scancelled map[string]bool
	// lostAttempts are the attempts told lost, in the tasks' results.
	lostAttempts []lostAttempt
	// lostTold counts the TaskLost lines, again those after which the
	// task waited for another worker.
	lostTold, again int
}

func (s *soak) since() time.Duration { return time.Since(s.start).Round(100 * time.Millisecond) }

// violate records an invariant's first breach.
func (s *soak) violate(invariant, format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.violateLocked(invariant, format, args...)
}

func (s *soak) violateLocked(invariant, format string, args ...any) {
	if _, ok := s.violated[invariant]; ok {
		return
	}
	v := violation{at: s.since(), what: fmt.Sprintf(format, args...)}
	s.violated[invariant] = v
	s.t.Logf("VIOLATION %s at %s: %s", invariant, v.at, v.what)
}

// The invariants, by name, in the report's order.
var invariants = []string{
	"no job left after the final stop",
	"no job without a need behind it",
	"no machine attached twice, no credential for a second job",
	"every need served or failed with a reason, none lost",
	"every task's result recorded once and right",
	"no task lost",
	"a task run again only after its machine was lost",
	"a need served after every fault",
	"alive <= max_workers, pending <= max_pending",
	"engine and plugin memory bounded",
	"engine goroutines bounded",
	"no panic, no data race",
	"no orphan process after the end",
	"the engine stops cleanly",
}

func TestSoak(t *testing.T) {
	if os.Getenv("SOAK_RUN") == "" {
		t.Skip("the soak runs with make soak (SOAK_RUN=1)")
	}
	dur := 3 * time.Minute
	if v := os.Getenv("SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 30*time.Second {
			t.Fatalf("SOAK=%q: want a duration of at least 30s, such as 3m or 30m", v)
		}
		dur = d
	}
	var seed uint64
	if v := os.Getenv("SOAK_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("SOAK_SEED=%q: want a whole number, such as the seed a report printed", v)
		}
		seed = n
	} else {
		var b [4]byte
		crand.Read(b[:])
		seed = uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])
	}
	env := sandboxtest.Require(t)
	p := newPlan(seed, dur)
	t.Logf("SOAK_SEED=%d SOAK=%s schedule digest %s\n%s", seed, dur, p.Digest(), p)

	s := &soak{t: t, env: env, plan: p, dur: dur, genOfPID: map[int]int{},
		byID: map[string]*task{}, byGen: map[int]map[string]*task{}, violated: map[string]violation{},
		workerJob: map[string]string{}, jobWorkers: map[string]map[string]bool{}, jobSeen: map[string]time.Time{}, orphanSeen: map[int]time.Time{},
		listed: map[int]map[string]time.Time{}, gone: map[int]map[string]string{},
		queueSeen: map[string]bool{}, queueGone: map[string]time.Time{}, scancelled: map[string]bool{}}
	// The commit the binaries are built from, read before the build:
	// the tree may move on while a long soak runs.
	if out, err := exec.Command("git", "-C", sandboxtest.ModuleRoot(), "describe", "--always", "--dirty").Output(); err == nil {
		s.commit = strings.TrimSpace(string(out))
	}
	s.setup()
	s.run()
	s.report()
	if len(s.violated) > 0 {
		race := ""
		if !s.race {
			race = " SOAK_RACE=0"
		}
		t.Errorf("%d invariant(s) violated; reproduce with SOAK_SEED=%d SOAK=%s%s make soak", len(s.violated), seed, dur, race)
	}
}

// setup builds the binaries (the engine and the plugin with -race unless
// SOAK_RACE=0), the proxy and the config.
func (s *soak) setup() {
	t := s.t
	switch v := os.Getenv("SOAK_RACE"); v {
	case "", "1":
		s.race = true
	case "0":
	default:
		t.Fatalf("SOAK_RACE=%q: want 1 (the engine and the plugin built with -race, the default) or 0 (plain binaries)", v)
	}
	if d := os.Getenv("SOAK_PPROF"); d != "" {
		abs, err := filepath.Abs(d)
		if err == nil {
			err = os.MkdirAll(abs, 0o755)
		}
		if err != nil {
			t.Fatalf("SOAK_PPROF=%q: want a directory for the plugins' heap profiles: %v", d, err)
		}
		s.pprofDir = abs
	}
	dir, err := os.MkdirTemp("", "fluksio-soak-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	t.Cleanup(func() { os.RemoveAll(dir) })
	s.dir = dir
	build := func(pkg, name string, race bool) string {
		out := filepath.Join(dir, name)
		args := []string{"build", "-o", out}
		if race {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, "github.com/fluksio/provision/"+pkg)...)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, b)
		}
		return out
	}
	s.engineBin = build("soak/soakengine", "soakengine", s.race)
	s.pluginBin = build("plugin", "provisioner-slurm", s.race)
	s.workerBin = build("worker/fluksio-worker", "fluksio-worker", false)

	var b [4]byte
	crand.Read(b[:])
	s.name = "soak-" + hex.EncodeToString(b[:])
	s.relay = s.name + "-relay"
	var sec [32]byte
	crand.Read(sec[:])
	s.secret = hex.EncodeToString(sec[:])

	s.px, err = newProxy(fmt.Sprintf("127.0.0.1:%d", s.env.Port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.px.close)
	// The sandbox's known_hosts names its sshd by its port; the proxy's
	// port gets the same key.
	kh, err := os.ReadFile(s.env.KnownHosts)
	if err != nil {
		t.Fatal(err)
	}
	khProxy := strings.ReplaceAll(string(kh), fmt.Sprintf("]:%d ", s.env.Port), fmt.Sprintf("]:%d ", s.px.port()))
	khPath := filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(khPath, []byte(khProxy), 0o644); err != nil {
		t.Fatal(err)
	}

	s.port = sandboxtest.FreePort(t)
	cfg := s.config(khPath, s.px.port())
	s.cfg = filepath.Join(dir, "config.hcl")
	if err := os.WriteFile(s.cfg, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	s.engineLog, err = os.Create(filepath.Join(dir, "engine.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Whatever happened, nothing of ours stays in a shared queue.
		if q := s.queue(); len(q) > 0 {
			t.Logf("cancelling %d job(s) the soak left", len(q))
			s.env.Command("scancel", "--name="+s.jobNames()).Run()
		}
		s.engineLog.Close()
	})
}

// config is the soak's configuration: the engine, and two provisioners
// that reach the login node on sshPort (the proxy's) with known_hosts.
func (s *soak) config(knownHosts string, sshPort int) string {
	profile := func(name string, cpus int) string {
		return fmt.Sprintf(`  profile %q {
    cpus   = %d
    ram_mb = 200
    sbatch = ["--partition=%s", "--time=00:15:00"]
  }
`, name, cpus, s.env.Partition)
	}
	// Both provisioners reach the login node through the proxy; the
	// direct one's workers dial the engine, the relay one's a relay the
	// plugin runs on the login node.
	provisioner := func(name, reach string, maxW, maxP int, profiles ...string) string {
		return fmt.Sprintf(`provisioner "slurm" %q {
  login             = %q
  ssh_port          = %d
  ssh_key           = %q
  known_hosts       = %q
%s  worker_command    = [%q]
  max_idle          = %q
  poll_interval     = %q
  provision_timeout = %q
  max_workers       = %d
  max_pending       = %d
  max_rpc_rate      = 100

%s}
`, name, s.env.Login, sshPort, s.env.Key, knownHosts, reach, s.workerBin,
			maxIdle.String(), pollInterval.String(), provisionTimeout.String(), maxW, maxP, strings.Join(profiles, ""))
	}
	return fmt.Sprintf(`engine {
  listen     = "127.0.0.1:%d"
  plugin_dir = %q
  secret_env = "SOAK_ENGINE_SECRET"
}

`, s.port, s.dir) +
		provisioner(s.name, fmt.Sprintf("  engine_url        = \"http://127.0.0.1:%d\"\n", s.port), maxWorkers, maxPending, profile("one", 1), profile("two", 2)) + "\n" +
		provisioner(s.relay, "  reach             = \"relay\"\n  relay_host        = \"127.0.0.1\"\n", relayMaxWorkers, relayMaxPending, profile("three", 3))
}

// jobNames are both provisioners' job names, as squeue --name takes a
// list.
func (s *soak) jobNames() string { return "fluksio-" + s.name + ",fluksio-" + s.relay }

// job is one of our jobs as squeue shows it.
type job struct {
	state string
	relay bool // the relay provisioner's
}

// queue is squeue's view of our jobs: id -> job; nil when squeue fails
// (the controller is down).
func (s *soak) queue() map[string]job {
	out, err := s.env.Command("squeue", "-h", "--name="+s.jobNames(), "-o", "%i %T %j").Output()
	if err != nil {
		return nil
	}
	q := map[string]job{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(line); len(f) == 3 {
			q[f[0]] = job{state: f[1], relay: f[2] == "fluksio-"+s.relay}
		}
	}
	return q
}

// startEngine starts a new engine generation and waits until it is ready.
func (s *soak) startEngine() {
	s.engMu.Lock()
	s.gen++
	gen := s.gen
	// Each generation has a journal and a task directory of its own: a
	// restarted engine holds none of the last one's tasks, and the
	// soak reads what each told apart.
	results := filepath.Join(s.dir, fmt.Sprintf("results-%d.jsonl", gen))
	s.jmu.Lock()
	for len(s.journals) <= gen {
		s.journals = append(s.journals, nil)
	}
	s.journals[gen] = &journalFile{path: results}
	s.jmu.Unlock()
	cmd := exec.Command(s.engineBin, "-config", s.cfg, "-results", results, "-task-dir", filepath.Join(s.dir, fmt.Sprintf("tasks-%d", gen)))
	cmd.Env = append(os.Environ(), "SOAK_ENGINE_SECRET="+s.secret,
		// Race reports of the engine and of the plugins (which inherit
		// it) go to files of their own: a plugin's stderr reaches the
		// engine's log only at debug level.
		"GORACE=halt_on_error=0 log_path="+filepath.Join(s.dir, "race"))
	if s.pprofDir != "" {
		// The plugins inherit it: each writes its heap profile there on
		// SIGUSR1 (shared/plugin's HeapProfileDirEnv).
		cmd.Env = append(cmd.Env, plugin.HeapProfileDirEnv+"="+s.pprofDir)
	}
	fmt.Fprintf(s.engineLog, "==== engine generation %d at %s\n", gen, s.since())
	cmd.Stdout, cmd.Stderr = s.engineLog, s.engineLog
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		s.engMu.Unlock()
		s.t.Fatalf("starting the engine: %v", err)
	}
	done := make(chan struct{})
	s.eng, s.engDone = cmd, done
	s.genOfPID[cmd.Process.Pid] = gen
	s.engMu.Unlock()
	go func() {
		cmd.Wait()
		close(done)
	}()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		resp, err := http.Get(s.url("/ready"))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-done:
			s.violate("the engine stops cleanly", "engine generation %d exited while starting (see its log)", gen)
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
	s.violate("the engine stops cleanly", "engine generation %d not ready in 2 minutes", gen)
}

// stopEngine signals the engine and waits for it; it reports whether the
// engine exited within the minute a clean stop is given.
func (s *soak) stopEngine(sig syscall.Signal) bool {
	s.engMu.Lock()
	cmd, done := s.eng, s.engDone
	s.eng = nil
	s.engMu.Unlock()
	if cmd == nil {
		return true
	}
	cmd.Process.Signal(sig)
	select {
	case <-done:
		return true
	case <-time.After(90 * time.Second):
		cmd.Process.Kill()
		<-done
		return false
	}
}

func (s *soak) url(path string) string { return fmt.Sprintf("http://127.0.0.1:%d%s", s.port, path) }

// profilePlugins asks each plugin process of the engine now up for its
// heap profile (SIGUSR1; the engine's environment gave them
// HeapProfileDirEnv) and names it plugin-PID-TAG.pprof in pprofDir,
// for `go tool pprof -top -diff_base plugin-PID-start.pprof
// plugin-PID-end.pprof`. Only the engine's children are asked: the relay
// runs the same binary on the login node and does not catch the signal.
// Without SOAK_PPROF it does nothing.
func (s *soak) profilePlugins(tag string) {
	if s.pprofDir == "" {
		return
	}
	_, engine := s.currentGen()
	if engine == 0 {
		s.t.Logf("%s: no heap profile %q: the engine is down", s.since(), tag)
		return
	}
	for _, pid := range sandboxtest.PIDsOf(s.pluginBin) {
		if parentOf(pid) != engine {
			continue
		}
		before, _ := filepath.Glob(filepath.Join(s.pprofDir, fmt.Sprintf("heap-%d-*.pprof", pid)))
		if err := syscall.Kill(pid, syscall.SIGUSR1); err != nil {
			s.t.Logf("%s: heap profile %q of plugin %d: %v", s.since(), tag, pid, err)
			continue
		}
		got := ""
		for deadline := time.Now().Add(15 * time.Second); got == "" && time.Now().Before(deadline); {
			now, _ := filepath.Glob(filepath.Join(s.pprofDir, fmt.Sprintf("heap-%d-*.pprof", pid)))
			for _, p := range now {
				if !slices.Contains(before, p) {
					got = p
				}
			}
			if got == "" {
				time.Sleep(100 * time.Millisecond)
			}
		}
		if got == "" {
			s.t.Logf("%s: plugin %d wrote no heap profile %q in 15 s", s.since(), pid, tag)
			continue
		}
		dst := filepath.Join(s.pprofDir, fmt.Sprintf("plugin-%d-%s.pprof", pid, tag))
		if err := os.Rename(got, dst); err != nil {
			s.t.Logf("%s: %v", s.since(), err)
			continue
		}
		s.t.Logf("%s: the heap profile %q of plugin %d: %s", s.since(), tag, pid, dst)
	}
}

// currentGen is the engine generation up now, or 0.
func (s *soak) currentGen() (int, int) {
	s.engMu.Lock()
	defer s.engMu.Unlock()
	if s.eng == nil {
		return 0, 0
	}
	return s.gen, s.eng.Process.Pid
}

// run is the soak: the engine up, the workload, the nemesis and the
// checker, for SOAK; then the drain, the final stop and its checks.
func (s *soak) run() {
	s.start = time.Now()
	s.startEngine()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(4)
	go func() { defer wg.Done(); s.workload(ctx) }()
	go func() { defer wg.Done(); s.feeder(ctx) }()
	go func() { defer wg.Done(); s.checker(ctx) }()
	go func() {
		defer wg.Done()
		// The start's heap profile once the first fifth has filled both
		// provisioners: the fifths the memory invariant compares are the
		// second and the last.
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(s.start.Add(s.dur / 5))):
			s.profilePlugins("start")
		}
	}()
	s.nemesis()
	s.profilePlugins("end")
	s.t.Logf("%s: the soak's faults are over; draining (at most %s)", s.since(), drainFor)
	// Drain: every task ended, or the bound; then the workflow is over,
	// and what still waits is withdrawn (its queued jobs must go), while
	// tasks under way finish, for at most their longest work and a
	// margin. Only what /status says waits is withdrawn: a task it says
	// is served, whose end the journal never told, is lost, and a
	// withdrawal must not hide it.
	drainEnd := s.start.Add(s.dur + drainFor)
	for time.Now().Before(drainEnd) && !s.settled(false) {
		time.Sleep(time.Second)
	}
	if gen, _ := s.currentGen(); gen != 0 {
		s.mu.Lock()
		var rest []*task
		for _, n := range s.tasks {
			if n.gen == gen && n.result == nil && !n.withdrawn && n.state == "waiting" {
				rest = append(rest, n)
			}
		}
		s.mu.Unlock()
		if len(rest) > 0 {
			took := s.withdraw(rest)
			s.mu.Lock()
			s.withdrawnAtEnd = took
			s.mu.Unlock()
			s.t.Logf("%s: the workflow is over: %d tasks still waiting withdrawn", s.since(), took)
		}
	}
	for end := time.Now().Add(40 * time.Second); time.Now().Before(end) && !s.settled(true); {
		time.Sleep(500 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	s.t.Logf("%s: stopping the engine", s.since())
	stopped := time.Now()
	if !s.stopEngine(syscall.SIGTERM) {
		s.violate("the engine stops cleanly", "the final SIGTERM did not stop the engine in 90 s")
	}
	// No job of ours 10 s after the final stop.
	deadline := stopped.Add(10 * time.Second)
	for {
		q := s.queue()
		if q != nil && len(q) == 0 {
			break
		}
		if time.Now().After(deadline) {
			s.violate("no job left after the final stop", "10 s after the final stop squeue still shows %v", q)
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	// No process of ours left: the plugins go with the engine, the relay
	// with the plugin's ssh session, the workers with their jobs. Each is
	// given 10 s (a relay's session takes a moment to close), then
	// counted.
	gone := func() bool {
		for _, bin := range []string{s.engineBin, s.pluginBin, s.workerBin} {
			if len(sandboxtest.PIDsOf(bin)) > 0 {
				return false
			}
		}
		return len(sandboxtest.RelayPIDs()) == 0
	}
	for deadline := time.Now().Add(10 * time.Second); !gone() && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
	}
	for _, bin := range []string{s.engineBin, s.pluginBin, s.workerBin} {
		if pids := sandboxtest.PIDsOf(bin); len(pids) > 0 {
			s.violate("no orphan process after the end", "%s still runs as pid %v", filepath.Base(bin), pids)
			for _, pid := range pids {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	if pids := sandboxtest.RelayPIDs(); len(pids) > 0 {
		s.violate("no orphan process after the end", "a relay still runs on the login node as pid %v", pids)
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	s.checkLog()
	// Every journal is whole now: every engine has exited.
	s.ingest()
	s.checkTasks()
}

// settled reports whether every task ended or was withdrawn; with
// waitingToo, a task that waits (none under way on a worker) counts as
// settled too, as it does at the workflow's end.
func (s *soak) settled(waitingToo bool) bool {
	s.ingest()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.tasks {
		if n.result == nil && !n.withdrawn && (!waitingToo || n.state != "waiting") {
			return false
		}
	}
	return true
}

// parentOf is a process's parent pid from /proc, or 0.
func parentOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name, in parentheses, may hold spaces: the fields
	// after its closing one are "state ppid ...".
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// workload adds the plan's bursts to the books at their times, each
// task with its input file written; the feeder gives them to the engine.
func (s *soak) workload(ctx context.Context) {
	for i, b := range s.plan.Bursts {
		if !sleepUntil(ctx, s.start.Add(b.At)) {
			return
		}
		now := time.Now()
		s.mu.Lock()
		first := len(s.tasks)
		s.mu.Unlock()
		batch := make([]*task, 0, b.Count)
		for k := range b.Count {
			n := &task{n: first + k, shape: b.Shape, work: b.Work, spec: fmt.Sprintf("%s,work=%s", b.Shape, b.Work), burst: i, added: now}
			n.id = fmt.Sprintf("t%d", n.n)
			n.input, n.digest = s.writeInput(n.n)
			batch = append(batch, n)
		}
		s.mu.Lock()
		for _, n := range batch {
			s.tasks = append(s.tasks, n)
			s.byID[n.id] = n
		}
		s.mu.Unlock()
	}
}

func sleepUntil(ctx context.Context, at time.Time) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(time.Until(at)):
		return true
	}
}

// feeder gives the engine up now every task it does not have and that
// has not ended: new ones, and, after a restart, the ones the last
// engine had not finished (an engine keeps nothing across a restart).
// It reads the journals first: a dead engine's is whole, so a task it
// finished is never submitted again.
func (s *soak) feeder(ctx context.Context) {
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		gen, _ := s.currentGen()
		if gen == 0 {
			continue
		}
		s.ingest()
		s.mu.Lock()
		var todo []*task
		for _, n := range s.tasks {
			if n.result == nil && !n.withdrawn && n.gen != gen {
				todo = append(todo, n)
			}
		}
		s.mu.Unlock()
		for len(todo) > 0 {
			k := min(len(todo), 200)
			if !s.submit(todo[:k]) {
				break // the engine is going down; next tick
			}
			todo = todo[k:]
		}
	}
}

// submit gives ns to the engine up now (POST /soak/tasks) and records
// which generation took each, from the pid that answered; false when
// the engine did not answer.
func (s *soak) submit(ns []*task) bool {
	reqs := make([]taskRequest, len(ns))
	for i, n := range ns {
		reqs[i] = n.request()
	}
	body, err := json.Marshal(reqs)
	if err != nil {
		s.t.Fatalf("encoding tasks: %v", err)
	}
	resp, err := http.Post(s.url("/soak/tasks"), "application/json", bytes.NewReader(body))
	if err != nil {
		return false
	}
	var answer struct {
		PID     int               `json:"pid"`
		Answers map[string]string `json:"answers"`
	}
	err = json.NewDecoder(resp.Body).Decode(&answer)
	resp.Body.Close()
	if err != nil {
		s.t.Logf("submitting %d tasks: %v", len(ns), err)
		return false
	}
	s.engMu.Lock()
	gen := s.genOfPID[answer.PID]
	s.engMu.Unlock()
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byGen[gen] == nil {
		s.byGen[gen] = map[string]*task{}
	}
	for _, n := range ns {
		if a := answer.Answers[n.id]; a != "submitted" {
			s.t.Logf("%s: engine generation %d did not take task %s: %q", s.since(), gen, n.id, a)
			continue
		}
		n.gen, n.adds, n.reg = gen, n.adds+1, now
		n.state, n.reason, n.missing = "waiting", "", time.Time{}
		s.byGen[gen][n.id] = n
		s.submissions++
	}
	return true
}

// status is the part of GET /status the soak reads.
type status struct {
	Provisioners []struct {
		Name  string `json:"name"`
		Phase string `json:"phase"`
	} `json:"provisioners"`
	Workers []struct {
		Name  string `json:"name"`
		JobID string `json:"job_id"`
	} `json:"workers"`
	Needs []struct {
		ID     string `json:"id"`
		State  string `json:"state"`
		Reason string `json:"reason"`
		Detail string `json:"detail"`
	} `json:"needs"`
}

// checker reads the system every second and checks what can be checked
// while it runs.
func (s *soak) checker(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	client := &http.Client{Timeout: 5 * time.Second}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		s.checkOnce(client)
	}
}

func (s *soak) checkOnce(client *http.Client) {
	now := time.Now()
	smp := sample{at: s.since()}
	gen, pid := s.currentGen()
	var st *status
	asked := time.Now()
	var orphans []int
	if gen != 0 {
		smp.engineRSS = rssOf(pid)
		for _, p := range sandboxtest.PIDsOf(s.pluginBin) {
			smp.pluginRSS += rssOf(p)
			if parentOf(p) != pid {
				orphans = append(orphans, p)
			}
		}
		if resp, err := client.Get(s.url("/status")); err == nil {
			var v status
			if json.NewDecoder(resp.Body).Decode(&v) == nil && resp.StatusCode == http.StatusOK {
				st = &v
			}
			resp.Body.Close()
		}
		rt := runtimeOf(client, s.url("/metrics"))
		smp.goroutines, smp.engineHeap, smp.engineLive = rt.goroutines, rt.engineHeap, rt.engineLive
		smp.pluginLive, smp.pluginObjects, smp.pluginGoroutines = rt.pluginLive, rt.pluginObjects, rt.pluginGoroutines
		if g, _ := s.currentGen(); g != gen {
			st = nil // the engine was restarted meanwhile: not its needs
		}
	}
	// The journals after /status: a task /status no longer lists (the
	// router forgets the oldest served) has had its end told by then,
	// or is told within the grace below.
	s.ingest()
	q := s.queue()
	smp.ctldUp = q != nil
	var alive, pending [2]int // direct, relay
	for _, j := range q {
		k := 0
		if j.relay {
			k = 1
		}
		switch j.state {
		case "PENDING":
			pending[k]++
			alive[k]++
		case "RUNNING", "CONFIGURING":
			alive[k]++
		}
	}
	smp.alive, smp.pending = alive[0]+alive[1], pending[0]+pending[1]
	if alive[0] > maxWorkers || pending[0] > maxPending {
		s.violate("alive <= max_workers, pending <= max_pending", "squeue shows %d alive (max_workers %d), %d pending (max_pending %d) of %s", alive[0], maxWorkers, pending[0], maxPending, s.name)
	}
	if alive[1] > relayMaxWorkers || pending[1] > relayMaxPending {
		s.violate("alive <= max_workers, pending <= max_pending", "squeue shows %d alive (max_workers %d), %d pending (max_pending %d) of %s", alive[1], relayMaxWorkers, pending[1], relayMaxPending, s.relay)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	// A plugin whose engine is gone shuts down within its orphan
	// timeout (3 s; shared/plugin); one still there well after that is
	// an orphan.
	live := map[int]bool{}
	for _, p := range orphans {
		live[p] = true
		first, ok := s.orphanSeen[p]
		if !ok {
			s.orphanSeen[p] = now
		} else if now.Sub(first) > orphanBound {
			s.violateLocked("no orphan process after the end", "plugin pid %d has outlived its engine by %s (its parent is pid %d, the engine is pid %d)", p, now.Sub(first).Round(time.Second), parentOf(p), pid)
		}
	}
	for p := range s.orphanSeen {
		if !live[p] {
			delete(s.orphanSeen, p)
		}
	}
	if st != nil {
		smp.engineUp = true
		smp.workers = len(st.Workers)
		// Needs: each the engine has is where the books say, and what it
		// says of it is recorded; one of this generation it lacks is lost.
		seen := map[string]bool{}
		waiting := 0
		for _, sn := range st.Needs {
			seen[sn.ID] = true
			n := s.byGen[gen][sn.ID]
			if n == nil {
				continue // added a moment ago: the feeder records it next
			}
			n.state, n.reason = sn.State, sn.Reason
			if sn.State != "served" {
				waiting++
				if sn.Reason == "" {
					n.reason = sn.Detail
				}
			}
		}
		smp.waiting = waiting
		for id, n := range s.byGen[gen] {
			// A served need may be gone from /status: the router lists
			// the last 1,000 served, and a long-lived engine serves more.
			// One not listed whose end the journal has not told within
			// missingGrace is lost.
			if seen[id] || n.gen != gen || !n.reg.Before(asked) || n.withdrawing || n.withdrawn || n.result != nil {
				n.missing = time.Time{}
				continue
			}
			if n.missing.IsZero() {
				n.missing = now
			} else if now.Sub(n.missing) > missingGrace {
				s.violateLocked("every need served or failed with a reason, none lost", "task %s (%s) of generation %d has not been in /status for %s, and its end was not told", id, n.spec, gen, now.Sub(n.missing).Round(time.Second))
			}
		}
		// Workers: one name, one job; one job, one name. When each was
		// last listed is kept, for the attempts told lost.
		attached := map[string]bool{}
		if s.listed[gen] == nil {
			s.listed[gen] = map[string]time.Time{}
		}
		for _, w := range st.Workers {
			attached[w.JobID] = true
			s.listed[gen][w.Name] = asked
			if j, ok := s.workerJob[w.Name]; ok && j != w.JobID {
				s.violateLocked("no machine attached twice, no credential for a second job", "worker %s attached for job %s and later for job %s", w.Name, j, w.JobID)
			}
			s.workerJob[w.Name] = w.JobID
			if s.jobWorkers[w.JobID] == nil {
				s.jobWorkers[w.JobID] = map[string]bool{}
			}
			s.jobWorkers[w.JobID][w.Name] = true
			if len(s.jobWorkers[w.JobID]) > 1 {
				s.violateLocked("no machine attached twice, no credential for a second job", "job %s has had workers %v", w.JobID, keys(s.jobWorkers[w.JobID]))
			}
		}
		// Jobs without a need: while the engine has nothing waiting, a
		// job of ours that no worker is attached from is there for no
		// need; within a poll, the provision timeout and the worker's
		// max_idle it must be gone.
		for id, j := range q {
			state := j.state
			if waiting > 0 || attached[id] || state == "COMPLETING" {
				delete(s.jobSeen, id)
				continue
			}
			first, ok := s.jobSeen[id]
			if !ok {
				s.jobSeen[id] = now
				continue
			}
			if limit := pollInterval + provisionTimeout + maxIdle + 30*time.Second; now.Sub(first) > limit && s.inFault == 0 {
				s.violateLocked("no job without a need behind it", "job %s (%s) has had no need behind it for %s (limit %s)", id, state, now.Sub(first).Round(time.Second), limit)
			}
		}
		for id := range s.jobSeen {
			if _, ok := q[id]; !ok && q != nil {
				delete(s.jobSeen, id)
			}
		}
	}
	// Our jobs' ends, as squeue shows them: a job seen once and then
	// not listed has ended.
	if q != nil {
		for id := range q {
			s.queueSeen[id] = true
			delete(s.queueGone, id)
		}
		for id := range s.queueSeen {
			if _, ok := q[id]; !ok {
				if _, told := s.queueGone[id]; !told {
					s.queueGone[id] = now
				}
			}
		}
	}
	smp.needs = len(s.tasks)
	smp.servedSoFar = len(s.served)
	s.samples = append(s.samples, smp)
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// rssOf is a process's VmRSS in kB, or 0.
func rssOf(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// runtimes is what the engine's /metrics says of its own runtime and of
// its plugins' (contract 2.8's StatusResponse.Runtime, re-exported per
// provisioner and summed here): heaps in kB.
type runtimes struct {
	goroutines                int
	engineHeap, engineLive    int64
	pluginLive, pluginObjects int64
	pluginGoroutines          int
}

// runtimeOf reads runtimes from the engine's /metrics; 0 for what it
// cannot read.
func runtimeOf(client *http.Client, u string) runtimes {
	v, err := sandboxtest.Metrics(client, u, "go_goroutines", "go_memstats_heap_inuse_bytes", "go_gc_heap_live_bytes",
		"fluksio_plugin_heap_live_bytes", "fluksio_plugin_heap_objects_bytes", "fluksio_plugin_goroutines")
	if err != nil {
		return runtimes{}
	}
	return runtimes{
		goroutines: int(v["go_goroutines"]),
		engineHeap: int64(v["go_memstats_heap_inuse_bytes"] / 1024), engineLive: int64(v["go_gc_heap_live_bytes"] / 1024),
		pluginLive: int64(v["fluksio_plugin_heap_live_bytes"] / 1024), pluginObjects: int64(v["fluksio_plugin_heap_objects_bytes"] / 1024),
		pluginGoroutines: int(v["fluksio_plugin_goroutines"]),
	}
}

// checkLog reads the engine's log (its plugins' stderr comes through it)
// for panics and race reports.
func (s *soak) checkLog() {
	b, err := os.ReadFile(s.engineLog.Name())
	if err != nil {
		s.t.Errorf("reading the engine's log: %v", err)
		return
	}
	races, _ := filepath.Glob(filepath.Join(s.dir, "race.*"))
	for _, r := range races {
		rb, _ := os.ReadFile(r)
		b = append(b, rb...)
	}
	for _, marker := range []string{"WARNING: DATA RACE", "panic:", "fatal error:"} {
		if i := bytes.Index(b, []byte(marker)); i >= 0 {
			end := min(len(b), i+3000)
			s.violate("no panic, no data race", "the engine's log has %q:\n%s", marker, b[i:end])
		}
	}
	if os.Getenv("SOAK_KEEP_LOG") != "" {
		dst := os.Getenv("SOAK_KEEP_LOG")
		os.WriteFile(dst, b, 0o644)
		s.t.Logf("the engine's log is in %s", dst)
	}
}

// pick chooses one of n things from a fault's seed.
func pick(seed uint64, n int) int {
	return rand.New(rand.NewPCG(seed, 7)).IntN(n)
}
