package worker

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
)

// TestSlotsRoomFreeBeforeTheResult: a worker of 2 CPUs runs a 2-CPU
// task; its result is recorded at once, the answer held back. Meanwhile
// the engine hands the worker's open poll another 2-CPU task, as a real
// engine may once it has recorded the first: the worker takes it and
// runs it, since the first's room was free before its result went; it
// does not refuse it as larger than what is free.
func TestSlotsRoomFreeBeforeTheResult(t *testing.T) {
	e := newTestEngine(t)
	e.holdResult = make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := e.Add(Task{Requires: []string{FeatureCommand}, Command: []string{"true"}, Need: Need{CPUs: 2}}, nil)
	var logs syncBuffer
	exited := make(chan int, 1)
	go func() {
		env := map[string]string{"TMPDIR": t.TempDir(), shared.WorkerTokenEnv: testToken}
		exited <- Run(ctx, []string{"--url", e.URL(), "--cpus", "2", "--max-idle", "30"}, func(k string) string { return env[k] }, &bytes.Buffer{}, &logs)
	}()
	e.Result(t, first)
	second := e.Add(Task{Requires: []string{FeatureCommand}, Command: []string{"true"}, Need: Need{CPUs: 2}}, nil)
	res := e.Result(t, second)
	close(e.holdResult)
	if res.State != StateSucceeded {
		t.Errorf("the second task, handed out while the first's result was on its way: %s %q; want it run\n%s", res.State, res.Error, logs.String())
	}
	cancel()
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatal("the worker did not stop")
	}
}
