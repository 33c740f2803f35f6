package engine_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

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

// An engine with a task model of its own places its tasks itself:
// Config.Place is handed, once a pass, what waits (in the order it was
// added) and the idle workers (smallest first), and says which task goes
// on which worker; the engine assigns those, checking that each worker
// fits and has the features the task requires, and asks the
// provisioners for machines for the rest. This one runs urgent tasks
// first, each on the largest idle worker that can run it. Here it is
// shown the pass it would see with two workers idle.
func ExampleConfig_place() {
	urgentFirst := func(waiting []engine.WaitingTask, idle []engine.WorkerInfo) []engine.Placement {
		slices.SortStableFunc(waiting, func(a, b engine.WaitingTask) int {
			return cmp.Compare(urgency(b.ID), urgency(a.ID))
		})
		taken := make([]bool, len(idle))
		var placed []engine.Placement
		for _, t := range waiting {
			for i := len(idle) - 1; i >= 0; i-- {
				if !taken[i] && idle[i].CPUs >= t.Need.CPUs && hasAll(idle[i].Features, t.Requires) {
					taken[i] = true
					placed = append(placed, engine.Placement{Task: t.ID, Worker: idle[i].Name})
					break
				}
			}
		}
		return placed
	}
	eng, err := engine.New(engine.Config{Secret: host.RandomSecret(), Listen: "127.0.0.1:0", Place: urgentFirst})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer eng.Stop(context.Background())
	for _, id := range []string{"batch-1", "urgent-1", "batch-2"} {
		if _, err := eng.Submit(engine.TaskSpec{ID: id, Need: shared.Need{CPUs: 2}, Command: []string{"make", id}}); err != nil {
			fmt.Println(err)
		}
	}
	var waiting []engine.WaitingTask
	for _, n := range eng.Needs() {
		waiting = append(waiting, engine.WaitingTask{ID: n.ID, Need: shared.Need{CPUs: n.Need.CPUs}, Requires: []string{"command"}})
	}
	idle := []engine.WorkerInfo{
		{Name: "hpc-cpu-1", CPUs: 4, Features: []string{"command"}},
		{Name: "hpc-cpu-2", CPUs: 8, Features: []string{"command"}},
	}
	for _, p := range urgentFirst(waiting, idle) {
		fmt.Println(p.Task, "on", p.Worker)
	}
	// Output:
	// urgent-1 on hpc-cpu-2
	// batch-1 on hpc-cpu-1
}

// urgency ranks a task of the example's by its id.
func urgency(id string) int {
	if strings.HasPrefix(id, "urgent-") {
		return 1
	}
	return 0
}

// hasAll reports whether have holds every one of want.
func hasAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}
