package engine

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/loglimit"
	"github.com/fluksio/provision/shared"
)

// Intervals of the run loop. A router pass is cheap (it answers "could
// anything fit?" from cached shapes) so it runs often; Reconcile crosses
// into every plugin, so it runs less.
var (
	passInterval      = time.Second
	reconcileInterval = 3 * time.Second
)

// dismissWait bounds how long Stop waits for attached workers to take
// their leave (CodeLeave) and detach, before it shuts the plugins down.
// A worker answers its open poll at once and detaches in one round trip;
// one busy with a task leaves when it reports it, or is let go by its
// plugin's shutdown after this.
const dismissWait = 10 * time.Second

// Config is what an engine is made of. Provisioners come from a
// configuration file (LoadConfig) or from the embedding engine's own.
type Config struct {
	// Provisioners are the blocks to launch, one supervised plugin each.
	Provisioners []*host.Block
	// Secret signs worker credentials (32+ bytes; host.RandomSecret for a
	// run of its own). It never leaves the engine.
	Secret []byte
	// ID is the engine's identity, which plugins tag what they create
	// with; host.EngineIdentity derives one.
	ID string
	// Listen is host:port or unix:PATH (see Listen). Required.
	Listen string
	// TLS, when set, serves the workers' endpoint in TLS.
	TLS *tls.Config
	// MaxConnections caps the listener's connections (0: 4096).
	MaxConnections int
	// HoldPolls holds every long poll on its goroutine, as net/http
	// holds any request, instead of parking it (engine/internal/park);
	// the configuration's park_polls = false. Systems without epoll hold
	// them anyway.
	HoldPolls bool
	// DropEnv names variables the plugins are started without (the
	// secret's, a token's).
	DropEnv []string
	// Logger is the engine's log; nil means none.
	Logger hclog.Logger
	// Hooks hear what happens, for a story or a UI of the embedder's.
	Hooks Hooks
}

// Hooks are called without any of the engine's locks, from the
// goroutine the thing happened on; each may be nil. A slow hook delays
// only what called it (a plugin's event dispatcher, a worker's request),
// never another plugin.
type Hooks struct {
	// PluginEvent hears a provisioner's event (stamped by the host)
	// within the log's budget: at most eventLogBurst per eventLogWindow
	// per provisioner. EventsNotTold hears how many were left out.
	PluginEvent   func(shared.Event)
	EventsNotTold func(provisioner string, n int)
	// Attach hears each first attach, Result each accepted result.
	Attach func(WorkerInfo)
	Result func(Result)
	// Burst hears each Provision answer that asked for or gave up
	// machines.
	Burst func(provisioner string, pd shared.ProfileDemand)
	// Stopped hears each provisioner's shutdown result.
	Stopped func(StopResult)
}

// Engine is the whole provisioning loop: a Fleet of supervised plugins,
// the Router that turns needs into demand, the Books workers attach to,
// the Hub of events and the metrics, wired together. New builds it and
// listens; Start launches the plugins; Serve serves HTTP; Run passes
// until its context ends; Stop lets the workers go and shuts it all
// down. Each is called once, in that order, from one goroutine.
type Engine struct {
	Fleet  *Fleet
	Router *Router
	Books  *Books
	Hub    *Hub

	cfg    Config
	logger hclog.Logger
	obs    *observer
	ln     net.Listener
	gate   *connGate
	srv    *http.Server
	// api serves the workers' endpoints, status the operator's GET
	// /status.
	api    *workerAPI
	status *statusPage
	// serving and watching are the HTTP server's and the books'
	// liveness goroutines; Stop waits for both.
	serving  sync.WaitGroup
	watching sync.WaitGroup
	stopLive context.CancelFunc
	// wake holds at most one pending wake-up for the run loop: an event
	// from a plugin, or a plugin up again.
	wake chan struct{}
	// addr is where the engine listens, as the listener says.
	addr string
	// eventLogs bounds, per provisioner, how many of its events are
	// logged; fixed after New.
	eventLogs []pluginEventLog
}

// pluginEventLog is one provisioner's budget of event lines.
type pluginEventLog struct {
	name   string
	logger hclog.Logger
	limit  *loglimit.Limiter
}

// A plugin's events are logged at most eventLogBurst per eventLogWindow
// each; the rest are counted, and the first line after them, or the
// engine's stop, says how many were not logged. They all reach the
// books, the event stream and the metrics: only the telling is bounded.
// A plugin that flooded small well-formed events made 48,355 log lines in
// 40 s; a hundred in ten seconds is a burst of a hundred machines told
// one by one, as many as a person reads.
const (
	eventLogBurst  = 100
	eventLogWindow = 10 * time.Second
)

