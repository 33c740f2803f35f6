package engine_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/shared"
)

// An engine's whole life. New builds it and opens nothing; Serve listens
// and serves the workers' endpoints and the operator's; Start launches
// the plugins (here none); Add records a need; Run passes until its done
// says so (here after one pass); Stop lets the workers go and shuts
// everything down, with a result per provisioner. With no provisioner,
// the need waits for a machine nothing can start, and says so.
func ExampleEngine() {
	eng, err := engine.New(engine.Config{Secret: host.RandomSecret(), ID: "example", Listen: "127.0.0.1:0"})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := eng.Serve(eng.Mux(nil, false)); err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	if diags := eng.Start(ctx); diags.HasErrors() {
		fmt.Println(diags)
	}
	eng.Add(shared.Need{CPUs: 2}, 0)
	onePass := func() bool { return true }
	eng.Run(ctx, onePass)
	fmt.Println("served:", eng.Served())
	for _, n := range eng.Needs() {
		fmt.Println(n.ID, n.Spec, n.State, n.Reason)
	}
	fmt.Println("results:", len(eng.Stop(ctx)))
	// Output:
	// served: false
	// need-1 cpus=2 waiting no_fit
	// results: 0
}

// A need that still waits is taken back: it leaves the engine's list, and
// the next pass tells its provisioner the smaller demand. A need that is
// not there (withdrawn already, or never added) says so.
func ExampleEngine_Withdraw() {
	eng, err := engine.New(engine.Config{Secret: host.RandomSecret(), Listen: "127.0.0.1:0"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer eng.Stop(context.Background())
	first := eng.Add(shared.Need{CPUs: 2}, 0)
	eng.Add(shared.Need{CPUs: 4, GPUs: 1}, 0)
	fmt.Println("withdraw", first+":", eng.Withdraw(first))
	fmt.Println("again:", errors.Is(eng.Withdraw(first), engine.ErrNoSuchNeed))
	for _, n := range eng.Needs() {
		fmt.Println(n.ID, n.Spec, n.State)
	}
	// Output:
	// withdraw need-1: <nil>
	// again: true
	// need-2 cpus=4,gpus=1 waiting
}

// Events delivers what the event stream (GET /v1/events) streams: the
// provisioners' events, the workers' and the plugins' own, each with its
// sequence number. The channel closes when its context ends or the
// engine stops. The provisioners come from a configuration file, so this
// example is compiled and not run.
func ExampleEngine_Events() {
	cfg, diags := engine.LoadConfig("engine.hcl")
	if diags.HasErrors() {
		fmt.Println(diags)
		return
	}
	eng, err := engine.New(engine.Config{Provisioners: cfg.Provisioners, Secret: host.RandomSecret(), Listen: cfg.Engine.Listen})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	told := make(chan struct{})
	go func() {
		defer close(told)
		for ev := range eng.Events(ctx, 0) {
			fmt.Println(ev.Seq, ev.Kind, ev.Provisioner, ev.Worker)
		}
	}()
	if err := eng.Serve(eng.Mux(nil, false)); err != nil {
		fmt.Println(err)
		return
	}
	if diags := eng.Start(ctx); diags.HasErrors() {
		fmt.Println(diags)
	}
	eng.Add(shared.Need{CPUs: 1}, 0)
	eng.Run(ctx, eng.Served)
	eng.Stop(ctx)
	<-told
}
