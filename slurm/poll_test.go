package slurm

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/internal/queue"
	"github.com/fluksio/provision/slurm/sbatch"
)

// manyProfiles replaces the profiles with n of one CPU each, p000 and up.
func manyProfiles(n int) func(map[string]any) {
	return func(c map[string]any) {
		var ps []any
		for i := range n {
			ps = append(ps, map[string]any{"name": fmt.Sprintf("p%03d", i), "cpus": 1, "gpus": 0, "ram_mb": 0, "labels": nil, "sbatch": nil, "prerun": nil})
		}
		c["profile"] = ps
	}
}

// addJob makes a request for the profile outstanding with a job, as if
// its submission had finished, and returns its worker.
func (h *harness) addJob(profile, job string) string {
	n, _ := strconv.Atoi(job)
	w := fmt.Sprintf("hpc-%s-%08x", profile, n)
	r := &request{profile: profile, worker: w, tag: w, task: -1, batch: 1, since: h.clock.Now(),
		cancel: func() {}, done: closedDone, job: job, phase: phaseQueued}
	h.p.mu.Lock()
	h.p.outstanding[w] = r
	h.p.mu.Unlock()
	return r.worker
}

// submitted waits until no submission is in flight.
func (h *harness) submitted(t *testing.T) {
	t.Helper()
	eventually(t, "the submissions to finish", func() bool {
		h.p.mu.Lock()
		defer h.p.mu.Unlock()
		return len(h.p.sub.inflight) == 0
	})
}

// provisioned asks for a cpu machine and waits for its job.
func (h *harness) provisioned(t *testing.T) shared.Event {
	t.Helper()
	n := len(h.host.Events())
	if r := h.provision(t, cpuNeed); r.Outcome != shared.OutcomeRequested {
		t.Fatalf("Provision = %+v", r)
	}
	ev := waitEvents(t, h.host, n+1)[n]
	if ev.Kind != shared.EventWorkerProvisioned {
		t.Fatalf("event = %+v", ev)
	}
	h.submitted(t)
	return ev
}

func (h *harness) calls() int64 { return h.p.q.Calls() - h.callsBefore }

func (h *harness) outstanding(t *testing.T) map[string]shared.Outstanding {
	t.Helper()
	m := map[string]shared.Outstanding{}
	for _, o := range h.status(t).Outstanding {
		m[o.Profile] = o
	}
	return m
}

// pollArgv is the poll's squeue: no --me, which costs an RPC; squeue
// prints each job's user instead (queue.Jobs).
var pollArgv = []string{"squeue", "-h", "-r", "-t", "all", "--name=fluksio-hpc", "-o", "'%i|%T|%r|%S|%k|%u'"}

func TestPollOneQueryPerCycle(t *testing.T) {
	for _, n := range []int{1, 10, 100} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			h := newHarness(t, "squeue=rows", manyProfiles(n))
			ctx := context.Background()

			// Nothing outstanding: a cycle costs nothing.
			h.p.poll.once(ctx)
			if c := h.calls(); c != 0 {
				t.Fatalf("%d Slurm calls with nothing outstanding", c)
			}

			var rows []string
			for i := range n {
				job := strconv.Itoa(1000 + i)
				worker := h.addJob(fmt.Sprintf("p%03d", i), job)
				rows = append(rows, job+"|PENDING|Priority|N/A|"+tagOf(worker))
			}
			h.fake.setRows(t, rows...)
			for cycle := 1; cycle <= 3; cycle++ {
				before := h.calls()
				h.p.poll.once(ctx)
				if d := h.calls() - before; d != 1 {
					t.Fatalf("cycle %d: %d Slurm calls for %d outstanding, want 1", cycle, d, n)
				}
			}
			squeues := h.fake.callsTo("squeue")
			if len(squeues) != 3 || len(h.fake.calls()) != 3 {
				t.Fatalf("%d squeue calls of %d", len(squeues), len(h.fake.calls()))
			}
			if got := squeues[0].remote(); !slices.Equal(got, pollArgv) {
				t.Errorf("squeue = %q, want %q", got, pollArgv)
			}
			st := h.status(t)
			if len(st.Outstanding) != n {
				t.Fatalf("%d outstanding, want %d", len(st.Outstanding), n)
			}
			for _, o := range st.Outstanding {
				if o.State != "PENDING" {
					t.Errorf("%s: state %q", o.Profile, o.State)
				}
			}
		})
	}
}

func TestPollSkipsSubmissionsInFlight(t *testing.T) {
	h := newHarness(t, "sbatch=gate,squeue=rows", nil)
	h.provision(t, cpuNeed)
	eventually(t, "the sbatch call", func() bool { return len(h.fake.callsTo("sbatch")) == 1 })
	before := h.calls()
	h.p.poll.once(context.Background())
	if d := h.calls() - before; d != 0 {
		t.Errorf("%d Slurm calls with only a submission in flight", d)
	}
	h.fake.openGate(t)
	waitEvents(t, h.host, 1)
}

