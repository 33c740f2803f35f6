package supervise

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"

	"github.com/fluksio/provision/engine/host"
	doubling "github.com/fluksio/provision/internal/backoff"
	"github.com/fluksio/provision/shared"
)

// Restart backoff for a plugin that exits on its own: the first restart
// after a second, doubling to two minutes, and back to a second once a
// plugin has stayed up for stableAfter. A plugin that crashes at start
// keeps failing slowly rather than spinning.
const (
	restartMin  = time.Second
	restartMax  = 2 * time.Minute
	stableAfter = time.Minute
)

// Supervisor keeps one provisioner's plugin running: it launches and
// configures it, and when the process exits without being asked to, it
// marks the provisioner down, starts a new process with backoff and
// configures it again: go-plugin never restarts anything. It restarts on
// the process's exit, the one certain signal that a plugin is gone.
//
// What it will not restart: a launch that fails for a reason another
// launch cannot fix (UnfixableError: the binary no longer matches its
// pin, speaks another protocol version, or is of another kind). It logs
// one error that says which and what to do, and the phase becomes
// host.PhaseFailed; retrying every two minutes would only bury that
// line. A crash, a hang or a configuration the plugin refuses is
// retried: a node's disk may come back, and only the plugin knows its
// own words.
type Supervisor struct {
	// WedgeAfter is how many calls in a row may miss their deadline
	// before the plugin is restarted; New sets the default. OnUp hears
	// of a (re)started plugin that is configured and ready, with its
	// shapes; OnDown hears that the plugin exited, so calls would fail;
	// OnFailed that it failed for good (host.PhaseFailed, with Err)
	// after a restart, where no caller is waiting to hear it. All three
	// are called without the Supervisor's lock, from the goroutine that
	// starts or watches the plugin. Set them before Start.
	WedgeAfter int
	OnUp       func(Configured)
	OnDown     func(name string)
	OnFailed   func(name string, err error)
	// ReconcileTimeout bounds one Reconcile call; New sets the default.
	ReconcileTimeout time.Duration
	// ReconcileResync bounds the time between two Reconciles that carry
	// the whole attached list to a plugin that takes changes
	// (shared.CapabilityReconcileDelta); zero means
	// host.DefaultReconcileResync. Set it before Start.
	ReconcileResync time.Duration

	// name and kind are the block's labels, which a reload never
	// changes.
	name, kind string
	logger     hclog.Logger
	opts       Options

	mu sync.Mutex // guards everything below
	// cfg is the block the plugin is configured from: the one given to
	// New, or the last Reconfigure applied. A restart configures the
	// new process from it.
	cfg *host.Block
	// schema and config are the current process's schema and the JSON
	// it was configured with; info what its Info said.
	schema   *shared.Schema
	config   json.RawMessage
	info     *shared.InfoResponse
	current  *host.Launched
	lastExit *host.ExitStatus
	restarts int
	// misses counts calls in a row that missed their deadline; wedged
	// says why the last process was killed for it, for Status.
	misses   int
	wedged   string
	stopping bool
	// reconciling says a Reconcile call is under way; the next waits.
	reconciling bool
	// tracker is what the current plugin process was last told of the
	// attached workers (host.AttachedTracker); a new process gets a new
	// one, so its first Reconcile carries the whole list.
	tracker *host.AttachedTracker
	phase   host.Phase
	// failure is why the phase is host.PhaseFailed (an *UnfixableError,
	// or a first start's diagnostics); nil otherwise.
	failure error
	// launches counts launch attempts, for tests that a failure is not
	// retried in a loop.
	launches int

	// shutResp and shutErr are the outcome of the one shutdown; shutDone
	// is closed once they are set, so that a second caller waits for the
	// first instead of returning "nothing cancelled" while it works.
	shutResp *shared.ShutdownResponse
	shutErr  error
	shutDone chan struct{}

	wg    sync.WaitGroup // the watch goroutine
	calls sync.WaitGroup // Reconcile calls under way; Shutdown waits
	stop  chan struct{}  // closed by shutdown
	// life bounds a restart the watch goroutine has begun; shutdown
	// cancels it when its own deadline passes, so that waiting for the
	// watch goroutine never outlasts the shutdown.
	life       context.Context
	cancelLife context.CancelFunc
}

// Configured is a provisioner whose plugin is configured and ready.
type Configured struct {
	Name        string
	Provisioner shared.Provisioner
	Shapes      []shared.Shape
	// Packs: the plugin's workers run as many tasks at once as their
	// machine holds (shared.CapabilityWorkerSlots).
	Packs bool
}

