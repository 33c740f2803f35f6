package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/internal/needspec"
	"github.com/fluksio/provision/internal/termsafe"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"

	"github.com/fluksio/provision/engine/hclconfig"
	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/shared"
)

// shutdownTimeout bounds a clean stop: the workers' leave, every
// plugin's Shutdown and the listener's close.
var shutdownTimeout = time.Minute

// runFlags is run's command line.
type runFlags struct {
	config, tasks, results, level string
	needs                         needspec.List
	timeout, linger               time.Duration
	// verbose: a story line for every task and machine, not only for
	// what needs a person.
	verbose bool
	// resume: keep the tasks an earlier run into -results succeeded
	// with (resume.go).
	resume bool
}

// parseRunFlags reads run's command line; done says to exit with code
// (help, or a usage error already written).
func parseRunFlags(args []string, stdout, stderr io.Writer) (f runFlags, code int, done bool) {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: host-example run -config FILE [-need SPEC]... [-tasks FILE -results DIR [-resume]] [-v] [-timeout DURATION] [-linger DURATION] [-log-level LEVEL]")
		fs.PrintDefaults()
	}
	fs.StringVar(&f.config, "config", "", "the configuration `file` (required)")
	fs.Var(&f.needs, "need", "nodes to place: cpus=N[,gpus=N][,ram_mb=N][,label=L][,count=N][,work=DURATION] (repeatable)")
	fs.StringVar(&f.tasks, "tasks", "", "run the tasks of this `file`: JSON lines, one task a line, with id, command (argv), cpus, gpus, ram_mb, label, env, inputs (name: local path), outputs, timeout, attempts (docs/operators.md)")
	fs.StringVar(&f.results, "results", "", "with -tasks: each task's stdout, stderr, result.json and outputs go under `DIR`/ID/")
	fs.BoolVar(&f.resume, "resume", false, "with -tasks: keep each task whose DIR/ID/result.json says it succeeded as the same task (command, env, need, timeout, inputs' contents, outputs), with its outputs as they were brought back, and run the rest; an earlier DIR/ID/ of a task that runs again is moved to DIR/.earlier/")
	fs.DurationVar(&f.timeout, "timeout", 0, "give up on the needs and tasks after this long (0: never)")
	fs.DurationVar(&f.linger, "linger", 0, "once the needs are served or -timeout passes, keep the engine up this long, so that its status page can be looked at")
	fs.BoolVar(&f.verbose, "v", false, "with -tasks: a line for every task as it ends and every machine as it comes and goes; without, only what needs a person (a task failed, lost, cancelled or timed out; a machine lost or refused), the progress and the summary")
	fs.StringVar(&f.level, "log-level", "info", "trace, debug, info, warn or error; the plugins log at the same level")
	rest, code, done := parseArgs(fs, args, stdout, stderr)
	switch {
	case done:
		return f, code, true
	case len(rest) != 0:
		return f, usageError(fs, stderr, "takes no arguments, got %q (the configuration is -config FILE)", rest), true
	case f.config == "":
		return f, usageError(fs, stderr, "-config FILE is required"), true
	case (f.tasks == "") != (f.results == ""):
		return f, usageError(fs, stderr, "-tasks FILE and -results DIR go together"), true
	case f.resume && f.tasks == "":
		return f, usageError(fs, stderr, "-resume goes with -tasks FILE -results DIR"), true
	case hclog.LevelFromString(f.level) == hclog.NoLevel:
		return f, usageError(fs, stderr, "-log-level %q: want trace, debug, info, warn or error", f.level), true
	}
	return f, 0, false
}