// TestPoller runs the real poller: it reads the queue while something is
// outstanding or attached, and has nothing to do once nothing is.
func TestPoller(t *testing.T) {
	h := newHarness(t, "sbatch=gate,squeue=rows", func(c map[string]any) { c["poll_interval"] = "20ms" })
	if h.p.poll.wanted() {
		t.Fatal("the poller wants to run with nothing outstanding and nothing to adopt")
	}
	h.provision(t, cpuNeed)
	eventually(t, "the sbatch call", func() bool { return len(h.fake.callsTo("sbatch")) == 1 })
	worker := h.status(t).Outstanding[0].Worker
	h.fake.setRows(t, "4242|RUNNING|None|2026-12-02T10:00:01|"+tagOf(worker))
	h.fake.openGate(t)
	eventually(t, "the poller to see the job running", func() bool { return h.outstanding(t)["cpu"].State == "RUNNING" })

	if _, err := h.p.Reconcile(context.Background(), &shared.ReconcileRequest{Attached: []string{worker}}); err != nil {
		t.Fatal(err)
	}
	// It reads the attached worker's job (ends.go), until the worker
	// has left and the queue shows its job ended.
	if !h.p.poll.wanted() {
		t.Error("the poller rests while a worker is attached")
	}
	h.fake.setRows(t, "4242|COMPLETED|None|2026-12-02T10:00:01|"+tagOf(worker))
	if _, err := h.p.Reconcile(context.Background(), &shared.ReconcileRequest{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the poller to rest once the job ended", func() bool { return !h.p.poll.wanted() })
	for _, c := range h.fake.callsTo("squeue") {
		if !slices.Equal(c.remote(), pollArgv) {
			t.Errorf("squeue = %q", c.remote())
		}
	}
}

func TestPollForgetsEndedJob(t *testing.T) {
	tests := []struct {
		row       string // state|reason|start, or "" for a job squeue no longer lists
		detail    string
		explained bool
	}{
		{"FAILED|NonZeroExitCode|2026-12-02T10:00:01", "job 4242 ended FAILED (NonZeroExitCode) before its worker attached", true},
		{"TIMEOUT|TimeLimit|2026-12-02T10:00:01", "job 4242 ended TIMEOUT (TimeLimit) before its worker attached", true},
		{"CANCELLED|None|2026-12-02T10:00:01", "job 4242 ended CANCELLED before its worker attached", false},
		{"DEADLINE|DeadLine|N/A", "job 4242 ended DEADLINE (DeadLine) before its worker attached", false},
		{"COMPLETED|None|2026-12-02T10:00:01", "job 4242 ended COMPLETED before its worker attached", true},
		{"", "job 4242 left the queue before its worker attached", true},
	}
	for _, tc := range tests {
		t.Run(tc.detail, func(t *testing.T) {
			h := newHarness(t, "sbatch=ok,squeue=rows", nil)
			ev := h.provisioned(t)
			if tc.row != "" {
				h.fake.setRows(t, "4242|"+tc.row+"|"+tagOf(ev.Worker))
			}
			h.p.poll.once(context.Background())

			evs := waitEvents(t, h.host, 2)
			want := tc.detail
			if tc.explained {
				// The cluster's answer to why (the fake's, in
				// main_test.go), escape sequences taken out.
				want += ": exit code 2, reason NonZeroExitCode, output /home/alice/.local/state/fluksio/hpc/4242.out," +
					" its last lines: loading modules | /usr/bin/env: 'fluksio-worker': No such file or directory"
			}
			if got := evs[1]; got.Kind != shared.EventWorkerProvisionFailed || got.Job != "4242" || got.Worker != ev.Worker || got.Detail != want {
				t.Errorf("event = %+v, want failed with %q", got, want)
			}
			st := h.status(t)
			if len(st.Outstanding) != 0 || st.LastError != want {
				t.Errorf("Status = %+v", st)
			}
			if n := len(h.fake.callsTo("sh")); n != map[bool]int{true: 1}[tc.explained] {
				t.Errorf("%d shell calls, want (log_dir being made at Configure) one to ask why for a job that ran, none else", n)
			}
			if len(st.BackingOff) != 1 || st.BackingOff[0].Failures != 1 {
				t.Errorf("BackingOff = %+v", st.BackingOff)
			}
			if n := len(h.fake.callsTo("scancel")); n != 0 {
				t.Errorf("%d scancel calls for a job that has ended", n)
			}
			// Asked for again once the backoff is over.
			h.clock.Advance(backoffBase)
			if r := h.provision(t, cpuNeed); r.Outcome != shared.OutcomeRequested {
				t.Errorf("Provision = %+v", r)
			}
		})
	}
}

func TestPollKeepsRunningAndPendingJobs(t *testing.T) {
	h := newHarness(t, "sbatch=ok,squeue=rows", nil)
	ev := h.provisioned(t)
	ctx := context.Background()
	for _, row := range []string{"PENDING|Priority|N/A", "PENDING|Resources|2026-12-02T11:00:00", "PENDING|BeginTime|2026-12-02T11:00:00", "CONFIGURING|None|2026-12-02T10:00:01"} {
		h.fake.setRows(t, "4242|"+row+"|"+tagOf(ev.Worker))
		h.p.poll.once(ctx)
		state, rest, _ := strings.Cut(row, "|")
		if o := h.outstanding(t)["cpu"]; o.Job != "4242" || o.State != state {
			t.Errorf("%s: outstanding = %+v", row, o)
		}
		// The waiting need says why Slurm holds its job, in Slurm's word,
		// and so does Status (contract 2.6).
		reason, _, _ := strings.Cut(rest, "|")
		if o := h.outstanding(t)["cpu"]; state == "PENDING" && o.Reason != reason || state != "PENDING" && o.Reason != "" {
			t.Errorf("%s: Status says the reason is %q", row, o.Reason)
		}
		want := strings.ToLower(state)
		if reason != "None" {
			want += ", held by Slurm for " + reason
		}
		if o := h.provision(t, cpuNeed); !strings.Contains(o.Detail, "is "+want+" and its worker has not attached") {
			t.Errorf("%s: the need is told %q; want it to say %q", row, o.Detail, want)
		}
	}
	h.p.mu.Lock()
	running := h.p.requestOf("cpu").running
	h.p.mu.Unlock()
	if !running.IsZero() {
		t.Errorf("running since %s before the job ran", running)
	}
	h.clock.Advance(time.Minute)
	h.fake.setRows(t, "4242|RUNNING|None|2026-12-02T10:01:00|"+tagOf(ev.Worker))
	h.p.poll.once(ctx)
	h.clock.Advance(time.Minute)
	h.p.poll.once(ctx)
	h.p.mu.Lock()
	running = h.p.requestOf("cpu").running
	h.p.mu.Unlock()
	if want := h.clock.Now().Add(-time.Minute); !running.Equal(want) {
		t.Errorf("running since %s, want %s (the first cycle that saw it)", running, want)
	}
	if got := kinds(h.host.Events()); len(got) != 1 {
		t.Errorf("events = %v", got)
	}
}

func TestPollCancelsJobThatCanNeverStart(t *testing.T) {
	h := newHarness(t, "sbatch=ok,squeue=rows,scancel=ok", nil)
	ev := h.provisioned(t)
	h.fake.setRows(t, "4242|PENDING|PartitionConfig|N/A|"+tagOf(ev.Worker))
	h.p.poll.once(context.Background())

	scancels := h.fake.callsTo("scancel")
	if len(scancels) != 1 || !slices.Equal(scancels[0].remote(), []string{"scancel", "4242"}) {
		t.Fatalf("scancel calls = %+v", scancels)
	}
	evs := waitEvents(t, h.host, 2)
	if got := evs[1]; got.Kind != shared.EventWorkerCancelled || got.Job != "4242" || !strings.Contains(got.Detail, "PartitionConfig") {
		t.Errorf("event = %+v", got)
	}
	st := h.status(t)
	if len(st.Outstanding) != 0 || !strings.Contains(st.LastError, "PartitionConfig") || len(st.BackingOff) != 1 {
		t.Errorf("Status = %+v", st)
	}
}

func TestReasonNeverClears(t *testing.T) {
	never := []string{"PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints", "InvalidAccount", "InvalidQOS",
		"QOSMaxWallDurationPerJobLimit", "QOSMaxCpuPerJobLimit", "QOSMaxGRESPerNode", "AssocMaxCpuPerJobLimit", "AssocMaxMemPerJob",
		"QOSMinCpuNotSatisfied", "DependencyNeverSatisfied", "AccountNotAllowed"}
	clears := []string{"Priority", "Resources", "Dependency", "BeginTime", "None", "JobHeldUser", "JobHeldAdmin", "ReqNodeNotAvail",
		"PartitionDown", "QOSMaxJobsPerUserLimit", "QOSMaxSubmitJobPerUserLimit", "AssocMaxJobsLimit", "AssocGrpCpuLimit", "QOSGrpNodeLimit",
		"MaxJobsPerAccount", "Licenses", "Reservation", ""}
	for _, r := range never {
		if !reasonNeverClears(r) {
			t.Errorf("%s: clears, want never", r)
		}
	}
	for _, r := range clears {
		if reasonNeverClears(r) {
			t.Errorf("%s: never clears, want it to", r)
		}
	}
}

func TestPollFailureKeepsEverything(t *testing.T) {
	h := newHarness(t, "sbatch=ok,squeue=fail", nil)
	ctx := context.Background()
	h.provision(t, cpuNeed)
	h.provision(t, gpuNeed)
	waitEvents(t, h.host, 2)
	h.submitted(t)
	warnings := func() int { return strings.Count(h.logs.String(), "[WARN]  cannot read the queue") }

	for range 3 {
		h.p.poll.once(ctx)
	}
	h.fake.setSpec(t, "squeue=drop")
	h.p.poll.once(ctx)
	st := h.status(t)
	if len(st.Outstanding) != 2 || !strings.Contains(st.LastError, "closed by remote host") {
		t.Fatalf("Status = %+v", st)
	}
	if n := warnings(); n != 1 {
		t.Errorf("%d warnings for one outage:\n%s", n, h.logs.String())
	}
	if n := len(h.host.Events()); n != 2 {
		t.Errorf("%d events", n)
	}

	// It works again: quietly.
	var rows []string
	for _, o := range st.Outstanding {
		rows = append(rows, o.Job+"|RUNNING|None|2026-12-02T10:00:01|"+tagOf(o.Worker))
	}
	h.fake.setSpec(t, "squeue=rows")
	h.fake.setRows(t, rows...)
	h.p.poll.once(ctx)
	for p, o := range h.outstanding(t) {
		if o.State != "RUNNING" {
			t.Errorf("%s: %+v", p, o)
		}
	}
	if n := warnings(); n != 1 {
		t.Errorf("%d warnings after recovering", n)
	}
	// A new outage is a new warning.
	h.fake.setSpec(t, "squeue=fail")
	h.p.poll.once(ctx)
	if n := warnings(); n != 2 {
		t.Errorf("%d warnings after a second outage", n)
	}
	if st := h.status(t); len(st.Outstanding) != 2 || !strings.Contains(st.LastError, "Unable to contact slurm controller") {
		t.Errorf("Status = %+v", st)
	}
}

func TestAttachTimeout(t *testing.T) {
	ctx := context.Background()
	reconcile := func(t *testing.T, h *harness) *shared.ReconcileResponse {
		t.Helper()
		resp, err := h.p.Reconcile(ctx, &shared.ReconcileRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	setState := func(t *testing.T, h *harness, worker, state string) {
		t.Helper()
		h.fake.setRows(t, "4242|"+state+"|None|N/A|"+tagOf(worker))
		h.p.poll.once(ctx)
	}

	// provision_timeout 15m, attach_timeout 10m.
	t.Run("queued is not stuck", func(t *testing.T) {
		h := newHarness(t, "sbatch=ok,squeue=rows,scancel=ok", nil)
		ev := h.provisioned(t)
		setState(t, h, ev.Worker, "PENDING")
		h.clock.Advance(12 * time.Minute)
		setState(t, h, ev.Worker, "PENDING")
		if resp := reconcile(t, h); len(resp.Expired) != 0 {
			t.Fatalf("a queued job expired after 12m: %+v", resp)
		}
		h.clock.Advance(3*time.Minute + time.Second)
		if resp := reconcile(t, h); !slices.Equal(resp.Expired, []string{"4242"}) {
			t.Fatalf("Reconcile after provision_timeout = %+v", resp)
		}
		if last := waitEvents(t, h.host, 2)[1]; last.Kind != shared.EventWorkerCancelled || last.Detail != "did not attach within 15m0s" {
			t.Errorf("event = %+v", last)
		}
	})

	t.Run("running without attaching", func(t *testing.T) {
		h := newHarness(t, "sbatch=ok,squeue=rows,scancel=ok", nil)
		ev := h.provisioned(t)
		h.clock.Advance(4 * time.Minute)
		setState(t, h, ev.Worker, "RUNNING")
		h.clock.Advance(10 * time.Minute)
		if resp := reconcile(t, h); len(resp.Expired) != 0 {
			t.Fatalf("expired at exactly attach_timeout: %+v", resp)
		}
		h.clock.Advance(time.Second)
		if resp := reconcile(t, h); !slices.Equal(resp.Expired, []string{"4242"}) {
			t.Fatalf("Reconcile after attach_timeout = %+v", resp)
		}
		last := waitEvents(t, h.host, 2)[1]
		if last.Kind != shared.EventWorkerCancelled || !strings.Contains(last.Detail, "attach_timeout 10m0s") {
			t.Errorf("event = %+v", last)
		}
		if st := h.status(t); len(st.BackingOff) != 1 {
			t.Errorf("BackingOff = %+v; a job that ran and never attached counts as a failure", st.BackingOff)
		}
	})

	t.Run("provision_timeout bounds a late start", func(t *testing.T) {
		h := newHarness(t, "sbatch=ok,squeue=rows,scancel=ok", nil)
		ev := h.provisioned(t)
		h.clock.Advance(14 * time.Minute)
		setState(t, h, ev.Worker, "RUNNING")
		h.clock.Advance(time.Minute + time.Second)
		if resp := reconcile(t, h); !slices.Equal(resp.Expired, []string{"4242"}) {
			t.Fatalf("Reconcile = %+v", resp)
		}
		if last := waitEvents(t, h.host, 2)[1]; last.Detail != "did not attach within 15m0s" {
			t.Errorf("event = %+v", last)
		}
	})
}

func TestBackoff(t *testing.T) {
	h := newHarness(t, "sbatch=busy", nil)
	const said = "Resource temporarily unavailable"
	delays := []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 40 * time.Second, 80 * time.Second, 160 * time.Second, 5 * time.Minute, 5 * time.Minute}
	for i, d := range delays {
		if r := h.provision(t, cpuNeed); r.Outcome != shared.OutcomeRequested {
			t.Fatalf("failure %d: Provision = %+v", i+1, r)
		}
		waitEvents(t, h.host, i+1)
		h.submitted(t)
		until := h.clock.Now().Add(d)
		st := h.status(t)
		if len(st.BackingOff) != 1 || st.BackingOff[0].Profile != "cpu" || st.BackingOff[0].Failures != i+1 ||
			!st.BackingOff[0].Until.Equal(until) || !strings.Contains(st.BackingOff[0].LastError, said) {
			t.Fatalf("failure %d: BackingOff = %+v, want until %s", i+1, st.BackingOff, until)
		}
		calls := h.calls()
		for _, at := range []time.Duration{0, d - time.Second} {
			h.clock.Advance(at)
			r := h.provision(t, cpuNeed)
			if r.Outcome != shared.OutcomeBackingOff || r.Condition != shared.ConditionBackingOff || r.Profile != "cpu" || !strings.Contains(r.Detail, until.Format(time.RFC3339)) || !strings.Contains(r.Detail, said) {
				t.Fatalf("failure %d, %s later: Provision = %+v", i+1, at, r)
			}
		}
		if h.calls() != calls {
			t.Fatalf("Provision during backoff ran %d Slurm calls", h.calls()-calls)
		}
		h.clock.Advance(time.Second)
		if st := h.status(t); len(st.BackingOff) != 0 {
			t.Fatalf("BackingOff after the wait = %+v", st.BackingOff)
		}
	}
	// Other profiles are not held back. (The cpu machine is not wanted
	// meanwhile, or this demand would ask for it too.)
	h.wants.Set(cpuNeed, 0)
	if r := h.provision(t, gpuNeed); r.Outcome != shared.OutcomeRequested {
		t.Errorf("gpu: %+v", r)
	}
	waitEvents(t, h.host, len(delays)+1)
	h.submitted(t)

	// A worker attaching resets the count.
	h.fake.setSpec(t, "sbatch=ok")
	ev := h.provisioned(t)
	if _, err := h.p.Reconcile(context.Background(), &shared.ReconcileRequest{Attached: []string{ev.Worker}}); err != nil {
		t.Fatal(err)
	}
	h.fake.setSpec(t, "sbatch=busy")
	n := len(h.host.Events())
	h.provision(t, cpuNeed)
	waitEvents(t, h.host, n+1)
	h.submitted(t)
	if st := h.status(t); len(st.BackingOff) != 2 || st.BackingOff[0].Failures != 1 || !st.BackingOff[0].Until.Equal(h.clock.Now().Add(backoffBase)) {
		t.Errorf("BackingOff after a worker attached and a new failure = %+v", st.BackingOff)
	}
}

// TestMisconfiguredProfile: a refusal for good holds the profile back for
// misconfiguredHold after one attempt, says so with Slurm's words, runs no
// Slurm command while it lasts, and tries once more after it.
func TestMisconfiguredProfile(t *testing.T) {
	h := newHarness(t, "sbatch=fail", nil)
	const said = "Invalid partition name specified"
	h.provision(t, cpuNeed)
	waitEvents(t, h.host, 1)
	h.submitted(t)
	st := h.status(t)
	if len(st.BackingOff) != 1 || !st.BackingOff[0].Until.Equal(h.clock.Now().Add(misconfiguredHold)) {
		t.Fatalf("BackingOff = %+v, want cpu held for %s", st.BackingOff, misconfiguredHold)
	}
	if len(st.Notes) != 1 || !strings.Contains(st.Notes[0], "profile cpu is misconfigured") || !strings.Contains(st.Notes[0], said) {
		t.Errorf("Notes = %q, want cpu misconfigured with Slurm's words", st.Notes)
	}
	if !strings.Contains(h.logs.String(), "[ERROR] profile misconfigured; Slurm refused it for good") {
		t.Errorf("no loud log line:\n%s", h.logs.String())
	}
	calls := h.calls()
	h.clock.Advance(misconfiguredHold - time.Second)
	if r := h.provision(t, cpuNeed); r.Outcome != shared.OutcomeBackingOff || !strings.Contains(r.Detail, "misconfigured") || !strings.Contains(r.Detail, said) {
		t.Errorf("just before the hold ends: Provision = %+v", r)
	}
	if h.calls() != calls {
		t.Errorf("%d Slurm calls while the profile was held back", h.calls()-calls)
	}
	h.clock.Advance(time.Second)
	if r := h.provision(t, cpuNeed); r.Outcome != shared.OutcomeRequested {
		t.Errorf("after the hold: Provision = %+v, want requested", r)
	}
	waitEvents(t, h.host, 2)
}

func TestBackoffDelay(t *testing.T) {
	var got []time.Duration
	for n := 1; n <= 8; n++ {
		got = append(got, backoffDelay(n))
	}
	want := []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 40 * time.Second, 80 * time.Second, 160 * time.Second, 5 * time.Minute, 5 * time.Minute}
	if !slices.Equal(got, want) {
		t.Errorf("delays = %v, want %v", got, want)
	}
	if d := backoffDelay(1000); d != backoffMax {
		t.Errorf("delay after 1000 failures = %s", d)
	}
}

var lookupArgv = []string{"squeue", "-h", "--name=fluksio-hpc", "-o", "'%i|%k|%u'"}

func TestLostAnswerFoundInQueue(t *testing.T) {
	// A hung sbatch is cut off at three quarters of submit_timeout; the
	// look for its job has the last quarter, 2 s here, which a loaded
	// machine's fake ssh (a -race test binary) needs.
	for _, tc := range []struct{ name, sbatch, timeout string }{
		{"timed out", "hang", "8s"},
		{"connection dropped", "drop", "30s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, "sbatch="+tc.sbatch+",squeue=list", func(c map[string]any) { c["submit_timeout"] = tc.timeout })
			h.provision(t, cpuNeed)
			ev := waitEvents(t, h.host, 1)[0]
			if ev.Kind != shared.EventWorkerProvisioned || ev.Job != "9001" {
				t.Fatalf("event = %+v", ev)
			}
			h.submitted(t)
			if n := len(h.fake.callsTo("sbatch")); n != 1 {
				t.Errorf("%d sbatch calls", n)
			}
			squeues := h.fake.callsTo("squeue")
			if len(squeues) != 1 || !slices.Equal(squeues[0].remote(), lookupArgv) {
				t.Fatalf("squeue calls = %+v", squeues)
			}
			if o := h.outstanding(t)["cpu"]; o.Job != "9001" || o.Worker != ev.Worker {
				t.Errorf("outstanding = %+v", o)
			}
			if r := h.provision(t, cpuNeed); r.Outcome != shared.OutcomeOutstanding {
				t.Errorf("second Provision = %+v", r)
			}
			if n := len(h.fake.callsTo("sbatch")); n != 1 {
				t.Errorf("%d sbatch calls: a duplicate", n)
			}
			if !strings.Contains(h.logs.String(), "sbatch's answer was lost, but its job is in the queue") {
				t.Errorf("no warning:\n%s", h.logs.String())
			}
			assertTokenHidden(t, h, tokenFor(ev.Worker))
		})
	}
}

// TestLostAnswerNotInQueue: a submission whose answer was lost and whose
// job the queue does not have yet is not "not submitted" until it can no
// longer land (landing.go): it stays outstanding, UNKNOWN, and the
// profile is not asked for twice; the poller's look after that says it
// was not submitted, and only then.
func TestLostAnswerNotInQueue(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, "sbatch=drop,squeue=ok", nil)
	h.provision(t, cpuNeed)
	h.submitted(t)
	if n := len(h.fake.callsTo("squeue")); n != 1 {
		t.Errorf("%d squeue calls", n)
	}
	o := h.outstanding(t)["cpu"]
	if o.State != "UNKNOWN" || o.Job != "" || len(h.host.Events()) != 0 {
		t.Fatalf("outstanding = %+v, events %+v; want it UNKNOWN and nothing said yet", o, h.host.Events())
	}
	if st := h.status(t); !strings.Contains(st.LastError, "closed by remote host") || !strings.Contains(st.LastError, "until it can no longer land") {
		t.Errorf("LastError = %q", st.LastError)
	}
	if r := h.provision(t, cpuNeed); r.Outcome != shared.OutcomeOutstanding {
		t.Errorf("Provision while it may land = %+v", r)
	}
	// Within the window a queue without it proves nothing.
	h.clock.Advance(landingWindow)
	h.p.poll.once(ctx)
	if n := len(h.host.Events()); n != 0 {
		t.Fatalf("said %+v before it could no longer land", h.host.Events())
	}
	// submit_timeout's 30 s bound the sbatch on the login node.
	h.clock.Advance(30 * time.Second)
	h.p.poll.once(ctx)
	ev := waitEvents(t, h.host, 1)[0]
	if ev.Kind != shared.EventWorkerProvisionFailed || ev.Worker != o.Worker || !strings.Contains(ev.Detail, "can no longer land: it was not submitted") || ev.Class != shared.FailureTransient {
		t.Fatalf("event = %+v", ev)
	}
	if st := h.status(t); len(st.Outstanding) != 0 {
		t.Errorf("Outstanding = %+v", st.Outstanding)
	}
	if n := len(h.fake.callsTo("sbatch")); n != 1 {
		t.Errorf("%d sbatch calls", n)
	}
}