// New returns a Supervisor for the provisioner block b. logger hears the
// Supervisor's own story (exits, restarts); opts.Logger hears the
// plugin's. Nothing runs until Start.
func New(b *host.Block, logger hclog.Logger, opts Options) *Supervisor {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	life, cancel := context.WithCancel(context.Background())
	return &Supervisor{WedgeAfter: defaultWedgeAfter, ReconcileTimeout: defaultReconcileTimeout, OnUp: func(Configured) {}, OnDown: func(string) {}, OnFailed: func(string, error) {}, cfg: b, logger: logger, opts: opts, stop: make(chan struct{}), phase: host.PhaseStarting,
		shutDone: make(chan struct{}), life: life, cancelLife: cancel, name: b.Name, kind: b.Kind}
}

// Start launches and configures the plugin the first time. Configuration
// problems come back as diagnostics against the config file; a first
// start that fails is not retried, because the operator is watching, and
// the phase becomes host.PhaseFailed with the diagnostics as Err.
func (s *Supervisor) Start(ctx context.Context) hcl.Diagnostics {
	l, diags := s.launch(ctx, true)
	if diags.HasErrors() {
		if l != nil {
			l.Kill()
		}
		var err error = diags
		if u := unfixable(s.name, diags); u != nil {
			err = u
		}
		s.fail(err)
		return diags
	}
	s.mu.Lock()
	if s.stopping {
		// A shutdown began while this plugin started; it may have found
		// nothing to stop, so this plugin is stopped here.
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = l.Stop(ctx)
		return diags
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go s.watch(l.Plugin)
	return diags
}

// launch starts a process, configures it and, with publish, publishes
// its shapes to the router. A launch made only to cancel at shutdown does
// not publish, so that nothing new is asked of it.
func (s *Supervisor) launch(ctx context.Context, publish bool) (*host.Launched, hcl.Diagnostics) {
	s.mu.Lock()
	s.launches++
	b := s.cfg
	s.mu.Unlock()
	l, diags := host.LaunchBlock(ctx, b, s.opts.launchConfig())
	if diags.HasErrors() {
		return l, diags
	}
	// Configure holds the plugin's mints to the shapes it lists, before
	// anyone hears it is up and asks it for machines.
	shapes, more := s.configure(ctx, l, b, l.Config)
	diags = append(diags, more...)
	if diags.HasErrors() {
		return l, diags
	}
	s.mu.Lock()
	s.current, s.phase = l, host.PhaseRunning
	s.schema, s.config, s.info = l.Schema, l.Config, l.Info
	s.tracker = host.NewAttachedTracker(l.Info, s.ReconcileResync)
	if publish && s.lastExit != nil {
		// A restart, counted before OnUp hears of it, so that whoever
		// OnUp wakes reads a Status that says so.
		s.restarts++
	}
	s.mu.Unlock()
	if publish {
		packs := shared.HasCapability(l.Info.ContractVersion, l.Info.Capabilities, shared.CapabilityWorkerSlots)
		s.OnUp(Configured{Name: s.name, Provisioner: l.Provisioner(), Shapes: shapes, Packs: packs})
	}
	return l, diags
}

// watch waits for the process to end and, unless it was asked to, starts
// another.
func (s *Supervisor) watch(p *host.Plugin) {
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
		s.lastExit, s.phase = exit, host.PhaseRestarting
		s.mu.Unlock()
		s.OnDown(s.name)
		s.logger.Error("plugin exited unexpectedly", "status", exit.String(), "stderr_tail", tail(exit.Stderr, 5))
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
			ctx, cancel := context.WithTimeout(s.life, s.opts.launchTimeout()+30*time.Second)
			l, diags := s.launch(ctx, true)
			cancel()
			if !diags.HasErrors() {
				s.logger.Info("plugin restarted", "pid", l.Pid())
				p = l.Plugin
				break
			}
			if l != nil {
				l.Kill()
			}
			if u := unfixable(s.name, diags); u != nil {
				// One line, at the one moment it became true; the
				// engine reads the rest from Phase and Err.
				s.logger.Error("plugin failed for good; not restarting it", "error", u.Error())
				if s.fail(u) {
					s.OnFailed(s.name, u)
				}
				return
			}
			s.logger.Error("restart failed", "error", diags.Error())
		}
	}
}

// defaultWedgeAfter is how many calls in a row may miss their deadline before
// the plugin is taken for wedged and restarted.
const defaultWedgeAfter = 3

