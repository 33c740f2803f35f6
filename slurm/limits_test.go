package slurm

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
)

// TestBurstTrimmedToSubmitLimit: under MaxSubmitJobs = 5 with 2 other jobs
// of the user's in the queue, a burst of 10 is one array of 3; the rest
// waits, answered capped with the limit's name, and nothing backs off.
func TestBurstTrimmedToSubmitLimit(t *testing.T) {
	h := newHarness(t, "sbatch=ok,squeue=rows,sacctmgr=limit5,scontrol=cluster1", nil)
	h.fake.setRows(t, "77|RUNNING|None|N/A|not-ours", "78|PENDING|Priority|N/A|not-ours")
	o, resp := h.provisionN(t, cpuNeed, 10)
	if o.Outcome != shared.OutcomeRequested || !strings.Contains(o.Detail, "MaxSubmitJobs = 5") {
		t.Errorf("10 wanted under MaxSubmitJobs 5: %+v; want requested, the limit named", o)
	}
	if pd := profileDemand(resp, "cpu"); pd.Requested != 5 {
		t.Errorf("cpu: %+v, want 5 requested by the books (nothing counted yet)", pd)
	}
	h.submitted(t)
	sb := h.fake.callsTo("sbatch")
	if len(sb) != 1 || !strings.Contains(sb[0].Stdin, "#SBATCH --array=0-2\n") {
		t.Fatalf("%d sbatch calls; want one array of 3 (5 less the 2 queued):\n%.300s", len(sb), sb[0].Stdin)
	}
	o, _ = h.provisionN(t, cpuNeed, 10)
	if o.Outcome != shared.OutcomeCapped || o.Condition != shared.ConditionSiteLimit || !strings.HasPrefix(o.Detail, limitReached) || !strings.Contains(o.Detail, "association proj/alice MaxSubmitJobs = 5") {
		t.Errorf("the same demand again: %+v; want capped by the limit, named", o)
	}
	if n := len(h.fake.callsTo("sbatch")); n != 1 {
		t.Errorf("%d sbatch calls with the limit reached, want still 1", n)
	}
	st := h.status(t)
	if len(st.BackingOff) != 0 {
		t.Errorf("backing off under a limit: %+v", st.BackingOff)
	}
	notes := strings.Join(st.Notes, "\n")
	if !strings.Contains(notes, limitReached) || !strings.Contains(notes, "running QOS normal MaxJobsPerUser = 8") || !strings.Contains(notes, "cpus QOS normal MaxTRESPerUser cpu = 64") {
		t.Errorf("Status notes do not show the limits:\n%s", notes)
	}
}

// TestLimitRefusalIsWeather: where the limits cannot be read, a burst
// Slurm refuses for a limit is weather: no backoff (the placer would fail
// over), counted as limit_reached, and the next ask is half the size,
// which fits.
func TestLimitRefusalIsWeather(t *testing.T) {
	h := newHarness(t, "sbatch=overlimit,sacctmgr=none", nil)
	if o, _ := h.provisionN(t, cpuNeed, 10); o.Outcome != shared.OutcomeRequested {
		t.Fatalf("10 wanted, limits unknown: %+v", o)
	}
	h.submitted(t)
	o, resp := h.provisionN(t, cpuNeed, 10)
	if o.Outcome == shared.OutcomeBackingOff {
		t.Fatalf("after a refusal for a limit: %+v; want no backoff", o)
	}
	if pd := profileDemand(resp, "cpu"); pd.Requested != 5 || !strings.Contains(o.Detail, "AssocMaxSubmitJobLimit") {
		t.Errorf("after refusing 10: %+v %+v; want 5 asked for, the refusal named", pd, o)
	}
	h.submitted(t)
	sb := h.fake.callsTo("sbatch")
	if len(sb) != 2 || !strings.Contains(sb[1].Stdin, "#SBATCH --array=0-4\n") {
		t.Fatalf("%d sbatch calls, want the second an array of 5", len(sb))
	}
	st := h.status(t)
	if len(st.BackingOff) != 0 {
		t.Errorf("backing off after a refusal for a limit: %+v", st.BackingOff)
	}
	var counted int64
	for _, f := range st.Counters.Failures {
		if f.Class == shared.FailureLimitReached {
			counted += f.Count
		}
	}
	if counted != 10 {
		t.Errorf("%d machines counted limit_reached, want 10: %+v", counted, st.Counters.Failures)
	}
	if notes := strings.Join(st.Notes, "\n"); !strings.Contains(notes, "accounting limits unknown") {
		t.Errorf("Status does not say the limits are unknown:\n%s", notes)
	}
	if n := strings.Count(h.logs.String(), "cannot read the accounting limits"); n != 1 {
		t.Errorf("said %d times that the limits cannot be read, want once", n)
	}
}

func TestLimitRefusalWords(t *testing.T) {
	for said, want := range map[string]string{
		"sbatch: error: AssocMaxSubmitJobLimit\nsbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)": "AssocMaxSubmitJobLimit",
		"sbatch: error: QOSMaxSubmitJobPerUserLimit\nsbatch: error: Batch job submission failed: Job violates accounting/QOS policy":                                               "QOSMaxSubmitJobPerUserLimit",
		"sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)":                                        "Job violates accounting/QOS policy",
		"sbatch: error: Batch job submission failed: Invalid partition name specified":                                                                                             "",
	} {
		got, ok := limitRefusal(said)
		if got != want || ok != (want != "") {
			t.Errorf("limitRefusal(%q) = %q, %v; want %q", said, got, ok, want)
		}
	}
}

