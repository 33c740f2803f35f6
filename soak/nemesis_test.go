package soak

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
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
		pids := pidsOf(s.pluginBin)
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
	case faultSSHDStop:
		d, err := s.findDaemon("sshd", filepath.Join(s.env.Dir, "ssh", "sshd_config"))
		if err != nil {
			return err.Error()
		}
		d.stop(syscall.SIGTERM)
		time.Sleep(f.For)
		if err := d.restart(); err != nil {
			s.violate("a need served after every fault", "restarting sshd: %v", err)
		}
		return fmt.Sprintf("sshd pid %d stopped for %s", d.pid, f.For)
	case faultSSHSlow:
		s.px.setDelay(f.Latency)
		time.Sleep(f.For)
		s.px.setDelay(0)
		return fmt.Sprintf("+%s each way for %s", f.Latency, f.For)
	case faultCtldRestart:
		d, err := s.findDaemon("slurmctld", s.env.SlurmConf)
		if err != nil {
			return err.Error()
		}
		d.stop(syscall.SIGTERM)
		if err := d.restart(); err != nil {
			s.violate("a need served after every fault", "restarting slurmctld: %v", err)
		}
		for deadline := time.Now().Add(time.Minute); s.queue() == nil && time.Now().Before(deadline); {
			time.Sleep(200 * time.Millisecond)
		}
		return fmt.Sprintf("slurmctld pid %d restarted", d.pid)
	case faultSlurmdKill:
		all := s.findDaemons("slurmd", s.env.SlurmConf)
		if len(all) == 0 {
			return "no slurmd found"
		}
		d := all[pick(f.Pick, len(all))]
		d.stop(syscall.SIGKILL)
		if err := d.restart(); err != nil {
			s.violate("a need served after every fault", "restarting slurmd: %v", err)
		}
		return fmt.Sprintf("slurmd pid %d (%s) killed and restarted", d.pid, strings.Join(d.argv[1:], " "))
	case faultScancel:
		q := s.queue()
		var ids []string
		for id, state := range q {
			if state == "RUNNING" || state == "PENDING" {
				ids = append(ids, id)
			}
		}
		if len(ids) == 0 {
			return "no job to cancel"
		}
		sort.Strings(ids)
		id := ids[pick(f.Pick, len(ids))]
		out, err := s.env.Command("scancel", id).CombinedOutput()
		return fmt.Sprintf("scancel %s (%s): %v %s", id, q[id], err, bytes.TrimSpace(out))
	case faultWorkerKill:
		pids := pidsOf(s.workerBin)
		if len(pids) == 0 {
			return "no worker to kill"
		}
		pid := pids[pick(f.Pick, len(pids))]
		syscall.Kill(pid, syscall.SIGKILL)
		return fmt.Sprintf("killed worker pid %d", pid)
	}
	return "unknown fault"
}

// daemon is a sandbox daemon as /proc shows it, enough to start it again
// the way sandbox/up.sh did: its executable, argv, environment, working
// directory and the log its stderr went to.
type daemon struct {
	pid  int
	exe  string
	argv []string
	env  []string
	cwd  string
	log  string
}

// findDaemons lists the processes whose executable is named name and
// whose command line mentions mark (the sandbox's slurm.conf or its dir),
// so that another sandbox's daemons are never touched. Children sshd
// forks for sessions rename themselves and do not match.
func (s *soak) findDaemons(name, mark string) []*daemon {
	ents, _ := os.ReadDir("/proc")
	var out []*daemon
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if err != nil {
			continue
		}
		// The name it was started by: Debian's slurmd is
		// /usr/sbin/slurmd-wlm behind an alternatives link.
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if filepath.Base(exe) != name && strings.TrimSpace(string(comm)) != name {
			continue
		}
		cl, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !bytes.Contains(cl, []byte(mark)) {
			continue
		}
		d := &daemon{pid: pid, exe: exe, argv: strings.Split(strings.TrimRight(string(cl), "\x00"), "\x00")}
		if len(d.argv) == 1 {
			// A title set by the daemon (sshd's "sshd: /usr/sbin/sshd -f
			// FILE -E LOG [listener] ..."): its argv, space-separated,
			// between the name and the bracket.
			title := d.argv[0]
			if _, rest, ok := strings.Cut(title, ": "); ok {
				title = rest
			}
			if i := strings.Index(title, " ["); i >= 0 {
				title = title[:i]
			}
			d.argv = strings.Fields(title)
		}
		if env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid)); err == nil {
			d.env = strings.Split(strings.TrimRight(string(env), "\x00"), "\x00")
		}
		d.cwd, _ = os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
		d.log, _ = os.Readlink(fmt.Sprintf("/proc/%d/fd/2", pid))
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return strings.Join(out[i].argv, " ") < strings.Join(out[j].argv, " ") })
	return out
}

func (s *soak) findDaemon(name, mark string) (*daemon, error) {
	all := s.findDaemons(name, mark)
	if len(all) == 0 {
		return nil, fmt.Errorf("no %s of the sandbox found", name)
	}
	return all[0], nil
}

// stop signals the daemon and waits (up to 30 s) until it is gone.
func (d *daemon) stop(sig syscall.Signal) {
	syscall.Kill(d.pid, sig)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", d.pid))
		if err != nil {
			return
		}
		if i := bytes.LastIndexByte(st, ')'); i > 0 && len(st) > i+2 && st[i+2] == 'Z' {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// restart starts the daemon as it was started; it forks into the
// background itself, so this returns once it has.
func (d *daemon) restart() error {
	// Started by the name it was started by (slurmd, not the
	// slurmd-wlm it resolves to), so that its comm, which
	// sandbox/status.sh checks, is what it was.
	path := d.exe
	if p, err := exec.LookPath(d.argv[0]); err == nil && filepath.IsAbs(p) {
		path = p
	}
	argv := append([]string{path}, d.argv[1:]...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Args = argv
	cmd.Env, cmd.Dir = d.env, d.cwd
	if d.log != "" && strings.HasPrefix(d.log, "/") {
		if f, err := os.OpenFile(d.log, os.O_WRONLY|os.O_APPEND, 0); err == nil {
			defer f.Close()
			cmd.Stdout, cmd.Stderr = f, f
		}
	}
	cmd.WaitDelay = 10 * time.Second
	var out []byte
	var err error
	if cmd.Stdout != nil {
		err = cmd.Run()
	} else {
		out, err = cmd.CombinedOutput()
	}
	if err != nil {
		return fmt.Errorf("%s: %v %s", strings.Join(argv, " "), err, out)
	}
	return nil
}