// New builds an engine for cfg and starts listening. An error is the
// operator's to fix (the address, the secret) and says how.
func New(cfg Config) (*Engine, error) {
	logger := cfg.Logger
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	if len(cfg.Secret) < host.MinSecretLen {
		return nil, fmt.Errorf("the signing secret is %d bytes; at least %d (host.RandomSecret makes one)", len(cfg.Secret), host.MinSecretLen)
	}
	if cfg.ID == "" {
		cfg.ID = host.EngineIdentity("", "")
	}
	signer := host.NewSigner(cfg.Secret)
	e := &Engine{cfg: cfg, logger: logger, wake: make(chan struct{}, 1)}
	ln, address, err := Listen(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("cannot listen on %s: %w", cfg.Listen, err)
	}
	e.ln, e.addr = ln, ln.Addr().String()

	e.Books = newBooks(logger.Named("http"), signer, time.Now, booksHooks{
		attach: func(w WorkerInfo) {
			e.Router.WorkerAttached(w.Provisioner, w.Profile)
			if cfg.Hooks.Attach != nil {
				cfg.Hooks.Attach(w)
			}
		},
		result:   cfg.Hooks.Result,
		activity: func(a Activity) { e.obs.activity(a) },
	})
	e.gate = newConnGate(cfg.MaxConnections, logger.Named("http"), loglimit.New(refusalLogBurst, refusalLogWindow))

	e.Router = NewRouter(logger.Named("router"), e.Books, nil)
	e.Fleet = newFleet(cfg, signer, address, logger, e)
	e.api = newWorkerAPI(e.Books, nil)
	e.status = &statusPage{id: cfg.ID, books: e.Books, provisioners: e.Fleet.Status, needs: e.Router.Needs, held: e.Router.Held}
	state := &stateCollector{health: e.Fleet.health, status: e.status.provisionerStatus, workers: e.workerCounts, needs: func() []NeedStatus { return e.Router.Needs() }, forgotten: func() int { return e.Router.Forgotten() },
		held: func() []HeldProfile { return e.Router.Held() }}
	e.obs = newObserver(newEngineMetrics(state))
	e.Hub = e.obs.hub
	e.Router.OnBurst = func(target string, pd shared.ProfileDemand) {
		e.obs.burst(target, pd)
		if cfg.Hooks.Burst != nil {
			cfg.Hooks.Burst(target, pd)
		}
	}
	e.Router.OnDeadline = e.Fleet.deadline

	// Liveness is decided here, by one goroutine, never on a read.
	lctx, cancel := context.WithCancel(context.Background())
	e.stopLive = cancel
	e.watching.Add(1)
	go func() {
		defer e.watching.Done()
		e.Books.watch(lctx)
	}()

	logger.Info("listening for workers", "addr", e.addr, "tls", cfg.TLS != nil, "max_connections", e.gate.max)
	if plainBeyondLoopback(ln.Addr(), cfg.TLS != nil) {
		logger.Warn("listening beyond loopback in plain HTTP: worker credentials cross the network in the clear; serve TLS, or terminate it in front of the engine",
			"addr", e.addr)
	}
	return e, nil
}

// plainBeyondLoopback reports whether addr (the listener's) accepts
// connections from other machines in plain HTTP.
func plainBeyondLoopback(addr net.Addr, tlsOn bool) bool {
	if tlsOn {
		return false
	}
	tcp, ok := addr.(*net.TCPAddr)
	return ok && !tcp.IP.IsLoopback()
}

// Addr is where the engine listens, as the listener has it.
func (e *Engine) Addr() string { return e.addr }

// URL is the engine's base URL on its own listener (http or https): what
// a worker on this machine dials, and what engine_url should name.
func (e *Engine) URL() string {
	scheme := "http"
	if e.cfg.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + e.addr + "/"
}

