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

func infoOf(contract string, caps ...shared.Capability) *shared.InfoResponse {
	return &shared.InfoResponse{ContractVersion: contract, Capabilities: caps}
}

// TestAttachedTracker: a plugin that offers reconcile_delta hears the
// whole list first, then only what joined and left; again the whole list
// after a call that failed, after the resync interval, and from a new
// tracker (a restarted plugin process). A plugin that does not offer it
// always hears the whole list.
func TestAttachedTracker(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	tr := NewAttachedTracker(infoOf(shared.ContractVersion, shared.CapabilityReconcileDelta), time.Minute)
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
	if got := reqString(NewAttachedTracker(infoOf("2.4"), 0).Request([]string{"x"}, t0)); got != "full [x]" {
		t.Errorf("a new tracker's first request: %s", got)
	}
	// Who gets changes: what a plugin declares, and a 2.4 plugin that
	// declares nothing (it could not); not a 2.3 plugin, and not a 2.5
	// plugin that declares nothing.
	for _, tc := range []struct {
		info  *shared.InfoResponse
		delta bool
	}{
		{infoOf("2.4"), true},
		{infoOf("2.5", shared.CapabilityReconcileDelta), true},
		{infoOf("2.3", shared.CapabilityReconcileDelta), true},
		{infoOf("2.3"), false},
		{infoOf("2.5"), false},
		{infoOf("2.5", shared.CapabilityBatchMint), false},
	} {
		tr := NewAttachedTracker(tc.info, time.Minute)
		for i := range 3 {
			req := tr.Request([]string{"a", "b"}, t0.Add(time.Duration(i)*time.Second))
			if req.Delta != (tc.delta && i > 0) {
				t.Errorf("a plugin of %s declaring %v, call %d: %s; want delta %v after the first", tc.info.ContractVersion, tc.info.Capabilities, i, reqString(req), tc.delta)
			}
			tr.Answered(req, true, t0)
		}
	}
}