// runMain is the run command: it reads the flags and the configuration,
// and runs a daemon, the engine as a process. With needs it exits once
// all are served (0) or -timeout passes (1); without, it runs until
// SIGINT or SIGTERM. Either way it stops the daemon first, which shuts
// every provisioner down, so nothing it asked for is left in a queue.
func runMain(args []string, stdout, stderr io.Writer) int {
	f, code, done := parseRunFlags(args, stdout, stderr)
	if done {
		return code
	}
	var tasks []engine.TaskSpec
	var results *os.Root
	var taskLines []int
	var digests [][32]byte
	var plan *resumePlan
	if f.tasks != "" {
		// The results directory and the whole file are checked before
		// anything is asked for.
		var err error
		// A results directory that is not the engine's own, or a mistake
		// in the tasks file, is a mistake in what was given: exit 2, as
		// a usage error.
		if results, err = openResults(f.results); err != nil {
			fmt.Fprintf(stderr, "host-example: %v\n", err)
			return 2
		}
		defer results.Close()
		if tasks, taskLines, err = readTaskFile(f.tasks, results, f.resume); err != nil {
			fmt.Fprintf(stderr, "host-example: %v\n", err)
			return 2
		}
		// Each task's digest goes into its result.json, for a later
		// -resume; this one keeps what an earlier run left.
		if digests, err = specDigests(tasks, taskLines, f.tasks); err != nil {
			fmt.Fprintf(stderr, "host-example: %v\n", err)
			return 2
		}
		if f.resume {
			if plan, err = planResume(results, tasks, taskLines, digests); err != nil {
				fmt.Fprintf(stderr, "host-example: %v\n", err)
				return 2
			}
			tasks, taskLines, digests = plan.run, plan.lines, plan.digests
		}
	}
	if err := receiveSecrets(); err != nil {
		fmt.Fprintf(stderr, "host-example: %v\n", err)
		return 1
	}
	// Names and values from the configuration and the plugins reach the
	// operator's terminal through this logger: termsafe shows a control
	// or bidi character as an escape instead of letting it act.
	logger := hclog.New(&hclog.LoggerOptions{Name: "engine", Output: termsafe.Writer(stderr), Level: hclog.LevelFromString(f.level)})
	cfg, diags := engine.LoadConfig(f.config)
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
	// SIGHUP reloads the configuration (reload.go); one that comes
	// while the plugins start waits for them.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	st := newStory(stdout)
	// A run of needs tells every machine: its story is the machines. A
	// run of tasks tells what needs a person, and the progress, unless
	// -v asks for every line.
	st.verbose = f.verbose || f.tasks == ""
	d, err := newDaemon(cfg, logger, st, results)
	if err != nil {
		fmt.Fprintf(stderr, "host-example: %v\n", err)
		return 1
	}
	if d.tasks != nil {
		for i, t := range tasks {
			d.tasks.digests[t.ID] = digests[i]
		}
		digests = nil
		if plan != nil {
			d.tasks.kept = plan.kept
		}
	}
	if diags := d.start(ctx); ctx.Err() != nil {
		// Whatever failed to start failed because of the signal.
		d.story.say("signal received while starting; shutting down")
		stopSignals()
		d.stop()
		if len(f.needs) > 0 {
			return 1
		}
		return 0
	} else if diags.HasErrors() {
		hclconfig.SortDiagnostics(diags)
		hclconfig.WriteDiagnostics(stderr, cfg.Files, diags)
		d.stop()
		return 1
	}
	// What no machine on offer can hold is refused now, before anything
	// is asked for: the shapes are known once the plugins are up. It is
	// a mistake in what was given, as the file's others are: exit 2.
	if err := unheld(d.eng, f.needs, tasks, f.tasks, taskLines); err != nil {
		fmt.Fprintf(stderr, "host-example: %v\n", err)
		d.stop()
		return 2
	}
	d.story.say("status page: %s (metrics at /metrics, events at /v1/events)", d.pageURL())
	if plan != nil {
		if err := d.resume(plan); err != nil {
			fmt.Fprintf(stderr, "host-example: %v\n", err)
			d.stop()
			return 1
		}
		plan = nil
	}
	stopReloads := d.reloadOn(ctx, hup, stderr)
	defer stopReloads()
	d.lingering = f.linger > 0
	code = d.run(ctx, f.needs, &tasks, f.timeout)
	if f.linger > 0 && ctx.Err() == nil {
		d.story.say("lingering for %s so the status page can be looked at: %s (Ctrl-C stops it now)", f.linger, d.pageURL())
		lctx, cancel := context.WithTimeoutCause(ctx, f.linger, errLingered)
		d.run(lctx, nil, nil, 0)
		cancel()
	}
	stopSignals()
	stopReloads()
	d.stop()
	return code
}

