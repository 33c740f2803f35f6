package engine

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/engine/internal/supervise"
	"github.com/fluksio/provision/internal/loglimit"
	"github.com/fluksio/provision/shared"
)

// fleet is the provisioners of one engine: a supervise.Supervisor per
// provisioner block, started together, asked for their status together
// and shut down together with a result each. supervise makes the first
// ones when the engine listens; a reload adds and removes (Engine.Reload).
type fleet struct {
	// signer, epoch, address, logger and e are what supervise was given,
	// for the supervisors a reload adds; set once by supervise.
	signer  *host.Signer
	cfg     Config
	address string
	logger  hclog.Logger
	e       *Engine

	// mu guards sups, byName and logs; it is held only to read or change
	// them, never across a call to a plugin.
	mu     sync.Mutex
	sups   []*supervise.Supervisor
	byName map[string]*supervise.Supervisor
	// logs bounds, per provisioner, how many of its events are logged.
	logs []pluginEventLog
	// retiring are the supervisors of provisioners a reload removed,
	// waiting for their workers to leave (retire); they are still told
	// who is attached and shut down at the latest by shutdown.
	retiring []*supervise.Supervisor

	// retirements counts retire's goroutines; shutdown closes stopping
	// and waits for them.
	retirements sync.WaitGroup
	stopping    chan struct{}
	stopOnce    sync.Once
}

// supervise makes a supervisor per provisioner block of cfg, each told
// that the engine listens at address and wired to e: its events, its
// plugin up, down or failed.
func (f *fleet) supervise(cfg Config, signer *host.Signer, address string, logger hclog.Logger, e *Engine) {
	f.cfg, f.signer, f.address, f.logger, f.e = cfg, signer, address, logger, e
	for _, pc := range cfg.Provisioners {
		f.add(f.newSupervisor(pc))
	}
}

// newSupervisor makes block pc's supervisor and its event log budget,
// not yet in the fleet.
func (f *fleet) newSupervisor(pc *host.Block) (*supervise.Supervisor, pluginEventLog) {
	e, logger := f.e, f.logger
	plog := logger.Named(pc.Name)
	name := pc.Name
	evLogs := loglimit.New(eventLogBurst, eventLogWindow)
	s := supervise.New(pc, plog, supervise.Options{
		Logger:          logger.Named("plugin"),
		Signer:          f.signer,
		EngineID:        f.cfg.ID,
		CredentialEpoch: host.CredentialEpoch(f.cfg.Secret),
		EngineAddress:   f.address,
		DropEnv:         f.cfg.DropEnv,
		OnEvent:         func(ev shared.Event) { e.pluginEvent(plog, evLogs, ev, time.Now()) },
	})
	s.OnUp = func(c supervise.Configured) {
		e.router.asks.setTarget(target{Name: c.Name, P: c.Provisioner, Shapes: c.Shapes, Packs: c.Packs})
		e.router.asks.setDown(name, false)
		e.obs.plugin(EventPluginUp, name, fmt.Sprintf("configured, %d shape(s)", len(c.Shapes)))
		e.poke()
	}
	s.OnDown = func(string) {
		e.router.asks.setDown(name, true)
		e.obs.plugin(EventPluginDown, name, "the plugin exited; restarting it")
	}
	s.OnFailed = func(_ string, err error) {
		e.router.asks.setDown(name, true)
		e.obs.plugin(EventPluginFailed, name, err.Error())
	}
	return s, pluginEventLog{name: name, logger: plog, limit: evLogs}
}

// add puts a supervisor and its log budget in the fleet, last.
func (f *fleet) add(s *supervise.Supervisor, l pluginEventLog) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sups = append(f.sups, s)
	f.byName[s.Name()] = s
	f.logs = append(f.logs, l)
}

// remove takes the named provisioner's supervisor out of the fleet and
// returns it, nil if there is none; its log budget stays, to be flushed
// at Stop.
func (f *fleet) remove(name string) *supervise.Supervisor {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.byName[name]
	if s == nil {
		return nil
	}
	delete(f.byName, name)
	f.sups = slices.DeleteFunc(f.sups, func(x *supervise.Supervisor) bool { return x == s })
	return s
}

// all is list and the retiring supervisors after it.
func (f *fleet) all() []*supervise.Supervisor {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append(slices.Clone(f.sups), f.retiring...)
}

// list is the supervisors, in configuration order, as they are now.
func (f *fleet) list() []*supervise.Supervisor {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.sups)
}

// get is the named provisioner's supervisor, nil if none.
func (f *fleet) get(name string) *supervise.Supervisor {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.byName[name]
}

// eventLogs is every provisioner's log budget, removed ones' included.
func (f *fleet) eventLogs() []pluginEventLog {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.logs)
}

// start launches and configures every plugin.
func (f *fleet) start(ctx context.Context) hcl.Diagnostics {
	var diags hcl.Diagnostics
	for _, s := range f.list() {
		diags = append(diags, s.Start(ctx)...)
	}
	return diags
}

// status is every provisioner's status, in configuration order; it may
// cross into each plugin.
func (f *fleet) status(ctx context.Context) []host.ProvisionerStatus {
	sups := f.list()
	out := make([]host.ProvisionerStatus, 0, len(sups))
	for _, s := range sups {
		out = append(out, s.Status(ctx))
	}
	return out
}

// pids lists the running plugin processes.
func (f *fleet) pids() []int {
	var out []int
	for _, s := range f.all() {
		if pid := s.Pid(); pid > 0 {
			out = append(out, pid)
		}
	}
	return out
}

// health reads every provisioner's plugin state from its supervisor.
func (f *fleet) health() []provHealth {
	sups := f.list()
	out := make([]provHealth, 0, len(sups))
	for _, s := range sups {
		up, restarts := s.Health()
		out = append(out, provHealth{name: s.Name(), kind: s.Kind(), up: up, restarts: restarts})
	}
	return out
}

// deadline tells a provisioner's supervisor whether its Provision call
// answered in time, so that one that keeps missing is restarted.
func (f *fleet) deadline(name string, missed bool) {
	if s := f.get(name); s != nil {
		s.Deadline("Provision", missed)
	}
}

// reconcile tells each provisioner which of its workers are attached;
// the workers that left since, of a list whose call was not made, go on
// the next.
func (f *fleet) reconcile(ctx context.Context, books *books) {
	for _, s := range f.all() {
		names := books.attachedBy(s.Name())
		if !s.Reconcile(ctx, names) {
			books.retell(s.Name(), names)
		}
	}
}

// shutdown shuts every provisioner down at once (each cancels what it
// asked for that has not arrived) and waits for all, within ctx.
func (f *fleet) shutdown(ctx context.Context) []StopResult {
	f.stopOnce.Do(func() { close(f.stopping) })
	f.retirements.Wait()
	sups := f.all()
	results := make([]StopResult, len(sups))
	var wg sync.WaitGroup
	for i, s := range sups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := StopResult{Provisioner: s.Name()}
			resp, err := s.Shutdown(ctx)
			if err != nil {
				r.Err = err
			} else if resp != nil {
				r.Cancelled = resp.Cancelled
			}
			results[i] = r
		}()
	}
	wg.Wait()
	return results
}
