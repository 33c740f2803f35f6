package worker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/fluksio/provision/internal/buildinfo"
)

// taskKind is how this worker runs a task it was handed.
type taskKind int

const (
	kindStandIn taskKind = iota // no command and no payload: the stand-in
	kindCommand                 // Task.Command, by the command runner (command.go)
	kindPayload                 // Task.Payload, by Serve's run function
	kindRefused                 // it requires a feature this worker lacks
)

// kindOf decides how a worker with features runs t; for kindRefused it
// also returns the feature the worker lacks. A task is refused, never
// half run, when it requires a feature the worker did not attach with,
// or carries a command or a payload this worker cannot run whatever its
// Requires say.
func kindOf(t Task, features []string) (taskKind, string) {
	for _, f := range t.Requires {
		if !slices.Contains(features, f) {
			return kindRefused, f
		}
	}
	var kind taskKind
	switch {
	case len(t.Command) > 0 || slices.Contains(t.Requires, FeatureCommand):
		kind = kindCommand
	case len(t.Payload) > 0 || slices.Contains(t.Requires, FeaturePayload):
		kind = kindPayload
	default:
		return kindStandIn, ""
	}
	if !slices.Contains(features, kind.feature()) {
		return kindRefused, kind.feature()
	}
	return kind, ""
}

// feature is the feature a worker needs to run a task of kind k.
func (k taskKind) feature() string {
	switch k {
	case kindCommand:
		return FeatureCommand
	case kindPayload:
		return FeaturePayload
	}
	return ""
}

// runTask runs t as its kind says and returns its result, and the task's
// directory on the node (empty: none), which the caller removes once
// the result is sent.
func (w *Client) runTask(ctx context.Context, t Task, st *stopper) (ResultRequest, string) {
	switch kind, missing := kindOf(t, w.cfg.features); kind {
	case kindRefused:
		res := w.resultFor(t)
		res.State = StateFailed
		res.Error = fmt.Sprintf("this worker cannot run %s tasks (fluksio-worker %s)", missing, buildinfo.Read().Version)
		w.log.Printf("refusing %s: %s", t.label(), res.Error)
		return res, ""
	case kindCommand:
		return w.runCommand(ctx, t, st)
	case kindPayload:
		return w.runPayload(ctx, t, st), ""
	}
	return w.standIn(t, st), ""
}

// resultFor is t's result before it runs: who ran it, where.
func (w *Client) resultFor(t Task) ResultRequest {
	cpus := w.cfg.cpus
	if n, err := strconv.Atoi(w.cfg.slurmCPUs); err == nil && n > 0 {
		cpus = n
	}
	return ResultRequest{TaskID: t.ID, Hostname: w.cfg.hostname, JobID: w.cfg.slurmJobID, CPUs: cpus}
}

// standIn runs the stand-in: say where it ran and with how much, and
// prove it ran by computing something. A task with WorkSeconds sleeps
// that long instead, and says so: it stands for work that takes time,
// so that a burst's parallelism shows, without loading a machine the
// sandbox shares with every other worker. A cancel ends it as
// StateCancelled; a success leaves State empty, as the stand-in always
// has.
func (w *Client) standIn(t Task, st *stopper) ResultRequest {
	res := w.resultFor(t)
	if t.WorkSeconds > 0 {
		d := time.Duration(min(t.WorkSeconds, 24*3600) * float64(time.Second))
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-timer.C:
			res.Output = fmt.Sprintf("slept %s (simulated work) on %s with %d cpus", d, w.cfg.hostname, res.CPUs)
		case <-st.done():
			res.Output = fmt.Sprintf("interrupted after part of %s of simulated work on %s", d, w.cfg.hostname)
			if reason, why := st.why(); reason == stopCancel {
				res.State, res.Error = StateCancelled, why
			}
		}
		return res
	}
	const below = 100000
	res.Output = fmt.Sprintf("%d primes below %d on %s with %d cpus", countPrimes(below), below, w.cfg.hostname, res.CPUs)
	return res
}

// countPrimes counts the primes below n with a sieve: small, exact, and
// easy to check (9592 below 100000).
func countPrimes(n int) int {
	if n < 3 {
		return 0
	}
	composite := make([]bool, n)
	count := 0
	for i := 2; i < n; i++ {
		if composite[i] {
			continue
		}
		count++
		for j := i * i; j < n; j += i {
			composite[j] = true
		}
	}
	return count
}

