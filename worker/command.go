package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fluksio/provision/shared"
)

// The variables a command finds in its environment beside the worker's
// own and Task.Env.
const (
	// TaskIDEnv is the engine's id of the task (Task.Name), the same on
	// every attempt.
	TaskIDEnv = "FLUKSIO_TASK_ID"
	// TaskDirEnv is the task's directory on the node: the command's
	// working directory, where its inputs are and its outputs go.
	TaskDirEnv = "FLUKSIO_TASK_DIR"
)

// runCommand runs a command task: a fresh directory, its inputs fetched
// into it and checked, the command run there in a process group of its
// own with its stdout and stderr streamed to the engine, its outputs
// uploaded, and what became of it. It returns the result and the
// directory, which the caller removes once the result is sent.
//
// A stop (st) kills the command's group, SIGTERM then SIGKILL after
// cfg.KillGrace; so does the command's own end, for whatever it left
// running in its group. After a cancel, or when the worker is leaving,
// nothing more is sent.
func (w *Client) runCommand(ctx context.Context, t Task, st *stopper) (res ResultRequest, dir string) {
	res = w.resultFor(t)
	if err := checkCommandTask(t); err != nil {
		failed(&res, err)
		return res, ""
	}
	dir, err := os.MkdirTemp(w.cfg.workDir, "fluksio-task-")
	if err != nil {
		failed(&res, fmt.Errorf("could not make the task's directory (under $TMPDIR, %s): %w", w.cfg.workDir, err))
		return res, ""
	}
	if err := w.fetchInputs(st.transfers, t, dir); err != nil {
		if reason, why := st.why(); reason != notStopped {
			res.State, res.Error = stateFor(reason), why
			return res, dir
		}
		failed(&res, err)
		return res, dir
	}

	cmd, streams, err := startCommand(t, commandEnv(w.cfg.environ, w.cfg.token, t, dir), dir)
	if err != nil {
		failed(&res, err)
		return res, dir
	}
	waitErr := w.execute(t, st, cmd, streams, &res)
	if reason := w.judge(st, cmd, waitErr, &res); reason.dropsTransfers() {
		return res, dir
	}
	w.upload(t, st, dir, &res)
	return res, dir
}

// failed marks res failed, adding err to what it says.
func failed(res *ResultRequest, err error) {
	res.State = StateFailed
	res.Error = joinErrors(res.Error, err.Error())
}

// execute runs the started cmd to its end, its streams sent as they
// fill, and records in res when it started and ended and what its
// streams sent; it returns what waiting for cmd returned.
func (w *Client) execute(t Task, st *stopper, cmd *exec.Cmd, streams []*logStream, res *ResultRequest) error {
	res.Started = time.Now()
	w.log.Printf("%s: started %q as process group %d in %s", t.label(), t.Command[0], cmd.Process.Pid, cmd.Dir)
	var streaming sync.WaitGroup
	for _, s := range streams {
		streaming.Go(func() { w.stream(t, st, s) })
	}
	waitErr := w.supervise(t, st, cmd)
	res.Ended = time.Now()
	drained := make(chan struct{})
	go func() { streaming.Wait(); close(drained) }()
	w.drain(t.ID, streams, drained)
	for _, s := range streams {
		s.r.Close()
	}
	res.Stdout, res.Stderr = streams[0].sent, streams[1].sent
	return waitErr
}

// judge sets res's exit code, signal and state from how cmd ended and
// whether the worker stopped it, and returns why it was stopped
// (notStopped when it was not).
func (w *Client) judge(st *stopper, cmd *exec.Cmd, waitErr error, res *ResultRequest) stopReason {
	res.ExitCode, res.Signal = exitOf(cmd.ProcessState)
	if r, _ := st.why(); r == notStopped && res.Signal != "" {
		// Killed by a signal the worker did not send: most often its job
		// ending (scancel, the walltime), which signals every process of
		// the job at once, the command sometimes first. The worker's own
		// signal follows within moments, and then the task is its lost
		// machine's, to run again, not a failure of its command.
		t := time.NewTimer(outsideSignalWait)
		select {
		case <-st.done():
		case <-t.C:
		}
		t.Stop()
	}
	reason, why := st.why()
	switch {
	case reason != notStopped:
		res.State, res.Error = stateFor(reason), why
	case cmd.ProcessState == nil:
		failed(res, fmt.Errorf("could not wait for the command: %w", waitErr))
	case res.Signal != "":
		failed(res, fmt.Errorf("the command was killed by %s", res.Signal))
	case *res.ExitCode != 0:
		failed(res, fmt.Errorf("the command exited with %d", *res.ExitCode))
	default:
		res.State = StateSucceeded
	}
	return reason
}

