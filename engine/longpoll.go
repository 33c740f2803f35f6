package engine

import (
	"slices"
	"time"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/worker"
)

// A long poll is a worker's GET /v1/work, waiting for a task, or its GET
// /v1/watch, held while it runs one. What either answers is decided here,
// from the books alone (longPoll.decideLocked); how it waits is a waiter's
// (waiter.go): held on the request's goroutine, or parked. Both ask the
// same question at the same moments (when the poll opens, and each time
// its wait ends), so a held poll and a parked one answer alike.

// pollAnswer is what a long poll answers.
type pollAnswer int

const (
	answerWait        pollAnswer = iota // nothing yet: keep waiting
	answerTask                          // the worker's task (200)
	answerCancel                        // on a watch: stop the task, the engine cancelled it (200 worker.WatchAnswer)
	answerNone                          // nothing this period (204)
	answerNotAttached                   // the worker is not attached (409)
	answerPollOpen                      // another poll of the worker's is open (409 poll_open)
	answerLeave                         // the engine lets its workers go (410 leave)
	answerStopping                      // the engine is closing (503)
)

// wakeReason is what ended a long poll's wait.
type wakeReason int

const (
	wakeOpen   wakeReason = iota + 1 // the poll opens: nothing has waited yet
	wakeBooks                        // the books changed (a task assigned, dismiss, Close)
	wakeTimer                        // its period passed
	wakeHangup                       // the worker hung up: nobody reads the answer
	wakeDone                         // the server is closing
)

// longPoll is one open long poll. Its fields but fire's target are fixed
// at opening; fire and the books' records of it are guarded by books.mu.
type longPoll struct {
	books *books
	// watch: GET /v1/watch; else GET /v1/work.
	watch bool
	name  string
	ws    *workerState
	// wait is the longest the poll waits.
	wait time.Duration
	// counted: the poll is counted in ws.polling and is ws.poll.
	counted bool
	// wake is the waiter's, set by arm: it ends the wait, with no I/O.
	wake func()
	// settled: the poll was answered and closed.
	settled bool
	// running are the attempt ids its worker (with slots) said it runs,
	// as the poll opened (for a watch: runs and has not been told to
	// cancel); nil when it said nothing. A task held and delivered that
	// a poll does not name went astray (the answer that carried it was
	// lost) and goes out again; a watch answers the cancel of a task it
	// names until the worker stops naming it.
	running map[string]bool
}

// openPoll opens a long poll for the worker cred names, in the session
// whose secret is session, waiting at most wait. It returns the poll and
// what it answers now; answerWait means the poll waits (the caller's
// waiter arms it and settles it), anything else is the answer and the
// poll is closed. A denial refuses the request and opens nothing.
func (b *books) openPoll(cred host.Credential, session string, watch bool, wait time.Duration, running map[string]bool) (*longPoll, pollAnswer, Task, denial, string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ws, d, refusal := b.sessionLocked(cred, session)
	if ws == nil {
		return nil, 0, Task{}, d, refusal
	}
	lp := &longPoll{books: b, watch: watch, name: cred.Worker, ws: ws, wait: wait}
	if ws.info.slots {
		lp.running = running
	}
	if !watch && ws.polling > 0 {
		// The first keeps its place: a task goes out in one answer.
		return lp, answerPollOpen, Task{}, allowed, ""
	}
	ws.lastSeen = b.now()
	if !watch && !ws.info.slots && len(ws.held) == 1 && ws.held[0].cancel {
		// A worker without slots polls only between tasks. One with
		// slots polls while it runs its tasks: its cancels go by its
		// watch, but one it does not run is not to be sent again.
		b.takeBackCancelledLocked(ws, ws.held[0], "cancelled; the worker polled for work again without reporting it")
	}
	if !watch && lp.running != nil {
		for _, h := range slices.Clone(ws.held) {
			if h.cancel && h.delivered && !lp.running[h.t.ID] {
				b.takeBackCancelledLocked(ws, h, "cancelled; the worker does not run it")
			}
		}
	}
	if !watch {
		ws.polling++
		ws.poll = lp
		lp.counted = true
	}
	a, task := lp.decideLocked(wakeOpen)
	if a != answerWait {
		lp.closeLocked(a, wakeOpen, task.ID)
	}
	return lp, a, task, allowed, ""
}

// takeBackCancelledLocked ends the cancelled task h, which ws holds, as
// reported cancelled, saying why: its worker never took it, or (without
// slots) polls for work again without having reported it, so it does
// not run it (such a worker reports a task before it polls; the report
// was lost, or its answer to the worker was). b.mu must be held.
func (b *books) takeBackCancelledLocked(ws *workerState, h *heldTask, why string) {
	id := h.t.ID
	b.results[id] = Result{TaskID: id, Worker: ws.info.Name, Hostname: ws.info.Hostname, JobID: ws.info.JobID, CPUs: ws.info.CPUs, At: b.now(),
		run: &worker.ResultRequest{TaskID: id, State: worker.StateCancelled, Error: why}}
	ws.reported = append(ws.reported, h.t)
	b.reported = append(b.reported, id)
	ws.dropLocked(h)
	b.notify()
}

