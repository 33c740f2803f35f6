package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/fluksio/provision/shared"
)

// TestServe: a worker built on Serve attaches with the payload feature,
// runs each payload task with its function and reports the Outcome (an
// error as failed), reports the engine's cancel and the task's timeout
// after its function's ctx ended, runs the stand-in itself, and refuses
// a command task.
func TestServe(t *testing.T) {
	t.Parallel()
	e := newTestEngine(t)
	waiting := make(chan string, 1)
	ctxErr := make(chan error, 2)
	run := func(ctx context.Context, task Task) (Outcome, error) {
		switch p := string(task.Payload); p {
		case "hello":
			return Outcome{Output: "hello from " + task.Name}, nil
		case "exit 4":
			return Outcome{ExitCode: 4, Error: "four"}, nil
		case "error":
			return Outcome{Output: "tried"}, errors.New("could not")
		case "wait":
			waiting <- task.ID
			<-ctx.Done()
			ctxErr <- ctx.Err()
			return Outcome{Output: "stopped"}, nil
		case "panic":
			panic("boom")
		default:
			return Outcome{}, fmt.Errorf("no such payload %q", p)
		}
	}
	log := &syncBuffer{}
	ctx, stop := context.WithCancel(context.Background())
	exited := make(chan int, 1)
	env := map[string]string{shared.WorkerTokenEnv: testToken}
	go func() {
		exited <- runWorker(ctx, "engine-worker", []string{"--url", e.URL(), "--cpus", "1", "--max-idle", "600"},
			func(k string) string { return env[k] }, io.Discard, log, run)
	}()
	defer func() {
		stop()
		if code := <-exited; code != 0 {
			t.Errorf("exit %d; want 0\n%s", code, log)
		}
	}()

	payload := func(p string) Task { return Task{Requires: []string{FeaturePayload}, Payload: []byte(p)} }
	hello := e.Add(payload("hello"), nil)
	exit4 := e.Add(payload("exit 4"), nil)
	failing := e.Add(payload("error"), nil)
	panics := e.Add(payload("panic"), nil)
	command := e.Add(Task{Requires: []string{FeatureCommand}, Command: []string{"true"}}, nil)
	standIn := e.Add(Task{}, nil)
	cancelled := e.Add(payload("wait"), nil)
	timeout := payload("wait")
	timeout.TimeoutSeconds = 0.2
	timedOut := e.Add(timeout, nil)

	check := func(id string, state TaskState, exit *int, errText, output string) {
		t.Helper()
		res := e.Result(t, id)
		if res.State != state || (exit == nil) != (res.ExitCode == nil) || (exit != nil && *exit != *res.ExitCode) ||
			!strings.Contains(res.Error, errText) || !strings.Contains(res.Output, output) {
			t.Errorf("%s: result %+v; want %s, exit %v, error %q, output %q", id, res, state, exit, errText, output)
		}
	}
	zero, four := 0, 4
	check(hello, StateSucceeded, &zero, "", "hello from job-1")
	check(exit4, StateFailed, &four, "four", "")
	check(failing, StateFailed, nil, "could not", "tried")
	check(panics, StateFailed, nil, "the task's function panicked: boom", "")
	check(command, StateFailed, nil, "this worker cannot run command tasks (fluksio-worker ", "")
	check(standIn, "", nil, "", "9592 primes below 100000")

	if id := <-waiting; id != cancelled {
		t.Fatalf("%s waits; want %s", id, cancelled)
	}
	e.Cancel(cancelled, "enough")
	check(cancelled, StateCancelled, nil, "cancelled by the engine: enough", "stopped")
	if err := <-ctxErr; !errors.Is(err, context.Canceled) {
		t.Errorf("the cancelled task's ctx ended with %v", err)
	}
	<-waiting
	check(timedOut, StateTimedOut, nil, "the task outlived its timeout of 200ms", "stopped")
	if err := <-ctxErr; !errors.Is(err, context.Canceled) {
		t.Errorf("the timed-out task's ctx ended with %v", err)
	}

	e.mu.Lock()
	defer e.mu.Unlock()
	if !slices.Equal(e.features, []string{FeaturePayload}) {
		t.Errorf("attached with features %q; want [payload]", e.features)
	}
}
