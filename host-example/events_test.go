package main

import (
	"testing"
)

// The history is bounded and a subscriber that does not keep up is let
// go rather than holding the publisher up; what it was sent stays in
// order, and the history still has what it missed.
func TestEventHubBoundsAndSlowSubscribers(t *testing.T) {
	h := newEventHub()
	_, slow := h.subscribe(0)
	for i := range historySize + subscriberBuffer + 10 {
		h.publish(engineEvent{Kind: "k", Detail: string(rune('a' + i%26))})
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
