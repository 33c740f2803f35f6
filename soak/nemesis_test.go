package soak

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fluksio/provision/internal/sandboxtest"
)

// nemesis injects the plan's faults at their times, one after another: a
// fault that is not over when the next is due delays it.
func (s *soak) nemesis() {
	for _, f := range s.plan.Faults {
		time.Sleep(time.Until(s.start.Add(f.At)))
		fr := &faultRun{fault: f, start: time.Now()}
		s.mu.Lock()
		s.inFault++
		s.mu.Unlock()
		s.t.Logf("%s: fault: %s", s.since(), f)
		fr.note = s.inject(f)
		fr.end = time.Now()
		s.mu.Lock()
		s.inFault--
		s.faults = append(s.faults, fr)
		s.mu.Unlock()
		if fr.note != "" {
			s.t.Logf("%s: fault over: %s", s.since(), fr.note)
		}
	}
	time.Sleep(time.Until(s.start.Add(s.dur)))
}

// inject does one fault and returns a note on what it did.
func (s *soak) inject(f fault) string {
	switch f.Kind {
	case faultPluginKill:
		pids := sandboxtest.PIDsOf(s.pluginBin)
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		return fmt.Sprintf("killed plugin pid %v", pids)
	case faultEngineKill:
		_, pid := s.currentGen()
		s.stopEngine(syscall.SIGKILL)
		s.startEngine()
		return fmt.Sprintf("killed engine pid %d, started again", pid)
	case faultEngineTerm:
		t0 := time.Now()
		if !s.stopEngine(syscall.SIGTERM) {
			s.violate("the engine stops cleanly", "the engine did not stop in 90 s after SIGTERM")
		}
		took := time.Since(t0).Round(100 * time.Millisecond)
		s.startEngine()
		return fmt.Sprintf("engine stopped in %s, started again", took)
	case faultEngineTermKill:
		// SIGTERM, then SIGKILL 0.5 to 3 s into the stop: workers are
		// being let go, plugins shutting down, when the engine dies.
		_, pid := s.currentGen()
		s.engMu.Lock()
		cmd, done := s.eng, s.engDone
		s.engMu.Unlock()
		if cmd == nil {
			return "no engine up"
		}
		after := time.Duration(500+pick(f.Pick, 2501)) * time.Millisecond
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
			s.stopEngine(syscall.SIGKILL)
			s.startEngine()
			return fmt.Sprintf("engine pid %d stopped before its SIGKILL was due (%s), started again", pid, after)
		case <-time.After(after):
		}
		s.stopEngine(syscall.SIGKILL)
		s.startEngine()
		return fmt.Sprintf("engine pid %d SIGKILLed %s into its stop, started again", pid, after)
	case faultSSHDStop:
		pid, err := s.stopDaemon("sshd", syscall.SIGTERM)
		if err != nil {
			return err.Error()
		}
		time.Sleep(f.For)
		s.restartSandbox("sshd")
		return fmt.Sprintf("sshd pid %d stopped for %s", pid, f.For)
	case faultSSHSlow:
		s.px.setDelay(f.Latency)
		time.Sleep(f.For)
		s.px.setDelay(0)
		return fmt.Sprintf("+%s each way for %s", f.Latency, f.For)
	case faultCtldRestart:
		pid, err := s.stopDaemon("slurmctld", syscall.SIGTERM)
		if err != nil {
			return err.Error()
		}
		// up.sh returns once the controller answers.
		s.restartSandbox("slurmctld")
		return fmt.Sprintf("slurmctld pid %d restarted", pid)
	case faultSlurmdKill:
		nodes, _ := filepath.Glob(filepath.Join(s.env.Dir, "pid", "slurmd-*.pid"))
		if len(nodes) == 0 {
			return "no slurmd found"
		}
		sort.Strings(nodes)
		name := strings.TrimSuffix(filepath.Base(nodes[pick(f.Pick, len(nodes))]), ".pid")
		pid, err := s.stopDaemon(name, syscall.SIGKILL)
		if err != nil {
			return err.Error()
		}
		s.restartSandbox(name)
		return fmt.Sprintf("%s pid %d killed and restarted", name, pid)
	case faultScancel:
		q := s.queue()
		var ids []string
		for id, j := range q {
			if j.state == "RUNNING" || j.state == "PENDING" {
				ids = append(ids, id)
			}
		}
		if len(ids) == 0 {
			return "no job to cancel"
		}
		sort.Strings(ids)
		id := ids[pick(f.Pick, len(ids))]
		s.mu.Lock()
		s.scancelled[id] = true
		s.mu.Unlock()
		out, err := s.env.Command("scancel", id).CombinedOutput()
		return fmt.Sprintf("scancel %s (%s): %v %s", id, q[id].state, err, bytes.TrimSpace(out))
	case faultDemandDrop:
		return s.dropDemand(f)
	case faultWorkerKill:
		pids := sandboxtest.PIDsOf(s.workerBin)
		if len(pids) == 0 {
			return "no worker to kill"
		}
		pid := pids[pick(f.Pick, len(pids))]
		syscall.Kill(pid, syscall.SIGKILL)
		return fmt.Sprintf("killed worker pid %d", pid)
	}
	return "unknown fault"
}

