package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"

	"github.com/fluksio/provision/shared"
)

// Restart backoff for a plugin that exits on its own: the first restart
// after a second, doubling to two minutes, and back to a second once a
// plugin has stayed up for stableAfter. A plugin that crashes at start
// keeps failing slowly rather than spinning.
var (
	restartMin  = time.Second
	restartMax  = 2 * time.Minute
	stableAfter = time.Minute
)

// supervisor keeps one provisioner's plugin running: it launches and
// configures it, and when the process exits without being asked to, it
// marks the provisioner down, starts a new process with backoff and
// configures it again. go-plugin never restarts anything, and a dead
// plugin that nobody notices is the failure its users complain of most.
type supervisor struct {
	cfg     *provisionerConfig
	logger  hclog.Logger
	opts    launchOptions
	onUp    func(Target)      // a (re)started plugin is configured and ready
	onDown  func(name string) // the plugin exited; calls would fail
	restart bool              // restart after an unexpected exit

	mu       sync.Mutex // guards everything below
	current  *shared.Plugin
	lastExit *shared.ExitStatus
	restarts int
	stopping bool
	state    string // "running", "restarting", "stopped", "failed: …"

	wg   sync.WaitGroup // the watch goroutine
	stop chan struct{}  // closed by shutdown
}

func newSupervisor(cfg *provisionerConfig, logger hclog.Logger, opts launchOptions) *supervisor {
	opts.configure = true
	return &supervisor{cfg: cfg, logger: logger, opts: opts, restart: true, stop: make(chan struct{}), state: "starting"}
}

// start launches and configures the plugin the first time. Configuration
// problems come back as diagnostics against the config file; a first
// start that fails is not retried, because the operator is watching.
func (s *supervisor) start(ctx context.Context) hcl.Diagnostics {
	l, diags := s.launch(ctx)
	if diags.HasErrors() {
		if l != nil {
			l.plugin.Kill()
		}
		return diags
	}
	s.wg.Add(1)
	go s.watch(l.plugin)
	return diags
}

// launch starts a process, configures it and publishes its shapes.
func (s *supervisor) launch(ctx context.Context) (*launched, hcl.Diagnostics) {
	l, diags := resolveProvisioner(ctx, s.cfg, s.opts)
	if diags.HasErrors() {
		return l, diags
	}
	p := l.plugin.Provisioner()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cr, err := p.Configure(cctx, &shared.ConfigureRequest{Name: s.cfg.Name, Config: l.json,
		EngineID: s.opts.engineID, CredentialEpoch: s.opts.epoch})
	if err != nil {
		return l, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Plugin could not be configured",
			Detail: err.Error() + ".", Subject: s.cfg.DefRange.Ptr()}}
	}
	diags = append(diags, shared.ConfigDiagnostics(s.cfg.Body, l.schema, cr.Diagnostics)...)
	if diags.HasErrors() {
		return l, diags
	}
	sr, err := p.Shapes(cctx, &shared.ShapesRequest{})
	if err != nil {
		return l, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Plugin did not list its shapes",
			Detail: err.Error() + ".", Subject: s.cfg.DefRange.Ptr()}}
	}
	s.mu.Lock()
	s.current, s.state = l.plugin, "running"
	s.mu.Unlock()
	s.onUp(Target{Name: s.cfg.Name, P: p, Shapes: sr.Shapes})
	return l, diags
}

// watch waits for the process to end and, unless it was asked to, starts
// another.
func (s *supervisor) watch(p *shared.Plugin) {
	defer s.wg.Done()
	backoff := restartMin
	for {
		started := time.Now()
		select {
		case <-p.Exited():
		case <-s.stop:
			return
		}
		exit := p.ExitStatus()
		s.mu.Lock()
		if s.stopping {
			s.mu.Unlock()
			return
		}
		s.lastExit, s.state = exit, "restarting"
		s.mu.Unlock()
		s.onDown(s.cfg.Name)
		s.logger.Error("plugin exited unexpectedly", "status", exit.String(), "stderr_tail", tail(exit.Stderr, 5))
		if !s.restart {
			s.setState("failed: " + exit.String())
			return
		}
		if time.Since(started) >= stableAfter {
			backoff = restartMin
		}
		for {
			s.logger.Info("restarting plugin", "in", backoff)
			select {
			case <-time.After(backoff):
			case <-s.stop:
				return
			}
			backoff = min(backoff*2, restartMax)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			l, diags := s.launch(ctx)
			cancel()
			if !diags.HasErrors() {
				s.mu.Lock()
				s.restarts++
				s.mu.Unlock()
				s.logger.Info("plugin restarted", "pid", l.plugin.Pid())
				p = l.plugin
				break
			}
			if l != nil {
				l.plugin.Kill()
			}
			s.logger.Error("restart failed", "error", diags.Error())
		}
	}
}

func (s *supervisor) setState(st string) {
	s.mu.Lock()
	s.state = st
	s.mu.Unlock()
}

// provisioner is the current plugin's client, or nil while it is down.
func (s *supervisor) provisioner() shared.Provisioner {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.current == nil || s.state != "running" {
		return nil
	}
	return s.current.Provisioner()
}

// status is this provisioner as GET /status shows it.
func (s *supervisor) status(ctx context.Context) ProvisionerStatus {
	s.mu.Lock()
	ps := ProvisionerStatus{Name: s.cfg.Name, Kind: s.cfg.Kind, Process: s.state}
	if s.lastExit != nil {
		ps.Process = fmt.Sprintf("%s (restarts: %d, last exit: %s)", s.state, s.restarts, s.lastExit)
		ps.LastExitStderr = tail(s.lastExit.Stderr, 10)
	}
	cur := s.current
	running := s.state == "running"
	s.mu.Unlock()
	if cur == nil || !running {
		ps.Error = "the plugin is not running"
		return ps
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := cur.Provisioner().Status(ctx, &shared.StatusRequest{})
	if err != nil {
		ps.Error = err.Error()
		return ps
	}
	ps.Status = st
	return ps
}

// shutdown asks the provisioner to cancel what is outstanding, then ends
// the process, and stops restarting it.
func (s *supervisor) shutdown(ctx context.Context) (*shared.ShutdownResponse, error) {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return &shared.ShutdownResponse{}, nil
	}
	s.stopping = true
	cur := s.current
	s.mu.Unlock()
	close(s.stop)
	s.wg.Wait()
	defer s.setState("stopped")
	if cur == nil {
		return &shared.ShutdownResponse{}, nil
	}
	resp, err := cur.Stop(ctx)
	if errors.Is(err, shared.ErrPluginGone) {
		err = fmt.Errorf("the plugin was gone before it could cancel its jobs (%s): %w", cur.ExitStatus(), err)
	}
	return resp, err
}

func tail(lines []string, n int) []string {
	if len(lines) > n {
		return lines[len(lines)-n:]
	}
	return lines
}