// Deadline records whether a call to the plugin answered in time. After
// wedgeAfter misses in a row the plugin is marked wedged and its process
// killed; the watch goroutine then restarts it as after any exit.
func (s *Supervisor) Deadline(call string, missed bool) {
	s.mu.Lock()
	if !missed {
		s.misses = 0
		s.mu.Unlock()
		return
	}
	s.misses++
	if s.misses < s.WedgeAfter || s.phase != host.PhaseRunning || s.stopping || s.current == nil {
		s.mu.Unlock()
		return
	}
	s.misses = 0
	s.wedged = fmt.Sprintf("wedged: %d calls in a row missed their deadline, the last a %s; killed to restart it", s.WedgeAfter, call)
	s.phase = host.PhaseWedged
	cur := s.current
	s.mu.Unlock()
	s.logger.Error("plugin wedged; killing it so that it restarts", "missed_calls", s.WedgeAfter, "last", call)
	// Kill waits for the process to be gone, which takes as long as the
	// plugin takes to die; the caller is a per-plugin goroutine.
	cur.Kill()
}

// fail records a failure no restart will fix, unless a shutdown came
// first (stopped says more than failed then); it says whether it did.
func (s *Supervisor) fail(err error) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return false
	}
	s.phase, s.failure = host.PhaseFailed, err
	return true
}

// Phase is where the plugin stands; it takes the lock only to read.
func (s *Supervisor) Phase() host.Phase {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.phase
}

// Err is why the phase is host.PhaseFailed: an *UnfixableError
// (errors.Is finds shared.ErrChecksumMismatch, shared.ErrIncompatible or
// host.ErrKindMismatch), or the first start's diagnostics. Nil in any
// other phase.
func (s *Supervisor) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.phase != host.PhaseFailed {
		return nil
	}
	return s.failure
}

// Provisioner is the current plugin's client, or nil while it is down.
func (s *Supervisor) Provisioner() shared.Provisioner {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.current == nil || s.phase != host.PhaseRunning {
		return nil
	}
	return s.current.Provisioner()
}

// Health says whether the plugin is up (running and configured, so that
// calls to it can succeed) and how many times it has been restarted
// after exiting on its own, for an engine's metrics and readiness. It
// takes the lock only to read, never crosses to the plugin.
func (s *Supervisor) Health() (up bool, restarts int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current != nil && s.phase == host.PhaseRunning, s.restarts
}

// Pid is the plugin process's id while one runs, else 0: an engine that
// trusts loopback tells a plugin's connections (a relay carrying a
// worker's) from a person's with it.
func (s *Supervisor) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.current == nil {
		return 0
	}
	return s.current.Pid()
}

// Status is this provisioner's process and its plugin's own report. The
// plugin is asked with a deadline of two seconds, without the lock.
func (s *Supervisor) Status(ctx context.Context) host.ProvisionerStatus {
	s.mu.Lock()
	ps := host.ProvisionerStatus{Name: s.name, Kind: s.kind, Phase: s.phase, Restarts: s.restarts}
	if s.phase == host.PhaseFailed && s.failure != nil {
		ps.Failure = s.failure.Error()
	}
	if s.lastExit != nil {
		ps.LastExit = s.lastExit.String()
		ps.LastExitStderr = tail(s.lastExit.Stderr, 10)
	}
	ps.Wedged = s.wedged
	ps.Process = processText(ps)
	cur := s.current
	running := s.phase == host.PhaseRunning
	s.mu.Unlock()
	if cur == nil || !running {
		ps.Error = "the plugin is not running"
		if ps.Failure != "" {
			ps.Error = ps.Failure
		}
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

// Shutdown asks the provisioner to cancel what is outstanding, then ends
// the process, and stops restarting it. Whatever state the plugin is in,
// its jobs are cancelled: a plugin that is dead, or waiting out its
// restart delay, is started again (and so adopts its jobs from the queue)
// only to be asked to cancel them, and a restart under way is waited for
// and its new process stopped. Every wait is bounded by ctx. A second
// caller waits for the first one's outcome.
func (s *Supervisor) Shutdown(ctx context.Context) (*shared.ShutdownResponse, error) {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		select {
		case <-s.shutDone:
			return s.shutResp, s.shutErr
		case <-ctx.Done():
			return nil, fmt.Errorf("provisioner %s: its shutdown was still under way when this caller's deadline passed", s.name)
		}
	}
	s.stopping = true
	s.mu.Unlock()
	resp, err := s.shutdownOnce(ctx)
	s.mu.Lock()
	s.shutResp, s.shutErr, s.phase = resp, err, host.PhaseStopped
	s.mu.Unlock()
	close(s.shutDone)
	return resp, err
}

func (s *Supervisor) shutdownOnce(ctx context.Context) (*shared.ShutdownResponse, error) {
	close(s.stop)
	watched := make(chan struct{})
	go func() {
		// A Reconcile under way ends within ReconcileTimeout; the plugin
		// is stopped after it, not under it.
		s.calls.Wait()
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
				l.Kill()
			}
			why := "it exited"
			if lastExit != nil {
				why = "it exited (" + lastExit.String() + ")"
			}
			return nil, fmt.Errorf("provisioner %s could not cancel its jobs: %s and could not be started again to cancel them (%s); what it asked for may still be in its cluster: look for what is tagged with engine id %s there and cancel it",
				s.name, why, diags.Error(), s.opts.EngineID)
		}
		cur = l
	}
	resp, err := cur.Stop(ctx)
	if errors.Is(err, shared.ErrPluginGone) {
		err = fmt.Errorf("the plugin was gone before it could cancel its jobs (%s): %w", cur.ExitStatus(), err)
	}
	return resp, err
}