// stopDaemon signals one of the sandbox's daemons, found by the pid file
// up.sh wrote for it (sshd, slurmctld, slurmd-<node>), never by name, so
// that another sandbox's daemons are never touched, and waits (up to
// 30 s) until it is gone or a zombie.
func (s *soak) stopDaemon(name string, sig syscall.Signal) (int, error) {
	b, err := os.ReadFile(filepath.Join(s.env.Dir, "pid", name+".pid"))
	if err != nil {
		return 0, fmt.Errorf("no %s of the sandbox: %v", name, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0, fmt.Errorf("%s's pid file holds %q, not a pid", name, b)
	}
	syscall.Kill(pid, sig)
	if !sandboxtest.WaitGone(pid, 30*time.Second) {
		return pid, fmt.Errorf("%s pid %d still running 30 s after signal %d", name, pid, sig)
	}
	return pid, nil
}

// restartSandbox runs sandbox/up.sh on the sandbox again, with the
// settings make gave it (SANDBOX_DIR, SANDBOX_SLURM in the environment):
// it starts whatever daemon is not running, as it started it the first
// time, writes its pid file (so that down.sh stops it), and returns once
// the cluster answers. A restart that fails is a violation: the faults
// after it would test a broken sandbox.
func (s *soak) restartSandbox(after string) {
	cmd := exec.Command("bash", filepath.Join(sandboxtest.ModuleRoot(), "sandbox", "up.sh"), s.env.Dir)
	// No smoke job: the soak's own jobs can fill the cluster, and a smoke
	// job pending behind them for up.sh's minute failed the restart (30
	// minutes, seed 1002). That the cluster runs jobs again is what the
	// soak's liveness invariant checks.
	cmd.Env = append(os.Environ(), "SANDBOX_SMOKE=0")
	cmd.WaitDelay = 10 * time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		s.violate("a need served after every fault", "sandbox/up.sh after stopping %s: %v\n%s", after, err, out)
	}
}

// dropDemand withdraws every task of one burst that still waits (the
// burst picked from the fault's seed among those with tasks waiting in
// the engine up now), as a user who cancels the rest of a burst does.
// Then what was queued for them must go: within two polls and a margin,
// squeue must show no more of our jobs pending than the engine has needs
// waiting; else the invariant "no job without a need behind it" fails.
func (s *soak) dropDemand(f fault) string {
	gen, _ := s.currentGen()
	if gen == 0 {
		return "no engine up"
	}
	s.mu.Lock()
	byBurst := map[int][]*task{}
	var bursts []int
	for _, n := range s.tasks {
		if n.gen == gen && n.result == nil && !n.withdrawn && n.state == "waiting" {
			if byBurst[n.burst] == nil {
				bursts = append(bursts, n.burst)
			}
			byBurst[n.burst] = append(byBurst[n.burst], n)
		}
	}
	s.mu.Unlock()
	if len(bursts) == 0 {
		return "no burst with tasks waiting"
	}
	sort.Ints(bursts)
	b := bursts[pick(f.Pick, len(bursts))]
	ns := byBurst[b]
	took := s.withdraw(ns)

	// What was queued for them goes.
	deadline := time.Now().Add(2*pollInterval + 15*time.Second)
	var pending, waiting int
	for {
		pending, waiting = 0, s.waitingNow()
		for _, j := range s.queue() {
			if j.state == "PENDING" {
				pending++
			}
		}
		if waiting < 0 || pending <= waiting {
			break
		}
		if time.Now().After(deadline) {
			s.violate("no job without a need behind it", "after a burst's demand was dropped, %d of our jobs still pend for %d needs waiting, %s later", pending, waiting, 2*pollInterval+15*time.Second)
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Sprintf("burst %d: %d of %d tasks withdrawn (the rest under way); then %d pending for %d waiting", b, took, len(ns), pending, waiting)
}

// withdraw asks the engine up now to take ns back (Withdraw, which
// cancels a task that waits), and marks in the books those it took; it
// returns how many. A task that went out on a worker meanwhile is not
// taken back, and stays a task like any other. A task the engine
// answers "withdrawn" for is withdrawn whichever generation answered:
// that engine cancelled it, and the soak never submits it again.
func (s *soak) withdraw(ns []*task) int {
	// Marked before asking, so that the checker, which may read /status
	// between the engine's answer and the books below, does not count
	// them lost.
	s.mu.Lock()
	for _, n := range ns {
		n.withdrawing = true
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		for _, n := range ns {
			n.withdrawing = false
		}
		s.mu.Unlock()
	}()
	form := url.Values{}
	for _, n := range ns {
		form.Add("id", n.id)
	}
	resp, err := http.PostForm(s.url("/soak/withdraw"), form)
	if err != nil {
		s.t.Logf("withdrawing %d tasks: %v", len(ns), err)
		return 0
	}
	var answers map[string]string
	err = json.NewDecoder(resp.Body).Decode(&answers)
	resp.Body.Close()
	if err != nil {
		s.t.Logf("withdrawing %d tasks: %v", len(ns), err)
		return 0
	}
	took := 0
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range ns {
		if answers[n.id] == "withdrawn" {
			n.withdrawn = true
			delete(s.byGen[n.gen], n.id)
			took++
		}
	}
	s.withdrawn += took
	return took
}

// waitingNow is how many needs the engine up now says wait, from
// /status; -1 when it does not answer.
func (s *soak) waitingNow() int {
	resp, err := http.Get(s.url("/status"))
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var st status
	if json.NewDecoder(resp.Body).Decode(&st) != nil {
		return -1
	}
	n := 0
	for _, x := range st.Needs {
		if x.State == "waiting" {
			n++
		}
	}
	return n
}
