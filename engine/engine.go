package engine

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/engine/internal/supervise"
	"github.com/fluksio/provision/internal/loglimit"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

// Intervals of the run loop. A pass runs on every change (Run), and at
// least every passInterval for what changes with time alone (a
// provisioner's backoff ending, the demand told again); Reconcile
// crosses into every plugin, so it runs less.
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
	// TaskDir is where tasks' stdout, stderr and outputs are kept, a
	// directory per task (TaskDir/ID); empty means a directory of the
	// engine's own under os.TempDir, made at Start and removed at Stop.
	TaskDir string
	// TaskLimits bound what one task moves.
	TaskLimits TaskLimits
	// OperatorHosts are names (host or host:port) besides the listen
	// address by which the operator's endpoints may be asked for
	// (OperatorGuard): a name the operator's browser uses for the
	// engine's machine.
	OperatorHosts []string
	// Digest names the configuration's content, as GET /status shows it
	// beside its generation (1, and one more per reload applied): File's
	// Digest for a configuration from a file; empty for none.
	Digest string
	// Place, when set, decides which waiting tasks (and needs) go to
	// which idle workers, in place of the router's own rule (the most
	// demanding first, each on the smallest idle worker that fits). It
	// is called once a pass, from the run loop, without any of the
	// engine's locks, with what waits in the order it was added and the
	// idle workers smallest first, both copies it may keep. Each
	// Placement that names a waiting task and an idle worker that fits
	// it (its need, and every feature it requires) and that no earlier
	// Placement took is assigned; the others are left out and logged.
	// What stays waiting is asked of the provisioners as always.
	Place func(waiting []WaitingTask, idle []WorkerInfo) []Placement
}

// Hooks are called on a goroutine of the engine's own, one at a time, in
// the order things happened (a task's TaskLost before its TaskEnded, a
// worker's Attach before its WorkerGone), without any of the engine's
// locks; each may be nil. Nothing of the embedder's runs on the
// router's pass, a worker's request or a plugin's event dispatcher: a
// slow hook delays the hooks after it, never the handing out of tasks.
// The calls waiting to run are bounded (4096); past that, what happened
// waits for room, so a hook slower than the tasks end, for longer than
// the queue lasts, paces dispatch at its own rate and nothing is dropped.
// Stop runs every call queued before it returns, so a hook must not
// call Stop (it would wait for itself); Cancel never waits for the
// queue, and a hook may call it and the engine's other methods. They
// are the embedder's own: the event stream and the metrics hear the same
// through the engine's own wiring, at once, set or not, and a hook
// replaces neither.
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
	// TaskStarted hears each attempt of a task handed to a worker: the
	// task's id (Task), the attempt's number and id, the worker, its
	// provisioner and job.
	TaskStarted func(Activity)
	// TaskEnded hears each task that ended (succeeded, failed,
	// cancelled, timed out, or lost after its last attempt).
	TaskEnded func(TaskResult)
	// TaskLost hears each attempt whose machine was lost under it (of
	// a task not cancelled: that one ends cancelled): again says
	// whether the task waits for another worker, or was given up
	// (TaskEnded hears that too).
	TaskLost func(r TaskResult, again bool)
	// WorkerGone hears each worker that left the books: detached, given
	// up on (silent), or dropped when its provisioner cancelled its
	// request; why says which, in words.
	WorkerGone func(w WorkerInfo, why string)
	// Mismatch hears each machine that attached for a kind of waiting
	// task and could not take it: its profile is not asked for such
	// tasks until m.Until, then one at a time.
	Mismatch func(m Mismatch)
}