// decideLocked is what the poll answers now, woken for why: the one
// decision for a poll and a watch, however they wait. It changes
// nothing. b.mu must be held.
//
// A poll answers, in order: 410 leave once the engine lets its workers
// go; 409 if its worker is no longer attached (it detached, was dropped,
// or attached afresh); its task if it has one (for a worker with slots,
// the first not yet delivered); 410 leave once a reload removed its
// profile (books.letGo) and, for a worker with slots, it holds no task;
// 503 once the engine is closing; 204 when its period passed or its
// worker hung up; else it waits. A watch answers 410 leave; the cancel
// of one of its worker's tasks (with the task) once the engine
// cancelled it (books.CancelTask), for a worker with slots once a
// task; 503, or 204 the same way.
func (lp *longPoll) decideLocked(why wakeReason) (pollAnswer, Task) {
	b := lp.books
	switch {
	case isClosed(b.leave):
		return answerLeave, Task{}
	case lp.watch:
		if b.workers[lp.name] == lp.ws {
			for _, h := range lp.ws.held {
				if h.cancel && lp.mayTellCancel(h) {
					return answerCancel, h.t
				}
			}
		}
	case b.workers[lp.name] != lp.ws:
		return answerNotAttached, Task{}
	case !lp.ws.info.slots && len(lp.ws.held) > 0:
		return answerTask, lp.ws.held[0].t
	case lp.ws.info.slots && slices.ContainsFunc(lp.ws.held, lp.toSend):
		return answerTask, lp.ws.held[slices.IndexFunc(lp.ws.held, lp.toSend)].t
	case lp.ws.leaving && len(lp.ws.held) == 0:
		return answerLeave, Task{}
	}
	switch {
	case why == wakeDone || isClosed(b.done):
		return answerStopping, Task{}
	case why == wakeTimer || why == wakeHangup:
		return answerNone, Task{}
	}
	return answerWait, Task{}
}

// arm has wake end the poll's wait whenever the books change for it
// (Assign, dismiss, Close), and calls it at once if they did since the
// poll opened.
func (lp *longPoll) arm(wake func()) {
	b := lp.books
	b.mu.Lock()
	defer b.mu.Unlock()
	if lp.settled {
		return
	}
	lp.wake = wake
	b.waiting[lp] = struct{}{}
	if a, _ := lp.decideLocked(wakeOpen); a != answerWait {
		wake()
	}
}

// fire wakes the poll's waiter, if it is armed. b.mu must be held.
func (lp *longPoll) fire() {
	if lp.wake != nil {
		lp.wake()
	}
}

// settle decides the poll's answer for why and closes the poll, unless
// the answer is answerWait (a held poll then waits on).
func (lp *longPoll) settle(why wakeReason) (pollAnswer, Task) {
	b := lp.books
	b.mu.Lock()
	defer b.mu.Unlock()
	a, task := lp.decideLocked(why)
	if a != answerWait {
		lp.closeLocked(a, why, task.ID)
	}
	return a, task
}

// settleNow is settle for a waiter that cannot wait again: a parked
// poll woken with nothing to say answers 204, and its worker polls
// again.
func (lp *longPoll) settleNow(why wakeReason) (pollAnswer, Task) {
	b := lp.books
	b.mu.Lock()
	defer b.mu.Unlock()
	a, task := lp.decideLocked(why)
	if a == answerWait {
		a = answerNone
	}
	lp.closeLocked(a, why, task.ID)
	return a, task
}

// closeLocked ends the poll in the books as it answers a for why, about
// task id: the worker was seen now, has one poll fewer open, and holds
// the task as delivered if the answer carries it to a worker that reads
// it (a watch's cancel, as told). A worker that hung up (it died
// mid-poll) never reads the task: it stays undelivered, so the worker's
// silence is noticed in deadAfter rather than goneFactor poll periods.
// b.mu must be held.
func (lp *longPoll) closeLocked(a pollAnswer, why wakeReason, id string) {
	b := lp.books
	lp.settled = true
	delete(b.waiting, lp)
	ws := lp.ws
	if h := ws.findLocked(id); h != nil && why != wakeHangup {
		switch {
		case a == answerTask:
			h.delivered = true
		case a == answerCancel && ws.info.slots:
			h.cancelTold = true
		}
	}
	if lp.counted {
		ws.polling--
		ws.lastSeen = b.now()
		if ws.poll == lp {
			ws.poll = nil
		}
		return
	}
	if b.workers[lp.name] == ws {
		ws.lastSeen = b.now()
	}
}

// isClosed reports whether ch, closed once and never sent on, is closed.
func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// toSend reports whether a poll of a worker with slots carries h: it
// has not gone out, or it went out and the poll does not name it among
// what its worker runs (the answer was lost on the way). A task that
// is cancelled does not go out again.
func (lp *longPoll) toSend(h *heldTask) bool {
	if !h.delivered {
		return true
	}
	return lp.running != nil && !h.cancel && !lp.running[h.t.ID]
}

// mayTellCancel reports whether a watch answers h's cancel: while its
// worker names it among what it runs and has not been told to cancel;
// for one that names nothing, once.
func (lp *longPoll) mayTellCancel(h *heldTask) bool {
	if lp.running != nil {
		return lp.running[h.t.ID]
	}
	return !h.cancelTold
}
