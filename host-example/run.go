package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"

	"github.com/fluksio/provision/internal/loglimit"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/shared/hclconfig"
	"github.com/fluksio/provision/shared/host"
)

// Intervals of the run loop. A placer pass is cheap (it answers "could
// anything fit?" from cached shapes) so it runs often; Reconcile crosses
// into every plugin, so it runs less.
var (
	passInterval      = time.Second
	reconcileInterval = 3 * time.Second
	shutdownTimeout   = time.Minute
)

// runMain is the run command: it reads the flags and the configuration,
// and runs a daemon, the engine as a process. With needs it exits once
// all are served (0) or -timeout passes (1); without, it runs until
// SIGINT or SIGTERM. Either way it stops the daemon first, which shuts
// every provisioner down, so nothing it asked for is left in a queue.
func runMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: host-example run -config FILE [-need SPEC]... [-timeout DURATION] [-linger DURATION] [-log-level LEVEL]")
		fs.PrintDefaults()
	}
	configPath := fs.String("config", "", "the configuration `file` (required)")
	var needs needList
	fs.Var(&needs, "need", "nodes to place: cpus=N[,gpus=N][,ram_mb=N][,label=L][,count=N][,work=DURATION] (repeatable)")
	timeout := fs.Duration("timeout", 0, "give up on the needs after this long (0: never)")
	linger := fs.Duration("linger", 0, "once the needs are served or -timeout passes, keep the engine up this long, so that its status page can be looked at")
	level := fs.String("log-level", "info", "trace, debug, info, warn or error; the plugins log at the same level")
	rest, code, done := parseArgs(fs, args, stdout, stderr)
	if done {
		return code
	}
	if len(rest) != 0 {
		return usageError(fs, stderr, "takes no arguments, got %q (the configuration is -config FILE)", rest)
	}
	if *configPath == "" {
		return usageError(fs, stderr, "-config FILE is required")
	}
	if hclog.LevelFromString(*level) == hclog.NoLevel {
		return usageError(fs, stderr, "-log-level %q: want trace, debug, info, warn or error", *level)
	}

	if err := receiveSecrets(); err != nil {
		fmt.Fprintf(stderr, "host-example: %v\n", err)
		return 1
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: "engine", Output: stderr, Level: hclog.LevelFromString(*level)})
	cfg, diags := loadConfig(*configPath)
	if diags.HasErrors() {
		hclconfig.WriteDiagnostics(stderr, cfg.Files, diags)
		return 1
	}
	// Before anything starts: the secrets leave the initial environment
	// (see secrets.go). This returns only when there is nothing to move.
	if err := reexecWithoutSecrets([]string{cfg.Engine.SecretEnv, cfg.Engine.OperatorTokenEnv}); err != nil {
		fmt.Fprintf(stderr, "host-example: %v\n", err)
		return 1
	}

	// Signals are caught from here on, so that one arriving while the
	// plugins start still shuts them down rather than killing the engine.
	ctx, stopSignals := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stopSignals()

	d, err := newDaemon(cfg, logger, newStory(stdout))
	if err != nil {
		fmt.Fprintf(stderr, "host-example: %v\n", err)
		return 1
	}
	if diags := d.start(ctx); ctx.Err() != nil {
		// Whatever failed to start failed because of the signal.
		d.story.say("signal received while starting; shutting down")
		stopSignals()
		d.stop()
		if len(needs) > 0 {
			return 1
		}
		return 0
	} else if diags.HasErrors() {
		hclconfig.SortDiagnostics(diags)
		hclconfig.WriteDiagnostics(stderr, cfg.Files, diags)
		d.stop()
		return 1
	}
	d.story.say("status page: %s (metrics at /metrics, events at /v1/events)", d.pageURL())
	d.lingering = *linger > 0
	code = d.run(ctx, needs, *timeout)
	if *linger > 0 && ctx.Err() == nil {
		d.story.say("lingering for %s so the status page can be looked at: %s (Ctrl-C stops it now)", *linger, d.pageURL())
		lctx, cancel := context.WithTimeoutCause(ctx, *linger, errLingered)
		d.run(lctx, nil, 0)
		cancel()
	}
	stopSignals()
	d.stop()
	return code
}

