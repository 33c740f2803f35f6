package engine

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/loglimit"
	"github.com/fluksio/provision/shared"
)

// fleet is the provisioners of one engine: a host.Supervisor per
// provisioner block, started together, asked for their status together
// and shut down together with a result each. The supervisors are made
// once, by supervise, when the engine listens.
type fleet struct {
	sups   []*host.Supervisor
	byName map[string]*host.Supervisor
}

// supervise makes a supervisor per provisioner block of cfg, each told
// that the engine listens at address and wired to e: its events, its
// plugin up, down or failed.
func (f *fleet) supervise(cfg Config, signer *host.Signer, address string, logger hclog.Logger, e *Engine) {
	epoch := host.CredentialEpoch(cfg.Secret)
	for _, pc := range cfg.Provisioners {
		plog := logger.Named(pc.Name)
		name := pc.Name
		evLogs := loglimit.New(eventLogBurst, eventLogWindow)
		e.eventLogs = append(e.eventLogs, pluginEventLog{name: name, logger: plog, limit: evLogs})
		s := host.NewSupervisor(pc, plog, host.Options{
			Logger:          logger.Named("plugin"),
			Signer:          signer,
			EngineID:        cfg.ID,
			CredentialEpoch: epoch,
			EngineAddress:   address,
			DropEnv:         cfg.DropEnv,
			OnEvent:         func(ev shared.Event) { e.pluginEvent(plog, evLogs, ev, time.Now()) },
		})
		s.OnUp = func(c host.Configured) {
			e.router.setTarget(target{Name: c.Name, P: c.Provisioner, Shapes: c.Shapes})
			e.router.setDown(name, false)
			e.obs.plugin(EventPluginUp, name, fmt.Sprintf("configured, %d shape(s)", len(c.Shapes)))
			e.poke()
		}
		s.OnDown = func(string) {
			e.router.setDown(name, true)
			e.obs.plugin(EventPluginDown, name, "the plugin exited; restarting it")
		}
		s.OnFailed = func(_ string, err error) {
			e.router.setDown(name, true)
			e.obs.plugin(EventPluginFailed, name, err.Error())
		}
		f.sups = append(f.sups, s)
		f.byName[name] = s
	}
}

// start launches and configures every plugin.
func (f *fleet) start(ctx context.Context) hcl.Diagnostics {
	var diags hcl.Diagnostics
	for _, s := range f.sups {
		diags = append(diags, s.Start(ctx)...)
	}
	return diags
}

// status is every provisioner's status, in configuration order; it may
// cross into each plugin.
func (f *fleet) status(ctx context.Context) []host.ProvisionerStatus {
	out := make([]host.ProvisionerStatus, 0, len(f.sups))
	for _, s := range f.sups {
		out = append(out, s.Status(ctx))
	}
	return out
}

// pids lists the running plugin processes.
func (f *fleet) pids() []int {
	var out []int
	for _, s := range f.sups {
		if pid := s.Pid(); pid > 0 {
			out = append(out, pid)
		}
	}
	return out
}

// health reads every provisioner's plugin state from its Supervisor.
func (f *fleet) health() []provHealth {
	out := make([]provHealth, 0, len(f.sups))
	for _, s := range f.sups {
		up, restarts := s.Health()
		out = append(out, provHealth{name: s.Name(), kind: s.Kind(), up: up, restarts: restarts})
	}
	return out
}

// deadline tells a provisioner's supervisor whether its Provision call
// answered in time, so that one that keeps missing is restarted.
func (f *fleet) deadline(name string, missed bool) {
	if s := f.byName[name]; s != nil {
		s.Deadline("Provision", missed)
	}
}

// reconcile tells each provisioner which of its workers are attached;
// the workers that left since, of a list whose call was not made, go on
// the next.
func (f *fleet) reconcile(ctx context.Context, books *books) {
	for _, s := range f.sups {
		names := books.attachedBy(s.Name())
		if !s.Reconcile(ctx, names) {
			books.retell(s.Name(), names)
		}
	}
}

// shutdown shuts every provisioner down at once (each cancels what it
// asked for that has not arrived) and waits for all, within ctx.
func (f *fleet) shutdown(ctx context.Context) []StopResult {
	results := make([]StopResult, len(f.sups))
	var wg sync.WaitGroup
	for i, s := range f.sups {
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