// Engine is the whole provisioning loop: the supervised plugins, the
// router that turns needs into demand, the books workers attach to, the
// event stream and the metrics, wired together. Its life cycle, each
// step called once from one goroutine:
//
//   - New builds it from cfg; it opens nothing and starts no goroutine.
//   - Serve listens and serves HTTP (normally Mux's routes).
//   - Start launches the plugins, which are told where the engine
//     listens; it listens first if Serve has not. From then on the
//     engine passes on a goroutine of its own.
//   - Run, optional, passes until its context ends or its done says
//     so; called before Start, it is the loop instead.
//   - Stop lets the workers go and shuts it all down.
//
// Between Start and Stop, an embedder submits tasks (Submit), cancels
// them (Cancel) and reads them (Task, TaskDir); adds needs for the
// worker's stand-in (Add) and takes back those still waiting (Withdraw);
// reads what waits (Needs, Served), the provisioners' status (Status)
// and the events (Events); the operator's endpoints (Mux) serve the
// same over HTTP.
type Engine struct {
	cfg    Config
	logger hclog.Logger
	signer *host.Signer

	fleet  *fleet
	router *router
	books  *books
	tasks  *taskTable
	hub    *hub
	obs    *observer

	// ln, addr and gate are the listener, where it listens (as the
	// listener says) and its connection cap; ln is nil until listen.
	ln   net.Listener
	addr string
	gate *connGate
	srv  *http.Server
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
	// reloads holds one token while a reload is under way (Reload), so
	// that two are never applied at once; it is taken across the calls
	// to the plugins a reload makes, by Reload, and by Stop for good
	// once halted is closed, so that no reload launches a plugin after
	// Stop began.
	reloads  chan struct{}
	halted   chan struct{}
	haltOnce sync.Once
	// version is the configuration's generation and digest (Reload).
	version configVersion
	// hooks runs the embedder's hooks (Config.Hooks) off every path
	// that hands out tasks (hooks.go); caughtUp holds at most one
	// wake-up for Run from its emptying, on which Run asks done.
	hooks *hookQueue
	// ends tells Wait and Ended of each task's end (wait.go).
	ends     *endFeed
	caughtUp chan struct{}
	// loop is the run loop's owner: the engine's own, which Start
	// begins, or Run's caller's (loop.go).
	loop runLoop
	// passEvery and reconcileEvery are the run loop's intervals
	// (passInterval, reconcileInterval; tests set their own before
	// Run). passes counts the passes Run made, timed those a timer
	// woke rather than a change, each counted once it is done (with
	// the Reconcile the timer asked for before it), so that a count
	// read says the loop has finished what that timer began.
	passEvery, reconcileEvery time.Duration
	passes, timed             atomic.Uint64
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

// New builds an engine for cfg. It opens no listener, launches no
// plugin and starts no goroutine: Serve and Start do. An error is the
// operator's to fix (the secret) and says how.
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
	e := &Engine{cfg: cfg, logger: logger, signer: host.NewSigner(cfg.Secret), wake: make(chan struct{}, 1), reloads: make(chan struct{}, 1), halted: make(chan struct{}),
		ends: newEndFeed()}
	e.version.set(1, cfg.Digest)
	e.caughtUp = make(chan struct{}, 1)
	e.hooks = newHookQueue(hookQueueLen, func() {
		select {
		case e.caughtUp <- struct{}{}:
		default:
		}
	})
	e.passEvery, e.reconcileEvery = passInterval, reconcileInterval
	// Each of the books' hooks is the engine's own and calls the
	// embedder's beside it: the event stream and the metrics hear
	// everything whatever Hooks the embedder set, and Hooks hear it too.
	e.books = newBooks(logger.Named("http"), e.signer, time.Now, booksHooks{
		attach: func(w WorkerInfo) {
			e.router.workerAttached(w.Provisioner, w.Profile)
			if h := cfg.Hooks.Attach; h != nil {
				e.hooks.put(func() { h(w) }, true)
			}
		},
		result: func(r Result) {
			if h := cfg.Hooks.Result; h != nil {
				e.hooks.put(func() { h(r) }, true)
			}
		},
		activity: func(a Activity) {
			e.obs.activity(a)
			if h := cfg.Hooks.TaskStarted; h != nil && a.Kind == EventTaskAssigned && a.Task != "" {
				e.hooks.put(func() { h(a) }, true)
			}
		},
		gone: func(w WorkerInfo, why string) {
			if h := cfg.Hooks.WorkerGone; h != nil {
				e.hooks.put(func() { h(w, why) }, true)
			}
		},
	})
	e.tasks = newTaskTable(cfg.TaskLimits, time.Now)
	e.router = newRouter(logger.Named("router"), e.books, nil)
	e.router.tasks, e.router.place, e.router.onTask = e.tasks, cfg.Place, e.taskNews
	e.fleet = &fleet{byName: map[string]*supervise.Supervisor{}, stopping: make(chan struct{})}
	e.gate = newConnGate(cfg.MaxConnections, logger.Named("http"), loglimit.New(refusalLogBurst, refusalLogWindow))
	e.api = newWorkerAPI(e.books, nil)
	e.api.tasks = e.tasks
	e.status = &statusPage{id: cfg.ID, version: &e.version, books: e.books, provisioners: e.fleet.status, needs: e.router.needsWhere, held: e.router.holds.list,
		tasks: e.tasks.counts}
	state := &stateCollector{health: e.fleet.health, status: e.status.provisionerStatus, workers: e.workerCounts,
		needs: e.router.needCounts, held: e.router.holds.list}
	e.obs = newObserver(newEngineMetrics(state))
	e.hub = e.obs.hub
	e.router.asks.onBurst = func(target string, pd shared.ProfileDemand) {
		e.obs.burst(target, pd)
		if h := cfg.Hooks.Burst; h != nil {
			e.hooks.put(func() { h(target, pd) }, true)
		}
	}
	e.router.asks.onDeadline = e.fleet.deadline
	e.router.onMismatch = func(m Mismatch) {
		e.obs.hub.publish(Event{Kind: EventMachineMismatch, Provisioner: m.Provisioner, Profile: m.Profile, Worker: m.Worker, Task: m.Task,
			Detail: fmt.Sprintf("%s; no other %s machine is asked for such tasks before %s, then one at a time", m.Detail, m.Profile, m.Until.UTC().Format(time.RFC3339))})
		if h := cfg.Hooks.Mismatch; h != nil {
			e.hooks.put(func() { h(m) }, true)
		}
	}
	return e, nil
}