// TestAnswerNotLost: when sbatch said no, or ssh never connected, there
// is nothing to look for.
func TestAnswerNotLost(t *testing.T) {
	for _, tc := range []struct{ sbatch, want string }{
		{"fail", "Invalid partition name specified"},
		{"refused", "Connection refused"},
	} {
		t.Run(tc.sbatch, func(t *testing.T) {
			h := newHarness(t, "sbatch="+tc.sbatch+",squeue=list", nil)
			h.provision(t, cpuNeed)
			ev := waitEvents(t, h.host, 1)[0]
			if ev.Kind != shared.EventWorkerProvisionFailed || !strings.Contains(ev.Detail, tc.want) {
				t.Errorf("event = %+v", ev)
			}
			h.submitted(t)
			if n := len(h.fake.callsTo("squeue")); n != 0 {
				t.Errorf("%d squeue calls", n)
			}
		})
	}
}

func TestAnswerLost(t *testing.T) {
	exit := func(code int) error { return exec.Command("sh", "-c", "exit "+strconv.Itoa(code)).Run() }
	wrap := func(err error) error { return fmt.Errorf("sbatch on login: %w", err) }
	tests := []struct {
		name   string
		err    error
		stderr string
		want   bool
	}{
		{"timeout", wrap(fmt.Errorf("no answer within 30s: %w", context.DeadlineExceeded)), "", true},
		{"dropped", wrap(exit(255)), "Connection to login closed by remote host.\n", true},
		{"reset", wrap(exit(255)), "client_loop: send disconnect: Broken pipe\n", true},
		{"silent 255", wrap(exit(255)), "", true},
		{"slurmctld timed out", wrap(exit(1)), "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation\n", true},
		{"refused", wrap(exit(1)), "sbatch: error: Batch job submission failed: Invalid partition name specified\n", false},
		{"bad option", wrap(exit(255)), "sbatch: error: Invalid --time specification\n", false},
		{"connection refused", wrap(exit(255)), "ssh: connect to host login port 22: Connection refused\n", false},
		{"banner timeout", wrap(exit(255)), "Connection timed out during banner exchange\nConnection to login port 22 timed out\n", false},
		{"host key", wrap(exit(255)), "Host key verification failed.\n", false},
		{"auth", wrap(exit(255)), "alice@login: Permission denied (publickey).\n", false},
		{"no ssh", wrap(&exec.Error{Name: "ssh", Err: exec.ErrNotFound}), "", false},
		{"cancelled", wrap(context.Canceled), "", false},
	}
	for _, tc := range tests {
		if got := answerLost(tc.err, []byte(tc.stderr)); got != tc.want {
			t.Errorf("%s: answerLost = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestLostAnswerLookupFails(t *testing.T) {
	ctx := context.Background()
	setup := func(t *testing.T) (*harness, string) {
		t.Helper()
		h := newHarness(t, "sbatch=drop,squeue=fail", nil)
		h.provision(t, cpuNeed)
		h.submitted(t)
		o := h.outstanding(t)["cpu"]
		if o.State != "UNKNOWN" || o.Job != "" {
			t.Fatalf("outstanding = %+v, want state UNKNOWN and no job", o)
		}
		if n := len(h.host.Events()); n != 0 {
			t.Errorf("%d events while the outcome is unknown", n)
		}
		if st := h.status(t); !strings.Contains(st.LastError, "closed by remote host") || !strings.Contains(st.LastError, "Unable to contact slurm controller") {
			t.Errorf("LastError = %q", st.LastError)
		}
		if r := h.provision(t, cpuNeed); r.Outcome != shared.OutcomeOutstanding || !strings.Contains(r.Detail, "lost") {
			t.Errorf("Provision while unknown = %+v", r)
		}
		h.p.poll.once(ctx) // still failing
		if o := h.outstanding(t)["cpu"]; o.State != "UNKNOWN" {
			t.Errorf("after a failed poll: %+v", o)
		}
		if n := len(h.fake.callsTo("sbatch")); n != 1 {
			t.Errorf("%d sbatch calls", n)
		}
		return h, o.Worker
	}

	t.Run("found later", func(t *testing.T) {
		h, worker := setup(t)
		h.fake.setSpec(t, "squeue=list")
		h.p.poll.once(ctx)
		ev := waitEvents(t, h.host, 1)[0]
		if ev.Kind != shared.EventWorkerProvisioned || ev.Job != "9001" || ev.Worker != worker {
			t.Errorf("event = %+v", ev)
		}
		if o := h.outstanding(t)["cpu"]; o.Job != "9001" || o.State != "PENDING" {
			t.Errorf("outstanding = %+v", o)
		}
	})

	t.Run("not in the queue", func(t *testing.T) {
		h, worker := setup(t)
		h.fake.setSpec(t, "squeue=rows")
		h.clock.Advance(time.Minute) // past when it could land
		h.p.poll.once(ctx)
		ev := waitEvents(t, h.host, 1)[0]
		if ev.Kind != shared.EventWorkerProvisionFailed || ev.Worker != worker || !strings.Contains(ev.Detail, "was not submitted") {
			t.Errorf("event = %+v", ev)
		}
		if st := h.status(t); len(st.Outstanding) != 0 {
			t.Errorf("Outstanding = %+v", st.Outstanding)
		}
	})

	t.Run("never found", func(t *testing.T) {
		h, worker := setup(t)
		h.clock.Advance(15 * time.Minute)
		if resp, err := h.p.Reconcile(ctx, &shared.ReconcileRequest{}); err != nil || len(resp.Expired) != 0 {
			t.Fatalf("Reconcile = %+v, %v", resp, err)
		}
		if st := h.status(t); len(st.Outstanding) != 1 {
			t.Fatalf("forgotten at exactly provision_timeout: %+v", st.Outstanding)
		}
		h.clock.Advance(time.Second)
		if _, err := h.p.Reconcile(ctx, &shared.ReconcileRequest{}); err != nil {
			t.Fatal(err)
		}
		ev := waitEvents(t, h.host, 1)[0]
		if ev.Kind != shared.EventWorkerProvisionFailed || ev.Worker != worker || !strings.Contains(ev.Detail, "15m0s") {
			t.Errorf("event = %+v", ev)
		}
		if st := h.status(t); len(st.Outstanding) != 0 {
			t.Errorf("Outstanding = %+v", st.Outstanding)
		}
	})
}

func TestAdoption(t *testing.T) {
	h := newUnconfigured(t, "squeue=rows,scancel=ok")
	h.fake.setRows(t,
		"500|PENDING|Priority|N/A|fluksio:v2:hpc:0:hpc-cpu-0000000a",
		"501|PENDING|Priority|N/A|fluksio:v2:hpc:0:hpc-cpu-0000000b",
		"499|RUNNING|None|2026-12-02T09:00:00|fluksio:v2:hpc:0:hpc-cpu-00000009",
		"503|RUNNING|None|2026-12-02T09:00:00|fluksio:v2:hpc:0:hpc-gpu-0000000d",
		"502|RUNNING|None|2026-12-02T09:00:00|fluksio:v2:hpc:0:hpc-gpu-0000000c",
		"504|PENDING|Priority|N/A|fluksio:v2:hpc:0:hpc-old-0000000e",
		"505|PENDING|Priority|N/A|(null)",
		"506|PENDING|Priority|N/A|fluksio:v2:hpc:0:other-cpu-0000000f",
		"507|COMPLETED|None|2026-12-02T09:00:00|fluksio:v2:hpc:0:hpc-cpu-00000010",
		"508|RUNNING|None|2026-12-02T09:00:00|fluksio:v2:hpc:0:hpc-old-00000011",
		// Not this engine's: a person's job of the same name, a job
		// of the first version's tag, another engine's (staging beside
		// production, same account and provisioner name).
		"509|PENDING|Priority|N/A|my own analysis, please keep",
		"510|PENDING|Priority|N/A|fluksio:hpc-cpu-00000012",
		"511|RUNNING|None|2026-12-02T09:00:00|fluksio:v2:staging:0:hpc-cpu-00000013",
		"512|PENDING|Priority|N/A|fluksio:v2:staging:0:hpc-cpu-00000014",
		// This engine's, under an earlier secret: its worker cannot
		// attach, so it goes even though it runs.
		"513|RUNNING|None|2026-12-02T09:00:00|fluksio:v2:hpc:e9:hpc-cpu-00000015",
		// Another account's, of the same name and tag down to the
		// secret (a copied configuration): not ours to adopt, nor
		// to cancel (squeue has no --me; its user says so).
		"514|PENDING|Priority|N/A|fluksio:v2:hpc:0:hpc-cpu-00000016|mallory",
		"515|PENDING|Priority|N/A|fluksio:v2:hpc:e9:hpc-cpu-00000017|mallory",
	)
	h.configure(t, nil)

	squeues := h.fake.callsTo("squeue")
	if want := []string{"squeue", "-h", "-r", "--name=fluksio-hpc", "-o", "'%i|%T|%r|%S|%k|%u'"}; len(squeues) != 1 || !slices.Equal(squeues[0].remote(), want) {
		t.Fatalf("squeue calls = %+v, want one %q", squeues, want)
	}
	scancels := h.fake.callsTo("scancel")
	if len(scancels) != 1 {
		t.Fatalf("%d scancel calls, want 1", len(scancels))
	}
	cancelled := slices.Sorted(slices.Values(scancels[0].remote()[1:]))
	if !slices.Equal(cancelled, []string{"504", "506", "513"}) {
		t.Errorf("cancelled %v", cancelled)
	}
	why := map[string]string{}
	adoptedEvents := map[string]string{}
	for _, ev := range h.host.Events() {
		switch ev.Kind {
		case shared.EventWorkerCancelled:
			why[ev.Job] = ev.Detail
		case shared.EventWorkerProvisioned:
			// The engine hears of every adopted machine, so that its
			// worker may attach.
			adoptedEvents[ev.Job] = ev.Worker
		default:
			t.Errorf("event %+v", ev)
		}
	}
	for job, want := range map[string]string{
		"504": "profile old is not configured",
		"506": `its tag names worker "other-cpu-0000000f", which is not a worker of provisioner hpc`,
		"513": "credential signed with an earlier secret",
	} {
		if !strings.Contains(why[job], want) {
			t.Errorf("job %s: detail %q, want %q", job, why[job], want)
		}
	}
	for _, job := range []string{"505", "509", "510", "511", "512", "514", "515"} {
		if _, adopted := adoptedEvents[job]; adopted {
			t.Errorf("job %s is not this engine's, and was adopted", job)
		}
		if _, touched := why[job]; touched {
			t.Errorf("job %s is not this engine's, and was cancelled", job)
		}
	}

	// Every machine of this engine's configured profiles is adopted, each
	// with the worker its tag names and its age counted from now.
	adopted := map[string]string{}
	for _, o := range h.status(t).Outstanding {
		adopted[o.Job] = o.Worker + " " + o.State
		if o.Age != 0 {
			t.Errorf("%+v: age counted from before the adoption", o)
		}
	}
	want := map[string]string{
		"500": "hpc-cpu-0000000a PENDING", "501": "hpc-cpu-0000000b PENDING", "499": "hpc-cpu-00000009 RUNNING",
		"502": "hpc-gpu-0000000c RUNNING", "503": "hpc-gpu-0000000d RUNNING",
	}
	if !maps.Equal(adopted, want) {
		t.Errorf("adopted %v, want %v", adopted, want)
	}
	for job, w := range want {
		if worker, _, _ := strings.Cut(w, " "); adoptedEvents[job] != worker {
			t.Errorf("no worker_provisioned for adopted job %s (%s); events %v", job, worker, adoptedEvents)
		}
	}
	h.p.mu.Lock()
	running := h.p.requestOf("gpu").running
	h.p.mu.Unlock()
	if !running.Equal(h.clock.Now()) {
		t.Errorf("adopted running job runs since %s", running)
	}
	if !h.p.poll.wanted() {
		t.Error("the poller does not watch adopted jobs")
	}
	logs := h.logs.String()
	if strings.Count(logs, "adopted a machine left by an earlier run") != 5 || strings.Count(logs, "left alone a running job") != 1 {
		t.Errorf("logs:\n%s", logs)
	}

	// The engine wants one cpu machine: one runs already, so the two
	// pending ones are given up; gpu's are running and stay, wanted or
	// not, since their workers are about to attach.
	r, resp := h.provisionAll(t, cpuNeed)
	if r.Outcome != shared.OutcomeOutstanding {
		t.Errorf("Provision = %+v", r)
	}
	if pd := profileDemand(resp, "cpu"); pd.Cancelled != 2 || pd.OnTheWay != 1 {
		t.Errorf("cpu after the demand: %+v, want 2 cancelled and 1 on the way", pd)
	}
	eventually(t, "the pending cpu jobs to be cancelled", func() bool { return len(h.fake.callsTo("scancel")) == 2 })
	if got := h.fake.callsTo("scancel")[1].remote(); !slices.Equal(slices.Sorted(slices.Values(got[1:])), []string{"500", "501"}) {
		t.Errorf("scancel %q, want the two pending cpu jobs", got)
	}

	// Reconcile and Shutdown treat them as their own.
	if resp, err := h.p.Reconcile(context.Background(), &shared.ReconcileRequest{Attached: []string{"hpc-gpu-0000000c"}}); err != nil || !slices.Equal(resp.Arrived, []string{"hpc-gpu-0000000c"}) {
		t.Errorf("Reconcile = %+v, %v", resp, err)
	}
	sresp, err := h.p.Shutdown(context.Background(), &shared.ShutdownRequest{})
	if err != nil || !slices.Equal(slices.Sorted(slices.Values(sresp.Cancelled)), []string{"499", "503"}) {
		t.Errorf("Shutdown = %+v, %v; want the two machines that never attached", sresp, err)
	}
}

func TestAdoptionRetriedByThePoller(t *testing.T) {
	h := newUnconfigured(t, "sbatch=ok,squeue=fail,scancel=ok")
	h.configure(t, nil)
	ctx := context.Background()
	if st := h.status(t); !strings.Contains(st.LastError, "Unable to contact slurm controller") {
		t.Errorf("LastError = %q", st.LastError)
	}
	if !strings.Contains(h.logs.String(), "could not list jobs left by an earlier run") {
		t.Errorf("no error logged:\n%s", h.logs.String())
	}
	if !h.p.poll.wanted() {
		t.Fatal("the poller would not retry adoption")
	}
	h.p.poll.once(ctx)
	if n := len(h.fake.callsTo("squeue")); n != 2 {
		t.Fatalf("%d squeue calls", n)
	}

	// Meanwhile this run asks for a machine; adoption must not take it
	// for a stray.
	ev := h.provisioned(t)
	h.fake.setSpec(t, "sbatch=ok,squeue=rows,scancel=ok")
	h.fake.setRows(t,
		"4242|PENDING|Priority|N/A|"+tagOf(ev.Worker),
		"700|PENDING|Priority|N/A|fluksio:v2:hpc:0:hpc-cpu-000000aa",
		"701|PENDING|Priority|N/A|fluksio:v2:hpc:0:hpc-gpu-000000bb",
	)
	before := h.calls()
	h.p.poll.once(ctx)
	if d := h.calls() - before; d != 1 {
		t.Errorf("%d Slurm calls, want one squeue", d)
	}
	// Both machines are this engine's, so both are adopted; whether
	// they are wanted is the demand's to say.
	if n := len(h.fake.callsTo("scancel")); n != 0 {
		t.Errorf("%d scancel calls; adoption cancels nothing of a configured profile", n)
	}
	jobs := map[string]string{}
	for _, o := range h.status(t).Outstanding {
		jobs[o.Job] = o.Profile
	}
	if !maps.Equal(jobs, map[string]string{"4242": "cpu", "700": "cpu", "701": "gpu"}) {
		t.Errorf("outstanding %v", jobs)
	}
	// The demand is one cpu machine: the newer of the two pending is
	// given up, 4242 (this run's own) stays.
	if _, resp := h.provisionAll(t, cpuNeed); profileDemand(resp, "cpu").Cancelled != 1 {
		t.Errorf("Provision after adoption: %+v", resp.Profiles)
	}
	eventually(t, "the surplus cpu job to be cancelled", func() bool { return len(h.fake.callsTo("scancel")) == 1 })
	// Slurm has cancelled it; the next cycle only reads the queue.
	h.fake.setRows(t,
		"4242|PENDING|Priority|N/A|"+tagOf(ev.Worker),
		"700|CANCELLED|None|N/A|fluksio:v2:hpc:0:hpc-cpu-000000aa",
		"701|PENDING|Priority|N/A|fluksio:v2:hpc:0:hpc-gpu-000000bb",
	)
	before = h.calls()
	h.p.poll.once(ctx)
	if d := h.calls() - before; d != 1 {
		t.Errorf("%d Slurm calls once adopted", d)
	}
}

// TestProvisionBeforeAdoption is a plugin restarted after a crash: the
// engine asks for a machine the moment Configure returns, while the job
// the dead process asked for is still in the queue. Whichever comes
// first, the job is adopted and nothing is submitted or cancelled; a
// Provision that came first hears of the adopted job by an event.
func TestProvisionBeforeAdoption(t *testing.T) {
	h := newUnconfigured(t, "sbatch=ok,squeue=rows,scancel=ok")
	h.fake.setRows(t, "500|RUNNING|None|2026-12-02T09:00:00|fluksio:v2:hpc:0:hpc-cpu-0000000a")
	resp, err := h.p.Configure(context.Background(), &shared.ConfigureRequest{Name: "hpc", Config: mustJSON(t, baseConfig()), Host: h.host})
	if err != nil || resp.Diagnostics.HasErrors() {
		t.Fatalf("Configure: %v %v", err, resp.Diagnostics)
	}
	r := h.provision(t, cpuNeed) // most likely before adoption has read the queue
	<-h.p.poll.adoptTried
	h.submitted(t)
	if n := len(h.fake.callsTo("sbatch")); n != 0 {
		t.Errorf("%d sbatch calls; the earlier run's job should have been adopted instead", n)
	}
	if n := len(h.fake.callsTo("scancel")); n != 0 {
		t.Errorf("%d scancel calls", n)
	}
	if o := h.outstanding(t)["cpu"]; o.Job != "500" || o.Worker != "hpc-cpu-0000000a" {
		t.Errorf("cpu: %+v, want the adopted job 500", o)
	}
	switch r.Outcome {
	case shared.OutcomeRequested:
		evs := waitEvents(t, h.host, 1)
		if ev := evs[0]; len(evs) != 1 || ev.Kind != shared.EventWorkerProvisioned || ev.Job != "500" || ev.Worker != "hpc-cpu-0000000a" {
			t.Errorf("events = %+v, want worker_provisioned for job 500", evs)
		}
	case shared.OutcomeOutstanding:
		// Adoption came first.
	default:
		t.Errorf("Provision = %+v", r)
	}
}

// TestProvisionBeforeAdoptionKeepsTheCaps: a plugin restarted while an
// earlier run's GPU jobs pend is asked for CPU machines up to max_workers
// before its first look at the queue has answered. Adoption yields this
// run's requests to the earlier run's jobs one for one within a profile;
// the caps are the provisioner's, so requests of another profile must give
// way too, or the provisioner holds more than max_workers (the soak saw 41
// under 40, three seconds after a plugin was killed).
func TestProvisionBeforeAdoptionKeepsTheCaps(t *testing.T) {
	h := newUnconfigured(t, "sbatch=ok,squeue=gaterows,scancel=ok")
	h.fake.setRows(t, "500|PENDING|Resources|N/A|fluksio:v2:hpc:0:hpc-gpu-0000000a\n"+
		"501|PENDING|Resources|N/A|fluksio:v2:hpc:0:hpc-gpu-0000000b")
	cfg := baseConfig()
	cfg["max_workers"] = 4
	resp, err := h.p.Configure(context.Background(), &shared.ConfigureRequest{Name: "hpc", Config: mustJSON(t, cfg), Host: h.host})
	if err != nil || resp.Diagnostics.HasErrors() {
		t.Fatalf("Configure: %v %v", err, resp.Diagnostics)
	}
	eventually(t, "the first look at the queue", func() bool { return len(h.fake.callsTo("squeue")) >= 1 })
	if o, _ := h.provisionN(t, cpuNeed, 4); o.Outcome != shared.OutcomeRequested {
		t.Fatalf("Provision = %+v, want requested before the queue answered", o)
	}
	h.fake.openGate(t)
	<-h.p.poll.adoptTried
	h.submitted(t)
	h.p.mu.Lock()
	alive := map[string]int{}
	for _, r := range h.p.outstanding {
		alive[r.profile]++
	}
	h.p.mu.Unlock()
	if total := alive["cpu"] + alive["gpu"]; total > 4 || alive["gpu"] != 2 {
		t.Errorf("after adoption the books hold %v: %d machines under max_workers 4; want the 2 adopted GPU jobs and at most 2 CPU machines", alive, total)
	}
	submitted := 0
	for _, c := range h.fake.callsTo("sbatch") {
		// One machine a job, or an array's tasks.
		n := 1
		if m := regexp.MustCompile(`#SBATCH --array=0-(\d+)\n`).FindStringSubmatch(c.Stdin); m != nil {
			n, _ = strconv.Atoi(m[1])
			n++
		}
		submitted += n
	}
	if submitted > 2 {
		t.Errorf("%d CPU machines submitted beside the 2 adopted under max_workers 4; want at most 2", submitted)
	}
}

func TestShutdownCancelsAdoptedAndUnknown(t *testing.T) {
	h := newUnconfigured(t, "sbatch=drop,squeue=rows,scancel=ok")
	h.fake.setRows(t, "500|PENDING|Priority|N/A|fluksio:v2:hpc:0:hpc-gpu-0000000a")
	h.configure(t, nil)
	h.fake.setSpec(t, "sbatch=drop,squeue=fail,scancel=ok")
	// The adopted gpu machine is still wanted, so the demand keeps it.
	if r := h.provision(t, gpuNeed); r.Outcome != shared.OutcomeOutstanding {
		t.Fatalf("gpu: %+v", r)
	}
	h.provision(t, cpuNeed)
	h.submitted(t)
	if o := h.outstanding(t)["cpu"]; o.State != "UNKNOWN" {
		t.Fatalf("cpu: %+v", o)
	}

	h.fake.setSpec(t, "squeue=list,scancel=ok")
	resp, err := h.p.Shutdown(context.Background(), &shared.ShutdownRequest{Deadline: time.Now().Add(10 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(slices.Values(resp.Cancelled)); !slices.Equal(got, []string{"500", "9001"}) {
		t.Fatalf("Cancelled = %v", resp.Cancelled)
	}
	scancels := h.fake.callsTo("scancel")
	if len(scancels) != 1 || len(scancels[0].remote()) != 3 {
		t.Errorf("scancel calls = %+v", scancels)
	}
	// The adopted job's worker_provisioned, then a cancel for each.
	if got := kinds(h.host.Events()); !slices.Equal(got, []shared.EventKind{shared.EventWorkerProvisioned, shared.EventWorkerCancelled, shared.EventWorkerCancelled}) {
		t.Errorf("events = %v", got)
	}
}

func TestScancelBatches(t *testing.T) {
	h := newHarness(t, "scancel=ok", nil)
	var ids []string
	for i := range 250 {
		ids = append(ids, strconv.Itoa(1000+i))
	}
	if err := h.p.q.Cancel(context.Background(), ids); err != nil {
		t.Fatal(err)
	}
	scancels := h.fake.callsTo("scancel")
	var sizes []int
	var all []string
	for _, c := range scancels {
		sizes = append(sizes, len(c.remote())-1)
		all = append(all, c.remote()[1:]...)
	}
	if !slices.Equal(sizes, []int{100, 100, 50}) || len(all) != 250 || h.calls() != 3 {
		t.Errorf("batches of %v (%d calls)", sizes, h.calls())
	}
	slices.Sort(all)
	if !slices.Equal(all, ids) {
		t.Error("not every id was cancelled once")
	}

	h.fake.setSpec(t, "scancel=fail")
	if err := h.p.q.Cancel(context.Background(), ids[:1]); err == nil || !strings.Contains(err.Error(), "Unable to contact slurm controller") {
		t.Errorf("err = %v", err)
	}
	if err := h.p.q.Cancel(context.Background(), []string{"1", "2;rm"}); !errors.Is(err, shared.ErrInvalidArgument) {
		t.Errorf("err = %v", err)
	}
}

func TestParseRows(t *testing.T) {
	out := "Welcome to the cluster\n" +
		"12|RUNNING|None|2026-12-02T10:00:00|fluksio:v2:hpc:0:hpc-cpu-0000000a\n" +
		"13|PENDING|Priority|N/A|a|b c\n" +
		"14|PENDING|Priority|N/A\n" +
		"x|PENDING|Priority|N/A|c\n" +
		"15_2|PENDING|Priority|N/A|c\n" +
		"\n"
	got := queue.ParseJobs([]byte(out), "")
	want := []queue.Job{
		{ID: "12", State: "RUNNING", Reason: "None", Start: "2026-12-02T10:00:00", Comment: "fluksio:v2:hpc:0:hpc-cpu-0000000a"},
		{ID: "13", State: "PENDING", Reason: "Priority", Start: "N/A", Comment: "a|b c"},
		{ID: "15_2", State: "PENDING", Reason: "Priority", Start: "N/A", Comment: "c"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("rows = %+v, want %+v", got, want)
	}
}

func TestProfileOf(t *testing.T) {
	s, diags := parseConfig("hpc", mustJSON(t, baseConfig()))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	if err := s.identity("", ""); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		comment, profile string
		ok               bool
	}{
		{tagOf("hpc-cpu-0123abcd"), "cpu", true},
		{tagOf("hpc-gpu-0123abcd"), "gpu", true},
		{tagOf("hpc-old-0123abcd"), "old", false},
		{tagOf("hpc-cpu-0123ABCD"), "", false},
		{tagOf("hpc-cpu-0123abc"), "", false},
		{tagOf("hpc-0123abcd"), "", false},
		{tagOf("hpcx-cpu-0123abcd"), "", false},
	}
	for _, tc := range tests {
		tag, ok := s.ours(tc.comment)
		if !ok {
			t.Errorf("%q is not ours", tc.comment)
			continue
		}
		profile, why := s.profileOf(tag.Worker)
		if profile != tc.profile || (why == "") != tc.ok {
			t.Errorf("%q: profile %q, why %q", tc.comment, profile, why)
		}
	}
}

// TestTagsOfOthersAreNotOurs: only a v2 tag naming this engine is ours. A
// person's comment, the tag of the first version and another engine's
// tag are not, whatever the job is called.
func TestTagsOfOthersAreNotOurs(t *testing.T) {
	s := &settings{name: "hpc"}
	if err := s.identity("prod", "e1"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{
		"my own analysis, please keep", "fluksio:hpc-cpu-0123abcd", "fluksio:v2:staging:e1:hpc-cpu-0123abcd",
		"fluksio:v2:prod:e1", "fluksio:v2:prod:e1:hpc-cpu-0123abcd:x", "fluksio:v2:prod:e1:hpc cpu", "", "(null)",
	} {
		if _, ok := s.ours(c); ok {
			t.Errorf("%q taken for this engine's", c)
		}
	}
	if tag, ok := s.ours("fluksio:v2:prod:e0:hpc-cpu-0123abcd"); !ok || tag.Epoch != "e0" || tag.Worker != "hpc-cpu-0123abcd" {
		t.Errorf("another epoch of this engine: %+v %v", tag, ok)
	}
	if c := s.comment("hpc-cpu-0123abcd"); c != "fluksio:v2:prod:e1:hpc-cpu-0123abcd" {
		t.Errorf("comment %q", c)
	}
	for _, bad := range []string{"a:b", "a b", strings.Repeat("x", 65)} {
		if err := (&settings{name: "hpc"}).identity(bad, "e1"); !errors.Is(err, shared.ErrInvalidArgument) {
			t.Errorf("engine id %q: %v", bad, err)
		}
	}
}

// tagOf is the tag of worker's job in the harness, whose engine says no
// id: the id falls back to the provisioner's name, the epoch to "0".
func tagOf(worker string) string {
	return sbatch.Tag{Engine: "hpc", Epoch: "0", Worker: worker}.Comment()
}

// TestLateLandingUsed: the job of a submission whose answer was lost,
// landing after the first look found the queue without it, is the
// request's: the one event the engine hears is worker_provisioned with
// that job, for the worker whose credential the job holds; nothing was
// said failed first, so the engine never revokes it (nextflow-io/nextflow#970
// is this landing taken for a failure).
func TestLateLandingUsed(t *testing.T) {
	h := newHarness(t, "sbatch=drop,squeue=rows", nil)
	h.fake.setRows(t)
	h.provision(t, cpuNeed)
	h.submitted(t)
	worker := h.outstanding(t)["cpu"].Worker
	h.clock.Advance(10 * time.Second)
	h.fake.setRows(t, "4300|PENDING|Priority|N/A|"+tagOf(worker))
	h.p.poll.once(context.Background())
	evs := waitEvents(t, h.host, 1)
	if ev := evs[0]; len(evs) != 1 || ev.Kind != shared.EventWorkerProvisioned || ev.Job != "4300" || ev.Worker != worker {
		t.Fatalf("events = %+v; want the landed job given to its worker, and nothing else", evs)
	}
	if o := h.outstanding(t)["cpu"]; o.Job != "4300" || o.State != "PENDING" {
		t.Errorf("outstanding %+v", o)
	}
	if n := len(h.fake.callsTo("sbatch")); n != 1 {
		t.Errorf("%d sbatch calls", n)
	}
}

// TestLateLandingFoundWhileWatching: a submission whose answer was lost
// is given up on once it can no longer land; should its sbatch have run
// on all the same (a login node without timeout, a clock gone wrong),
// the poller keeps reading the queue for provision_timeout, and the job
// that lands is adopted on the next cycle. Before, the idle poller
// stopped and the job sat in the queue.
func TestLateLandingFoundWhileWatching(t *testing.T) {
	h := newHarness(t, "sbatch=drop,squeue=rows", nil)
	h.fake.setRows(t)
	h.provision(t, cpuNeed)
	h.submitted(t)
	h.clock.Advance(time.Minute)
	h.p.poll.once(context.Background())
	ev := waitEvents(t, h.host, 1)[0]
	if ev.Kind != shared.EventWorkerProvisionFailed {
		t.Fatalf("event = %+v", ev)
	}
	if !h.p.poll.wanted() {
		t.Fatal("the poller rests although a submission may still land")
	}
	h.fake.setRows(t, "4300|PENDING|Priority|N/A|"+tagOf(ev.Worker))
	h.p.poll.once(context.Background())
	if o := h.outstanding(t)["cpu"]; o.Job != "4300" || o.Worker != ev.Worker {
		t.Errorf("outstanding %+v; want the late job adopted", o)
	}
	// Once adopted it is watched as any job; after provision_timeout
	// with nothing outstanding the poller rests.
	h.p.mu.Lock()
	clear(h.p.outstanding)
	h.p.mu.Unlock()
	h.clock.Advance(time.Hour)
	if h.p.poll.wanted() {
		t.Error("the poller still watches an hour later")
	}
}

// TestPollHearsJobEndUnderWorker: the job of a worker the engine reports
// attached is read in each poll cycle, and its end under the worker is
// told once as worker_job_ended, in Slurm's word; a job requeued under
// its worker is cancelled; a worker that left is no longer watched.
func TestPollHearsJobEndUnderWorker(t *testing.T) {
	tests := []struct {
		row, state, detail string
		cancels            int
	}{
		{"FAILED|NonZeroExitCode|2026-12-02T10:00:01", "FAILED", "job 4242 is FAILED (NonZeroExitCode)", 0},
		{"NODE_FAIL|None|2026-12-02T10:00:01", "NODE_FAIL", "job 4242 is NODE_FAIL", 0},
		{"COMPLETING|None|2026-12-02T10:00:01", "COMPLETING", "job 4242 is COMPLETING", 0},
		{"", "GONE", "job 4242 has left the queue", 0},
		{"PENDING|BeginTime|2026-12-02T10:02:00", "PENDING", "job 4242 is pending again (requeued, BeginTime): its worker's processes are gone", 1},
	}
	for _, tc := range tests {
		t.Run(tc.state, func(t *testing.T) {
			h := newHarness(t, "sbatch=ok,squeue=rows,scancel=ok", nil)
			ev := h.provisioned(t)
			ctx := context.Background()
			if _, err := h.p.Reconcile(ctx, &shared.ReconcileRequest{Attached: []string{ev.Worker}}); err != nil {
				t.Fatal(err)
			}
			if !h.p.poll.wanted() {
				t.Fatal("the poller rests with a worker attached")
			}
			h.fake.setRows(t, "4242|RUNNING|None|2026-12-02T10:00:01|"+tagOf(ev.Worker))
			h.p.poll.once(ctx)
			if got := kinds(h.host.Events()); len(got) != 1 {
				t.Fatalf("a running job told: %v", got)
			}
			if tc.row != "" {
				h.fake.setRows(t, "4242|"+tc.row+"|"+tagOf(ev.Worker))
			} else {
				h.fake.setRows(t)
			}
			squeues := len(h.fake.callsTo("squeue"))
			h.p.poll.once(ctx)
			// The light look at the running job's state, then the full
			// poll for the words of its change (lightpoll.go).
			if calls := h.fake.callsTo("squeue"); len(calls) != squeues+2 || !slices.Contains(calls[squeues].remote(), "--only-job-state") ||
				!slices.Equal(calls[squeues+1].remote(), pollArgv) {
				t.Errorf("%d squeue calls for the cycle, want the light one and the full one", len(calls)-squeues)
			}
			evs := waitEvents(t, h.host, 2)
			if got := evs[1]; got.Kind != shared.EventWorkerJobEnded || got.Job != "4242" || got.Worker != ev.Worker ||
				got.JobState != tc.state || got.Detail != tc.detail || got.Profile != "cpu" {
				t.Errorf("event = %+v; want worker_job_ended, job 4242, %s, %q", got, tc.state, tc.detail)
			}
			h.p.poll.once(ctx)
			if got := kinds(h.host.Events()); len(got) != 2+tc.cancels {
				t.Errorf("events after another cycle = %v; want the end told once", got)
			}
			if n := len(h.fake.callsTo("scancel")); n != tc.cancels {
				t.Errorf("%d scancel calls, want %d", n, tc.cancels)
			}
		})
	}
	t.Run("left", func(t *testing.T) {
		h := newHarness(t, "sbatch=ok,squeue=rows", nil)
		ev := h.provisioned(t)
		ctx := context.Background()
		if _, err := h.p.Reconcile(ctx, &shared.ReconcileRequest{Attached: []string{ev.Worker}}); err != nil {
			t.Fatal(err)
		}
		if _, err := h.p.Reconcile(ctx, &shared.ReconcileRequest{}); err != nil {
			t.Fatal(err)
		}
		h.fake.setRows(t, "4242|COMPLETED|None|2026-12-02T10:00:01|"+tagOf(ev.Worker))
		h.p.poll.once(ctx)
		if got := kinds(h.host.Events()); len(got) != 1 {
			t.Errorf("events = %v; a worker that left is not watched", got)
		}
		if h.p.poll.wanted() {
			t.Error("the poller works with nothing attached or outstanding")
		}
	})
	// A job seen running and pending again before the engine said its
	// worker attached: requeued (its node failed); its worker may have
	// attached and left, so it is cancelled and asked for anew.
	t.Run("requeued before its worker attached", func(t *testing.T) {
		h := newHarness(t, "sbatch=ok,squeue=rows,scancel=ok", nil)
		ev := h.provisioned(t)
		ctx := context.Background()
		h.fake.setRows(t, "4242|RUNNING|None|2026-12-02T10:00:01|"+tagOf(ev.Worker))
		h.p.poll.once(ctx)
		h.fake.setRows(t, "4242|PENDING|BeginTime|2026-12-02T10:02:00|"+tagOf(ev.Worker))
		h.p.poll.once(ctx)
		if got := kinds(h.host.Events()); !slices.Equal(got, []shared.EventKind{shared.EventWorkerProvisioned, shared.EventWorkerCancelled}) {
			t.Errorf("events = %v; want the requeued job cancelled", got)
		}
		if st := h.status(t); len(st.Outstanding) != 0 || len(st.BackingOff) != 0 {
			t.Errorf("Outstanding = %+v, BackingOff = %+v; want nothing on its way and no backoff", st.Outstanding, st.BackingOff)
		}
	})
	// A worker that left as its node failed: Slurm requeues its job,
	// which must be cancelled, not adopted as a machine on its way.
	t.Run("left, then requeued", func(t *testing.T) {
		h := newHarness(t, "sbatch=ok,squeue=rows,scancel=ok", nil)
		ev := h.provisioned(t)
		ctx := context.Background()
		if _, err := h.p.Reconcile(ctx, &shared.ReconcileRequest{Attached: []string{ev.Worker}}); err != nil {
			t.Fatal(err)
		}
		h.fake.setRows(t, "4242|RUNNING|None|2026-12-02T10:00:01|"+tagOf(ev.Worker))
		h.p.poll.once(ctx)
		if _, err := h.p.Reconcile(ctx, &shared.ReconcileRequest{}); err != nil {
			t.Fatal(err)
		}
		h.fake.setRows(t, "4242|PENDING|BeginTime|2026-12-02T10:02:00|"+tagOf(ev.Worker))
		h.p.poll.once(ctx)
		if got := kinds(h.host.Events()); !slices.Equal(got, []shared.EventKind{shared.EventWorkerProvisioned, shared.EventWorkerCancelled}) {
			t.Errorf("events = %v; want the requeued job cancelled, not adopted", got)
		}
		if n := len(h.fake.callsTo("scancel")); n != 1 {
			t.Errorf("%d scancel calls, want 1", n)
		}
		if st := h.status(t); len(st.Outstanding) != 0 {
			t.Errorf("Outstanding = %+v; want nothing on its way", st.Outstanding)
		}
	})
}

// TestPollLightWhileRunning: with every watched job running (a worker
// attached), a poll cycle reads only their states, with one RPC
// (squeue --only-job-state -j); every fifth cycle is full, and so is one
// whose light look shows a change. A squeue without the option (Slurm
// before 24.05) gets full polls from then on, in the same cycle too.
func TestPollLightWhileRunning(t *testing.T) {
	ctx := context.Background()
	for _, noOption := range []bool{false, true} {
		t.Run(fmt.Sprintf("without the option %v", noOption), func(t *testing.T) {
			h := newHarness(t, "sbatch=ok,squeue=rows,scancel=ok", nil)
			if noOption {
				h.fake.write(t, "no-only-job-state", "")
			}
			ev := h.provisioned(t)
			if _, err := h.p.Reconcile(ctx, &shared.ReconcileRequest{Attached: []string{ev.Worker}}); err != nil {
				t.Fatal(err)
			}
			h.fake.setRows(t, "4242|RUNNING|None|2026-12-02T10:00:01|"+tagOf(ev.Worker))
			var forms []string
			for range 7 {
				before := len(h.fake.callsTo("squeue"))
				h.p.poll.once(ctx)
				calls := h.fake.callsTo("squeue")[before:]
				form := ""
				for _, c := range calls {
					switch {
					case slices.Equal(c.remote(), []string{"squeue", "--only-job-state", "-h", "-r", "-t", "all", "-j", "4242", "-o", "'%i|%T'"}):
						form += "L"
					case slices.Equal(c.remote(), pollArgv):
						form += "F"
					default:
						t.Fatalf("squeue %q", c.remote())
					}
				}
				forms = append(forms, form)
			}
			want := "L L L L F L L"
			if noOption {
				want = "LF F F F F F F"
			}
			if got := strings.Join(forms, " "); got != want {
				t.Errorf("poll cycles' squeues %q, want %q (L light, F full)", got, want)
			}
		})
	}
}