// upload sends t's outputs from dir and records them in res; a failed
// upload fails the task, unless it was cancelled or lost meanwhile,
// which is then how it ended, or timed out, which it stays.
func (w *Client) upload(t Task, st *stopper, dir string, res *ResultRequest) {
	outputs, notes, err := w.uploadOutputs(st.transfers, t, dir)
	res.Outputs = outputs
	res.Output = strings.Join(notes, "\n")
	if err == nil {
		return
	}
	if reason, why := st.why(); reason.dropsTransfers() {
		res.State, res.Error = stateFor(reason), why
		return
	}
	if res.State != StateTimedOut { // timed out, whatever else went wrong
		res.State = StateFailed
	}
	res.Error = joinErrors(res.Error, err.Error())
}

// startCommand starts t's command in dir with env, in a process group
// of its own, stdin from /dev/null, and returns it with its stdout and
// stderr to be read.
func startCommand(t Task, env []string, dir string) (*exec.Cmd, []*logStream, error) {
	argv0, err := lookPath(t.Command[0], env)
	if err != nil {
		return nil, nil, err
	}
	stdout, stdoutW, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("could not run the command: %w", err)
	}
	stderr, stderrW, err := os.Pipe()
	if err != nil {
		stdout.Close()
		stdoutW.Close()
		return nil, nil, fmt.Errorf("could not run the command: %w", err)
	}
	cmd := &exec.Cmd{
		Path: argv0, Args: t.Command, Env: env, Dir: dir,
		// Stdin nil is /dev/null. The pipes' write ends are the
		// command's alone once it has started.
		Stdout: stdoutW, Stderr: stderrW,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	err = cmd.Start()
	stdoutW.Close()
	stderrW.Close()
	if err != nil {
		stdout.Close()
		stderr.Close()
		return nil, nil, fmt.Errorf("could not run %q: %w", t.Command[0], err)
	}
	return cmd, []*logStream{{name: StreamStdout, r: stdout}, {name: StreamStderr, r: stderr}}, nil
}

// supervise waits for cmd to exit, stopping its group at st's stop or
// at t's timeout (which is one), and then stops what it left running in
// its group, so that nothing of the task outlives it on the node. It
// returns cmd.Wait's error.
func (w *Client) supervise(t Task, st *stopper, cmd *exec.Cmd) error {
	grp := group{pgid: cmd.Process.Pid, grace: w.cfg.KillGrace}
	defer grp.stop()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var timeout <-chan time.Time
	limit := seconds(t.TimeoutSeconds)
	if limit > 0 {
		timer := time.NewTimer(limit)
		defer timer.Stop()
		timeout = timer.C
	}
	var waitErr error
	for stopping, done := st.done(), false; !done; {
		select {
		case waitErr = <-exited:
			done = true
		case <-timeout:
			timeout = nil
			st.stop(stopTimeout, fmt.Sprintf("the command outlived its timeout of %s", limit))
		case <-stopping:
			stopping = nil
			_, why := st.why()
			w.log.Printf("%s: %s; stopping process group %d", t.label(), why, grp.pgid)
			grp.terminate()
		case <-grp.killC:
			grp.kill()
		}
	}
	if left := grp.finish(); left {
		w.log.Printf("%s: process group %d still has processes after SIGKILL", t.label(), grp.pgid)
	}
	return waitErr
}

