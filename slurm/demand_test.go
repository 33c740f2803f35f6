package slurm

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
)

// TestBurstWithinCaps: 200 machines wanted of one profile, with
// max_pending 64, is one sbatch of a 64-task array, each task with its own
// worker and credential; the same demand again asks for nothing while the
// burst is pending; the cap is named in the answer.
func TestBurstWithinCaps(t *testing.T) {
	h := newHarness(t, "sbatch=ok,squeue=rows,scancel=ok", nil)
	o, resp := h.provisionN(t, cpuNeed, 200)
	if o.Outcome != shared.OutcomeRequested || !strings.Contains(o.Detail, "max_pending 64") {
		t.Errorf("200 wanted: %+v; want requested, with the cap named", o)
	}
	if pd := profileDemand(resp, "cpu"); pd.Requested != 64 || pd.Submissions != 1 || pd.Wanted != 200 {
		t.Errorf("cpu: %+v, want 64 requested of 200 in 1 submission", pd)
	}
	h.submitted(t)
	sb := h.fake.callsTo("sbatch")
	if len(sb) != 1 {
		t.Fatalf("%d sbatch calls for a burst, want 1", len(sb))
	}
	script := sb[0].Stdin
	if !strings.Contains(script, "#SBATCH --array=0-63\n") {
		t.Errorf("the script asks for no array of 64:\n%.400s", script)
	}
	minted := h.host.Minted()
	names := map[string]bool{}
	for _, m := range minted {
		names[m.Worker] = true
	}
	if len(minted) != 64 || len(names) != 64 {
		t.Errorf("%d credentials for %d names, want 64 for 64", len(minted), len(names))
	}
	// Each task's exec line carries exactly one credential: the one for
	// its own name.
	for i := range 64 {
		line := fmt.Sprintf("\n%d) %s=", i, tokenVar)
		if strings.Count(script, line) != 1 {
			t.Fatalf("task %d has no exec line of its own", i)
		}
	}
	evs := waitEvents(t, h.host, 64)
	for _, ev := range evs {
		if ev.Kind != shared.EventWorkerProvisioned || !strings.HasPrefix(ev.Job, "4242_") {
			t.Fatalf("event %+v, want worker_provisioned for a task of 4242", ev)
		}
	}
	// Pending, the burst fills the cap: the same demand asks for nothing.
	o, resp = h.provisionN(t, cpuNeed, 200)
	if o.Outcome != shared.OutcomeCapped || o.Condition != shared.ConditionCap || profileDemand(resp, "cpu").Requested != 0 || len(h.fake.callsTo("sbatch")) != 1 {
		t.Errorf("the same demand again: %+v %+v", o, resp.Profiles)
	}
}

// TestMinWorkersKeptWarm: with nothing wanted, a profile with
// min_workers 2 asks for two machines, in one submission.
func TestMinWorkersKeptWarm(t *testing.T) {
	h := newHarness(t, "sbatch=ok", func(c map[string]any) {
		c["profile"].([]any)[1].(map[string]any)["min_workers"] = 2
	})
	resp, err := h.p.Provision(context.Background(), &shared.ProvisionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if pd := profileDemand(resp, "cpu"); pd.Wanted != 2 || pd.Requested != 2 || pd.Submissions != 1 {
		t.Errorf("cpu with min_workers 2 and no demand: %+v", pd)
	}
	h.submitted(t)
	if n := len(h.fake.callsTo("sbatch")); n != 1 {
		t.Errorf("%d sbatch calls, want 1", n)
	}
}

// TestArrayTasksFailingAtOnce: every task of a burst fails before its
// worker attaches, and one poll notices each of them, with an event per
// machine; the profile's backoff counts the poll once, not once per task.
func TestArrayTasksFailingAtOnce(t *testing.T) {
	h := newHarness(t, "sbatch=ok,squeue=rows,scancel=ok", nil)
	h.provisionN(t, cpuNeed, 3)
	h.submitted(t)
	evs := waitEvents(t, h.host, 3)
	var rows []string
	for _, ev := range evs {
		rows = append(rows, ev.Job+"|FAILED|NonZeroExitCode|2026-12-02T10:00:00|"+tagOf(strings.TrimSuffix(ev.Worker, ev.Worker[strings.LastIndexByte(ev.Worker, '-'):])))
	}
	h.fake.setRows(t, rows...)
	h.p.poll.once(context.Background())
	failed := 0
	for _, ev := range h.host.Events() {
		if ev.Kind == shared.EventWorkerProvisionFailed && strings.Contains(ev.Detail, "ended FAILED") {
			failed++
		}
	}
	if failed != 3 {
		t.Errorf("%d worker_provision_failed after one poll, want one per task (3): %v", failed, kinds(h.host.Events()))
	}
	st := h.status(t)
	if len(st.Outstanding) != 0 || len(st.BackingOff) != 1 || st.BackingOff[0].Failures != 1 {
		t.Errorf("after the poll: outstanding %v, backing off %+v; want none, and one failure counted", st.Outstanding, st.BackingOff)
	}
}

// TestNoArrays: a cluster whose sbatch refuses --array gets one job per
// machine from the first refusal on, and Status says so; one whose
// MaxArraySize is 0 never gets an array at all.
func TestNoArrays(t *testing.T) {
	for _, tc := range []struct{ name, spec string }{
		{"refused", "sbatch=noarray,squeue=rows,scancel=ok"},
		{"MaxArraySize 0", "sbatch=noarray,scontrol=noarrays,squeue=rows,scancel=ok"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.spec, nil)
			h.provisionN(t, cpuNeed, 3)
			h.submitted(t)
			evs := waitEvents(t, h.host, 3)
			for _, ev := range evs {
				if ev.Kind != shared.EventWorkerProvisioned || strings.Contains(ev.Job, "_") {
					t.Errorf("event %+v; want worker_provisioned for a job of its own", ev)
				}
			}
			accepted := 0
			for _, c := range h.fake.callsTo("sbatch") {
				if !strings.Contains(c.Stdin, "#SBATCH --array=") {
					accepted++
				}
			}
			if accepted != 3 {
				t.Errorf("%d single-job sbatch calls, want 3", accepted)
			}
			if st := h.status(t); len(st.Notes) != 1 || !strings.Contains(st.Notes[0], "one job per machine") {
				t.Errorf("notes %q", st.Notes)
			}
		})
	}
}