// daemon is the engine as a process: the kit's engine (engine),
// the operator's auth and page in front of it, and the story on stdout.
// newDaemon builds it and listens; start launches the plugins; run
// places needs until they are served, time runs out or ctx ends; stop
// lets the workers go and shuts it all down. Each is called once, in
// that order, from one goroutine.
type daemon struct {
	// cfg is the configuration the engine runs: set by newDaemon, and
	// after start only by the reload goroutine (reloadOn).
	cfg    *engine.File
	logger hclog.Logger
	story  *story
	eng    *engine.Engine
	// lingering is set when run is followed by -linger.
	lingering bool
	// tasks is the run's tasks' side, with -tasks; nil without.
	tasks *taskRun
	// progress counts what the progress line and the summary tell.
	progress *progress
}

// newDaemon sets up the engine for cfg and starts listening. An error is
// the operator's to fix (the secret, the address), and says how.
func newDaemon(cfg *engine.File, logger hclog.Logger, story *story, results *os.Root) (*daemon, error) {
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
	engineID := host.EngineIdentity(cfg.Engine.ID, cfg.Path)
	logger.Info("worker credentials", "secret", map[bool]string{true: "from $" + cfg.Engine.SecretEnv, false: "random, this run only"}[fromEnv],
		"engine_id", engineID, "credential_epoch", host.CredentialEpoch(secret))
	d := &daemon{cfg: cfg, logger: logger, story: story, progress: newProgress()}
	taskDir := ""
	if results != nil {
		d.tasks = newTaskRun(results, story)
		taskDir = results.Name()
	}
	d.eng, err = engine.New(engine.Config{
		Provisioners:   cfg.Provisioners,
		Digest:         cfg.Digest,
		Secret:         secret,
		ID:             engineID,
		Listen:         cfg.Engine.Listen,
		TLS:            cfg.Engine.ServerTLS(),
		MaxConnections: cfg.Engine.MaxConnections,
		HoldPolls:      !cfg.Engine.ParkPolls,
		DropEnv:        []string{cfg.Engine.SecretEnv, cfg.Engine.OperatorTokenEnv},
		Logger:         logger,
		TaskDir:        taskDir,
		OperatorHosts:  cfg.Engine.OperatorHosts,
		Hooks:          d.hooks(results != nil),
	})
	if err != nil {
		return nil, err
	}
	operator := newOperatorAuth(opToken, host.NewSigner(secret), logger.Named("http"))
	operator.plugins = d.eng.PIDs
	mux := d.eng.Mux(operator.wrap, cfg.Engine.OpenMetrics)
	page := d.eng.OperatorGuard(operator.wrap(pageHandler()))
	for _, path := range []string{"GET /{$}", "GET /app.js", "GET /style.css", "GET /favicon.svg"} {
		mux.Handle(path, page)
	}
	if err := d.eng.Serve(mux); err != nil {
		d.eng.Stop(context.Background())
		return nil, fmt.Errorf("%w (engine.listen)", err)
	}
	return d, nil
}