// joinErrors is a task's errors in words, one after the other.
func joinErrors(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// seconds is a task's number of seconds as a duration, zero for none
// (zero, negative or not a number) and at most a year.
func seconds(s float64) time.Duration {
	if !(s > 0) {
		return 0
	}
	return time.Duration(min(s, 365*24*3600) * float64(time.Second))
}

// stateFor is the state of a task stopped for r.
func stateFor(r stopReason) TaskState {
	switch r {
	case stopCancel:
		return StateCancelled
	case stopTimeout:
		return StateTimedOut
	}
	return StateFailed
}

// outsideSignalWait is how long a worker whose command was killed by a
// signal it did not send waits for a signal of its own before it
// reports the task failed.
const outsideSignalWait = 2 * time.Second

// exitOf is how a command ended: its exit code, or the name of the
// signal that killed it; neither when it was not waited for.
func exitOf(ps *os.ProcessState) (code *int, signal string) {
	if ps == nil {
		return nil, ""
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		name := unix.SignalName(ws.Signal())
		if name == "" {
			name = fmt.Sprintf("signal %d", int(ws.Signal()))
		}
		return nil, name
	}
	c := ps.ExitCode()
	return &c, ""
}

// drainRounds bounds how many grace periods drain waits for streams
// that a process outside the command's group keeps writing to.
const drainRounds = 6

// drain waits, once the command's group is gone, for its streams to
// end (drained closes) and be sent. A pipe ends when the last process
// holding it does, and one that left the group (setsid) may hold it
// for ever: a stream that has waited in Read a whole grace period with
// nothing coming is closed under it, and every stream after
// drainRounds periods. One still sending what it read is not: its
// bytes are the command's.
func (w *Client) drain(id string, streams []*logStream, drained <-chan struct{}) {
	last := make([]int64, len(streams))
	for i, s := range streams {
		last[i] = s.got.Load()
	}
	tick := time.NewTicker(w.cfg.KillGrace)
	defer tick.Stop()
	for round := 1; ; round++ {
		select {
		case <-drained:
			return
		case <-tick.C:
		}
		for i, s := range streams {
			got := s.got.Load()
			if (s.reading.Load() && got == last[i]) || round >= drainRounds {
				w.log.Printf("%s: a process outside the command's group holds its %s; closing it", id, s.name)
				s.r.Close()
			}
			last[i] = got
		}
	}
}

// checkCommandTask says what is wrong with a command task before
// anything of it is done on the node: its command, the names of its
// inputs and outputs, its environment.
func checkCommandTask(t Task) error {
	if len(t.Command) == 0 || t.Command[0] == "" {
		return errors.New("the task requires the command feature but has no command")
	}
	if !(t.TimeoutSeconds >= 0) {
		return fmt.Errorf("timeout_seconds is %v; zero (none) or a positive number of seconds", t.TimeoutSeconds)
	}
	seen := map[string]bool{}
	for _, in := range t.Inputs {
		if err := checkName(in.Name); err != nil {
			return fmt.Errorf("input %q: %w", in.Name, err)
		}
		if seen[in.Name] {
			return fmt.Errorf("input %q is listed twice", in.Name)
		}
		seen[in.Name] = true
		if in.Size < 0 {
			return fmt.Errorf("input %q has a negative size", in.Name)
		}
	}
	for _, out := range t.Outputs {
		if err := checkName(out); err != nil {
			return fmt.Errorf("output %q: %w", out, err)
		}
	}
	for k, v := range t.Env {
		switch {
		case k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0):
			return fmt.Errorf("env %q: a variable's name may not be empty or hold '=' or NUL, nor its value NUL", k)
		case isCredentialVar(k):
			return fmt.Errorf("env %q: the worker's credential variable is not the task's to set", k)
		case k == TaskIDEnv || k == TaskDirEnv:
			return fmt.Errorf("env %q: the worker sets it", k)
		}
	}
	return nil
}

// checkName says what is wrong with the name of a task's file (an input
// or an output), or nil: a path relative to the task's directory,
// slash-separated and clean, with no ".." element.
func checkName(name string) error {
	switch {
	case name == "" || name == ".":
		return errors.New("a file's name must name a path inside the task's directory")
	case strings.HasPrefix(name, "/"):
		return errors.New("an absolute path; name it relative to the task's directory")
	case slices.Contains(strings.Split(name, "/"), ".."):
		return errors.New(`a ".." element would leave the task's directory; name a path inside it`)
	case strings.ContainsRune(name, 0):
		return errors.New("a NUL byte in a file's name")
	case path.Clean(name) != name:
		return fmt.Errorf("not a clean path; name it %q", path.Clean(name))
	}
	return nil
}

