package engine

import (
	"slices"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

// A worker that names worker.FeatureSlots at attach runs as many tasks
// at once as its attach's CPUs, GPUs and memory hold: the books keep
// every task it holds (workerState.held) and offer the router what is
// free of it (roomLocked) as the worker's shape, and the router gives it
// needs while they fit that room (WorkerInfo.take). A worker without
// the feature holds one task at a time, as before the feature: an old
// worker polls for its next task only after reporting its last.
//
// A task takes at least one CPU of its worker's, whatever its need says:
// a need of 0 CPUs (the stand-in's) would otherwise fit a full machine
// without end.

// heldTask is a task assigned to a worker and not yet reported. Every
// field is guarded by books.mu.
type heldTask struct {
	t Task
	// delivered is set once the task went out in a poll's answer: from
	// then the worker is busy with it.
	delivered bool
	// cancel is set when the engine cancels the task after it went out:
	// the worker's watch answers it (longPoll.decideLocked) until the
	// worker reports the task, or, for a worker with slots, once.
	cancel bool
	// cancelTold is set once a watch's answer carried the cancel to a
	// worker with slots: its watch goes on for its other tasks, and
	// answering the same cancel again would only spin it.
	cancelTold bool
}

// cost is what a task of need n takes of a worker's room.
func cost(n worker.Need) (cpus, gpus int, ramMB int64) {
	return max(1, n.CPUs), max(0, n.GPUs), max(0, n.RAMMB)
}

// findLocked is the task ws holds whose attempt id is id, or nil.
// books.mu must be held.
func (ws *workerState) findLocked(id string) *heldTask {
	for _, h := range ws.held {
		if h.t.ID == id {
			return h
		}
	}
	return nil
}

// dropLocked takes h off ws's held tasks. books.mu must be held.
func (ws *workerState) dropLocked(h *heldTask) {
	ws.held = slices.DeleteFunc(ws.held, func(x *heldTask) bool { return x == h })
}

// busyLocked reports whether ws holds a task, or a result the router has
// not collected. books.mu must be held.
func (ws *workerState) busyLocked() bool { return len(ws.held) > 0 || len(ws.reported) > 0 }

// freeLocked is what of ws's attach no task holds (held, or reported and
// not yet collected). ramMB is meaningful only when the worker said its
// memory. books.mu must be held.
func (ws *workerState) freeLocked() (cpus, gpus int, ramMB int64) {
	cpus, gpus, ramMB = ws.info.CPUs, ws.info.GPUs, ws.info.RAMMB
	add := func(t *Task) {
		c, g, r := cost(t.Need)
		cpus, gpus, ramMB = cpus-c, gpus-g, ramMB-r
	}
	for _, h := range ws.held {
		add(&h.t)
	}
	for i := range ws.reported {
		add(&ws.reported[i])
	}
	return cpus, gpus, ramMB
}

// fitsFreeLocked reports whether a task of need n fits what is free of
// ws now. books.mu must be held.
func (ws *workerState) fitsFreeLocked(n worker.Need) bool {
	cpus, gpus, ram := ws.freeLocked()
	c, g, r := cost(n)
	return c <= cpus && g <= gpus && (ws.info.RAMMB == 0 || r <= ram)
}

// roomLocked is ws as the router may give it a task now, with what is
// free of it as its shape; false when it may be given none (leaving,
// busy without slots, or full). books.mu must be held.
func (ws *workerState) roomLocked() (WorkerInfo, bool) {
	if ws.leaving {
		return WorkerInfo{}, false
	}
	if !ws.info.slots {
		return ws.info, !ws.busyLocked()
	}
	cpus, gpus, ram := ws.freeLocked()
	if cpus < 1 || (ws.info.RAMMB > 0 && ram < 1) {
		return WorkerInfo{}, false
	}
	w := ws.info
	w.CPUs, w.GPUs = cpus, gpus
	if w.RAMMB > 0 {
		w.RAMMB = ram
	}
	w.running = len(ws.held) + len(ws.reported)
	return w, true
}

// take counts a need the router gives w out of w's room in a pass, and
// reports whether w is full now: a worker without slots is full with
// one task; one with slots while a CPU is free.
func (w *WorkerInfo) take(n shared.Need) (full bool) {
	w.running++
	if !w.slots {
		return true
	}
	c, g, r := cost(toNeedJSON(n))
	w.CPUs, w.GPUs = w.CPUs-c, w.GPUs-g
	if w.RAMMB > 0 {
		w.RAMMB -= r
		if w.RAMMB < 1 {
			return true
		}
	}
	return w.CPUs < 1
}

// busyShareLocked is what of ws's CPUs and GPUs its tasks take: those
// it holds and those reported and not yet collected, each a CPU at
// least, and the whole machine for a busy worker without slots.
// books.mu must be held.
func (ws *workerState) busyShareLocked() (cpus, gpus int) {
	if !ws.info.slots {
		if ws.busyLocked() {
			return ws.info.CPUs, ws.info.GPUs
		}
		return 0, 0
	}
	free, freeGPUs, _ := ws.freeLocked()
	return min(ws.info.CPUs, ws.info.CPUs-free), min(ws.info.GPUs, ws.info.GPUs-freeGPUs)
}