// hooks are the engine's hooks for run: the story, the progress, and,
// with tasks, each task's result.json.
func (d *daemon) hooks(tasks bool) engine.Hooks {
	story := d.story
	h := engine.Hooks{
		PluginEvent: func(ev shared.Event) {
			d.progress.event(ev)
			story.event(ev)
		},
		WorkerGone: func(w engine.WorkerInfo, why string) {
			d.progress.gone(w, why)
			// A worker that detaches idle leaves as it should; any other
			// leaving (its job stopped under its task, gone silent,
			// dropped) is a person's to know.
			say := story.say
			if why == "detached" {
				say = story.detail
			}
			say("worker %s left (job %s): %s", w.Name, orDash(w.JobID), why)
		},
		EventsNotTold: func(provisioner string, n int) {
			story.say("%s: %d more event(s) not told here; GET /v1/events has them all", provisioner, n)
		},
		Attach: func(w engine.WorkerInfo) {
			d.progress.attach(w)
			ends := ""
			if !w.EndsAt.IsZero() {
				ends = fmt.Sprintf(", its job ends in %s", time.Until(w.EndsAt).Round(time.Second))
			}
			story.detail("worker %s attached from %s (job %s, %d cpus, %d gpus%s)", w.Name, w.Hostname, orDash(w.JobID), w.CPUs, w.GPUs, ends)
		},
		Result: func(r engine.Result) {
			if r.Output == "" {
				// A task's result: TaskEnded tells it.
				return
			}
			story.say("work done by %s: host %s, job %s, cpus %d: %s", r.Worker, r.Hostname, orDash(r.JobID), r.CPUs, r.Output)
		},
		Mismatch: func(m engine.Mismatch) {
			story.say("%s: worker %s (%q) cannot take task %s: %s; asking for no other %q machine for such tasks before %s, then one at a time",
				m.Provisioner, m.Worker, m.Profile, m.Task, m.Detail, m.Profile, m.Until.Local().Format(time.TimeOnly))
		},
		Burst: func(target string, pd shared.ProfileDemand) {
			d.progress.burst(target, pd)
			if pd.Requested > 0 {
				story.say("%s: asked for %d %q machine(s) in %d submission(s) (wanted %d, on the way %d, attached %d)",
					target, pd.Requested, pd.Profile, pd.Submissions, pd.Wanted, pd.OnTheWay, pd.Attached)
			}
			if pd.Cancelled > 0 {
				story.say("%s: demand fell; gave up %d pending %q machine(s)", target, pd.Cancelled, pd.Profile)
			}
		},
	}
	if tasks {
		h.TaskEnded = func(r engine.TaskResult) {
			d.progress.taskEnded(r)
			d.tasks.taskEnded(r)
		}
		h.TaskLost = d.tasks.taskLost
	}
	return h
}

// errLingered ends the run loop after -linger.
var errLingered = errors.New("lingered")

// pageURL is the status page's address, as the listener has it.
func (d *daemon) pageURL() string { return d.eng.URL() }

// start launches and configures every provisioner's plugin, and says
// which are ready.
func (d *daemon) start(ctx context.Context) hcl.Diagnostics {
	diags := d.eng.Start(ctx)
	if ctx.Err() == nil && !diags.HasErrors() {
		for _, b := range d.cfg.Provisioners {
			d.story.say("%s: %s provisioner ready", b.Name, b.Kind)
		}
	}
	return diags
}

// run places needs and runs tasks until all are served and ended (0,
// or 1 if a task did not succeed), timeout passes (1, if not zero) or
// ctx ends (0 without needs or tasks, 1 with). It takes the tasks' specs
// from *tasks and leaves nil there: the engine keeps what it needs of
// each, and nothing holds the file's copies once they are submitted. As
// a slice parameter they stayed reachable for the whole run (through
// the parameter's spill slot), 23 MB of heap with 100,000 tasks.
func (d *daemon) run(ctx context.Context, specs []needspec.Spec, tasks *[]engine.TaskSpec, timeout time.Duration) int {
	// The -need flags and the tasks file are one demand: the
	// provisioners hear of it whole, so that the shares under a cap
	// are of all of it.
	needs, ntasks, submitted, kept := 0, 0, 0, 0
	d.eng.Together(func() {
		needs = d.addNeeds(specs)
		if tasks != nil {
			ntasks, submitted = len(*tasks), d.submitTasks(*tasks)
			*tasks = nil
		}
	})
	if tasks != nil && d.tasks != nil {
		d.tasks.mu.Lock()
		kept = d.tasks.kept
		d.tasks.mu.Unlock()
	}
	rctx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	// A run whose tasks were all kept (-resume) has work all the same:
	// it ends at once, with its summary.
	working := needs > 0 || ntasks > 0 || kept > 0
	done := func() bool {
		return working && d.eng.Served() && (d.tasks == nil || d.tasks.allEnded())
	}
	stopProgress := func() {}
	if working {
		stopProgress = d.showProgress()
	}
	ok := d.eng.Run(rctx, done)
	stopProgress()
	if ok {
		switch {
		case ntasks > 0 || kept > 0:
			line, ok := d.tasks.summary()
			d.story.say("%s; %s", line, d.progress.read(nil, nil).machinesLine())
			if !ok || submitted < ntasks {
				return 1
			}
		case d.lingering:
			d.story.say("all %d need(s) served", needs)
			d.story.say("%s", d.needsSummary(needs))
		default:
			d.story.say("all %d need(s) served; shutting down", needs)
			d.story.say("%s", d.needsSummary(needs))
		}
		return 0
	}
	switch {
	case ctx.Err() == nil:
		var unserved []string
		for _, n := range d.eng.Needs() {
			if n.State != engine.NeedServed {
				unserved = append(unserved, fmt.Sprintf("%s (%s): %s", n.ID, n.Spec, n.Detail))
			}
		}
		d.story.say("timed out after %s; not served: %s", timeout, strings.Join(unserved, "; "))
		d.story.say("%s", d.summary(needs, ntasks+kept))
		return 1
	case context.Cause(ctx) == errLingered:
		d.story.say("lingered; shutting down")
		return 0
	}
	d.story.say("signal received; shutting down")
	if working {
		d.story.say("%s", d.summary(needs, ntasks+kept))
		return 1
	}
	return 0
}

