package worker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// payloadFunc is Serve's run function.
type payloadFunc = func(ctx context.Context, t Task) (Outcome, error)

// Outcome is how a payload task ended, as Serve's run function says.
type Outcome struct {
	// State is StateSucceeded or StateFailed; empty means succeeded
	// when Error is empty and ExitCode zero, else failed. A cancel or a
	// timeout is reported as such, whatever the function returns then.
	State TaskState
	// ExitCode is the task's exit code, zero for success.
	ExitCode int
	// Error says why, in words, when the task did not succeed.
	Error string
	// Output is free text about the run, for the engine's log.
	Output string
}

// Serve is a Go engine's own worker, as a program: it reads the command
// line fluksio-worker reads (shared.WorkerArgs) and the credential from
// getenv, attaches with FeaturePayload, and calls run for each task that
// carries a payload, until it has been idle for --max-idle, the engine
// lets it go, or ctx ends (cancel ctx on SIGTERM, as Main does, so that
// the worker detaches). It returns the exit code Main would.
//
// run's ctx ends when the engine cancels the task, when the task's
// timeout passes, and when the worker is leaving; run should return
// soon after, since Serve waits for it. Serve reports what run returns
// (an error as StateFailed with its text), or the cancel or the
// timeout; it reports nothing when it is leaving, and the engine hands
// the task out again. A task with no command and no payload is the
// stand-in, which Serve runs itself; a command task is refused, since
// this worker does not run commands.
func Serve(ctx context.Context, args []string, getenv func(string) string, run func(ctx context.Context, t Task) (Outcome, error)) int {
	if run == nil {
		fmt.Fprintln(os.Stderr, "worker: Serve needs a function to run tasks with")
		return 2
	}
	if err := protectProcess(); err != nil {
		fmt.Fprintf(os.Stderr, "worker: could not close this process to its tasks: %v\n", err)
		return 1
	}
	return runWorker(ctx, filepath.Base(os.Args[0]), args, getenv, os.Stdout, os.Stderr, run)
}

// runPayload runs a payload task with cfg.payload: its ctx ends at any
// stop of the task's, and a timeout is one.
func (w *Client) runPayload(ctx context.Context, t Task, st *stopper) ResultRequest {
	res := w.resultFor(t)
	res.Started = time.Now()
	type ended struct {
		out Outcome
		err error
	}
	done := make(chan ended, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- ended{err: fmt.Errorf("the task's function panicked: %v", p)}
			}
		}()
		out, err := w.cfg.payload(st.stopped, t)
		done <- ended{out, err}
	}()
	var timeout <-chan time.Time
	limit := seconds(t.TimeoutSeconds)
	if limit > 0 {
		timer := time.NewTimer(limit)
		defer timer.Stop()
		timeout = timer.C
	}
	var e ended
	for waiting := true; waiting; {
		select {
		case e = <-done:
			waiting = false
		case <-timeout:
			timeout = nil
			st.stop(stopTimeout, fmt.Sprintf("the task outlived its timeout of %s", limit))
		}
	}
	res.Ended = time.Now()
	res.Output = e.out.Output
	reason, why := st.why()
	switch {
	case reason != notStopped:
		res.State, res.Error = stateFor(reason), why
	case e.err != nil:
		res.State, res.Error = StateFailed, e.err.Error()
	default:
		code := e.out.ExitCode
		res.ExitCode = &code
		res.State, res.Error = e.out.State, e.out.Error
		switch {
		case res.State == "" && (res.Error != "" || code != 0):
			res.State = StateFailed
		case res.State == "":
			res.State = StateSucceeded
		case !slices.Contains([]TaskState{StateSucceeded, StateFailed, StateCancelled, StateTimedOut}, res.State):
			res.Error = joinErrors(res.Error, fmt.Sprintf("the task's function returned the state %q, which is none of a result's", res.State))
			res.State = StateFailed
		}
	}
	return res
}