// gone reports whether the plugin's process has exited.
func gone(p *host.Launched) bool {
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

// Name and Kind are the provisioner block's labels.
func (s *Supervisor) Name() string { return s.name }
func (s *Supervisor) Kind() string { return s.kind }

// defaultReconcileTimeout bounds one Reconcile call.
const defaultReconcileTimeout = 30 * time.Second

// Reconcile tells the plugin which of its workers are attached, so that
// it forgets what arrived and gives up on what took too long. The call
// runs on a goroutine of its own, so a plugin that hangs delays neither
// the caller's loop nor other provisioners, and it is not made again
// while one is under way; Reconcile returns at once. A call that misses
// ReconcileTimeout counts towards WedgeAfter. It reports whether the call
// is made: not while one is under way or the plugin is not running.
func (s *Supervisor) Reconcile(ctx context.Context, attached []string) bool {
	s.mu.Lock()
	if s.reconciling || s.stopping || s.current == nil || s.phase != host.PhaseRunning {
		s.mu.Unlock()
		return false
	}
	s.reconciling = true
	p, tracker := s.current.Provisioner(), s.tracker
	s.calls.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.calls.Done()
		s.reconcileOnce(ctx, p, tracker, attached)
		s.mu.Lock()
		s.reconciling = false
		s.mu.Unlock()
	}()
	return true
}

// Ended reports whether ctx has ended, counting from its deadline too: a
// call made under ctx has a timer of its own for the same deadline,
// which may fire (or the plugin answer DeadlineExceeded) a moment before
// ctx reports it. A call whose caller's context Ended was cut short, and
// is neither a failure nor a missed deadline.
func Ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// MissedDeadline reports whether a call to a plugin made with ctx, which
// ended with err, ran out of ctx's time: gRPC's own timer for the
// deadline may end the call a moment before ctx reports
// DeadlineExceeded, so a failed call at or past the deadline counts as
// well. The engine's Provision calls and the Supervisor's Reconciles
// count misses with it.
func MissedDeadline(ctx context.Context, err error) bool {
	if ctx.Err() == context.DeadlineExceeded {
		return true
	}
	d, ok := ctx.Deadline()
	return err != nil && ok && !time.Now().Before(d)
}

func (s *Supervisor) reconcileOnce(ctx context.Context, p shared.Provisioner, tracker *host.AttachedTracker, attached []string) {
	rctx, cancel := context.WithTimeout(ctx, s.ReconcileTimeout)
	defer cancel()
	req := tracker.Request(attached, time.Now())
	resp, err := p.Reconcile(rctx, req)
	tracker.Answered(req, err == nil, time.Now())
	// The caller's context ended (a run's -timeout, a stop): the call was
	// cut short, and nothing failed.
	cutShort := Ended(ctx)
	s.Deadline("Reconcile", !cutShort && MissedDeadline(rctx, err))
	if err != nil {
		if cutShort {
			s.logger.Debug("reconcile cut short", "error", err)
			return
		}
		s.logger.Warn("reconcile failed", "error", err)
		return
	}
	if len(resp.Expired) > 0 {
		s.logger.Warn("gave up on jobs that never attached", "jobs", resp.Expired)
	}
}

// processText renders the phase and its history as one line: a
// ProvisionerStatus's Process.
func processText(p host.ProvisionerStatus) string {
	text := p.Phase.String()
	if p.Phase == host.PhaseFailed && p.Failure != "" {
		text += ": " + p.Failure
	}
	if p.LastExit != "" {
		text = fmt.Sprintf("%s (restarts: %d, last exit: %s)", text, p.Restarts, p.LastExit)
	}
	if p.Wedged != "" {
		text += "; last " + p.Wedged
	}
	return text
}