// listen opens the engine's listener, makes a supervisor per provisioner
// (each plugin is told where the engine listens) and starts the books'
// liveness watch, once: Serve and Start call it, whichever comes first.
// Liveness is decided there, by one goroutine, never on a read.
func (e *Engine) listen() error {
	if e.ln != nil {
		return nil
	}
	if err := e.tasks.makeRoot(e.cfg.TaskDir); err != nil {
		return err
	}
	ln, address, err := Listen(e.cfg.Listen)
	if err != nil {
		return fmt.Errorf("cannot listen on %s: %w", e.cfg.Listen, err)
	}
	e.ln, e.addr = ln, ln.Addr().String()
	e.fleet.supervise(e.cfg, e.signer, address, e.logger, e)

	lctx, cancel := context.WithCancel(context.Background())
	e.stopLive = cancel
	e.watching.Add(1)
	go func() {
		defer e.watching.Done()
		e.books.watch(lctx)
	}()

	e.logger.Info("listening for workers", "addr", e.addr, "tls", e.cfg.TLS != nil, "max_connections", e.gate.max)
	if plainBeyondLoopback(ln.Addr(), e.cfg.TLS != nil) {
		e.logger.Warn("listening beyond loopback in plain HTTP: worker credentials cross the network in the clear; serve TLS, or terminate it in front of the engine",
			"addr", e.addr)
	}
	return nil
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

// Addr is where the engine listens, as the listener has it; empty
// before Serve or Start.
func (e *Engine) Addr() string { return e.addr }

// URL is the engine's base URL on its own listener (http or https): what
// a worker on this machine dials, and what engine_url should name. It is
// meaningful after Serve or Start.
func (e *Engine) URL() string {
	scheme := "http"
	if e.cfg.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + e.addr + "/"
}

// Mux routes the engine's endpoints: the workers' (/v1/attach, /v1/work,
// /v1/watch, /v1/result, /v1/detach, and a task's transfers under
// /v1/work/ID/), which their credentials guard, and the operator's (GET
// /status, GET /v1/events, GET /metrics, GET /v1/tasks/ID, POST
// /v1/tasks/ID/cancel), which protect wraps (metricsOpen leaves /metrics
// unwrapped), and GET /health, GET /ready and GET /v1/probe, open. With protect nil, the operator's endpoints answer only
// the engine's own user and root on this machine (LocalUser, peer.go);
// AllowAnyLocalUser opens them to anyone who can connect. The embedder
// adds its own routes (a page) to the mux before Serve.
func (e *Engine) Mux(protect func(http.Handler) http.Handler, metricsOpen bool) *http.ServeMux {
	if protect == nil {
		protect = ownUserOnly(e.fleet.pids)
	}
	// Every operator's endpoint refuses a web page's request first.
	guarded := protect
	protect = func(h http.Handler) http.Handler { return e.OperatorGuard(guarded(h)) }
	mux := http.NewServeMux()
	mux.Handle("/v1/", e.api.handler())
	mux.Handle("GET /status", protect(e.status))
	mux.Handle("GET /v1/events", protect(http.HandlerFunc(e.hub.ServeHTTP)))
	mux.Handle("GET /v1/tasks/{id}", protect(http.HandlerFunc(e.serveTask)))
	mux.Handle("POST /v1/tasks/{id}/cancel", protect(http.HandlerFunc(e.serveCancel)))
	metrics := e.obs.metrics.handler()
	if !metricsOpen {
		metrics = protect(metrics)
	}
	mux.Handle("GET /metrics", metrics)
	mux.HandleFunc("GET /health", health)
	mux.HandleFunc("GET /ready", ready(e.fleet.health))
	mux.HandleFunc("GET "+worker.ProbePath, ServeProbe)
	return mux
}

// ServeProbe answers a reach probe (worker.ProbePath), open to anyone: a
// worker started with --probe on a compute node asks it to learn whether
// the engine's URL is reachable there. The answer says that an engine
// is there, and which run (ProbeValue, probe.go). validate -check -probe
// serves it where the engine would listen, when no engine runs there.
func ServeProbe(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, worker.ProbeLine(probeValue)+"\n")
}

