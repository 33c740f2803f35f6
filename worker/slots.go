package worker

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The variables a command of a worker with slots (FeatureSlots) finds
// in its environment: its task's share of the machine. They override
// what the worker inherited, and the task's Env too, but for
// OMP_NUM_THREADS, which is set to the task's CPUs only when the task's
// Env does not set it.
const (
	CPUsEnv  = "FLUKSIO_CPUS"
	GPUsEnv  = "FLUKSIO_GPUS"
	RAMMBEnv = "FLUKSIO_RAM_MB"
)

// slotBook is what a worker with slots has free of its attach, and the
// tasks it runs. Its fields are guarded by mu; changed is signalled
// (at most one pending) each time a task ends or the worker is told to
// stop, for the loop that waits for room.
type slotBook struct {
	mu sync.Mutex
	// cpus, gpus and ramMB are free now; ramMB is counted only when the
	// worker said its memory (hasRAM).
	cpus, gpus int
	ramMB      int64
	hasRAM     bool
	// devices are the GPU indices no task holds, from the job's
	// CUDA_VISIBLE_DEVICES (or 0..gpus-1 when it is not set).
	devices []string
	// running are the tasks under way, by attempt id.
	running map[string]*stopper
	// idleSince is when the last task ended (or the worker attached),
	// for --max-idle.
	idleSince time.Time
	// leave: the engine let the worker go (its watch said so);
	// fatal: a result could not be given (the engine is gone or refuses
	// the worker), so it exits 1.
	leave, fatal bool
	changed      chan struct{}
	// started holds at most one pending wake-up for the watch: a task
	// started.
	started chan struct{}
}

// share is a task's part of the machine, as its environment says it.
type share struct {
	cpus, gpus int
	ramMB      int64
	devices    []string
}

func newSlotBook(cfg Config) *slotBook {
	s := &slotBook{cpus: cfg.cpus, gpus: cfg.gpus, ramMB: cfg.ramMB, hasRAM: cfg.ramMB > 0,
		running: map[string]*stopper{}, idleSince: time.Now(), changed: make(chan struct{}, 1), started: make(chan struct{}, 1)}
	s.devices = gpuDevices(cfg.cudaDevices, cfg.gpus)
	return s
}

// gpuDevices is the job's GPU indices: CUDA_VISIBLE_DEVICES's (as
// Slurm sets it for a job's GPUs), at most gpus of them, else 0 to
// gpus-1.
func gpuDevices(visible string, gpus int) []string {
	var out []string
	for _, d := range strings.Split(visible, ",") {
		if d = strings.TrimSpace(d); d != "" {
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		for i := range gpus {
			out = append(out, strconv.Itoa(i))
		}
	}
	return out[:min(len(out), gpus)]
}

// signal wakes the loop waiting for room, if it waits.
func (s *slotBook) signal() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// hasRoom reports whether a task of a CPU (the least a task takes) may
// fit.
func (s *slotBook) hasRoom() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cpus >= 1 && (!s.hasRAM || s.ramMB >= 1)
}

// take reserves n's share, or says why it does not fit what is free.
func (s *slotBook) take(id string, n Need, st *stopper) (share, error) {
	c, g, r := max(1, n.CPUs), max(0, n.GPUs), max(0, n.RAMMB)
	s.mu.Lock()
	defer s.mu.Unlock()
	if c > s.cpus || g > s.gpus || (s.hasRAM && r > s.ramMB) {
		// Named among what runs until its refusal is given, so that a
		// poll meanwhile does not have it sent again; drop takes it off.
		s.running[id] = st
		return share{}, fmt.Errorf("the task needs %d cpus, %d gpus, %d MB; this worker has %d cpus, %d gpus, %d MB free",
			c, g, r, s.cpus, s.gpus, s.ramMB)
	}
	s.cpus, s.gpus = s.cpus-c, s.gpus-g
	if s.hasRAM {
		s.ramMB -= r
	}
	k := min(g, len(s.devices))
	sh := share{cpus: c, gpus: g, ramMB: r, devices: slices.Clone(s.devices[:k])}
	s.devices = s.devices[k:]
	s.running[id] = st
	select {
	case s.started <- struct{}{}:
	default:
	}
	return sh, nil
}

// drop takes a task off what runs once its result (or, for one that
// did not fit, its refusal) is given.
func (s *slotBook) drop(id string) {
	s.mu.Lock()
	delete(s.running, id)
	if len(s.running) == 0 {
		s.idleSince = time.Now()
	}
	s.mu.Unlock()
	s.signal()
}

// release returns a task's share once its command has ended; drop
// takes the task off what runs once its result is given.
func (s *slotBook) release(sh share) {
	s.mu.Lock()
	s.cpus, s.gpus = s.cpus+sh.cpus, s.gpus+sh.gpus
	if s.hasRAM {
		s.ramMB += sh.ramMB
	}
	s.devices = append(s.devices, sh.devices...)
	s.mu.Unlock()
	s.signal()
}