// TestWaitingDetailIsSteady: while a machine waits in the queue, the same
// demand gets the same answer, word for word, however much time passes.
// The engine logs an answer when it differs from the last one; an age in
// the detail made that a log line per need per second.
func TestWaitingDetailIsSteady(t *testing.T) {
	h := newHarness(t, "sbatch=ok,squeue=rows,scancel=ok", nil)
	h.provisionN(t, cpuNeed, 1)
	h.submitted(t)
	first, _ := h.provisionN(t, cpuNeed, 1)
	if first.Outcome != shared.OutcomeOutstanding || !strings.Contains(first.Detail, "has not attached") {
		t.Fatalf("the same demand again: %+v; want outstanding, waiting to attach", first)
	}
	h.clock.Advance(47 * time.Second)
	again, _ := h.provisionN(t, cpuNeed, 1)
	if *again != *first {
		t.Errorf("47 s later the answer changed without anything happening:\n  %+v\n  %+v", first, again)
	}
}

// TestLogDirMadeOnce: log_dir is made at Configure, beside adoption, so
// that a first burst pays only its sbatch; the first submissions of two
// profiles, made at once, make no log_dir of their own.
func TestLogDirMadeOnce(t *testing.T) {
	h := newUnconfigured(t, "sbatch=ok,squeue=rows,scancel=ok")
	h.configure(t, nil)
	if n := mkdirCalls(h); n != 1 {
		t.Fatalf("%d calls making log_dir at Configure, want 1", n)
	}
	h.wants.Set(gpuNeed, 3)
	h.provisionN(t, cpuNeed, 3)
	h.submitted(t)
	if n, mkdirs := len(h.fake.callsTo("sbatch")), mkdirCalls(h); n != 2 || mkdirs != 1 {
		t.Errorf("%d sbatch calls and %d calls making log_dir in all; want 2 and 1", n, mkdirs)
	}
}

// TestLogDirMadeOnceAfterStartFailed: when making log_dir at Configure
// failed, the first submissions of two profiles, made at once, make it
// with one ssh call between them, not one each: a burst of a thousand
// first submissions would otherwise be a thousand more calls on the
// login node, and submissions timed out waiting for a session.
func TestLogDirMadeOnceAfterStartFailed(t *testing.T) {
	h := newHarness(t, "sbatch=ok,squeue=rows,scancel=ok,sh=fail", nil)
	h.fake.setSpec(t, "sbatch=ok,squeue=rows,scancel=ok")
	h.wants.Set(gpuNeed, 3)
	h.provisionN(t, cpuNeed, 3)
	h.submitted(t)
	if n, mkdirs := len(h.fake.callsTo("sbatch")), mkdirCalls(h); n != 2 || mkdirs != 1 {
		t.Errorf("%d sbatch calls and %d calls making log_dir after Configure's failed; want 2 and 1", n, mkdirs)
	}
}

func mkdirCalls(h *harness) int {
	n := 0
	for _, c := range h.fake.callsTo("sh") {
		if strings.Contains(strings.Join(c.remote(), " "), "mkdir -p") {
			n++
		}
	}
	return n
}

// TestStartReadsBesideAdoption: the limits and log_dir are read at
// Configure beside adoption's squeue, not after it, so a first burst
// waits for one round trip of the three, not three in a row.
func TestStartReadsBesideAdoption(t *testing.T) {
	h := newUnconfigured(t, "sbatch=ok,squeue=gate,sacctmgr=ok")
	cfg := baseConfig()
	if _, err := h.p.Configure(context.Background(), &shared.ConfigureRequest{Name: "hpc", Config: mustJSON(t, cfg), Host: h.host}); err != nil {
		t.Fatal(err)
	}
	// Adoption's squeue is held at the gate; the other reads finish.
	h.limitsRead(t)
	select {
	case <-h.p.poll.adoptTried:
		t.Fatal("adoption was over with its squeue held at the gate")
	default:
	}
	if n, s := mkdirCalls(h), len(h.fake.callsTo("sacctmgr")); n != 1 || s != 1 {
		t.Errorf("with adoption's squeue held, %d calls made log_dir and %d read the limits; want 1 and 1", n, s)
	}
	h.fake.openGate(t)
	<-h.p.poll.adoptTried
}
