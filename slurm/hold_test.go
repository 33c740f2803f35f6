package slurm

import (
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
)

// TestHoldsDecideByKind: Provision answers a hold by its kind, whatever
// its words say: a profile's backoff and misconfiguration back off, the
// cluster's, the throttle's and the login's holds cap; each answer carries
// the hold's own words; nothing is submitted while one holds, the
// profile's own hold comes first, and a hold whose until has passed holds
// nothing.
func TestHoldsDecideByKind(t *testing.T) {
	h := newHarness(t, "", nil)
	now := h.clock.Now()
	later := now.Add(time.Minute)
	// Words that name no kind, so that only the kind can decide.
	const words = "opaque words"
	for _, c := range []struct {
		set     func(p *Provisioner)
		outcome shared.ProvisionOutcome
		says    string
	}{
		{func(p *Provisioner) {
			p.holds.backoff["cpu"] = &backoff{failures: 2, hold: hold{kind: holdBackoff, until: later, reason: words}}
		}, shared.OutcomeBackingOff, "2 failures in a row; not asking again until " + later.Format(time.RFC3339) + ". Last: " + words},
		{func(p *Provisioner) {
			p.holds.backoff["cpu"] = &backoff{failures: 1, hold: hold{kind: holdMisconfigured, until: later, reason: words}}
		}, shared.OutcomeBackingOff, "profile cpu is misconfigured: Slurm refused it for a reason waiting will not change (" + words + ")"},
		{func(p *Provisioner) { p.holds.clusterFull = hold{kind: holdClusterFull, until: later, reason: words} }, shared.OutcomeCapped, words},
		{func(p *Provisioner) { p.holds.throttled = hold{kind: holdThrottled, until: later, reason: words} }, shared.OutcomeCapped, words},
		{func(p *Provisioner) {
			// The profile's own hold is answered before the cluster's.
			p.holds.throttled = hold{kind: holdThrottled, until: later, reason: "the throttle's"}
			p.holds.backoff["cpu"] = &backoff{failures: 1, hold: hold{kind: holdBackoff, until: later, reason: words}}
		}, shared.OutcomeBackingOff, "Last: " + words},
	} {
		h.p.mu.Lock()
		h.p.holds = holds{p: h.p, backoff: map[string]*backoff{}}
		c.set(h.p)
		h.p.mu.Unlock()
		if o := h.provision(t, cpuNeed); o.Outcome != c.outcome || !strings.Contains(o.Detail, c.says) {
			t.Errorf("Provision = %+v, want %s saying %q", o, c.outcome, c.says)
		}
	}
	h.submitted(t)
	if n := len(h.fake.callsTo("sbatch")); n != 0 {
		t.Errorf("%d sbatch while held, want none", n)
	}
	// Past its until a hold holds nothing.
	h.p.mu.Lock()
	h.p.holds = holds{p: h.p, backoff: map[string]*backoff{}}
	h.p.holds.clusterFull = hold{kind: holdClusterFull, until: now, reason: words}
	h.p.mu.Unlock()
	if o := h.provision(t, cpuNeed); o.Outcome != shared.OutcomeRequested {
		t.Errorf("Provision after the hold's until = %+v, want requested", o)
	}
	h.submitted(t)
}

// TestHoldKindNames: every kind has a name of its own.
func TestHoldKindNames(t *testing.T) {
	seen := map[string]bool{}
	for k := holdNone; k <= holdLoginNeeded; k++ {
		if s := k.String(); s == "unknown" || seen[s] {
			t.Errorf("holdKind(%d) = %q", k, s)
		} else {
			seen[s] = true
		}
	}
}
