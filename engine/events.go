package engine

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/fluksio/provision/shared"
)

// The event stream, GET /v1/events, is the engine's events as they
// happen, in Server-Sent Events: what the provisioners published
// (worker_provisioned, worker_provision_failed, worker_cancelled), what
// happened to workers and tasks here (worker_attached, worker_detached,
// worker_gone, worker_dropped, task_assigned, task_done, task_lost,
// task_ended) and to the
// plugins (plugin_down, plugin_up). Each carries its time, provisioner,
// profile, job and worker where it has them, and a sequence number that
// is the SSE id, so a client that reconnects with Last-Event-ID misses
// nothing the history still holds. A client that connects late gets the
// history first (the last historySize events).
//
// It is SSE, not a WebSocket: the stream goes one way, EventSource
// reconnects and resumes from Last-Event-ID by itself, and it is plain
// HTTP (docs/design/engine-events-sse.md).
//
// What it won't do: keep events across restarts, or hold a slow client
// up. A client that does not keep up (its buffer of subscriberBuffer
// events is full) is disconnected; EventSource reconnects and resumes
// from the history.

const (
	historySize      = 1000
	subscriberBuffer = 256
	// keepAlive is how often an idle stream gets a comment line, so
	// that proxies do not take it for dead.
	keepAlive = 15 * time.Second
)

// EventKind is what an event on the stream is about: one vocabulary for
// the plugins' events, the workers', the tasks' and the plugins' own
// lifecycle. Label says what a metric calls it.
type EventKind string

const (
	// What a provisioner published, as shared.EventKind says it.
	EventWorkerProvisioned     = EventKind(shared.EventWorkerProvisioned)
	EventWorkerProvisionFailed = EventKind(shared.EventWorkerProvisionFailed)
	EventWorkerCancelled       = EventKind(shared.EventWorkerCancelled)
	// What happened to a worker here.
	EventWorkerAttached EventKind = "worker_attached"
	EventWorkerDetached EventKind = "worker_detached"
	// EventWorkerGone: silent past its time (books.watch).
	EventWorkerGone EventKind = "worker_gone"
	// EventWorkerDropped: its provisioner cancelled its request.
	EventWorkerDropped EventKind = "worker_dropped"
	// What happened to a task. EventTaskDone is a worker's report;
	// EventTaskLost an attempt of a submitted task whose machine was
	// lost (Detail says whether it waits again), EventTaskEnded a
	// submitted task's end (Detail is its state, and why).
	EventTaskAssigned EventKind = "task_assigned"
	EventTaskDone     EventKind = "task_done"
	EventTaskLost     EventKind = "task_lost"
	EventTaskEnded    EventKind = "task_ended"
	// What happened to a plugin: up (configured, again after a restart),
	// down (exited; being restarted), failed (not restarted: a restart
	// cannot fix what it hit).
	EventPluginUp     EventKind = "plugin_up"
	EventPluginDown   EventKind = "plugin_down"
	EventPluginFailed EventKind = "plugin_failed"
	// EventMachineMismatch: a machine asked for a kind of waiting task
	// attached and could not take it (mismatch.go); Detail says why, and
	// until when its profile is not asked for such tasks.
	EventMachineMismatch EventKind = "machine_mismatch"
)

// workerLeft reports whether k is a worker leaving the books.
func (k EventKind) workerLeft() bool {
	return k == EventWorkerDetached || k == EventWorkerGone || k == EventWorkerDropped
}

// Event is one event on the stream.
type Event struct {
	Seq         uint64    `json:"seq"`
	Time        time.Time `json:"time"`
	Kind        EventKind `json:"kind"`
	Provisioner string    `json:"provisioner,omitempty"`
	Profile     string    `json:"profile,omitempty"`
	Job         string    `json:"job,omitempty"`
	Worker      string    `json:"worker,omitempty"`
	// Task is the task's id, as every surface names it (empty for the
	// stand-in's work); Attempt is its attempt's number and AttemptID
	// the attempt's id on the workers' routes.
	Task      string `json:"task,omitempty"`
	Attempt   int    `json:"attempt,omitempty"`
	AttemptID string `json:"attempt_id,omitempty"`
	Detail    string `json:"detail,omitempty"`
}

