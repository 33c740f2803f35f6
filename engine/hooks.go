package engine

import "sync"

// hookQueueLen bounds the embedder's hook calls waiting to run
// (hookQueue): a task's end and the rest are each one entry, holding what
// the hook is told (a TaskResult: its streams' last 4 KiB each, its
// attempts). 4096 of them are a few tens of MB at worst, and a hook that
// keeps up with a thousand tasks a second falls behind by four seconds
// before anyone waits for it.
const hookQueueLen = 4096

// hookQueue runs the embedder's hooks (Config.Hooks) on a goroutine of
// its own, one at a time, in the order they were put: nothing of the
// embedder's runs on the router's pass, a worker's request or a plugin's
// event dispatcher, so a slow hook (a disk that is slow to take a
// task's result file) delays the hooks after it, never the handing out
// of tasks. One goroutine, not one per task: a task's TaskLost comes
// before its TaskEnded, a worker's Attach before its WorkerGone, as
// they happened.
//
// The queue is bounded (max). When it is full, put waits for room: the
// thing that happened (a pass settling a task's end, a worker's
// request, a plugin's event) waits until the hooks catch up, so a hook
// that is slower than the tasks end for longer than the queue lasts
// paces dispatch at its own rate, and the engine's memory stays what
// the bound allows; nothing is dropped. A put that must not wait (Cancel,
// which a hook may call: it would wait for itself) goes beyond the bound.
//
// The goroutine is started by the first put, and stop waits for it to
// run what is queued; a put after stop runs the hook on the caller. A
// nil queue runs each hook on the caller.
type hookQueue struct {
	// idle is called, without mu, each time the goroutine finds the
	// queue empty after running hooks: the run loop asks its done
	// again, which may read what the hooks recorded.
	idle func()
	max  int

	// mu guards every field below; room and ready are its conds.
	mu          sync.Mutex
	room, ready sync.Cond
	q           []func()
	// waiting counts the puts waiting for room (what a test waits on to
	// know a put is blocked).
	waiting  int
	started  bool
	stopping bool
	// exited is set by the goroutine as it ends; finished closes then.
	exited   bool
	finished chan struct{}
}

func newHookQueue(max int, idle func()) *hookQueue {
	q := &hookQueue{idle: idle, max: max, finished: make(chan struct{})}
	q.room.L, q.ready.L = &q.mu, &q.mu
	return q
}

// put queues f, waiting for room while the queue is full if wait says
// so (see hookQueue).
func (q *hookQueue) put(f func(), wait bool) {
	if q == nil {
		f()
		return
	}
	q.mu.Lock()
	if !q.started && !q.stopping {
		q.started = true
		go q.loop()
	}
	for wait && len(q.q) >= q.max && !q.exited {
		q.waiting++
		q.room.Wait()
		q.waiting--
	}
	if q.exited || !q.started {
		q.mu.Unlock()
		f()
		return
	}
	q.q = append(q.q, f)
	q.ready.Signal()
	q.mu.Unlock()
}

// loop runs what is queued until stop, and then what is left.
func (q *hookQueue) loop() {
	defer close(q.finished)
	q.mu.Lock()
	for {
		for len(q.q) == 0 && !q.stopping {
			q.ready.Wait()
		}
		if len(q.q) == 0 {
			break
		}
		f := q.q[0]
		q.q[0] = nil
		q.q = q.q[1:]
		empty := len(q.q) == 0
		q.room.Broadcast()
		q.mu.Unlock()
		f()
		if empty && q.idle != nil {
			q.idle()
		}
		q.mu.Lock()
	}
	q.exited = true
	q.q = nil
	q.room.Broadcast()
	q.mu.Unlock()
}

// stop runs what is queued and waits for the goroutine to end; the
// hooks put after it run on their callers. It is idempotent.
func (q *hookQueue) stop() {
	if q == nil {
		return
	}
	q.mu.Lock()
	q.stopping = true
	started := q.started
	q.ready.Broadcast()
	q.mu.Unlock()
	if started {
		<-q.finished
	}
}
