package engine_test

import (
	"context"
	"fmt"
	"time"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/shared/sharedtest"
)

// The Router turns needs nobody serves into demand on the provisioners
// that cover them, and says, typed, why each need waits. Here one
// provisioner (a stand-in for a plugin) has a small profile only: the
// need it fits is asked for and waits queued; the one nothing fits waits
// for no fit, and is asked of nobody.
func ExampleRouter() {
	books := engine.NewBooks(nil, host.NewSigner(host.RandomSecret()), nil)
	defer books.Close()
	hpc := &sharedtest.Provisioner{
		Name:      "hpc",
		ShapeList: []shared.Shape{{Profile: "small", CPUs: 4}},
		OnProvision: func(r *shared.ProvisionRequest) (*shared.ProvisionResponse, error) {
			resp := &shared.ProvisionResponse{}
			for range r.Demand {
				resp.Outcomes = append(resp.Outcomes, shared.DemandOutcome{Outcome: shared.OutcomeRequested, Profile: "small"})
			}
			return resp, nil
		},
	}
	router := engine.NewRouter(nil, books, []engine.Target{{Name: "hpc", P: hpc, Shapes: hpc.ShapeList}})
	defer router.Close()
	router.AddWork(shared.Need{CPUs: 2}, 0)
	router.AddWork(shared.Need{CPUs: 64}, time.Second)
	router.Pass(context.Background())
	for _, n := range router.Needs() {
		fmt.Println(n.ID, n.Spec, n.State, n.Reason)
	}
	fmt.Println("asked of hpc:", hpc.LastDemand())
	// Output:
	// need-1 cpus=2 waiting queued
	// need-2 cpus=64 waiting no_fit
	// asked of hpc: [{{2 0 0 } 1}]
}

// An engine's whole life, without a provisioner: New listens, Serve
// serves the workers' endpoints and the operator's, Stop lets the workers
// go and shuts everything down, with a result per provisioner.
func ExampleEngine() {
	eng, err := engine.New(engine.Config{Secret: host.RandomSecret(), ID: "example", Listen: "127.0.0.1:0"})
	if err != nil {
		fmt.Println(err)
		return
	}
	eng.Serve(eng.Mux(nil, false))
	if diags := eng.Start(context.Background()); diags.HasErrors() {
		fmt.Println(diags)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	fmt.Println("served:", eng.Run(ctx, eng.Router.Served))
	fmt.Println("results:", len(eng.Stop(context.Background())))
	// Output:
	// served: true
	// results: 0
}
