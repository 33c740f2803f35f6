package slurm

import (
	"fmt"
	"strings"
	"testing"

	"github.com/fluksio/provision/shared"
)

// TestBurstTrimmedToMaxJobCount: under MaxJobCount = 20 with 12 jobs of
// other users in slurmctld, a burst of 10 is one array of 7 (the
// controller refuses at the ceiling itself); the rest is held, answered
// capped with the limit's name, and Status says which limit bit.
func TestBurstTrimmedToMaxJobCount(t *testing.T) {
	h := newHarness(t, "scontrol=jobs20,squeue=rows,sbatch=ok", nil)
	var rows []string
	for i := range 12 {
		rows = append(rows, fmt.Sprintf("%d|PENDING|Priority|N/A|someone-else", 700+i))
	}
	h.fake.setRows(t, rows...)
	h.provisionN(t, cpuNeed, 10)
	h.submitted(t)
	sb := h.fake.callsTo("sbatch")
	if len(sb) != 1 || !strings.Contains(sb[0].Stdin, "#SBATCH --array=0-6\n") {
		t.Fatalf("%d sbatch calls; want one array of 7 tasks (0-6)", len(sb))
	}
	counted := false
	for _, c := range h.fake.callsTo("squeue") {
		r := strings.Join(c.remote(), " ")
		counted = counted || (strings.Contains(r, "-t all") && !strings.Contains(r, "--name="))
	}
	if !counted {
		t.Error("no squeue counted every user's jobs before the submission")
	}
	o, _ := h.provisionN(t, cpuNeed, 10)
	if o.Outcome != shared.OutcomeCapped || o.Condition != shared.ConditionClusterFull || !strings.Contains(o.Detail, "MaxJobCount = 20") {
		t.Errorf("the rest of the demand: %+v; want capped, naming MaxJobCount", o)
	}
	if n := len(h.fake.callsTo("sbatch")); n != 1 {
		t.Errorf("%d sbatch calls while held; want still 1", n)
	}
	if !slicesContains(h.status(t).Notes, "MaxJobCount = 20") {
		t.Errorf("Status notes %q do not say MaxJobCount bit", h.status(t).Notes)
	}
	if st := h.status(t); len(st.BackingOff) != 0 {
		t.Errorf("a limit backed the profile off: %+v", st.BackingOff)
	}
}

// TestFarFromMaxJobCountNotCounted: a burst the books keep below half of
// MaxJobCount pays only its sbatch: no count of the controller's jobs.
func TestFarFromMaxJobCountNotCounted(t *testing.T) {
	h := newHarness(t, "scontrol=jobs20,squeue=rows,sbatch=ok", nil)
	h.provisionN(t, cpuNeed, 3)
	h.submitted(t)
	if n := len(h.fake.callsTo("squeue")); n != 0 {
		t.Errorf("%d squeue calls for a burst of 3 under MaxJobCount 20; want none", n)
	}
	if n := len(h.fake.callsTo("sbatch")); n != 1 {
		t.Errorf("%d sbatch calls; want 1", n)
	}
}

// TestSbatchRetryingBounded: where the count did not prevent it, an sbatch
// that slurmctld keeps refusing with "temporarily unable to accept job"
// (it retries for two minutes) is cut off by submit_timeout, reported as
// a limit with sbatch's words, without backoff, and submissions are held.
// A stand-in for the two minutes of retries: a sandbox started with
// SANDBOX_MAX_JOB_COUNT small produces sbatch's words, but not on a
// clock a unit test can wait for.
func TestSbatchRetryingBounded(t *testing.T) {
	h := newHarness(t, "scontrol=jobs20,squeue=rows,sbatch=full", func(c map[string]any) { c["submit_timeout"] = "2s" })
	h.provision(t, cpuNeed)
	ev := waitEvents(t, h.host, 1)[0]
	if ev.Kind != shared.EventWorkerProvisionFailed || ev.Class != shared.FailureLimitReached || !strings.Contains(ev.Detail, "temporarily unable to accept job") {
		t.Fatalf("event = %+v; want a limit failure with sbatch's words", ev)
	}
	st := h.status(t)
	if len(st.BackingOff) != 0 || !slicesContains(st.Notes, "would not take a job") {
		t.Errorf("Status: backing off %+v, notes %q", st.BackingOff, st.Notes)
	}
	if o := h.provision(t, cpuNeed); o.Outcome != shared.OutcomeCapped {
		t.Errorf("asked again at once: %+v; want capped", o)
	}
}

func slicesContains(notes []string, sub string) bool {
	for _, n := range notes {
		if strings.Contains(n, sub) {
			return true
		}
	}
	return false
}
