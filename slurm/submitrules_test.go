package slurm

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/fluksio/provision/shared"
)

// TestSubmitRuleWordsEveryVersion: what require_timelimit and throttle
// made each Slurm say (capture-submit-rules.sh) is read the same on every
// version: a missing --time is a verdict with the fix named, a throttle
// is weather the provisioner waits out, never a verdict.
func TestSubmitRuleWordsEveryVersion(t *testing.T) {
	for _, dir := range versionDirs(t) {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			for _, f := range []string{"submit-rule-timelimit-sbatch.txt", "submit-rule-timelimit-test-only.txt"} {
				said := fixture(t, dir, f)
				if !refusedForGood(said) {
					t.Errorf("%s is not a verdict: %q", f, said)
				}
				if h := submitRuleHint(said); !strings.Contains(h, "--time=") {
					t.Errorf("%s: hint %q does not say to add --time", f, h)
				}
				if throttled(said) {
					t.Errorf("%s read as a throttle", f)
				}
			}
			said := fixture(t, dir, "submit-rule-throttle-sbatch.txt")
			if !throttled(said) || refusedForGood(said) {
				t.Errorf("throttle: throttled %v, verdict %v; want weather: %q", throttled(said), refusedForGood(said), said)
			}
			if h := submitRuleHint(said); !strings.Contains(h, "6m0s") {
				t.Errorf("throttle: hint %q does not say when a submission comes back", h)
			}
		})
	}
}

// TestSubmitRuleThrottleWaits: a throttle's refusal fails the machines it
// was for, limit_reached, in the site's words with the time of the next
// try; no profile backs off; Provision asks for nothing until the
// throttle gives a submission back, and asks then.
func TestSubmitRuleThrottleWaits(t *testing.T) {
	h := newHarness(t, "sbatch=throttle", nil)
	if o := h.provision(t, cpuNeed); o.Outcome != shared.OutcomeRequested {
		t.Fatalf("Provision = %+v", o)
	}
	ev := waitEvents(t, h.host, 1)[0]
	h.submitted(t)
	if ev.Kind != shared.EventWorkerProvisionFailed || ev.Class != shared.FailureLimitReached ||
		!strings.Contains(ev.Detail, "Reached jobs per hour limit") || !strings.Contains(ev.Detail, "asking again at 2026-12-02T10:06:00Z") {
		t.Errorf("event = %+v, want limit_reached in the site's words with the next try", ev)
	}
	st := h.status(t)
	if len(st.BackingOff) != 0 {
		t.Errorf("a throttle backs off %+v, want no profile held", st.BackingOff)
	}
	if !strings.HasPrefix(strings.Join(st.Notes, "\n"), limitReached) && !strings.Contains(strings.Join(st.Notes, "\n"), "submit rule") {
		t.Errorf("Status notes %q do not say the throttle holds", st.Notes)
	}
	n := len(h.fake.callsTo("sbatch"))
	if o := h.provision(t, cpuNeed); o.Outcome != shared.OutcomeCapped || o.Condition != shared.ConditionThrottled || !strings.Contains(o.Detail, "job_submit/throttle") {
		t.Errorf("Provision while throttled = %+v, want capped until the throttle gives one back", o)
	}
	h.submitted(t)
	if got := len(h.fake.callsTo("sbatch")) - n; got != 0 {
		t.Errorf("%d sbatch while throttled, want none", got)
	}
	h.fake.setSpec(t, "")
	h.clock.Advance(throttleWait)
	if o := h.provision(t, cpuNeed); o.Outcome != shared.OutcomeRequested {
		t.Errorf("Provision once the throttle gave one back = %+v, want requested", o)
	}
	h.submitted(t)
	if n := strings.Count(h.logs.String(), "throttles submissions"); n != 1 {
		t.Errorf("%d log lines about the throttle, want 1", n)
	}
}

// TestSubmitRuleTimelimitIsMisconfigured: require_timelimit's refusal
// marks the profile misconfigured, in Slurm's words with the fix.
func TestSubmitRuleTimelimitIsMisconfigured(t *testing.T) {
	h := newHarness(t, "sbatch=notime", nil)
	h.provision(t, cpuNeed)
	ev := waitEvents(t, h.host, 1)[0]
	h.submitted(t)
	if ev.Class != shared.FailureMisconfigured || !strings.Contains(ev.Detail, "Time limit specification required") ||
		!strings.Contains(ev.Detail, `add a line such as "--time=01:00:00"`) {
		t.Errorf("event = %+v, want misconfigured, Slurm's words and the fix", ev)
	}
	if o := h.provision(t, cpuNeed); o.Outcome != shared.OutcomeBackingOff || o.Condition != shared.ConditionMisconfigured || !strings.Contains(o.Detail, "misconfigured") {
		t.Errorf("Provision after = %+v, want the profile held as misconfigured", o)
	}
}