// daemon is the engine as a process: the HTTP engine workers attach to,
// a supervised plugin per provisioner block (host.Supervisor) and the
// placer, wired together. newDaemon builds it and listens; start
// launches the plugins; run places needs until they are served, time runs
// out or ctx ends; stop shuts it all down, provisioners first. Each is
// called once, in that order, from one goroutine.
type daemon struct {
	cfg    *config
	logger hclog.Logger
	story  *story

	engine   *Engine
	operator *operatorAuth
	obs      *observer
	srv      *http.Server
	serving  sync.WaitGroup // the HTTP server's goroutine
	placer   *Placer
	sups     []*host.Supervisor
	// wake holds at most one pending wake-up for the run loop: an event
	// from a plugin, or a plugin up again.
	wake chan struct{}
	// addr is where the engine listens, as the listener says.
	addr string
	// lingering is set when run is followed by -linger.
	lingering bool
	// eventLogs bounds, per provisioner, how many of its events are told
	// in the story and the log; fixed after newDaemon.
	eventLogs []pluginEventLog
}

// pluginEventLog is one provisioner's budget of event lines.
type pluginEventLog struct {
	name   string
	logger hclog.Logger
	limit  *loglimit.Limiter
}

// A plugin's events are told in the story and the log at most
// eventLogBurst per eventLogWindow each; the rest are counted, and the
// first line after them, or the engine's stop, says how many were not
// told. They still all reach the engine's books, the event stream and
// the metrics: only the telling is bounded. A plugin that flooded small
// well-formed events made 48,355 log lines in 40 s. A hundred in ten
// seconds is a burst of a hundred machines told one by one, which is as
// many as a person reads.
const (
	eventLogBurst  = 100
	eventLogWindow = 10 * time.Second
)

// pluginEvent is what the engine does with an event a provisioner's
// plugin sent (stamped by the host), at now: the engine learns each
// worker's job, and which names to revoke; the observer streams and
// counts it; the story and the log tell it, within logs' budget.
func (d *daemon) pluginEvent(plog hclog.Logger, logs *loglimit.Limiter, ev shared.Event, now time.Time) {
	d.engine.ObserveEvent(ev)
	d.placer.ObserveEvent(ev)
	d.obs.pluginEvent(ev)
	if ok, leftOut := logs.Allow(now); ok {
		if leftOut > 0 {
			d.eventsNotTold(plog, ev.Provisioner, leftOut)
		}
		d.story.event(ev)
		plog.Info("event", "kind", ev.Kind, "profile", ev.Profile, "job", ev.Job, "worker", ev.Worker, "detail", ev.Detail)
	}
	d.poke()
}

// flushEventLogs tells, for each provisioner, how many of its events
// the current window left out, which no later event will.
func (d *daemon) flushEventLogs() {
	for _, l := range d.eventLogs {
		if n := l.limit.Flush(); n > 0 {
			d.eventsNotTold(l.logger, l.name, n)
		}
	}
}

// eventsNotTold is the summary of n events of provisioner left out of
// the story and the log.
func (d *daemon) eventsNotTold(plog hclog.Logger, provisioner string, n int) {
	plog.Warn("events not logged: the plugin sent more than the log takes", "not_logged", n,
		"max", eventLogBurst, "per", eventLogWindow.String())
	d.story.say("%s: %d more event(s) not told here (more than %d in %s); GET /v1/events has them all", provisioner, n, eventLogBurst, eventLogWindow)
}

