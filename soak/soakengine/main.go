// Soakengine is the engine the soak (make soak, soak/soak_test.go) drives:
// examples/embed's page of engine kit, with two routes more, POST
// /soak/need and POST /soak/withdraw, through which the soak adds demand
// while the engine runs and takes some back.
// host-example takes its needs on the command line only, and a soak's
// workload changes over time, so the soak runs this instead; it is the
// same kit (engine) host-example is a thin layer over, so what the
// soak finds is the engine's, not this file's.
//
//	soakengine -config FILE
//
// It serves until SIGTERM or SIGINT, then stops cleanly: workers let go,
// plugins shut down. It keeps nothing across a restart (the kit does not);
// the soak adds again what a killed engine had not served.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
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
	level := flag.String("log-level", "info", "the log's level (trace, debug, info, warn, error)")
	flag.Parse()
	if *configPath == "" {
		fmt.Fprintln(os.Stderr, "usage: soakengine -config FILE")
		return 2
	}
	cfg, diags := engine.LoadConfig(*configPath)
	if diags.HasErrors() {
		hclconfig.WriteDiagnostics(os.Stderr, cfg.Files, diags)
		return 1
	}
	var err error
	logger := hclog.New(&hclog.LoggerOptions{Name: "soakengine", Level: hclog.LevelFromString(*level), Output: os.Stderr})
	// The secret comes from the variable secret_env names when there is
	// one, so that a restarted engine accepts the credentials of the
	// workers the last one started (they attach again); else it is this
	// run's own.
	secret := host.RandomSecret()
	if name := cfg.Engine.SecretEnv; name != "" && os.Getenv(name) != "" {
		secret, err = host.ParseSecret(os.Getenv(name))
		if err != nil {
			fmt.Fprintf(os.Stderr, "soakengine: %s: %v\n", name, err)
			return 1
		}
		os.Unsetenv(name)
	}
	eng, err := engine.New(engine.Config{
		Provisioners: cfg.Provisioners,
		Secret:       secret,
		DropEnv:      []string{cfg.Engine.SecretEnv},
		// The identity comes from the configuration's path, so a
		// restarted engine is the same engine to its plugins, which adopt
		// the jobs the last one left.
		ID:     host.EngineIdentity(cfg.Engine.ID, cfg.Path),
		Listen: cfg.Engine.Listen,
		Logger: logger,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "soakengine:", err)
		return 1
	}
	mux := eng.Mux(nil, true)
	mux.HandleFunc("POST /soak/need", func(w http.ResponseWriter, r *http.Request) {
		spec, err := engine.ParseNeedSpec(r.FormValue("spec"))
		if err != nil {
			engine.WriteError(w, http.StatusBadRequest, err.Error())
			return
		}
		ids := make([]string, 0, spec.Count)
		for range spec.Count {
			ids = append(ids, eng.Add(spec.Need, spec.Work))
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(ids)
	})
	// POST /soak/withdraw takes needs back by id (id=..., repeated) and
	// answers, per id, "withdrawn" or why not.
	mux.HandleFunc("POST /soak/withdraw", func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil {
			engine.WriteError(w, http.StatusBadRequest, err.Error())
			return
		}
		answers := map[string]string{}
		for _, id := range r.PostForm["id"] {
			answers[id] = "withdrawn"
			if err := eng.Withdraw(id); err != nil {
				answers[id] = err.Error()
			}
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(answers)
	})
	if err := eng.Serve(mux); err != nil {
		fmt.Fprintln(os.Stderr, "soakengine:", err)
		return 1
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if diags := eng.Start(ctx); diags.HasErrors() {
		fmt.Fprintln(os.Stderr, "soakengine: cannot start the provisioners:", diags.Error())
	} else {
		fmt.Println("soakengine: started")
		eng.Run(ctx, nil)
	}
	sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, r := range eng.Stop(sctx) {
		fmt.Println(r)
	}
	return 0
}