// Mux routes the engine's endpoints: the workers' (/v1/attach, /v1/work,
// /v1/watch, /v1/result, /v1/detach), which their credentials guard, and the
// operator's (GET /status, GET /v1/events, GET /metrics), which protect
// wraps (metricsOpen leaves /metrics unwrapped), and GET /health and
// GET /ready, open. With protect nil, the operator's endpoints answer only
// the engine's own user and root on this machine (LocalUser, peer.go);
// AllowAnyLocalUser opens them to anyone who can connect. The embedder
// adds its own routes (a page) to the mux before Serve.
func (e *Engine) Mux(protect func(http.Handler) http.Handler, metricsOpen bool) *http.ServeMux {
	if protect == nil {
		protect = ownUserOnly(e.Fleet.PIDs)
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/", e.api.handler())
	mux.Handle("GET /status", protect(e.status))
	mux.Handle("GET /v1/events", protect(http.HandlerFunc(e.Hub.ServeHTTP)))
	metrics := e.obs.metrics.handler()
	if !metricsOpen {
		metrics = protect(metrics)
	}
	mux.Handle("GET /metrics", metrics)
	mux.HandleFunc("GET /health", health)
	mux.HandleFunc("GET /ready", ready(e.Fleet.health))
	return mux
}

// Serve serves handler (normally Mux's) on the engine's listener, with
// every timeout set and the connection cap, until Stop.
func (e *Engine) Serve(handler http.Handler) {
	e.srv = newHTTPServer(handler, e.gate, e.Books.pollWait())
	rl := serverListener(e.ln, e.cfg.TLS)
	if !e.cfg.HoldPolls {
		e.api.parker = newParker(e.gate, rl)
	}
	e.serving.Add(1)
	go func() {
		defer e.serving.Done()
		err := e.srv.Serve(rl)
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			e.logger.Error("http server stopped", "error", err)
		}
	}()
}

// Start launches and configures every provisioner's plugin, within two
// minutes. Diagnostics point at the configuration.
func (e *Engine) Start(ctx context.Context) hcl.Diagnostics {
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return e.Fleet.start(startCtx)
}

// Add records a need whose task takes work (zero: the worker's stand-in
// computation) and returns its id.
func (e *Engine) Add(n shared.Need, work time.Duration) string { return e.Router.AddWork(n, work) }

// Withdraw takes back a need that still waits (Router.Withdraw) and wakes
// the run loop, so that its provisioner hears the smaller demand at once
// rather than at the next tick.
func (e *Engine) Withdraw(id string) error {
	if err := e.Router.Withdraw(id); err != nil {
		return err
	}
	e.poke()
	return nil
}

// Run passes until ctx ends or done, checked after each pass, says
// to stop; it reports whether done did.
func (e *Engine) Run(ctx context.Context, done func() bool) bool {
	passTick := time.NewTicker(passInterval)
	defer passTick.Stop()
	reconcileTick := time.NewTicker(reconcileInterval)
	defer reconcileTick.Stop()
	for {
		took := e.pass(ctx)
		if done != nil && done() {
			return true
		}
		// A pass costs in proportion to the workers and needs, and
		// every attach, result and event asks for one: at 10,000
		// workers they come by the thousand a second, and passes back
		// to back took most of a core from the attaches themselves.
		// After a pass the loop rests three times as long as it took
		// (at most maxPassRest), so the router keeps to a quarter of a
		// core however busy the workers are; a pass of 100 µs rests
		// 300 µs, which nobody waits for.
		if rest := min(3*took, maxPassRest); rest > 0 {
			t := time.NewTimer(rest)
			select {
			case <-ctx.Done():
				t.Stop()
				return false
			case <-t.C:
			}
		}
		select {
		case <-ctx.Done():
			return false
		case <-passTick.C:
		case <-e.wake:
		case <-e.Books.changes():
		case <-reconcileTick.C:
			e.Fleet.reconcile(ctx, e.Books)
		}
	}
}

// maxPassRest bounds the rest after a pass (Run).
const maxPassRest = 100 * time.Millisecond

// pass runs one router pass and says how long it took.
func (e *Engine) pass(ctx context.Context) time.Duration {
	start := time.Now()
	e.Router.Pass(ctx)
	return time.Since(start)
}

