package sshrun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sync"
)

// Session is one command left running on a login node, its input and
// output the caller's (the Slurm plugin's relay). Its ssh is the
// Session's: Close ends it and waits for it, and the Transport's Close
// closes every Session still open.
type Session struct {
	// Login is the login node it runs on.
	Login Login
	// Stdin is the command's standard input; Close closes it.
	Stdin io.WriteCloser
	// Stdout is the command's standard output.
	Stdout io.Reader

	t      *Transport
	cancel context.CancelFunc
	once   sync.Once
	// exited is closed once ssh has exited and err is set.
	exited chan struct{}
	err    error
}

// Start runs remote on a login node and leaves it running: on the login
// the last command got through to, unless it is skipped now, else the
// first in order; through its shared connection when multiplexing. ssh's
// stderr goes to stderr. It takes none of the MaxSessions slots, which
// are for commands that end. The Session ends when ctx does, or at
// Close, whichever comes first; Start after Close is refused.
func (t *Transport) Start(ctx context.Context, stderr io.Writer, remote ...string) (*Session, error) {
	logins := t.cfg.Logins
	if len(remote) == 0 || len(logins) == 0 {
		return nil, fmt.Errorf("ssh to %s: no remote command, or no login node to run it on", t.host())
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, errors.New("ssh to " + t.host() + ": the connection is closed (shutting down)")
	}
	t.starting.Add(1)
	t.mu.Unlock()
	defer t.starting.Done()

	i := t.logins.current(len(logins), t.cfg.Now())
	if i < 0 {
		return nil, t.logins.held(remote[0], logins)
	}
	ctx, cancel := context.WithCancel(ctx)
	cmd := exec.CommandContext(ctx, t.program, t.argv(logins[i], muxOptions(t.controlSocket(i)), t.proxyInUse(), remote)...)
	cmd.WaitDelay = WaitDelay
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, err
	}
	s := &Session{Login: logins[i], Stdin: stdin, Stdout: stdout, t: t, cancel: cancel, exited: make(chan struct{})}
	go func() {
		s.err = cmd.Wait()
		close(s.exited)
	}()
	t.mu.Lock()
	t.sessions[s] = struct{}{}
	t.mu.Unlock()
	return s, nil
}

// Done is closed once ssh has exited.
func (s *Session) Done() <-chan struct{} { return s.exited }

// Err is how ssh exited; nil until Done is closed.
func (s *Session) Err() error {
	select {
	case <-s.exited:
		return s.err
	default:
		return nil
	}
}

// Close closes the command's input, ends ssh and waits for it (a killed
// ssh may hold its output open for WaitDelay). It may be called more than
// once, from any goroutine.
func (s *Session) Close() {
	s.once.Do(func() {
		s.Stdin.Close()
		s.cancel()
	})
	<-s.exited
	s.t.mu.Lock()
	delete(s.t.sessions, s)
	s.t.mu.Unlock()
}
