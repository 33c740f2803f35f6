package engine

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/engine/internal/supervise"
	"github.com/fluksio/provision/internal/loglimit"
	"github.com/fluksio/provision/shared"
)

// The history is bounded and a subscriber that does not keep up is let
// go rather than holding the publisher up; what it was sent stays in
// order, and the history still has what it missed.
func TestEventHubBoundsAndSlowSubscribers(t *testing.T) {
	h := newHub()
	_, slow := h.subscribe(0)
	for i := range historySize + subscriberBuffer + 10 {
		h.publish(Event{Kind: "k", Detail: string(rune('a' + i%26))})
	}
	select {
	case <-slow.dropped:
	default:
		t.Fatal("a subscriber that read nothing was not dropped")
	}
	if n := len(slow.ch); n != subscriberBuffer {
		t.Errorf("the dropped subscriber holds %d events, want its buffer's %d", n, subscriberBuffer)
	}
	for want := uint64(1); len(slow.ch) > 0; want++ {
		if ev := <-slow.ch; ev.Seq != want {
			t.Fatalf("got seq %d, want %d", ev.Seq, want)
		}
	}
	past, sub := h.subscribe(0)
	defer h.unsubscribe(sub)
	if len(past) != historySize {
		t.Fatalf("history holds %d, want %d", len(past), historySize)
	}
	last := uint64(historySize + subscriberBuffer + 10)
	if past[0].Seq != last-historySize+1 || past[len(past)-1].Seq != last {
		t.Errorf("history runs %d..%d, want the last %d up to %d", past[0].Seq, past[len(past)-1].Seq, historySize, last)
	}
	if after, s := h.subscribe(last - 3); len(after) != 3 {
		t.Errorf("after seq %d: %d events, want 3", last-3, len(after))
	} else {
		h.unsubscribe(s)
	}
	h.close()
	select {
	case <-sub.dropped:
	default:
		t.Error("close left a subscriber open")
	}
}

// TestPluginEventFloodLogged, with the attack's figure: a plugin sends
// 48,355 small well-formed events in one window (before: 48,355 engine
// log lines in 40 s). The log and the story tell eventLogBurst of them,
// and one summary line each counts the rest, in the next window and at
// the engine's stop; every event still reaches the event stream, and the
// engine's books up to their bound (recordBudget, maxWaiting: the
// two bounds passed are said once each, and the rest counted).
func TestPluginEventFloodLogged(t *testing.T) {
	logger, logs := testLogger(t)
	var out lockedBuffer
	books := newBareBooks(logger, host.NewSigner(testSecret), nil)
	d := &Engine{logger: logger, wake: make(chan struct{}, 1), books: books, router: newRouter(logger, books, nil),
		obs: newObserver(newEngineMetrics(&stateCollector{})), cfg: Config{Hooks: storyHooks(&out)}}
	defer d.books.Close()
	plog := logger.Named(testProvisioner)
	limit := loglimit.New(eventLogBurst, eventLogWindow)
	d.fleet = &fleet{byName: map[string]*supervise.Supervisor{}, stopping: make(chan struct{}), logs: []pluginEventLog{{name: testProvisioner, logger: plog, limit: limit}}}
	const flood = 48_355
	start := time.Now()
	for i := range flood {
		d.pluginEvent(plog, limit, shared.Event{Kind: shared.EventWorkerProvisioned, Provisioner: testProvisioner,
			Profile: "cpu", Worker: fmt.Sprintf("%s-cpu-%d", testProvisioner, i), Job: fmt.Sprint(i)}, start)
	}
	lines := func(s string) int { return strings.Count(s, "\n") }
	if n := lines(logs.String()); n != eventLogBurst+2 {
		t.Errorf("%d events in one window made %d log lines; want %d and one for each of 2 bounds", flood, n, eventLogBurst)
	}
	if n := lines(out.String()); n != eventLogBurst {
		t.Errorf("%d events in one window made %d story lines; want %d", flood, n, eventLogBurst)
	}
	// All of them reached the stream, and the books up to their bounds.
	d.obs.hub.mu.Lock()
	seq := d.obs.hub.seq
	d.obs.hub.mu.Unlock()
	if seq != flood {
		t.Errorf("the event stream got %d events; want %d", seq, flood)
	}
	d.obs.mu.Lock()
	waiting := len(d.obs.waiting)
	d.obs.mu.Unlock()
	jobs, _ := d.books.records(testProvisioner)
	if waiting != maxWaiting || jobs != recordBudget {
		t.Errorf("the engine's books hold %d machines on their way and %d job records; want %d and %d", waiting, jobs, maxWaiting, recordBudget)
	}
	_, unrecorded := provisionerMetrics(t, d, testProvisioner)
	if want := float64(flood - recordBudget); unrecorded[unrecordedWorker] != want || unrecorded[unrecordedTimed] != want {
		t.Errorf("unrecorded %v; want %v of each of %s and %s", unrecorded, want, unrecordedWorker, unrecordedTimed)
	}
	// The next window opens with the summary of the first.
	d.pluginEvent(plog, limit, shared.Event{Kind: shared.EventWorkerCancelled, Provisioner: testProvisioner, Worker: "x"}, start.Add(eventLogWindow))
	want := fmt.Sprintf("not_logged=%d", flood-eventLogBurst)
	if !strings.Contains(logs.String(), want) || !strings.Contains(out.String(), fmt.Sprintf("%d more event(s) not told", flood-eventLogBurst)) {
		t.Errorf("no summary with %s:\n%s", want, tail(logs.String(), 400))
	}
	// Events about another provisioner's workers, ignored, are logged
	// at a bounded rate too.
	before := strings.Count(logs.String(), "ignored an event")
	for range 10_000 {
		d.pluginEvent(plog, limit, shared.Event{Kind: shared.EventWorkerCancelled, Provisioner: testProvisioner, Worker: "other-cpu-1"}, start.Add(2*eventLogWindow))
	}
	if n := strings.Count(logs.String(), "ignored an event") - before; n > refusalLogBurst {
		t.Errorf("10,000 events about another provisioner's worker made %d log lines; want at most %d", n, refusalLogBurst)
	}
	// And the engine's stop tells what the last window left out: 5.
	d.pluginEvent(plog, limit, shared.Event{Kind: shared.EventWorkerCancelled, Provisioner: testProvisioner, Worker: "y"}, start.Add(3*eventLogWindow))
	for range eventLogBurst + 4 {
		d.pluginEvent(plog, limit, shared.Event{Kind: shared.EventWorkerCancelled, Provisioner: testProvisioner, Worker: "y"}, start.Add(3*eventLogWindow))
	}
	d.flushEventLogs()
	if !strings.HasSuffix(out.String(), "5 more event(s) not told\n") ||
		!strings.Contains(logs.String(), "not_logged=5 ") {
		t.Errorf("no summary of 5 at stop:\n%s", tail(out.String(), 400))
	}
}

func tail(s string, n int) string { return s[max(0, len(s)-n):] }