// count is how many tasks run, and since when none has (when none
// does).
func (s *slotBook) count() (int, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.running), s.idleSince
}

// ids are the attempt ids of the tasks under way (RunningParam), or,
// with unstopped, of those not told to stop. Never nil.
func (s *slotBook) ids(unstopped bool) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, 0, len(s.running))
	for id, st := range s.running {
		if unstopped {
			if r, _ := st.why(); r != notStopped {
				continue
			}
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// stopAll stops every task under way for r.
func (s *slotBook) stopAll(r stopReason, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.running {
		st.stop(r, why)
	}
}

// stopOne stops task id for r, if it runs.
func (s *slotBook) stopOne(id string, r stopReason, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.running[id]; st != nil {
		st.stop(r, why)
	}
}

// mark sets leave or fatal and wakes the loop.
func (s *slotBook) mark(leave, fatal bool) {
	s.mu.Lock()
	s.leave, s.fatal = s.leave || leave, s.fatal || fatal
	s.mu.Unlock()
	s.signal()
}

// told reports whether the worker was let go, or must give up.
func (s *slotBook) told() (leave, fatal bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.leave, s.fatal
}

// env is the share's variables, added to t's Env.
func (sh share) env(t Task) map[string]string {
	env := make(map[string]string, len(t.Env)+6)
	for k, v := range t.Env {
		env[k] = v
	}
	if _, set := env["OMP_NUM_THREADS"]; !set {
		env["OMP_NUM_THREADS"] = strconv.Itoa(sh.cpus)
	}
	env[CPUsEnv] = strconv.Itoa(sh.cpus)
	env[GPUsEnv] = strconv.Itoa(sh.gpus)
	env[RAMMBEnv] = strconv.FormatInt(sh.ramMB, 10)
	// A task of no GPUs sees none: an empty list hides the job's.
	devices := strings.Join(sh.devices, ",")
	env["CUDA_VISIBLE_DEVICES"] = devices
	env["GPU_DEVICE_ORDINAL"] = devices
	return env
}

// workSlots is Work for a worker with slots, once attached: it polls
// while it has room, runs each task it is given on a goroutine of its
// own (which reports it), keeps one watch open while any task runs, and
// leaves as Work does: after --max-idle with nothing running, before its
// job's end (once its tasks have ended), when the engine lets it go or
// ctx ends (its tasks stopped and dropped).
func (w *Client) workSlots(ctx context.Context) int {
	s := newSlotBook(w.cfg)
	var tasks sync.WaitGroup
	watchCtx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		w.watchSlots(watchCtx, s)
	}()
	// finish stops what runs for r (notStopped: nothing), waits for
	// every task and the watch, detaches when asked, and returns code.
	finish := func(r stopReason, why string, detach bool, code int) int {
		if r != notStopped {
			s.stopAll(r, why)
		}
		tasks.Wait()
		stopWatch()
		<-watchDone
		if detach {
			w.detach(ctx)
		}
		return code
	}
	for {
		if ctx.Err() != nil {
			w.log.Printf("stopping: %v", context.Cause(ctx))
			return finish(stopShutdown, "the worker is stopping", true, 0)
		}
		switch leave, fatal := s.told(); {
		case fatal:
			return finish(stopLost, "the engine is gone or refuses this worker", false, 1)
		case leave:
			w.log.Printf("the engine lets us go; leaving")
			return finish(stopLeave, "the engine lets its workers go", true, 0)
		}
		running, idleSince := s.count()
		left := w.cfg.maxIdle
		if running == 0 {
			left -= time.Since(idleSince)
			if left <= 0 {
				w.log.Printf("no work for %s; leaving", w.cfg.maxIdle)
				return finish(notStopped, "", true, 0)
			}
		}
		if !w.cfg.endsAt.IsZero() {
			toEnd := time.Until(w.cfg.endsAt) - EndMargin
			if toEnd <= 0 {
				// The engine gives no task that runs past this; those
				// under way end on their own, or at SIGTERM.
				w.log.Printf("the job ends at %s; taking no more tasks, leaving %s before it once %d running end",
					w.cfg.endsAt.UTC().Format(time.RFC3339), EndMargin, running)
				return finish(notStopped, "", true, 0)
			}
			left = min(left, toEnd)
		}
		if !s.hasRoom() {
			select {
			case <-s.changed:
			case <-ctx.Done():
			}
			continue
		}
		task, err := w.poll(ctx, left, s.ids(false))
		switch {
		case errors.Is(err, errLeave):
			w.log.Printf("the engine lets us go; leaving")
			return finish(stopLeave, "the engine lets its workers go", true, 0)
		case errors.Is(err, errNotAttachedRemote):
			// The engine restarted or gave up on us: what runs is no
			// longer ours to report. Stop it, and say hello again.
			w.log.Printf("engine does not know us; stopping %d task(s) and attaching again", running)
			s.stopAll(stopLeave, "the engine no longer knows this worker")
			tasks.Wait()
			if err := w.Attach(ctx); err != nil && ctx.Err() == nil {
				w.log.Printf("could not attach again: %v", err)
				return finish(notStopped, "", false, 1)
			}
			continue
		case ctx.Err() != nil:
			continue
		case err != nil:
			w.log.Printf("giving up: %v", err)
			return finish(stopLost, "the engine is gone", false, 1)
		case task == nil:
			continue
		}
		st := newStopper(ctx)
		sh, err := s.take(task.ID, task.Need, st)
		tasks.Add(1)
		go func(t Task) {
			defer tasks.Done()
			w.runSlot(ctx, s, t, st, sh, err)
		}(*task)
	}
}

// runSlot runs t on its share (or reports it failed, with unfit, when it
// did not fit what was free: the engine gave more than this worker
// holds), reports it and gives its share back.
func (w *Client) runSlot(ctx context.Context, s *slotBook, t Task, st *stopper, sh share, unfit error) {
	defer st.release()
	if unfit != nil {
		defer s.drop(t.ID)
		res := w.resultFor(t)
		failed(&res, unfit)
		w.log.Printf("refusing %s: %v", t.label(), unfit)
		w.reportSlot(ctx, s, t, res)
		return
	}
	// Named among what runs until its result is given (RunningParam).
	defer s.drop(t.ID)
	w.log.Printf("running %s on %d cpus, %d gpus [%s]", t.label(), sh.cpus, sh.gpus, strings.Join(sh.devices, ","))
	run := t
	run.Env = sh.env(t)
	res, dir := w.runTask(ctx, run, st)
	// Its outputs are sent: the directory has nothing more to give, and
	// goes before the result, so that a task reported has left nothing.
	w.removeTaskDir(dir)
	// Its room is free before its result goes: the engine frees it only
	// once it has recorded the result, and may then hand the room out
	// on this worker's open poll while the result's answer is still on
	// its way back. Freed after, the worker would be handed a task its
	// room does not yet hold, and refuse it.
	s.release(sh)
	if reason, why := st.why(); reason.dropsTask() {
		if reason == stopLeave {
			w.log.Printf("the engine lets us go; dropping %s and leaving", t.label())
		} else {
			w.log.Printf("%s; dropped %s", why, t.label())
		}
		return
	}
	w.reportSlot(ctx, s, t, res)
}

// reportSlot gives t's result; an engine gone, or refusing the worker,
// makes the worker give up (slotBook.fatal).
func (w *Client) reportSlot(ctx context.Context, s *slotBook, t Task, res ResultRequest) {
	_, err := w.reportAndPoll(ctx, res, 0)
	switch {
	case err == nil:
		w.log.Printf("reported %s: %s", t.label(), describe(res))
	case errors.Is(err, errLeave):
		w.log.Printf("reported %s: %s; the engine lets us go", t.label(), describe(res))
		s.mark(true, false)
	case ctx.Err() != nil:
	default:
		w.log.Printf("could not report %s: %v", t.label(), err)
		if errors.Is(err, errEngineGone) || errors.Is(err, errRefused) {
			s.mark(false, true)
		}
	}
}

// watchSlots keeps GET /v1/watch open while any task runs (from
// cfg.WatchAfter after the first starts), until ctx ends: a cancel
// stops the task it names, a leave stops them all and lets the worker
// go. A watch answered anything else is tried again after a pause.
func (w *Client) watchSlots(ctx context.Context, s *slotBook) {
	for ctx.Err() == nil {
		if n, _ := s.count(); n == 0 {
			// Nothing to watch: wait for a task to start, and give it
			// cfg.WatchAfter (a task that ends within it costs no
			// watch).
			select {
			case <-s.started:
			case <-ctx.Done():
				return
			}
			if !sleepCtx(ctx, w.cfg.WatchAfter) {
				return
			}
			continue
		}
		var ans WatchAnswer
		q := url.Values{RunningParam: {strings.Join(s.ids(true), ",")}}
		status, err := w.call(ctx, http.MethodGet, "/v1/watch", q, nil, &ans, watchTimeout)
		switch {
		case errors.Is(err, errLeave):
			s.stopAll(stopLeave, "the engine lets its workers go")
			s.mark(true, false)
			return
		case err == nil && status == http.StatusOK && ans.Cancel != "":
			why := "cancelled by the engine"
			if ans.Reason != "" {
				why += ": " + ans.Reason
			}
			s.stopOne(ans.Cancel, stopCancel, why)
		case err == nil && status == http.StatusNoContent:
		default:
			if !sleepCtx(ctx, time.Second) {
				return
			}
		}
	}
}

// sleepCtx waits d, or until ctx ends; it reports whether ctx is alive.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