// addNeeds adds the -need specs' needs and says so; it returns how many.
func (d *daemon) addNeeds(specs []needspec.Spec) int {
	needs := 0
	for _, spec := range specs {
		var first, last string
		for range spec.Count {
			last = d.eng.Add(spec.Need, spec.Work)
			if first == "" {
				first = last
			}
		}
		needs += spec.Count
		what := needspec.Format(spec.Need)
		if spec.Work > 0 {
			what += fmt.Sprintf(" for %s of work", spec.Work)
		}
		if spec.Count == 1 {
			d.story.say("%s needs %s: asking the provisioners that cover it", first, what)
		} else {
			d.story.say("%s..%s: %d needs of %s: asking the provisioners that cover them", first, last, spec.Count, what)
		}
	}
	return needs
}

// submitTasks submits the -tasks file's tasks and says so; it returns
// how many the engine took.
func (d *daemon) submitTasks(tasks []engine.TaskSpec) int {
	submitted := 0
	for _, t := range tasks {
		if _, err := d.eng.Submit(t); err != nil {
			// readTasks checked the file; what is left is the engine's
			// word (an input that changed since, a limit).
			d.story.say("task %s not submitted: %v", t.ID, err)
			continue
		}
		submitted++
	}
	if d.tasks != nil {
		d.tasks.mu.Lock()
		d.tasks.total += submitted
		d.tasks.mu.Unlock()
		if submitted > 0 {
			d.story.say("%d task(s) submitted; results under %s", submitted, d.tasks.results.Name())
		}
	}
	return submitted
}

// resume tells what -resume kept and runs, and moves the earlier
// directories of the tasks that run again aside (moveAside), before
// any is submitted.
func (d *daemon) resume(p *resumePlan) error {
	d.story.say("%s", p.resumeLine())
	for _, t := range p.run {
		if why := p.why[t.ID]; why != "" {
			d.story.detail("task %s runs: %s", t.ID, why)
		}
	}
	dir, err := moveAside(d.tasks.results, p.aside, time.Now())
	if err != nil {
		return err
	}
	if dir != "" {
		d.story.say("resume: moved %d earlier task director(ies) of tasks that run again to %s", len(p.aside), dir)
	}
	return nil
}

// summary is the run's last word when it did not finish: its tasks or
// needs, and its machines.
func (d *daemon) summary(needs, tasks int) string {
	if tasks > 0 {
		line, _ := d.tasks.summary()
		return line + "; " + d.progress.read(nil, nil).machinesLine()
	}
	return d.needsSummary(needs)
}

// needsSummary is the summary of a run with -need: how many were
// served, by how many machines from how many submissions, what waits
// and why, and what failed.
func (d *daemon) needsSummary(needs int) string {
	all := d.eng.Needs()
	c := d.progress.read(all, nil)
	// Served needs the engine no longer lists are served all the same.
	served := needs - (c.needs - c.served)
	line := fmt.Sprintf("summary: %d of %d need(s) served by %s", served, needs, c.machinesLine())
	if c.machines > 0 && c.machines < served {
		line += fmt.Sprintf("; machines were reused (%d needs, %d machines: a machine serves one need at a time, then the next)", served, c.machines)
	}
	if w := c.waiting(); w != "" {
		line += "; still waiting: " + w
	}
	return line
}