// isCredentialVar reports whether an environment variable is the
// worker's credential, or one of a multi-node job's (the batch script
// exports one per node as FLUKSIO_WORKER_TOKEN_<i>).
func isCredentialVar(name string) bool {
	return name == shared.WorkerTokenEnv || strings.HasPrefix(name, shared.WorkerTokenEnv+"_")
}

// commandEnv is a command's environment: the worker's (environ) without
// the credential's variables or any variable holding the credential,
// then Task.Env, then TaskIDEnv and TaskDirEnv. SLURM_* variables pass
// through, so a command sees its allocation as the worker does.
func commandEnv(environ []string, token string, t Task, dir string) []string {
	env := make([]string, 0, len(environ)+len(t.Env)+2)
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		_, overridden := t.Env[k]
		if isCredentialVar(k) || (token != "" && strings.TrimSpace(v) == token) ||
			overridden || k == TaskIDEnv || k == TaskDirEnv {
			continue
		}
		env = append(env, kv)
	}
	keys := make([]string, 0, len(t.Env))
	for k := range t.Env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		env = append(env, k+"="+t.Env[k])
	}
	id := t.Name
	if id == "" {
		id = t.ID
	}
	return append(env, TaskIDEnv+"="+id, TaskDirEnv+"="+dir)
}

// lookPath finds a command's program: a name with a slash as it is
// (relative to the task's directory), else in the PATH of the command's
// own environment, whose relative entries are skipped, as the shell's
// are not, so that nothing in the task's directory runs by a bare name.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	pathVar := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathVar = v
		}
	}
	for _, d := range filepath.SplitList(pathVar) {
		if !filepath.IsAbs(d) {
			continue
		}
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("could not run %q: not found in the command's PATH (%s); name it with its path", name, pathVar)
}

// group is a command's process group (its pgid is the command's pid,
// Setpgid), and how it is stopped: SIGTERM to the whole group, SIGKILL
// grace later. It is the runner's alone.
type group struct {
	pgid  int
	grace time.Duration
	// killC fires grace after terminate; nil before.
	killC  <-chan time.Time
	killAt time.Time
	timer  *time.Timer
}

// terminate sends SIGTERM to the group, once, and starts its grace.
func (g *group) terminate() {
	if g.timer != nil {
		return
	}
	_ = syscall.Kill(-g.pgid, syscall.SIGTERM)
	g.killAt = time.Now().Add(g.grace)
	g.timer = time.NewTimer(g.grace)
	g.killC = g.timer.C
}

// kill sends SIGKILL to the group.
func (g *group) kill() {
	g.killC = nil
	_ = syscall.Kill(-g.pgid, syscall.SIGKILL)
}

// stop releases the group's timer.
func (g *group) stop() {
	if g.timer != nil {
		g.timer.Stop()
	}
}

// finish ends what is left of the group once its leader has exited:
// SIGTERM (unless it was sent already), SIGKILL when the grace runs out,
// and it returns once no process of the group is alive, or reports
// that some still is a while after SIGKILL (a process stuck in the
// kernel). There is no event for a group emptying, so it looks, at
// widening intervals.
func (g *group) finish() (left bool) {
	look := 5 * time.Millisecond
	pause := func() {
		time.Sleep(look)
		look = min(2*look, 200*time.Millisecond)
	}
	if !groupAlive(g.pgid) {
		return false
	}
	g.terminate()
	for groupAlive(g.pgid) {
		if !time.Now().Before(g.killAt) {
			g.kill()
			break
		}
		pause()
	}
	for deadline := time.Now().Add(afterKill); groupAlive(g.pgid); pause() {
		if !time.Now().Before(deadline) {
			return true
		}
	}
	return false
}

// afterKill is how long finish waits for a group to die after SIGKILL,
// which cannot be caught: only a process stuck in the kernel outlives it.
const afterKill = 2 * time.Second
