package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"

	doubling "github.com/fluksio/provision/internal/backoff"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/shared/hclconfig"
	"github.com/fluksio/provision/shared/host"
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
	// wedgeAfter is how many calls in a row may miss their deadline
	// before the plugin is restarted; newSupervisor sets the default.
	wedgeAfter int

	cfg     *provisionerConfig
	logger  hclog.Logger
	opts    launchOptions
	onUp    func(Target)      // a (re)started plugin is configured and ready
	onDown  func(name string) // the plugin exited; calls would fail
	restart bool              // restart after an unexpected exit

	mu       sync.Mutex // guards everything below
	current  *host.Plugin
	lastExit *host.ExitStatus
	restarts int
	// misses counts calls in a row that missed their deadline; wedged
	// says why the last process was killed for it, for GET /status.
	misses   int
	wedged   string
	stopping bool
	state    string // "running", "restarting", "stopped", "failed: …"

	// shutResp and shutErr are the outcome of the one shutdown; shutDone
	// is closed once they are set, so that a second caller waits for the
	// first instead of returning "nothing cancelled" while it works.
	shutResp *shared.ShutdownResponse
	shutErr  error
	shutDone chan struct{}

	wg   sync.WaitGroup // the watch goroutine
	stop chan struct{}  // closed by shutdown
	// life bounds a restart the watch goroutine has begun; shutdown
	// cancels it when its own deadline passes, so that waiting for the
	// watch goroutine never outlasts the shutdown.
	life       context.Context
	cancelLife context.CancelFunc
}

func newSupervisor(cfg *provisionerConfig, logger hclog.Logger, opts launchOptions) *supervisor {
	opts.configure = true
	life, cancel := context.WithCancel(context.Background())
	return &supervisor{wedgeAfter: defaultWedgeAfter, cfg: cfg, logger: logger, opts: opts, restart: true, stop: make(chan struct{}), state: "starting",
		shutDone: make(chan struct{}), life: life, cancelLife: cancel}
}

// start launches and configures the plugin the first time. Configuration
// problems come back as diagnostics against the config file; a first
// start that fails is not retried, because the operator is watching.
func (s *supervisor) start(ctx context.Context) hcl.Diagnostics {
	l, diags := s.launch(ctx, true)
	if diags.HasErrors() {
		if l != nil {
			l.plugin.Kill()
		}
		return diags
	}
	s.mu.Lock()
	if s.stopping {
		// A shutdown began while this plugin started; it may have found
		// nothing to stop, so this plugin is stopped here.
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = l.plugin.Stop(ctx)
		return diags
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go s.watch(l.plugin)
	return diags
}

// launch starts a process, configures it and, with publish, publishes
// its shapes to the placer. A launch made only to cancel at shutdown does
// not publish, so that nothing new is asked of it.
func (s *supervisor) launch(ctx context.Context, publish bool) (*launched, hcl.Diagnostics) {
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
	diags = append(diags, hclconfig.ConfigDiagnostics(s.cfg.Body, l.schema, cr.Diagnostics)...)
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
	if publish {
		s.onUp(Target{Name: s.cfg.Name, P: p, Shapes: sr.Shapes})
	}
	return l, diags
}

// watch waits for the process to end and, unless it was asked to, starts
// another.
func (s *supervisor) watch(p *host.Plugin) {
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
			backoff = doubling.Next(backoff, restartMax)
			ctx, cancel := context.WithTimeout(s.life, time.Minute)
			l, diags := s.launch(ctx, true)
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

// defaultWedgeAfter is how many calls in a row may miss their deadline before
// the plugin is taken for wedged and restarted.
const defaultWedgeAfter = 3

// deadline records whether a call to the plugin answered in time. After
// wedgeAfter misses in a row the plugin is marked wedged and its process
// killed; the watch goroutine then restarts it as after any exit.
func (s *supervisor) deadline(call string, missed bool) {
	s.mu.Lock()
	if !missed {
		s.misses = 0
		s.mu.Unlock()
		return
	}
	s.misses++
	if s.misses < s.wedgeAfter || s.state != "running" || s.stopping || s.current == nil {
		s.mu.Unlock()
		return
	}
	s.misses = 0
	s.wedged = fmt.Sprintf("wedged: %d calls in a row missed their deadline, the last a %s; killed to restart it", s.wedgeAfter, call)
	s.state = "wedged"
	cur := s.current
	s.mu.Unlock()
	s.logger.Error("plugin wedged; killing it so that it restarts", "missed_calls", s.wedgeAfter, "last", call)
	// Kill waits for the process to be gone, which takes as long as the
	// plugin takes to die; the caller is a per-plugin goroutine.
	cur.Kill()
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
	if s.wedged != "" {
		ps.Process += "; last " + s.wedged
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
// the process, and stops restarting it. Whatever state the plugin is in,
// its jobs are cancelled: a plugin that is dead, or waiting out its
// restart delay, is started again (and so adopts its jobs from the queue)
// only to be asked to cancel them, and a restart under way is waited for
// and its new process stopped. Every wait is bounded by ctx. A second
// caller waits for the first one's outcome.
func (s *supervisor) shutdown(ctx context.Context) (*shared.ShutdownResponse, error) {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		select {
		case <-s.shutDone:
			return s.shutResp, s.shutErr
		case <-ctx.Done():
			return nil, fmt.Errorf("provisioner %s: its shutdown was still under way when this caller's deadline passed", s.cfg.Name)
		}
	}
	s.stopping = true
	s.mu.Unlock()
	resp, err := s.shutdownOnce(ctx)
	s.mu.Lock()
	s.shutResp, s.shutErr, s.state = resp, err, "stopped"
	s.mu.Unlock()
	close(s.shutDone)
	return resp, err
}

func (s *supervisor) shutdownOnce(ctx context.Context) (*shared.ShutdownResponse, error) {
	close(s.stop)
	watched := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(watched)
	}()
	select {
	case <-watched:
	case <-ctx.Done():
		// A restart is taking longer than the shutdown may: give it up.
		// The watch goroutine kills what it had started.
		s.cancelLife()
		<-watched
	}
	defer s.cancelLife()

	s.mu.Lock()
	cur, lastExit := s.current, s.lastExit
	s.mu.Unlock()
	if cur == nil {
		// It never started, so it never asked for anything.
		return &shared.ShutdownResponse{}, nil
	}
	if gone(cur) {
		s.logger.Warn("the plugin is not running at shutdown; starting it again to cancel its jobs", "last_exit", cur.ExitStatus().String())
		l, diags := s.launch(ctx, false)
		if diags.HasErrors() {
			if l != nil {
				l.plugin.Kill()
			}
			why := "it exited"
			if lastExit != nil {
				why = "it exited (" + lastExit.String() + ")"
			}
			return nil, fmt.Errorf("provisioner %s could not cancel its jobs: %s and could not be started again to cancel them (%s); look for its jobs with squeue and cancel them with scancel",
				s.cfg.Name, why, diags.Error())
		}
		cur = l.plugin
	}
	resp, err := cur.Stop(ctx)
	if errors.Is(err, shared.ErrPluginGone) {
		err = fmt.Errorf("the plugin was gone before it could cancel its jobs (%s): %w", cur.ExitStatus(), err)
	}
	return resp, err
}

// gone reports whether the plugin's process has exited.
func gone(p *host.Plugin) bool {
	select {
	case <-p.Exited():
		return true
	default:
		return false
	}
}

func tail(lines []string, n int) []string {
	if len(lines) > n {
		return lines[len(lines)-n:]
	}
	return lines
}