// newDaemon sets up the engine for cfg and starts listening. An error is
// the operator's to fix (the secret, the address), and says how.
func newDaemon(cfg *config, logger hclog.Logger, story *story) (*daemon, error) {
	if v := cfg.Engine.SecretEnv; v != "" && !nonEmpty(lookupSecret(v)) {
		// A configured secret that is missing would silently become a
		// random one, and workers from an earlier run would be refused.
		return nil, fmt.Errorf("engine.secret_env names %s, which is not set; export it (32+ bytes, or 64+ hex digits) or remove secret_env", v)
	}
	secret, fromEnv, err := engineSecret(cfg.Engine.SecretEnv)
	if err != nil {
		return nil, err
	}
	opToken, err := operatorToken(cfg.Engine.OperatorTokenEnv)
	if err != nil {
		return nil, err
	}
	engineID, epoch := host.EngineIdentity(cfg.Engine.ID, cfg.Path), host.CredentialEpoch(secret)
	logger.Info("worker credentials", "secret", map[bool]string{true: "from $" + cfg.Engine.SecretEnv, false: "random, this run only"}[fromEnv],
		"engine_id", engineID, "credential_epoch", epoch)
	signer := host.NewSigner(secret)
	d := &daemon{cfg: cfg, logger: logger, story: story, wake: make(chan struct{}, 1)}
	d.engine = NewEngine(logger.Named("http"), signer, time.Now)
	d.operator = newOperatorAuth(opToken, signer, logger.Named("http"))
	d.operator.plugins = d.pluginPIDs
	d.engine.ID = engineID
	d.engine.OnAttach = func(w WorkerInfo) {
		d.placer.WorkerAttached(w.Provisioner, w.Profile)
		story.say("worker %s attached from %s (job %s, %d cpus, %d gpus)", w.Name, w.Hostname, orDash(w.JobID), w.CPUs, w.GPUs)
	}
	d.engine.OnResult = func(r Result) {
		story.say("work done by %s: host %s, job %s, cpus %d: %s", r.Worker, r.Hostname, orDash(r.JobID), r.CPUs, r.Output)
	}

	ln, engineAddress, err := listenEngine(cfg.Engine.Listen)
	if err != nil {
		return nil, fmt.Errorf("cannot listen on %s (engine.listen): %w", cfg.Engine.Listen, err)
	}
	gate := newConnGate(cfg.Engine.MaxConnections, logger.Named("http"), loglimit.New(refusalLogBurst, refusalLogWindow))
	tlsConfig := cfg.Engine.serverTLSConfig()

	state := &stateCollector{health: d.health, status: d.engine.provisionerStatus, workers: d.workerCounts, tasks: d.taskCounts,
		held: func() []heldProfile { return d.placer.Held() }}
	d.obs = newObserver(newEngineMetrics(state))
	d.engine.OnActivity = d.obs.activity

	d.placer = NewPlacer(logger.Named("placer"), d.engine, nil)
	d.placer.OnBurst = func(target string, pd shared.ProfileDemand) {
		d.obs.burst(target, pd)
		if pd.Requested > 0 {
			story.say("%s: asked for %d %q machine(s) in %d submission(s) (wanted %d, on the way %d, attached %d)",
				target, pd.Requested, pd.Profile, pd.Submissions, pd.Wanted, pd.OnTheWay, pd.Attached)
		}
		if pd.Cancelled > 0 {
			story.say("%s: demand fell; gave up %d pending %q machine(s)", target, pd.Cancelled, pd.Profile)
		}
	}
	supByName := map[string]*host.Supervisor{}
	d.placer.OnDeadline = func(name string, missed bool) {
		if s := supByName[name]; s != nil {
			s.Deadline("Provision", missed)
		}
	}
	d.engine.NeedsFunc = d.placer.Needs
	d.engine.HeldFunc = d.placer.Held
	for _, pc := range cfg.Provisioners {
		plog := logger.Named(pc.Name)
		name := pc.Name
		evLogs := loglimit.New(eventLogBurst, eventLogWindow)
		d.eventLogs = append(d.eventLogs, pluginEventLog{name: name, logger: plog, limit: evLogs})
		s := host.NewSupervisor(pc, plog, host.Options{
			Logger:          logger.Named("plugin"),
			Signer:          signer,
			EngineID:        engineID,
			CredentialEpoch: epoch,
			EngineAddress:   engineAddress,
			DropEnv:         []string{cfg.Engine.SecretEnv, cfg.Engine.OperatorTokenEnv},
			OnEvent:         func(ev shared.Event) { d.pluginEvent(plog, evLogs, ev, time.Now()) },
		})
		s.OnUp = func(c host.Configured) {
			d.placer.SetTarget(Target{Name: c.Name, P: c.Provisioner, Shapes: c.Shapes})
			d.placer.SetDown(name, false)
			d.obs.plugin("plugin_up", name, fmt.Sprintf("configured, %d shape(s)", len(c.Shapes)))
			d.poke()
		}
		s.OnDown = func(string) {
			d.placer.SetDown(name, true)
			d.obs.plugin("plugin_down", name, "the plugin exited; restarting it")
		}
		d.sups = append(d.sups, s)
		supByName[name] = s
	}
	d.engine.StatusFunc = func(ctx context.Context) []host.ProvisionerStatus {
		out := make([]host.ProvisionerStatus, 0, len(d.sups))
		for _, s := range d.sups {
			out = append(out, s.Status(ctx))
		}
		return out
	}

	// Served only now that everything a handler reads is in place.
	d.srv = newHTTPServer(d.handler(), gate, d.engine.pollWait(), tlsConfig)
	d.serving.Add(1)
	go func() {
		defer d.serving.Done()
		var err error
		if tlsConfig != nil {
			err = d.srv.ServeTLS(ln, "", "")
		} else {
			err = d.srv.Serve(ln)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("http server stopped", "error", err)
		}
	}()
	logger.Info("listening for workers", "addr", ln.Addr().String(), "tls", tlsConfig != nil, "max_connections", gate.max)
	if plainBeyondLoopback(ln.Addr(), tlsConfig != nil) {
		logger.Warn("listening beyond loopback in plain HTTP: worker credentials cross the network in the clear; set tls_cert and tls_key in the engine block, or terminate TLS in front of the engine",
			"addr", ln.Addr().String())
	}
	d.addr = ln.Addr().String()
	return d, nil
}