// describe is a result in a few words, for the worker's log.
func describe(res ResultRequest) string {
	switch {
	case res.State == "":
		return "done"
	case res.Signal != "":
		return fmt.Sprintf("%s (%s)", res.State, res.Signal)
	case res.ExitCode != nil:
		return fmt.Sprintf("%s (exit %d)", res.State, *res.ExitCode)
	case res.Error != "":
		return fmt.Sprintf("%s: %s", res.State, res.Error)
	}
	return string(res.State)
}

// removeTaskDir removes a task's directory, if it has one, with what its
// command made unwritable in it; a failure is logged, since there is
// no one else to tell.
func (w *Client) removeTaskDir(dir string) {
	if dir == "" {
		return
	}
	if err := os.RemoveAll(dir); err == nil {
		return
	}
	// A directory the command took write permission from keeps its
	// entries: give it back and try again. WalkDir visits a directory
	// before it reads it.
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if d != nil && d.IsDir() {
			_ = os.Chmod(path, 0o700)
		}
		return nil
	})
	if err := os.RemoveAll(dir); err != nil {
		w.log.Printf("could not remove the task directory %s: %v", dir, err)
	}
}

// stopReason is why a task's run was stopped before its work ended on
// its own.
type stopReason int

const (
	notStopped stopReason = iota
	// stopCancel: the engine cancelled the task (its watch answered 200).
	stopCancel
	// stopTimeout: the command outlived Task.TimeoutSeconds.
	stopTimeout
	// stopLogLimit: a stream of the command's passed Limits.Log.
	stopLogLimit
	// stopLost: the engine refused a transfer of the task's (it no
	// longer has the task for this worker), or could not be reached.
	stopLost
	// stopLeave: the engine lets its workers go (410 leave on the watch).
	stopLeave
	// stopShutdown: the worker itself is stopping (SIGTERM, SIGINT: its
	// ctx ended).
	stopShutdown
)

// dropsTransfers reports whether nothing more of the task is sent after
// a stop for r: not its logs' rest, not its outputs.
func (r stopReason) dropsTransfers() bool {
	return r == stopCancel || r == stopLost || r == stopLeave || r == stopShutdown
}

// dropsTask reports whether a task stopped for r goes unreported: the
// worker is leaving, and the engine hands the task out again.
func (r stopReason) dropsTask() bool { return r == stopLeave || r == stopShutdown }

// stopper is one task's stop: the first reason given wins, and the
// worker's own ctx ending counts as stopShutdown. Its contexts are for
// what the task does: stopped ends at any stop (a payload's run);
// transfers at a stop after which nothing more is sent
// (stopReason.dropsTransfers).
type stopper struct {
	parent                         context.Context
	stopped, transfers             context.Context
	cancelStopped, cancelTransfers context.CancelFunc

	mu     sync.Mutex // guards reason and detail
	reason stopReason
	detail string // the reason in words, for ResultRequest.Error
}

func newStopper(ctx context.Context) *stopper {
	st := &stopper{parent: ctx}
	st.stopped, st.cancelStopped = context.WithCancel(ctx)
	st.transfers, st.cancelTransfers = context.WithCancel(ctx)
	return st
}

// stop stops the task for r, unless it was stopped already.
func (s *stopper) stop(r stopReason, detail string) {
	s.mu.Lock()
	first := s.reason == notStopped
	if first {
		s.reason, s.detail = r, detail
	}
	s.mu.Unlock()
	if !first {
		return
	}
	s.cancelStopped()
	if r.dropsTransfers() {
		s.cancelTransfers()
	}
}

// done is closed at the task's stop, or when the worker stops.
func (s *stopper) done() <-chan struct{} { return s.stopped.Done() }

// why is the reason the task was stopped, and in words; notStopped if
// it was not.
func (s *stopper) why() (stopReason, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reason == notStopped && s.parent.Err() != nil {
		return stopShutdown, fmt.Sprintf("the worker is stopping (%v)", context.Cause(s.parent))
	}
	return s.reason, s.detail
}

// release frees the stopper's contexts once the task is over.
func (s *stopper) release() {
	s.cancelStopped()
	s.cancelTransfers()
}

// label is how the worker's log names t: the task's id, with its
// attempt's number and id beside it ("task t0151 (attempt 1,
// attempt_id task-152)"), as the engine's surfaces name it; the
// stand-in's work, which has no task id, by its attempt's id alone.
func (t Task) label() string {
	switch {
	case t.Name == "":
		return t.ID
	case t.Attempt == 0:
		return fmt.Sprintf("task %s (attempt_id %s)", t.Name, t.ID)
	}
	return fmt.Sprintf("task %s (attempt %d, attempt_id %s)", t.Name, t.Attempt, t.ID)
}