// poke wakes the run loop; wake-ups that arrive while one is pending are
// merged.
func (e *Engine) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// pluginEvent is what the engine does with an event a provisioner's
// plugin sent (stamped by the host), at now: the books learn each
// worker's job and which names to revoke; the router its failures; the
// hub and the metrics have it; the log and the hook, within logs'
// budget.
//
// What the engine keeps for a plugin's events is bounded per
// provisioner: the books' records (host.RecordBudget), the profiles it
// holds back (maxHeldProfiles), the machines it times (maxWaiting); the
// event stream's history and the metrics' labels are bounded for all.
// An event past a bound is counted (fluksio_provisioner_events_unrecorded_total)
// and said once; a plugin that floods costs its own workers, and the
// engine's memory stays what the bounds allow.
func (e *Engine) pluginEvent(plog hclog.Logger, logs *loglimit.Limiter, ev shared.Event, now time.Time) {
	if err := e.Books.ObserveEvent(ev); err != nil {
		why := unrecordedRevocation
		if ev.Kind == shared.EventWorkerProvisioned {
			why = unrecordedWorker
		}
		e.obs.unrecorded(plog, ev.Provisioner, why, err)
	}
	if err := e.Router.ObserveEvent(ev); err != nil {
		e.obs.unrecorded(plog, ev.Provisioner, unrecordedProfile, err)
	}
	if !e.obs.pluginEvent(ev) {
		e.obs.unrecorded(plog, ev.Provisioner, unrecordedTimed, fmt.Errorf("%d machines of the provisioner's are being timed already", maxWaiting))
	}
	if ok, leftOut := logs.Allow(now); ok {
		if leftOut > 0 {
			e.eventsNotTold(plog, ev.Provisioner, leftOut)
		}
		if e.cfg.Hooks.PluginEvent != nil {
			e.cfg.Hooks.PluginEvent(ev)
		}
		plog.Info("event", "kind", ev.Kind, "profile", ev.Profile, "job", ev.Job, "worker", ev.Worker, "detail", ev.Detail)
	}
	e.poke()
}

// eventsNotTold is the summary of n events of provisioner left out of
// the log.
func (e *Engine) eventsNotTold(plog hclog.Logger, provisioner string, n int) {
	plog.Warn("events not logged: the plugin sent more than the log takes", "not_logged", n,
		"max", eventLogBurst, "per", eventLogWindow.String())
	if e.cfg.Hooks.EventsNotTold != nil {
		e.cfg.Hooks.EventsNotTold(provisioner, n)
	}
}

// flushEventLogs tells, for each provisioner, how many of its events
// the current window left out, which no later event will.
func (e *Engine) flushEventLogs() {
	for _, l := range e.eventLogs {
		if n := l.limit.Flush(); n > 0 {
			e.eventsNotTold(l.logger, l.name, n)
		}
	}
}

// workerCounts is the attached workers per configured provisioner.
func (e *Engine) workerCounts() map[string]workerCounts {
	out := map[string]workerCounts{}
	for _, s := range e.Fleet.sups {
		out[s.Name()] = workerCounts{}
	}
	for owner, n := range e.Books.workerCounts() {
		out[owner] = n
	}
	return out
}

// Stop ends the engine cleanly, within ctx: the workers are let go first
// (each open poll answers CodeLeave, and each worker detaches and exits
// 0, so its job ends completed), then every provisioner is shut down
// (each cancels what it asked for that has not arrived), then the HTTP
// server and the liveness watch stop. It returns a result per
// provisioner.
func (e *Engine) Stop(ctx context.Context) []StopResult {
	// Each plugin hears first who is attached, so that it counts their
	// jobs as arrived: a plugin's Shutdown cancels what has not arrived,
	// and must not race the workers about to leave on their own.
	e.Fleet.reconcile(ctx, e.Books)
	if n := e.Books.dismiss(ctx, dismissWait); n > 0 {
		e.logger.Warn("workers still attached when the engine stopped; their provisioners let them go", "workers", n)
	}
	results := e.Fleet.Shutdown(ctx)
	e.flushEventLogs()
	e.Router.Close()
	e.Books.Close()
	e.Hub.Close()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if e.srv != nil {
		_ = e.srv.Shutdown(sctx)
	} else {
		e.ln.Close()
	}
	e.serving.Wait()
	// Hijacked connections are not the server's to wait for: the
	// parked polls' are answered and closed here.
	e.api.parker.Close()
	e.stopLive()
	e.watching.Wait()
	return results
}

// StopResult is one provisioner's shutdown.
type StopResult struct {
	Provisioner string
	// Cancelled names what the provisioner cancelled (its jobs).
	Cancelled []string
	Err       error
}

func (r StopResult) String() string {
	switch {
	case r.Err != nil:
		return fmt.Sprintf("%s: shutdown failed: %v", r.Provisioner, r.Err)
	case len(r.Cancelled) > 0:
		return fmt.Sprintf("%s: shut down, cancelled job(s) %s", r.Provisioner, strings.Join(r.Cancelled, ", "))
	}
	return r.Provisioner + ": shut down, nothing outstanding"
}