// handler routes every endpoint: the workers' (the Engine's), the
// operator's and the monitoring ones.
func (d *daemon) handler() http.Handler {
	mux := http.NewServeMux()
	engine := d.engine.Handler()
	op := d.operator.wrap
	mux.Handle("/v1/", engine)
	mux.Handle("GET /status", op(engine))
	mux.Handle("GET /v1/events", op(http.HandlerFunc(d.obs.hub.serveEvents)))
	metrics := d.obs.metrics.handler()
	if !d.cfg.Engine.OpenMetrics {
		metrics = op(metrics)
	}
	mux.Handle("GET /metrics", metrics)
	mux.HandleFunc("GET /health", health)
	mux.HandleFunc("GET /ready", ready(d.health))
	page := op(pageHandler())
	for _, path := range []string{"GET /{$}", "GET /app.js", "GET /style.css", "GET /favicon.svg"} {
		mux.Handle(path, page)
	}
	return mux
}

// health reads every provisioner's plugin state from its Supervisor.
func (d *daemon) health() []provHealth {
	out := make([]provHealth, 0, len(d.sups))
	for _, s := range d.sups {
		up, restarts := s.Health()
		out = append(out, provHealth{name: s.Name(), kind: s.Kind(), up: up, restarts: restarts})
	}
	return out
}

// pluginPIDs lists the running plugin processes.
func (d *daemon) pluginPIDs() []int {
	var out []int
	for _, s := range d.sups {
		if pid := s.Pid(); pid > 0 {
			out = append(out, pid)
		}
	}
	return out
}

// workerCounts is the attached workers per configured provisioner.
func (d *daemon) workerCounts() map[string]workerCounts {
	out := map[string]workerCounts{}
	for _, s := range d.sups {
		out[s.Name()] = workerCounts{}
	}
	for owner, n := range d.engine.workerCounts() {
		out[owner] = n
	}
	return out
}

// taskCounts is the placer's needs by state.
func (d *daemon) taskCounts() map[string]int {
	out := map[string]int{}
	for _, n := range d.placer.Needs() {
		out[n.State]++
	}
	return out
}

// errLingered ends the run loop after -linger.
var errLingered = errors.New("lingered")

// pageURL is the status page's address, as the listener has it.
func (d *daemon) pageURL() string {
	scheme := "http"
	if d.cfg.Engine.tlsCert != nil {
		scheme = "https"
	}
	return scheme + "://" + d.addr + "/"
}

// poke wakes the run loop; wake-ups that arrive while one is pending are
// merged.
func (d *daemon) poke() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// start launches and configures every provisioner's plugin, within two
// minutes, and says which are ready.
func (d *daemon) start(ctx context.Context) hcl.Diagnostics {
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var diags hcl.Diagnostics
	for _, s := range d.sups {
		diags = append(diags, s.Start(startCtx)...)
	}
	if ctx.Err() == nil && !diags.HasErrors() {
		for _, s := range d.sups {
			d.story.say("%s: %s provisioner ready", s.Name(), s.Kind())
		}
	}
	return diags
}

