// Embed is an engine in one page: it imports the engine kit
// (engine), reads the provisioner blocks of a configuration file,
// and serves the needs given on its command line through the configured
// plugins, with the project's worker (fluksio-worker), then stops cleanly:
// its workers are let go and end their jobs as completed.
//
//	embed -config FILE -need cpus=2[,gpus=N][,ram_mb=N][,label=L][,count=N][,work=D] ...
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
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/engine/hclconfig"
	"github.com/fluksio/provision/engine/host"
)

func main() {
	os.Exit(run())
}

func run() int {
	configPath := flag.String("config", "", "the configuration `file` (engine and provisioner blocks)")
	var needs engine.NeedList
	flag.Var(&needs, "need", "a need, as host-example's -need (repeatable)")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up after this long")
	flag.Parse()
	if *configPath == "" || len(needs) == 0 {
		fmt.Fprintln(os.Stderr, "usage: embed -config FILE -need SPEC [-need SPEC]...")
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
			Result: func(r engine.Result) {
				fmt.Printf("done: %s by %s (job %s): %s\n", r.TaskID, r.Worker, r.JobID, r.Output)
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
	code := serve(ctx, eng, needs, *timeout)

	// A clean stop, whatever happened: workers let go, plugins shut down
	// (each cancels what has not arrived), the listener closed.
	sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, r := range eng.Stop(sctx) {
		fmt.Println(r)
	}
	return code
}

// serve starts the plugins, adds the needs and runs the loop until every
// need is served (0), or the timeout or a signal ends it (1).
func serve(ctx context.Context, eng *engine.Engine, needs engine.NeedList, timeout time.Duration) int {
	if diags := eng.Start(ctx); diags.HasErrors() {
		fmt.Fprintln(os.Stderr, "embed: cannot start the provisioners:", diags.Error())
		return 1
	}
	for _, spec := range needs {
		for range spec.Count {
			eng.Add(spec.Need, spec.Work)
		}
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if eng.Run(rctx, eng.Served) {
		fmt.Println("all needs served")
		return 0
	}
	for _, n := range eng.Needs() {
		if n.State != engine.NeedServed {
			fmt.Printf("not served: %s (%s): %s\n", n.ID, n.Spec, n.Detail)
		}
	}
	return 1
}
