package host

import (
	"fmt"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
)

func reqString(r *shared.ReconcileRequest) string {
	if r.Delta {
		return fmt.Sprintf("delta +%v -%v", r.Joined, r.Left)
	}
	return fmt.Sprintf("full %v", r.Attached)
}

// TestAttachedTracker: a plugin of 2.4 hears the whole list first, then
// only what joined and left; again the whole list after a call that
// failed, after the resync interval, and from a new tracker (a restarted
// plugin process). A plugin of 2.3 always hears the whole list.
func TestAttachedTracker(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	tr := NewAttachedTracker("2.4", time.Minute)
	steps := []struct {
		attached []string
		at       time.Duration
		ok       bool
		want     string
	}{
		{[]string{"a", "b", "c"}, 0, true, "full [a b c]"},
		{[]string{"a", "b", "c"}, time.Second, true, "delta +[] -[]"},
		{[]string{"a", "c", "d", "e"}, 2 * time.Second, true, "delta +[d e] -[b]"},
		// Failed: the plugin may or may not have applied it.
		{[]string{"c", "d", "e"}, 3 * time.Second, false, "delta +[] -[a]"},
		{[]string{"c", "d", "e"}, 4 * time.Second, true, "full [c d e]"},
		{[]string{"e", "d", "c", "f"}, 5 * time.Second, true, "delta +[f] -[]"},
		// A minute after the last whole list, another.
		{[]string{"c", "d", "e", "f"}, 64 * time.Second, true, "full [c d e f]"},
		{nil, 65 * time.Second, true, "delta +[] -[c d e f]"},
	}
	for i, s := range steps {
		req := tr.Request(s.attached, t0.Add(s.at))
		if got := reqString(req); got != s.want {
			t.Errorf("step %d: %s; want %s", i, got, s.want)
		}
		tr.Answered(req, s.ok, t0.Add(s.at))
	}
	// A restarted plugin is a new tracker: the whole list first.
	if got := reqString(NewAttachedTracker("2.4", 0).Request([]string{"x"}, t0)); got != "full [x]" {
		t.Errorf("a new tracker's first request: %s", got)
	}
	old := NewAttachedTracker("2.3", time.Minute)
	for i := range 3 {
		req := old.Request([]string{"a", "b"}, t0.Add(time.Duration(i)*time.Second))
		if got := reqString(req); got != "full [a b]" {
			t.Errorf("a 2.3 plugin, call %d: %s; want the whole list", i, got)
		}
		old.Answered(req, true, t0)
	}
}