// run places needs until all are served (0), timeout passes (1, if not
// zero) or ctx ends (0 without needs, 1 with).
func (d *daemon) run(ctx context.Context, specs []needSpec, timeout time.Duration) int {
	needs := 0
	for _, spec := range specs {
		var first, last string
		for range spec.Count {
			last = d.placer.AddWork(spec.Need, spec.Work)
			if first == "" {
				first = last
			}
		}
		needs += spec.Count
		what := formatNeed(spec.Need)
		if spec.Work > 0 {
			what += fmt.Sprintf(" for %s of work", spec.Work)
		}
		if spec.Count == 1 {
			d.story.say("%s needs %s: asking the provisioners that cover it", first, what)
		} else {
			d.story.say("%s..%s: %d needs of %s: asking the provisioners that cover them", first, last, spec.Count, what)
		}
	}
	var deadline <-chan time.Time
	if timeout > 0 {
		timer := time.NewTimer(timeout)
		defer timer.Stop()
		deadline = timer.C
	}
	passTick := time.NewTicker(passInterval)
	defer passTick.Stop()
	reconcileTick := time.NewTicker(reconcileInterval)
	defer reconcileTick.Stop()

	d.placer.Pass(ctx)
	for {
		if needs > 0 && d.placer.Served() {
			if d.lingering {
				d.story.say("all %d need(s) served", needs)
			} else {
				d.story.say("all %d need(s) served; shutting down", needs)
			}
			return 0
		}
		select {
		case <-ctx.Done():
			if context.Cause(ctx) == errLingered {
				d.story.say("lingered; shutting down")
				return 0
			}
			d.story.say("signal received; shutting down")
			if needs > 0 {
				return 1
			}
			return 0
		case <-deadline:
			d.story.say("timed out after %s; not served: %s", timeout, strings.Join(d.placer.Unserved(), "; "))
			return 1
		case <-passTick.C:
		case <-d.wake:
		case <-d.engine.Changed():
		case <-reconcileTick.C:
			for _, s := range d.sups {
				s.Reconcile(ctx, d.engine.AttachedBy(s.Name()))
			}
		}
		d.placer.Pass(ctx)
	}
}

// stop shuts every provisioner down (each cancels what it asked for),
// waits for the calls under way, then closes the engine and its listener.
func (d *daemon) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, s := range d.sups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := s.Shutdown(ctx)
			switch {
			case err != nil:
				d.story.say("%s: shutdown failed: %v", s.Name(), err)
			case len(resp.Cancelled) > 0:
				d.story.say("%s: shut down, cancelled job(s) %s", s.Name(), strings.Join(resp.Cancelled, ", "))
			default:
				d.story.say("%s: shut down, nothing outstanding", s.Name())
			}
		}()
	}
	wg.Wait()
	d.flushEventLogs()
	d.placer.Close()
	d.engine.Close()
	d.obs.hub.close()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	_ = d.srv.Shutdown(sctx)
	d.serving.Wait()
}

// story prints what happens in words a person can follow, with the time
// since the engine started; the log on stderr has the details.
type story struct {
	mu    sync.Mutex // guards w
	w     io.Writer
	start time.Time
}

func newStory(w io.Writer) *story { return &story{w: w, start: time.Now()} }

func (s *story) say(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(s.w, "[%6.1fs] %s\n", time.Since(s.start).Seconds(), fmt.Sprintf(format, args...))
}

func (s *story) event(ev shared.Event) {
	switch ev.Kind {
	case shared.EventWorkerProvisioned:
		s.say("%s: asked for a %q machine: job %s, worker %s", ev.Provisioner, ev.Profile, ev.Job, ev.Worker)
	case shared.EventWorkerProvisionFailed:
		s.say("%s: could not get a %q machine: %s", ev.Provisioner, ev.Profile, ev.Detail)
	case shared.EventWorkerCancelled:
		s.say("%s: cancelled job %s (%s) %s", ev.Provisioner, ev.Job, ev.Worker, ev.Detail)
	default:
		s.say("%s: %s %s %s", ev.Provisioner, ev.Kind, ev.Job, ev.Detail)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// engineSecret is the secret the engine signs with: from the environment
// variable name if it is set, else fresh random bytes.
//
// Once read, the variable is removed from this process's environment, so
// nothing the engine starts inherits it; plugins are started without it
// besides (LaunchConfig.DropEnv), in case another path put it back. When
// run was started with it, the value arrived by descriptor instead and
// the variable was never in this image's environment (secrets.go).
func engineSecret(name string) (secret []byte, fromEnv bool, err error) {
	if name == "" || !nonEmpty(lookupSecret(name)) {
		return host.RandomSecret(), false, nil
	}
	v, _ := lookupSecret(name)
	forgetSecret(name)
	secret, err = host.ParseSecret(v)
	if err != nil {
		// The value itself is never part of the message: it is the secret.
		return nil, false, fmt.Errorf("%s: %w", name, err)
	}
	return secret, true, nil
}

// nonEmpty says a looked-up value is set and not empty.
func nonEmpty(v string, ok bool) bool { return ok && v != "" }