// TestCheckShowsLimits: validate -check's preflight names the limits that
// apply to the login user in this cluster (not another cluster's
// smaller one) and warns that max_pending 64 and max_workers 256 are
// above MaxSubmitJobs = 5.
func TestCheckShowsLimits(t *testing.T) {
	h := newUnconfigured(t, "sacctmgr=limit5,scontrol=cluster1,sbatch=ok,sh=ok")
	resp, err := h.p.Check(context.Background(), &shared.CheckRequest{Name: "hpc", Config: mustJSON(t, baseConfig())})
	if err != nil {
		t.Fatal(err)
	}
	facts := map[string]string{}
	for _, f := range resp.Facts {
		facts[f.Name] = f.Value
	}
	if got := facts["limit on jobs in the queue"]; got != "association proj/alice MaxSubmitJobs = 5" {
		t.Errorf("the submit limit shown: %q; facts %v", got, facts)
	}
	if got := facts["limit on jobs running"]; got != "QOS normal MaxJobsPerUser = 8" {
		t.Errorf("the running limit shown: %q", got)
	}
	warned := map[string]string{}
	for _, d := range resp.Diagnostics {
		if d.Severity == shared.SeverityWarning && len(d.Path) > 0 {
			warned[strings.Join(d.Path, ".")] = d.Detail
		}
	}
	if w := warned["max_pending"]; !strings.Contains(w, "max_pending = 64") || !strings.Contains(w, "MaxSubmitJobs = 5") {
		t.Errorf("no warning at max_pending naming 64 and the limit: %q (all: %v)", w, resp.Diagnostics)
	}
	if w := warned["max_workers"]; !strings.Contains(w, "max_workers = 256") || !strings.Contains(w, "at most 5") {
		t.Errorf("no warning at max_workers: %q", w)
	}
}

// TestExplainFromSacct: a job that failed before its worker attached and
// that the controller has already forgotten (MinJobAge) is explained from
// sacct: its state, exit code and last lines reach the event.
func TestExplainFromSacct(t *testing.T) {
	h := newHarness(t, "sbatch=ok,squeue=rows,sh=forgot", nil)
	ev := h.provisioned(t)
	h.p.poll.once(context.Background()) // the queue no longer lists it
	evs := waitEvents(t, h.host, 2)
	want := "job 4242 left the queue before its worker attached: state FAILED (from sacct: the controller no longer knows the job), exit code 7," +
		" output /home/alice/.local/state/fluksio/hpc/4242.out, its last lines: fluksio-worker: cannot start: no such module"
	if got := evs[1]; got.Kind != shared.EventWorkerProvisionFailed || got.Worker != ev.Worker || got.Detail != want {
		t.Errorf("event = %+v\nwant detail %q", got, want)
	}
}

// TestLimitRoomComesBackAsOthersEnd: held back by MaxSubmitJobs = 5 with 2
// jobs of the user's that are not this provisioner's, the room comes back
// when they end: a capped demand counts the queue again once the count is
// limitRecount old, and the next ask takes the room.
func TestLimitRoomComesBackAsOthersEnd(t *testing.T) {
	h := newHarness(t, "sbatch=ok,squeue=rows,sacctmgr=limit5,scontrol=cluster1", nil)
	h.fake.setRows(t, "77|RUNNING|None|N/A|not-ours", "78|PENDING|Priority|N/A|not-ours")
	h.provisionN(t, cpuNeed, 10)
	h.submitted(t)
	if o, _ := h.provisionN(t, cpuNeed, 10); o.Outcome != shared.OutcomeCapped {
		t.Fatalf("with the limit reached: %+v", o)
	}
	// The other two end; ours (4242, an array of 3) are still queued.
	h.fake.setRows(t, "4242_0|PENDING|Priority|N/A|x", "4242_1|PENDING|Priority|N/A|x", "4242_2|PENDING|Priority|N/A|x")
	h.clock.Advance(limitRecount)
	h.provisionN(t, cpuNeed, 10) // capped still, and counts again
	eventually(t, "the queue counted again", func() bool {
		h.p.mu.Lock()
		defer h.p.mu.Unlock()
		return h.p.lim.limits.queued == 3 && !h.p.lim.limits.counting
	})
	o, resp := h.provisionN(t, cpuNeed, 10)
	if pd := profileDemand(resp, "cpu"); o.Outcome != shared.OutcomeRequested || pd.Requested != 2 {
		t.Errorf("after the others ended: %+v %+v; want the 2 machines of room asked for", o, pd)
	}
}

// limitsRead waits for the poller's reads at start beside adoption (the
// limits and log_dir), which the tests then count from.
func (h *harness) limitsRead(t *testing.T) {
	t.Helper()
	select {
	case <-h.p.poll.startReads:
	case <-time.After(10 * time.Second):
		t.Fatal("the reads at start (limits, log_dir) were not over in 10 s")
	}
}