// Hub numbers events, keeps the last historySize and hands each to
// every subscriber. publish never blocks on a subscriber.
type hub struct {
	// mu guards every field below; held only to append and to copy,
	// never while writing to a client.
	mu      sync.Mutex
	seq     uint64
	history []Event // a ring, oldest at start once full
	start   int
	subs    map[*subscriber]bool
	closed  bool
}

type subscriber struct {
	ch chan Event
	// dropped is closed when the hub let go of the subscriber, because
	// it fell behind or the hub closed.
	dropped chan struct{}
}

func newHub() *hub {
	return &hub{subs: map[*subscriber]bool{}}
}

// publish stamps ev with the next sequence number (and the time, if it
// has none) and delivers it.
func (h *hub) publish(ev Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	h.seq++
	ev.Seq = h.seq
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	if len(h.history) < historySize {
		h.history = append(h.history, ev)
	} else {
		h.history[h.start] = ev
		h.start = (h.start + 1) % historySize
	}
	for s := range h.subs {
		select {
		case s.ch <- ev:
		default:
			delete(h.subs, s)
			close(s.dropped)
		}
	}
}

// subscribe returns the history after seq after (all of it for 0) and a
// subscriber that gets every event after that, in order.
func (h *hub) subscribe(after uint64) ([]Event, *subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := &subscriber{ch: make(chan Event, subscriberBuffer), dropped: make(chan struct{})}
	var past []Event
	for i := range h.history {
		ev := h.history[(h.start+i)%len(h.history)]
		if ev.Seq > after {
			past = append(past, ev)
		}
	}
	if h.closed {
		close(s.dropped)
		return past, s
	}
	h.subs[s] = true
	return past, s
}

func (h *hub) unsubscribe(s *subscriber) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.subs[s] {
		delete(h.subs, s)
		close(s.dropped)
	}
}

// close ends every stream, so that the server's Shutdown need not wait
// for them.
func (h *hub) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	h.closed = true
	for s := range h.subs {
		delete(h.subs, s)
		close(s.dropped)
	}
}

// ServeHTTP is GET /v1/events.
func (h *hub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var after uint64
	for _, v := range []string{r.Header.Get("Last-Event-ID"), r.URL.Query().Get("after")} {
		if v == "" {
			continue
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			WriteError(w, http.StatusBadRequest, "Last-Event-ID and after are event sequence numbers")
			return
		}
		after = n
	}
	rc := http.NewResponseController(w)
	// The server's WriteTimeout bounds a worker's answer; a stream is
	// meant to stay open, so this request has none.
	if err := rc.SetWriteDeadline(time.Time{}); err != nil {
		WriteError(w, http.StatusInternalServerError, "this connection cannot stream")
		return
	}
	past, sub := h.subscribe(after)
	defer h.unsubscribe(sub)

	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	// How long EventSource waits before it reconnects.
	fmt.Fprint(w, "retry: 2000\n\n")
	for _, ev := range past {
		if writeSSE(w, ev) != nil {
			return
		}
	}
	if rc.Flush() != nil {
		return
	}
	tick := time.NewTicker(keepAlive)
	defer tick.Stop()
	for {
		select {
		case ev := <-sub.ch:
			if writeSSE(w, ev) != nil {
				return
			}
			// Drain what else is queued before flushing once.
			for more := true; more; {
				select {
				case ev := <-sub.ch:
					if writeSSE(w, ev) != nil {
						return
					}
				default:
					more = false
				}
			}
		case <-tick.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return
			}
		case <-sub.dropped:
			// Fell behind, or the engine is stopping; what is queued
			// still goes out, and a reconnect resumes after it.
			for {
				select {
				case ev := <-sub.ch:
					if writeSSE(w, ev) != nil {
						return
					}
				default:
					rc.Flush()
					return
				}
			}
		case <-r.Context().Done():
			return
		}
		if rc.Flush() != nil {
			return
		}
	}
}

// writeSSE writes one event. The data is one line of JSON: encoding/json
// escapes newlines inside strings, so no field can end the event early.
func writeSSE(w http.ResponseWriter, ev Event) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "id: %d\ndata: %s\n\n", ev.Seq, b)
	return err
}
