package engine

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/shared/sharedtest"
	"github.com/fluksio/provision/worker"
)

// TestEngineRunsByItself: after Start, with no Run anywhere, a task
// submitted is handed to a worker and Wait returns its end; Run called
// then only waits for done (it reports true once done does); Stop ends
// the engine's own loop (the race detector and the leak of its
// goroutine would say otherwise). Run called before Start owns the
// loop, and Start starts none.
func TestEngineRunsByItself(t *testing.T) {
	t.Parallel()
	cfg := Config{Secret: testSecret, ID: "test", Listen: "127.0.0.1:0"}
	cfg.Logger, _ = testLogger(t)
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Serve(e.Mux(nil, false)); err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			e.Stop(context.Background())
		}
	}()
	if diags := e.Start(context.Background()); diags.HasErrors() {
		t.Fatal(diags)
	}
	t.Run("alone", func(t *testing.T) {
		id, err := e.Submit(commandTask("by-itself"))
		if err != nil {
			t.Fatal(err)
		}
		w := joinWorker(t, e, "slurm-self", worker.FeatureCommand)
		task := w.take()
		zero := 0
		w.report(worker.ResultRequest{TaskID: task.ID, State: worker.StateSucceeded, ExitCode: &zero})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res, err := e.Wait(ctx, id)
		if err != nil || res[0].State != worker.StateSucceeded {
			t.Fatalf("Wait: %+v, %v; want the task succeeded, with no Run called", res, err)
		}
		asked := 0
		if !e.Run(ctx, func() bool { asked++; return asked > 1 }) {
			t.Error("Run beside the engine's own loop returned false; want true once done said so")
		}
	})
	e.Stop(context.Background())
	stopped = true
	e.loop.mu.Lock()
	owner := e.loop.owner
	e.loop.mu.Unlock()
	if owner != noLoop {
		t.Errorf("the loop's owner after Stop: %d; want none", owner)
	}

	m, stop := runTaskEngine(t, Config{}, 0)
	waitFor(t, "Run to own the loop", func() bool {
		m.loop.mu.Lock()
		defer m.loop.mu.Unlock()
		return m.loop.owner == manualLoop
	})
	if diags := m.Start(context.Background()); diags.HasErrors() {
		t.Fatal(diags)
	}
	m.loop.mu.Lock()
	own := m.loop.stop != nil
	m.loop.mu.Unlock()
	if own {
		t.Error("Start began a loop of its own while Run owned it")
	}
	stop()
}

// TestTaskStartedHook: each attempt handed to a worker is heard by
// Hooks.TaskStarted with the task's id, the attempt's number and id,
// the worker, its provisioner and job.
func TestTaskStartedHook(t *testing.T) {
	t.Parallel()
	heard := make(chan Activity, 4)
	e := taskEngine(t, Config{Hooks: Hooks{TaskStarted: func(a Activity) { heard <- a }}})
	if _, err := e.Submit(commandTask("started-1")); err != nil {
		t.Fatal(err)
	}
	w := joinWorker(t, e, "slurm-started", worker.FeatureCommand)
	task := w.take()
	select {
	case a := <-heard:
		if a.Task != "started-1" || a.Attempt != 1 || a.AttemptID != task.ID || a.Worker != "slurm-started" || a.Job != "77" || a.Kind != EventTaskAssigned {
			t.Errorf("TaskStarted heard %+v; want started-1, attempt 1 (%s), on slurm-started, job 77", a, task.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("TaskStarted heard nothing in 10 s")
	}
}

// TestTogetherAsksForItAllAtOnce: needs added inside Together, with
// passes of the run loop between them, reach the provisioner in one
// Provision call once Together returns; none is asked for while it
// runs. Without it the passes between the Adds ask for the first part
// alone (a cap's shares are then of that part).
func TestTogetherAsksForItAllAtOnce(t *testing.T) {
	t.Parallel()
	prov, calls := countingProvisioner(shared.Shape{Profile: "c1", CPUs: 1}, shared.Shape{Profile: "c2", CPUs: 2})
	e, _ := runTaskEngine(t, Config{}, 10*time.Millisecond)
	e.router.asks.setTarget(target{Name: "slurm", P: prov, Shapes: prov.ShapeList})
	e.Together(func() {
		for range 5 {
			e.Add(shared.Need{CPUs: 1}, time.Second)
		}
		// Passes run between the two parts, as they may between any
		// two Adds of a caller's loop.
		from := e.passes.Load()
		waitFor(t, "three passes inside Together", func() bool { return e.passes.Load() >= from+3 })
		for range 3 {
			e.Add(shared.Need{CPUs: 2}, time.Second)
		}
		if c := calls(); len(c) > 0 {
			t.Errorf("Provision was called inside Together with %v need(s); want no call until it returns", c)
		}
	})
	waitFor(t, "a Provision call after Together", func() bool { return len(calls()) > 0 })
	if c := calls(); c[0] != 8 {
		t.Errorf("the first Provision call carried %d need(s) (calls %v); want all 8 added inside Together", c[0], c)
	}
}

// countingProvisioner is a provisioner of shapes that answers every
// demand outstanding, and calls, the machines each of its Provision
// calls asked for (the demand's counts added up), in order.
func countingProvisioner(shapes ...shared.Shape) (*sharedtest.Provisioner, func() []int) {
	var mu sync.Mutex
	var asked []int
	prov := &sharedtest.Provisioner{Name: "slurm", ShapeList: shapes,
		OnProvision: func(r *shared.ProvisionRequest) (*shared.ProvisionResponse, error) {
			mu.Lock()
			defer mu.Unlock()
			n := 0
			resp := &shared.ProvisionResponse{}
			for _, d := range r.Demand {
				n += d.Count
				resp.Outcomes = append(resp.Outcomes, shared.DemandOutcome{Outcome: shared.OutcomeOutstanding, Profile: shapes[0].Profile})
			}
			asked = append(asked, n)
			return resp, nil
		}}
	return prov, func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(asked)
	}
}
