package loglimit

import (
	"testing"
	"time"
)

func TestAllow(t *testing.T) {
	l := New(2, time.Hour)
	now := time.Now()
	for i := range 2 {
		if ok, _ := l.Allow(now); !ok {
			t.Fatalf("line %d of a burst of 2 refused", i+1)
		}
	}
	for range 5 {
		if ok, _ := l.Allow(now); ok {
			t.Fatal("a third line in the window was allowed")
		}
	}
	if ok, left := l.Allow(now.Add(2 * time.Hour)); !ok || left != 5 {
		t.Errorf("next window: allowed %v, left out %d; want true, 5", ok, left)
	}
}

func TestFlush(t *testing.T) {
	l := New(1, time.Hour)
	now := time.Now()
	for range 4 {
		l.Allow(now)
	}
	if n := l.Flush(); n != 3 {
		t.Errorf("Flush after 3 left out: %d", n)
	}
	if n := l.Flush(); n != 0 {
		t.Errorf("second Flush: %d; want 0, the count was taken", n)
	}
	if ok, left := l.Allow(now.Add(2 * time.Hour)); !ok || left != 0 {
		t.Errorf("after a Flush the next line counts %d left out; want 0", left)
	}
}
