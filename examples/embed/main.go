// Embed is an engine in one page: it imports the engine kit
// (engine), reads the provisioner blocks of a configuration file, and
// runs the command given on its command line as n tasks, each on a
// machine of the configured plugins with the project's worker
// (fluksio-worker), then stops cleanly: its workers are let go and end
// their jobs as completed.
//
//	embed -config FILE [-n N] [-cpus N] -- COMMAND [ARG]...
//
// It is what an engine author starts from; host-example is the same loop
// with a CLI, TLS, operator authentication, a status page and a story.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/engine/hclconfig"
	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

func main() {
	os.Exit(run())
}

func run() int {
	configPath := flag.String("config", "", "the configuration `file` (engine and provisioner blocks)")
	n := flag.Int("n", 1, "run the command this many times, each a task")
	cpus := flag.Int("cpus", 1, "CPUs each task needs")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up after this long")
	flag.Parse()
	if *configPath == "" || flag.NArg() == 0 || *n < 1 || *cpus < 1 {
		fmt.Fprintln(os.Stderr, "usage: embed -config FILE [-n N] [-cpus N] -- COMMAND [ARG]...")
		return 2
	}

	// The configuration: the kit reads the engine block and decodes each
	// provisioner block against its plugin's schema; errors say where.
	cfg, diags := engine.LoadConfig(*configPath)
	if diags.HasErrors() {
		hclconfig.WriteDiagnostics(os.Stderr, cfg.Files, diags)
		return 1
	}

	// The engine: a fresh signing secret (credentials of this run only),
	// to listen where the engine block says, which is what the plugins'
	// engine_url must name. New opens nothing; Serve listens.
	logger := hclog.New(&hclog.LoggerOptions{Name: "embed", Level: hclog.Warn})
	eng, err := engine.New(engine.Config{
		Provisioners: cfg.Provisioners,
		Secret:       host.RandomSecret(),
		ID:           host.EngineIdentity(cfg.Engine.ID, cfg.Path),
		Listen:       cfg.Engine.Listen,
		Logger:       logger,
		Hooks: engine.Hooks{
			Attach: func(w engine.WorkerInfo) { fmt.Printf("attached: %s (job %s)\n", w.Name, w.JobID) },
			// Each task's end, with the last of its stdout; the whole
			// streams are in eng.TaskDir(id).
			TaskEnded: func(r engine.TaskResult) {
				a := r.Attempts[len(r.Attempts)-1]
				fmt.Printf("%s: %s by %s (job %s): %s\n", r.ID, r.State, a.Worker, a.JobID, strings.TrimSpace(r.Stdout))
			},
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "embed:", err)
		return 1
	}
	// The kit's default operator auth (nil): /status, /v1/events and
	// /metrics answer only this engine's own user and root on this
	// machine (engine.LocalUser), everyone else 403. Passing
	// engine.AllowAnyLocalUser instead opens them to whoever can reach
	// the listener; host-example passes its own, which adds a token.
	if err := eng.Serve(eng.Mux(nil, false)); err != nil {
		fmt.Fprintln(os.Stderr, "embed:", err)
		eng.Stop(context.Background())
		return 1
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	spec := engine.TaskSpec{Need: shared.Need{CPUs: *cpus}, Command: flag.Args(), Retries: 2}
	code := serve(ctx, eng, spec, *n, *timeout)

	// A clean stop, whatever happened: workers let go, plugins shut down
	// (each cancels what has not arrived), the listener closed.
	sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, r := range eng.Stop(sctx) {
		fmt.Println(r)
	}
	return code
}

// serve starts the plugins, submits n tasks of spec and runs the loop
// until every one has ended (0 if all succeeded), or the timeout or a
// signal ends it (1).
func serve(ctx context.Context, eng *engine.Engine, spec engine.TaskSpec, n int, timeout time.Duration) int {
	if diags := eng.Start(ctx); diags.HasErrors() {
		fmt.Fprintln(os.Stderr, "embed: cannot start the provisioners:", diags.Error())
		return 1
	}
	ids := make([]string, n)
	for i := range ids {
		var err error
		if ids[i], err = eng.Submit(spec); err != nil {
			fmt.Fprintln(os.Stderr, "embed:", err)
			return 1
		}
	}
	ended := func() bool {
		for _, id := range ids {
			if r, _ := eng.Task(id); r.State == engine.TaskWaiting || r.State == engine.TaskRunning {
				return false
			}
		}
		return true
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	eng.Run(rctx, ended)
	code := 0
	for _, id := range ids {
		if r, _ := eng.Task(id); r.State != worker.StateSucceeded {
			fmt.Printf("%s: %s %s\n", id, r.State, r.Error)
			code = 1
		}
	}
	return code
}