// showProgress draws the progress line until the stop it returns is
// called: every redrawEvery in place on a terminal, every progressEvery
// as a story line elsewhere, and only when it changed.
func (d *daemon) showProgress() (stop func()) {
	every := progressEvery
	if d.story.terminal {
		every = redrawEvery
	}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		last := ""
		for {
			select {
			case <-quit:
				return
			case <-t.C:
			}
			tc, nc := d.eng.Counts()
			if line := d.progress.readCounts(tc, nc, d.tasks, time.Now()).line(); line != last {
				last = line
				d.story.progress(line)
			}
		}
	}()
	return func() {
		close(quit)
		wg.Wait()
		d.story.endProgress()
	}
}

// stop lets the workers go, shuts every provisioner down (each cancels
// what it asked for that has not arrived) and closes the engine.
func (d *daemon) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	for _, r := range d.eng.Stop(ctx) {
		d.story.say("%s", r)
	}
}

// story prints what happens in words a person can follow, with the time
// since the engine started; the log on stderr has the details. On a
// terminal its last line is the progress line, redrawn in place; else
// the progress is a story line of its own now and then.
type story struct {
	mu    sync.Mutex // guards w and status
	w     io.Writer
	start time.Time
	// verbose: detail lines are told too; fixed before the engine
	// starts.
	verbose bool
	// terminal: w is a terminal, where status is drawn below the story
	// and redrawn in place.
	terminal bool
	// status is the progress line drawn last on a terminal; empty when
	// none is.
	status string
}

func newStory(w io.Writer) *story { return &story{w: w, start: time.Now(), terminal: isTerminal(w)} }

// say prints one line of the story. What it says is escaped
// (termsafe.EscapeLine): its words come from workers (a task's error, the
// tail of its stderr), plugins and files, and none of them may move the
// cursor, retitle the terminal, clear the screen or start another line.
func (s *story) say(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	line := fmt.Sprintf("[%6.1fs] %s\n", time.Since(s.start).Seconds(), termsafe.EscapeLine(fmt.Sprintf(format, args...)))
	if s.status != "" {
		// The story's line goes where the progress line was, and the
		// progress line below it again.
		line = "\r\x1b[K" + line + s.status
	}
	io.WriteString(s.w, line)
}

// detail says a line only with -v: a task that succeeded, a machine
// that came or went as it should.
func (s *story) detail(format string, args ...any) {
	if s.verbose {
		s.say(format, args...)
	}
}

// progress shows line as the run's progress: in place on a terminal; as
// a story line elsewhere.
func (s *story) progress(line string) {
	if !s.terminal {
		s.say("%s", line)
		return
	}
	line = termsafe.EscapeLine(line)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status = line
	io.WriteString(s.w, "\r\x1b[K"+line)
}

// endProgress takes the progress line off a terminal, before the last
// words.
func (s *story) endProgress() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.status != "" {
		io.WriteString(s.w, "\r\x1b[K")
		s.status = ""
	}
}

func (s *story) event(ev shared.Event) {
	switch ev.Kind {
	case shared.EventWorkerProvisioned:
		s.detail("%s: asked for a %q machine: job %s, worker %s", ev.Provisioner, ev.Profile, ev.Job, ev.Worker)
	case shared.EventWorkerProvisionFailed:
		s.say("%s: could not get a %q machine: %s", ev.Provisioner, ev.Profile, ev.Detail)
	case shared.EventWorkerCancelled:
		s.detail("%s: cancelled job %s (%s) %s", ev.Provisioner, ev.Job, ev.Worker, ev.Detail)
	case shared.EventWorkerJobEnded:
		if ev.JobState != "COMPLETED" && ev.JobState != "COMPLETING" {
			s.say("%s: job %s ended under worker %s: %s", ev.Provisioner, ev.Job, ev.Worker, ev.Detail)
		}
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