// Serve listens where Config.Listen says and serves handler (normally
// Mux's) there, with every timeout set and the connection cap, until
// Stop. An error says why it cannot listen; the operator fixes the
// address.
func (e *Engine) Serve(handler http.Handler) error {
	if err := e.listen(); err != nil {
		return err
	}
	e.srv = newHTTPServer(handler, e.gate, e.books.pollWait())
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
	return nil
}

// Start launches and configures every provisioner's plugin, within two
// minutes, and listens first if Serve has not (the plugins are told
// where); then the engine passes on a goroutine of its own until Stop,
// unless Run is passing already (Run). Diagnostics point at the
// configuration.
func (e *Engine) Start(ctx context.Context) hcl.Diagnostics {
	if err := e.listen(); err != nil {
		return hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Cannot listen for workers", Detail: err.Error() + "."}}
	}
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	diags := e.fleet.start(startCtx)
	e.startOwn()
	return diags
}

// Add records a need whose task takes work (zero: the worker's stand-in
// computation) and returns its id.
func (e *Engine) Add(n shared.Need, work time.Duration) string { return e.router.AddWork(n, work) }

// Together runs f, which adds needs (Add) or submits tasks (Submit),
// and asks the provisioners for them together when it returns: while
// f runs, the run loop matches and settles but asks no provisioner.
// Without it a pass may fall between two Adds of a loop, and the
// provisioners hear of the first part alone: under max_workers the
// first part's profile can take the whole cap, and the rest wait for
// its machines to go idle. f should do no more than add and submit;
// nothing is asked for until it returns. Calls may nest or overlap.
func (e *Engine) Together(f func()) {
	e.router.asks.holding.Add(1)
	defer func() {
		e.router.asks.holding.Add(-1)
		e.poke()
	}()
	f()
}

// Withdraw takes back a need that still waits and wakes the run loop,
// so that its provisioner hears the smaller demand at once rather than
// at the next tick, and cancels what is still queued for it beyond the
// rest. A need whose task is out, or that is served, is not withdrawn:
// the error is ErrNeedUnderWay, ErrNeedServed or ErrNoSuchNeed. Given a
// task's id (Submit), it cancels the task if it waits, and says the
// same of one on a worker or ended.
func (e *Engine) Withdraw(id string) error {
	if err := e.withdrawTask(id); err != errNotATask {
		return err
	}
	if err := e.router.Withdraw(id); err != nil {
		return err
	}
	e.poke()
	return nil
}

// Needs reports every need, in the order they were added, with its
// phase and, while it waits, why (Reason) and in words (Detail). The
// last served ones are kept; older served needs are forgotten.
func (e *Engine) Needs() []NeedStatus { return e.router.Needs() }

// Served reports whether every need added has been served (trivially
// true with none): a done for Run.
func (e *Engine) Served() bool { return e.router.Served() }

// Status is the provisioners and what the engine holds back, as GET
// /status shows them.
type Status struct {
	// Provisioners is each provisioner's, in configuration order: its
	// plugin's process and its own report.
	Provisioners []host.ProvisionerStatus
	// HeldBack is the profiles the engine does not ask for while their
	// machines keep failing (its own backoff).
	HeldBack []HeldProfile
}

// Status asks every provisioner's plugin for its status, within ctx, and
// says which profiles the engine holds back. A plugin that cannot answer
// has its Error set; one slow plugin delays the answer, not the engine.
func (e *Engine) Status(ctx context.Context) Status {
	return Status{Provisioners: e.fleet.status(ctx), HeldBack: e.router.holds.list()}
}

// PIDs lists the running plugin processes: the plugins argument of
// LocalUser, for an embedder's own operator authentication.
func (e *Engine) PIDs() []int { return e.fleet.pids() }

// Events delivers the engine's events, as GET /v1/events streams them:
// those the history still holds after sequence number after (all of it
// for 0), then each as it happens. The channel closes when ctx ends, when
// the engine stops, or when the reader falls behind by more than the
// stream buffers (subscriberBuffer); then subscribe again with the last
// Seq read, as the stream's client reconnects with Last-Event-ID.
func (e *Engine) Events(ctx context.Context, after uint64) <-chan Event {
	past, sub := e.hub.subscribe(after)
	out := make(chan Event)
	go func() {
		defer close(out)
		defer e.hub.unsubscribe(sub)
		send := func(ev Event) bool {
			select {
			case out <- ev:
				return true
			case <-ctx.Done():
				return false
			}
		}
		for _, ev := range past {
			if !send(ev) {
				return
			}
		}
		for {
			select {
			case ev := <-sub.ch:
				if !send(ev) {
					return
				}
			case <-sub.dropped:
				// What is queued still goes out.
				for {
					select {
					case ev := <-sub.ch:
						if !send(ev) {
							return
						}
					default:
						return
					}
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// Run passes until ctx ends or done, checked after each pass, says
// to stop; it reports whether done did. After Start the engine passes
// on a goroutine of its own until Stop (loop.go), and Run only waits
// for done, asked after each of those passes; called before Start, Run
// is the loop, and Start starts none.
//
// A pass runs when something may have changed what it would do: a
// worker attached, reported a result or left (the books' changes), a
// task was submitted or cancelled, a plugin sent an event or came up
// again (e.wake); and at least every passInterval. done is asked after
// each pass, and, without a pass, each time the hooks' queue empties
// (e.caughtUp): what the hooks recorded may be what done reads.
// It runs at once, with no rest after the last one: a worker's result
// and its next task are one pass apart. Wake-ups that come during a
// pass merge into one, so passes run back to back at most, never
// queued, and each costs in proportion to what it finds: the tasks out
// (settled), the idle workers (matched, only while some need waits),
// and the needs it reads until the idle workers are taken; asking the
// provisioners, which costs in proportion to every need waiting, is
// done at most once per provisionEvery unless the demand rose
// (router.Step).
func (e *Engine) Run(ctx context.Context, done func() bool) bool {
	if !e.loop.take(manualLoop) {
		// The engine's own loop passes; Run waits for done.
		return e.loop.await(ctx, done)
	}
	defer e.loop.release()
	return e.loopPasses(ctx, done)
}

// loopPasses is the run loop: Run's body, and the engine's own loop's
// (loop.go) with done nil.
func (e *Engine) loopPasses(ctx context.Context, done func() bool) bool {
	passTick := time.NewTicker(e.passEvery)
	defer passTick.Stop()
	reconcileTick := time.NewTicker(e.reconcileEvery)
	defer reconcileTick.Stop()
	// soon fires arrivalReconcileDelay after a worker attached, for a
	// Reconcile that tells its plugin; nil when none is due.
	var soon <-chan time.Time
	// onlyDone: the hooks caught up, which changes nothing a pass reads
	// but may change what done reads.
	onlyDone := false
	// byTimer: a timer, not a change, woke this pass.
	byTimer := false
	for {
		if !onlyDone {
			e.router.Step(ctx)
			e.passes.Add(1)
			if byTimer {
				e.timed.Add(1)
			}
		}
		e.loop.passed()
		onlyDone, byTimer = false, false
		if done != nil && done() {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-e.caughtUp:
			onlyDone = true
		case <-passTick.C:
			byTimer = true
		case <-e.wake:
		case <-e.books.changes():
		case <-e.books.arrivals():
			if soon == nil {
				soon = time.After(arrivalReconcileDelay)
			}
		case <-soon:
			soon = nil
			byTimer = true
			e.fleet.reconcile(ctx, e.books)
		case <-reconcileTick.C:
			byTimer = true
			e.fleet.reconcile(ctx, e.books)
		}
	}
}

// arrivalReconcileDelay is how long after a worker attaches its plugin
// hears so: a plugin that has not heard takes the end of the job for a
// start that failed (a job killed a second after its worker attached),
// and the delay gathers a burst of attaches into one call.
const arrivalReconcileDelay = 100 * time.Millisecond

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
// provisioner: the books' records (recordBudget), the profiles it
// holds back (maxHeldProfiles), the machines it times (maxWaiting); the
// event stream's history and the metrics' labels are bounded for all.
// An event past a bound is counted (fluksio_provisioner_events_unrecorded_total)
// and said once; a plugin that floods costs its own workers, and the
// engine's memory stays what the bounds allow.
func (e *Engine) pluginEvent(plog hclog.Logger, logs *loglimit.Limiter, ev shared.Event, now time.Time) {
	if err := e.books.ObserveEvent(ev); err != nil {
		why := unrecordedRevocation
		if ev.Kind == shared.EventWorkerProvisioned {
			why = unrecordedWorker
		}
		e.obs.unrecorded(plog, ev.Provisioner, why, err)
	}
	if err := e.router.observeEvent(ev); err != nil {
		e.obs.unrecorded(plog, ev.Provisioner, unrecordedProfile, err)
	}
	if !e.obs.pluginEvent(ev) {
		e.obs.unrecorded(plog, ev.Provisioner, unrecordedTimed, fmt.Errorf("%d machines of the provisioner's are being timed already", maxWaiting))
	}
	if ok, leftOut := logs.Allow(now); ok {
		if leftOut > 0 {
			e.eventsNotTold(plog, ev.Provisioner, leftOut)
		}
		if h := e.cfg.Hooks.PluginEvent; h != nil {
			e.hooks.put(func() { h(ev) }, true)
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
	if h := e.cfg.Hooks.EventsNotTold; h != nil {
		e.hooks.put(func() { h(provisioner, n) }, true)
	}
}

// flushEventLogs tells, for each provisioner, how many of its events
// the current window left out, which no later event will.
func (e *Engine) flushEventLogs() {
	for _, l := range e.fleet.eventLogs() {
		if n := l.limit.Flush(); n > 0 {
			e.eventsNotTold(l.logger, l.name, n)
		}
	}
}

// workerCounts is the attached workers per configured provisioner.
func (e *Engine) workerCounts() map[string]workerCounts {
	out := map[string]workerCounts{}
	for _, s := range e.fleet.list() {
		out[s.Name()] = workerCounts{}
	}
	for owner, n := range e.books.workerCounts() {
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
	// The engine's own loop first: nothing is handed out once the
	// workers are being let go.
	e.stopOwn()
	// A reload under way finishes first (what it launched is shut down
	// with the rest); none begins after.
	e.haltOnce.Do(func() {
		close(e.halted)
		select {
		case e.reloads <- struct{}{}:
		case <-ctx.Done():
		}
	})
	// Each plugin hears first who is attached, so that it counts their
	// jobs as arrived: a plugin's Shutdown cancels what has not arrived,
	// and must not race the workers about to leave on their own.
	e.fleet.reconcile(ctx, e.books)
	if n := e.books.dismiss(ctx, dismissWait); n > 0 {
		e.logger.Warn("workers still attached when the engine stopped; their provisioners let them go", "workers", n)
	}
	results := e.fleet.shutdown(ctx)
	e.flushEventLogs()
	e.router.Close()
	e.books.Close()
	e.hub.close()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	switch {
	case e.srv != nil:
		_ = e.srv.Shutdown(sctx)
	case e.ln != nil:
		e.ln.Close()
	}
	e.serving.Wait()
	// Hijacked connections are not the server's to wait for: the
	// parked polls' are answered and closed here.
	e.api.parker.Close()
	if e.stopLive != nil {
		e.stopLive()
	}
	e.watching.Wait()
	// The hooks queued run before the tasks' directory goes: a hook may
	// read a task's files.
	e.hooks.stop()
	e.ends.close()
	// No transfer is under way once the server stopped.
	e.tasks.removeRoot()
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
