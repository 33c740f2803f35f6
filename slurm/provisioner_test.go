package slurm

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/internal/queue"
	"github.com/fluksio/provision/slurm/sshrun"
)

var (
	cpuNeed = shared.Need{CPUs: 2}
	gpuNeed = shared.Need{CPUs: 1, GPUs: 1}
)

func TestProvisionSubmitsOverSSH(t *testing.T) {
	h := newHarness(t, "sbatch=ok", nil)

	resp := h.provision(t, cpuNeed)
	if resp.Outcome != shared.OutcomeRequested || resp.Profile != "cpu" {
		t.Fatalf("Provision = %+v, want requested cpu", resp)
	}
	evs := waitEvents(t, h.host, 1)
	ev := evs[0]
	if ev.Kind != shared.EventWorkerProvisioned || ev.Provisioner != "hpc" || ev.Profile != "cpu" || ev.Job != "4242" {
		t.Fatalf("event = %+v", ev)
	}
	if !regexp.MustCompile(`^hpc-cpu-[0-9a-f]{8}$`).MatchString(ev.Worker) {
		t.Errorf("worker name %q is not hpc-cpu-<8 hex>", ev.Worker)
	}
	if m := h.host.Minted(); len(m) != 1 || m[0].Worker != ev.Worker || m[0].TTL != 24*time.Hour {
		t.Errorf("minted %+v, want one for %s with 24h", m, ev.Worker)
	}

	calls := h.fake.callsTo("sbatch")
	if len(calls) != 1 {
		t.Fatalf("%d sbatch calls, want 1", len(calls))
	}
	// ConnectTimeout is half of submit_timeout (30s).
	want := []string{"-o", "BatchMode=yes", "-o", "ConnectTimeout=15", "--", "alice@login.example.org", "sbatch", "--parsable"}
	if got, given := unbounded(withoutMux(calls[0].Argv)); !slices.Equal(got, want) || given == "" {
		t.Errorf("argv = %q, want %q under the login node's timeout", calls[0].Argv, want)
	}
	token := tokenFor(ev.Worker)
	if !strings.Contains(calls[0].Stdin, "\nFLUKSIO_WORKER_TOKEN="+token+" ") {
		t.Errorf("the script does not give the worker the token:\n%s", calls[0].Stdin)
	}
	// The worker is told its job's log, in log_dir, which it removes
	// when it ends well.
	if !strings.Contains(calls[0].Stdin, ` FLUKSIO_JOB_LOG=/home/alice/.local/state/fluksio/hpc/"${SLURM_JOB_ID}.out" exec fluksio-worker `) {
		t.Errorf("the script does not name the job's log to the worker:\n%s", calls[0].Stdin)
	}
	if !strings.Contains(calls[0].Stdin, "#SBATCH --comment="+tagOf(ev.Worker)+"\n") {
		t.Errorf("the script does not name its worker:\n%s", calls[0].Stdin)
	}

	st := h.status(t)
	if len(st.Outstanding) != 1 || st.Outstanding[0].Job != "4242" || st.Outstanding[0].Worker != ev.Worker {
		t.Errorf("Outstanding = %+v", st.Outstanding)
	}
	logs := h.logs.String()
	if !strings.Contains(logs, "asked for a machine") || !strings.Contains(logs, "job=4242") || !strings.Contains(logs, "worker="+ev.Worker) {
		t.Errorf("no info line for the submission in:\n%s", logs)
	}
	assertTokenHidden(t, h, token)
}

// assertTokenHidden checks that a token reached ssh only on stdin.
func assertTokenHidden(t *testing.T, h *harness, token string) {
	t.Helper()
	secret := token[len("s3cr3t-"):]
	for _, c := range h.fake.calls() {
		for _, a := range c.Argv {
			if strings.Contains(a, secret) {
				t.Errorf("token in ssh argv %q", c.Argv)
			}
		}
	}
	if strings.Contains(h.logs.String(), "t0k3n") {
		t.Errorf("token in the log:\n%s", h.logs.String())
	}
	for _, ev := range h.host.Events() {
		if strings.Contains(ev.Detail, "t0k3n") {
			t.Errorf("token in event %+v", ev)
		}
	}
}

func TestProvisionReturnsAtOnce(t *testing.T) {
	h := newHarness(t, "sbatch=hang", nil)

	start := time.Now()
	resp := h.provision(t, cpuNeed)
	if took := time.Since(start); took > time.Second {
		t.Errorf("Provision took %s with ssh hanging", took)
	}
	if resp.Outcome != shared.OutcomeRequested {
		t.Fatalf("Provision = %+v", resp)
	}
	eventually(t, "the sbatch call", func() bool { return len(h.fake.callsTo("sbatch")) == 1 })
	st := h.status(t)
	if len(st.Outstanding) != 1 || st.Outstanding[0].Job != "" || st.Outstanding[0].Profile != "cpu" {
		t.Errorf("while submitting, Outstanding = %+v", st.Outstanding)
	}
	if again := h.provision(t, cpuNeed); again.Outcome != shared.OutcomeOutstanding {
		t.Errorf("second Provision = %+v, want outstanding", again)
	}
}

func TestOneOutstandingPerProfile(t *testing.T) {
	h := newHarness(t, "sbatch=ok", nil)

	if r := h.provision(t, cpuNeed); r.Outcome != shared.OutcomeRequested {
		t.Fatalf("first = %+v", r)
	}
	// Reserved before the goroutine starts, so this sees it however
	// far the submission has got.
	if r := h.provision(t, cpuNeed); r.Outcome != shared.OutcomeOutstanding || r.Profile != "cpu" || r.Detail == "" {
		t.Fatalf("second = %+v, want outstanding with a detail", r)
	}
	if r := h.provision(t, gpuNeed); r.Outcome != shared.OutcomeRequested || r.Profile != "gpu" {
		t.Fatalf("gpu = %+v", r)
	}
	waitEvents(t, h.host, 2)
	r := h.provision(t, cpuNeed)
	if r.Outcome != shared.OutcomeOutstanding || !strings.Contains(r.Detail, "has not attached") {
		t.Errorf("after submission = %+v", r)
	}
	if n := len(h.fake.callsTo("sbatch")); n != 2 {
		t.Errorf("%d sbatch calls, want 2", n)
	}
}

func TestProvisionNoFit(t *testing.T) {
	h := newHarness(t, "sbatch=ok", nil)
	for _, need := range []shared.Need{{CPUs: 64}, {CPUs: 1, GPUs: 2}, {CPUs: 1, Label: "tpu"}, {CPUs: 1, GPUs: 1, RAMMB: 64000}} {
		r := h.provision(t, need)
		if r.Outcome != shared.OutcomeNoFit || r.Profile != "" || r.Detail == "" {
			t.Errorf("Provision(%+v) = %+v, want no_fit with a detail", need, r)
		}
	}
	if n := len(h.fake.calls()); n != 0 {
		t.Errorf("%d ssh calls for needs nothing fits", n)
	}
}

func TestNotConfiguredAndShutdown(t *testing.T) {
	ctx := context.Background()
	p := New(nil)
	if _, err := p.Provision(ctx, &shared.ProvisionRequest{Demand: []shared.Demand{{Need: cpuNeed, Count: 1}}}); !errors.Is(err, shared.ErrNotConfigured) {
		t.Errorf("Provision before Configure: %v", err)
	}
	if _, err := p.Shapes(ctx, &shared.ShapesRequest{}); !errors.Is(err, shared.ErrNotConfigured) {
		t.Errorf("Shapes before Configure: %v", err)
	}
	if _, err := p.Covers(ctx, &shared.CoversRequest{Need: cpuNeed}); !errors.Is(err, shared.ErrNotConfigured) {
		t.Errorf("Covers before Configure: %v", err)
	}
	if _, err := p.Reconcile(ctx, &shared.ReconcileRequest{}); !errors.Is(err, shared.ErrNotConfigured) {
		t.Errorf("Reconcile before Configure: %v", err)
	}
	if info, err := p.Info(ctx, &shared.InfoRequest{}); err != nil || info.Kind != "slurm" || info.ContractVersion != shared.ContractVersion {
		t.Errorf("Info = %+v, %v", info, err)
	}
	if st, err := p.Status(ctx, &shared.StatusRequest{}); err != nil || st.Kind != "slurm" {
		t.Errorf("Status = %+v, %v", st, err)
	}

	h := newHarness(t, "sbatch=ok", nil)
	if _, err := h.p.Configure(ctx, &shared.ConfigureRequest{Name: "other", Config: mustJSON(t, baseConfig())}); err == nil {
		t.Error("a second Configure under another name succeeded")
	}
	if _, err := h.p.Shutdown(ctx, &shared.ShutdownRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.p.Provision(ctx, &shared.ProvisionRequest{Demand: []shared.Demand{{Need: cpuNeed, Count: 1}}}); !errors.Is(err, shared.ErrShutdown) {
		t.Errorf("Provision after Shutdown: %v", err)
	}
}

func TestSubmissionFailure(t *testing.T) {
	h := newHarness(t, "sbatch=busy", nil)

	h.provision(t, cpuNeed)
	ev := waitEvents(t, h.host, 1)[0]
	wantDetail := "sbatch: error: Batch job submission failed: Resource temporarily unavailable"
	if ev.Kind != shared.EventWorkerProvisionFailed || ev.Profile != "cpu" || ev.Detail != wantDetail {
		t.Fatalf("event = %+v", ev)
	}
	eventually(t, "the reservation to be dropped", func() bool { return len(h.status(t).Outstanding) == 0 })
	if st := h.status(t); st.LastError != wantDetail {
		t.Errorf("LastError = %q", st.LastError)
	}
	logs := h.logs.String()
	if !regexp.MustCompile(`\[ERROR\] could not ask for a machine: provisioner=hpc profile=cpu`).MatchString(logs) {
		t.Errorf("no error line naming provisioner and profile in:\n%s", logs)
	}
	// The reservation is gone, so the profile can be asked for again once
	// its backoff is over.
	h.clock.Advance(backoffBase)
	if r := h.provision(t, cpuNeed); r.Outcome != shared.OutcomeRequested {
		t.Errorf("after a failure, Provision = %+v", r)
	}
	waitEvents(t, h.host, 2)
	assertTokenHidden(t, h, tokenFor(ev.Worker))
}

func TestLastErrorTrimmed(t *testing.T) {
	h := newHarness(t, "sbatch=long", nil)
	h.provision(t, cpuNeed)
	ev := waitEvents(t, h.host, 1)[0]
	if n := utf8.RuneCountInString(ev.Detail); n != 500 {
		t.Errorf("event detail has %d characters, want 500", n)
	}
	eventually(t, "last_error", func() bool { return h.status(t).LastError != "" })
	if st := h.status(t); st.LastError != ev.Detail {
		t.Errorf("LastError = %q, want the event's detail", st.LastError)
	}
}

func TestGarbageFromSbatch(t *testing.T) {
	h := newHarness(t, "sbatch=garbage", nil)
	h.provision(t, cpuNeed)
	ev := waitEvents(t, h.host, 1)[0]
	if ev.Kind != shared.EventWorkerProvisionFailed || !strings.Contains(ev.Detail, "not a job id") {
		t.Errorf("event = %+v", ev)
	}
}

// TestSbatchEchoingTheScriptLeaksNothing: when what answers sbatch echoes
// the script, credential included, and then no job id or an error, the
// credential reaches neither the log, nor an event, nor last_error.
// Before, the error that carried sbatch's output was logged unredacted.
func TestSbatchEchoingTheScriptLeaksNothing(t *testing.T) {
	for _, b := range []string{"echo", "echofail"} {
		t.Run(b, func(t *testing.T) {
			h := newHarness(t, "sbatch="+b, nil)
			h.provision(t, cpuNeed)
			ev := waitEvents(t, h.host, 1)[0]
			if ev.Kind != shared.EventWorkerProvisionFailed {
				t.Fatalf("event = %+v", ev)
			}
			if !strings.Contains(h.fake.callsTo("sbatch")[0].Stdin, "t0k3n") {
				t.Fatal("the script had no token to leak")
			}
			assertTokenHidden(t, h, tokenFor(ev.Worker))
			if st := h.status(t); strings.Contains(st.LastError, "t0k3n") || !strings.Contains(st.LastError, "[redacted]") {
				t.Errorf("last_error %q", st.LastError)
			}
		})
	}
}

func TestSubmitTimeout(t *testing.T) {
	h := newHarness(t, "sbatch=hang", func(c map[string]any) { c["submit_timeout"] = "300ms" })

	start := time.Now()
	h.provision(t, cpuNeed)
	h.submitted(t)
	took := time.Since(start)
	if took > 300*time.Millisecond+sshrun.WaitDelay+time.Second {
		t.Errorf("the submission ended after %s, want within submit_timeout", took)
	}
	// Either the look for its job found none in time and it failed, or
	// the look itself ran out of time and the poller will look again.
	if evs := h.host.Events(); len(evs) > 0 {
		if ev := evs[0]; ev.Kind != shared.EventWorkerProvisionFailed || !strings.Contains(ev.Detail, "no answer within 300ms") {
			t.Errorf("event = %+v", ev)
		}
	} else if o := h.outstanding(t)["cpu"]; o.State != stateUnknown {
		t.Errorf("no event and outstanding %+v; want its outcome unknown", o)
	}
}

// TestSubmitTimeoutBoundsTheWholeSubmission: submit_timeout bounds the
// submission, not each of its steps: a slow mint leaves less time for
// sbatch. Before, a 2.5 s mint and a hung sbatch took 5.5 s with a 3 s
// submit_timeout.
func TestSubmitTimeoutBoundsTheWholeSubmission(t *testing.T) {
	h := newHarness(t, "sbatch=hang,squeue=ok", func(c map[string]any) { c["submit_timeout"] = "3s" })
	// A slow engine: each mint takes 2.5 s.
	h.host.MintF = func(ctx context.Context, r *shared.MintCredentialRequest) (*shared.MintCredentialResponse, error) {
		t := time.NewTimer(2500 * time.Millisecond)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return &shared.MintCredentialResponse{Token: tokenFor(r.Worker), Expires: time.Now().Add(r.TTL)}, nil
	}
	start := time.Now()
	h.provision(t, cpuNeed)
	ev := waitEvents(t, h.host, 1)[0]
	took := time.Since(start)
	if ev.Kind != shared.EventWorkerProvisionFailed {
		t.Errorf("event = %+v", ev)
	}
	if took > 3*time.Second+sshrun.WaitDelay {
		t.Errorf("the submission took %s with submit_timeout 3s", took.Round(time.Millisecond))
	}
	t.Logf("failed after %s", took.Round(time.Millisecond))
}

func TestNoHost(t *testing.T) {
	fake := newFakeCluster(t, "sbatch=ok")
	p := New(nil)
	p.sshPath = os.Args[0]
	if _, err := p.Configure(context.Background(), &shared.ConfigureRequest{Name: "hpc", Config: mustJSON(t, baseConfig())}); err != nil {
		t.Fatal(err)
	}
	p.Provision(context.Background(), &shared.ProvisionRequest{Demand: []shared.Demand{{Need: cpuNeed, Count: 1}}})
	eventually(t, "the failure", func() bool {
		st, _ := p.Status(context.Background(), nil)
		return strings.Contains(st.LastError, "no host channel")
	})
	if n := len(fake.callsTo("sbatch")); n != 0 {
		t.Errorf("%d sbatch calls without a host", n)
	}
	p.Shutdown(context.Background(), &shared.ShutdownRequest{})
}

func TestReconcile(t *testing.T) {
	h := newHarness(t, "sbatch=ok,scancel=ok", nil)
	ctx := context.Background()

	h.provision(t, cpuNeed)
	h.provision(t, gpuNeed)
	evs := waitEvents(t, h.host, 2)
	workers := map[string]shared.Event{}
	for _, e := range evs {
		workers[e.Profile] = e
	}

	// Nothing has attached and nothing is old: nothing changes.
	resp, err := h.p.Reconcile(ctx, &shared.ReconcileRequest{})
	if err != nil || len(resp.Arrived)+len(resp.Expired) != 0 {
		t.Fatalf("Reconcile = %+v, %v", resp, err)
	}

	resp, err = h.p.Reconcile(ctx, &shared.ReconcileRequest{Attached: []string{workers["cpu"].Worker, "someone-else"}})
	if err != nil || !slices.Equal(resp.Arrived, []string{workers["cpu"].Worker}) || len(resp.Expired) != 0 {
		t.Fatalf("Reconcile(attached) = %+v, %v", resp, err)
	}

	h.clock.Advance(16 * time.Minute)
	resp, err = h.p.Reconcile(ctx, &shared.ReconcileRequest{})
	if err != nil || !slices.Equal(resp.Expired, []string{workers["gpu"].Job}) || len(resp.Arrived) != 0 {
		t.Fatalf("Reconcile(late) = %+v, %v", resp, err)
	}
	scancels := h.fake.callsTo("scancel")
	if len(scancels) != 1 || !slices.Equal(scancels[0].remote(), []string{"scancel", workers["gpu"].Job}) {
		t.Fatalf("scancel calls = %+v", scancels)
	}
	evs = h.host.Events()
	last := evs[len(evs)-1]
	if last.Kind != shared.EventWorkerCancelled || last.Job != workers["gpu"].Job || last.Worker != workers["gpu"].Worker {
		t.Errorf("last event = %+v", last)
	}
	if st := h.status(t); len(st.Outstanding) != 0 {
		t.Errorf("Outstanding = %+v", st.Outstanding)
	}
	if !strings.Contains(h.logs.String(), "gave up on a machine that never attached") {
		t.Errorf("no warning for the expired job:\n%s", h.logs.String())
	}

	// Idempotent.
	resp, err = h.p.Reconcile(ctx, &shared.ReconcileRequest{})
	if err != nil || len(resp.Arrived)+len(resp.Expired) != 0 || len(h.fake.callsTo("scancel")) != 1 {
		t.Errorf("second Reconcile = %+v, %v", resp, err)
	}
}

func TestReconcileKeepsSubmissionsInFlight(t *testing.T) {
	h := newHarness(t, "sbatch=gate,scancel=ok", nil)
	ctx := context.Background()

	h.provision(t, cpuNeed)
	eventually(t, "the sbatch call", func() bool { return len(h.fake.callsTo("sbatch")) == 1 })
	h.clock.Advance(time.Hour)
	resp, err := h.p.Reconcile(ctx, &shared.ReconcileRequest{})
	if err != nil || len(resp.Expired) != 0 {
		t.Fatalf("Reconcile of a submission in flight = %+v, %v", resp, err)
	}
	if st := h.status(t); len(st.Outstanding) != 1 || st.Outstanding[0].Job != "" {
		t.Fatalf("Outstanding = %+v", st.Outstanding)
	}

	h.fake.openGate(t)
	waitEvents(t, h.host, 1)
	eventually(t, "the submission to finish", func() bool {
		h.p.mu.Lock()
		defer h.p.mu.Unlock()
		return len(h.p.sub.inflight) == 0
	})
	resp, err = h.p.Reconcile(ctx, &shared.ReconcileRequest{})
	if err != nil || !slices.Equal(resp.Expired, []string{"4242"}) {
		t.Fatalf("Reconcile once submitted = %+v, %v", resp, err)
	}
	if got := kinds(h.host.Events()); !slices.Equal(got, []shared.EventKind{shared.EventWorkerProvisioned, shared.EventWorkerCancelled}) {
		t.Errorf("events = %v", got)
	}
}

// TestReconcileScancelFails: a job whose scancel fails is not reported
// expired ("cancelled") and dropped, as it was: it is kept, the engine
// hears that it could not be cancelled, and the next poll cycle tries
// again until Slurm agrees; Shutdown too.
func TestReconcileScancelFails(t *testing.T) {
	h := newHarness(t, "sbatch=ok,squeue=rows,scancel=fail", nil)
	h.provision(t, cpuNeed)
	ev := waitEvents(t, h.host, 1)[0]
	h.submitted(t)
	h.fake.setRows(t, "4242|PENDING|Priority|N/A|"+tagOf(ev.Worker))
	h.clock.Advance(time.Hour)
	ctx := context.Background()
	resp, err := h.p.Reconcile(ctx, &shared.ReconcileRequest{})
	if err != nil || len(resp.Expired) != 0 {
		t.Fatalf("Reconcile = %+v, %v; want nothing expired while scancel fails", resp, err)
	}
	evs := h.host.Events()
	if last := evs[len(evs)-1]; last.Kind != shared.EventWorkerProvisionFailed || !strings.Contains(last.Detail, "Unable to contact slurm controller") {
		t.Errorf("last event = %+v", last)
	}
	if st := h.status(t); !strings.Contains(st.LastError, "Unable to contact slurm controller") {
		t.Errorf("LastError = %q", st.LastError)
	}
	if !h.p.poll.wanted() {
		t.Fatal("nothing outstanding, and the poller would not retry the scancel")
	}
	// Still failing: one more try per cycle, and one event in all.
	h.p.poll.once(ctx)
	if n := len(h.fake.callsTo("scancel")); n != 2 {
		t.Errorf("%d scancel calls after a poll cycle; want 2", n)
	}
	// The controller is back: the next cycle cancels it.
	h.fake.setSpec(t, "sbatch=ok,squeue=rows,scancel=ok")
	h.p.poll.once(ctx)
	scancels := h.fake.callsTo("scancel")
	if len(scancels) != 3 || !slices.Equal(scancels[2].remote(), []string{"scancel", "4242"}) {
		t.Fatalf("scancel calls = %+v", scancels)
	}
	got := kinds(h.host.Events())
	want := []shared.EventKind{shared.EventWorkerProvisioned, shared.EventWorkerProvisionFailed, shared.EventWorkerCancelled}
	if !slices.Equal(got, want) {
		t.Errorf("events = %v, want %v", got, want)
	}
	if h.p.poll.wanted() {
		t.Error("the poller still has work once the job is cancelled")
	}
}

// TestShutdownCancelsWhatScancelFailedOn: a job whose scancel failed
// during Reconcile is cancelled at Shutdown.
func TestShutdownCancelsWhatScancelFailedOn(t *testing.T) {
	h := newHarness(t, "sbatch=ok,squeue=list,scancel=fail", nil)
	h.provision(t, cpuNeed)
	waitEvents(t, h.host, 1)
	h.submitted(t)
	h.clock.Advance(time.Hour)
	if _, err := h.p.Reconcile(context.Background(), &shared.ReconcileRequest{}); err != nil {
		t.Fatal(err)
	}
	h.fake.setSpec(t, "sbatch=ok,squeue=list,scancel=ok")
	resp, err := h.p.Shutdown(context.Background(), &shared.ShutdownRequest{Deadline: time.Now().Add(10 * time.Second)})
	if err != nil || !slices.Equal(resp.Cancelled, []string{"4242"}) {
		t.Fatalf("Shutdown = %+v, %v", resp, err)
	}
}

func TestShutdownCancelsAllWithOneCall(t *testing.T) {
	h := newHarness(t, "sbatch=ok,scancel=ok", nil)
	h.provision(t, cpuNeed)
	h.provision(t, gpuNeed)
	waitEvents(t, h.host, 2)

	resp, err := h.p.Shutdown(context.Background(), &shared.ShutdownRequest{Deadline: time.Now().Add(10 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	got := slices.Sorted(slices.Values(resp.Cancelled))
	if !slices.Equal(got, []string{"4242", "4243"}) {
		t.Fatalf("Cancelled = %v", resp.Cancelled)
	}
	scancels := h.fake.callsTo("scancel")
	if len(scancels) != 1 || !slices.Equal(scancels[0].remote(), []string{"scancel", resp.Cancelled[0], resp.Cancelled[1]}) {
		t.Fatalf("scancel calls = %+v", scancels)
	}
	if n := len(h.fake.callsTo("squeue")); n != 0 {
		t.Errorf("%d squeue calls with nothing in flight", n)
	}
	evs := h.host.Events()
	if got := kinds(evs[2:]); !slices.Equal(got, []shared.EventKind{shared.EventWorkerCancelled, shared.EventWorkerCancelled}) {
		t.Errorf("events after shutdown = %v", got)
	}
	if st := h.status(t); len(st.Outstanding) != 0 {
		t.Errorf("Outstanding = %+v", st.Outstanding)
	}
	// A second Shutdown gets the first's outcome and runs nothing.
	calls := h.calls()
	if again, err := h.p.Shutdown(context.Background(), &shared.ShutdownRequest{}); err != nil || !slices.Equal(again.Cancelled, resp.Cancelled) {
		t.Errorf("second Shutdown = %+v, %v; want the first's outcome", again, err)
	}
	if h.calls() != calls {
		t.Errorf("the second Shutdown ran %d commands", h.calls()-calls)
	}
}

// TestShutdownTwiceWaitsForTheFirst: a second Shutdown while the first is
// still waiting for a submission (a second Ctrl-C) waits for it and gets
// its outcome. Before, it returned "nothing cancelled" at once, and the
// plugin's exit that followed cut the first short.
func TestShutdownTwiceWaitsForTheFirst(t *testing.T) {
	h := newHarness(t, "sbatch=gate,scancel=ok", nil)
	h.provision(t, cpuNeed)
	eventually(t, "the sbatch call", func() bool { return len(h.fake.callsTo("sbatch")) == 1 })
	first := h.shutdownAsync(20 * time.Second)
	h.shutdownBegun(t)
	second := h.shutdownAsync(20 * time.Second)
	select {
	case r := <-second:
		t.Fatalf("the second Shutdown returned %+v, %v while the first was still working", r.resp, r.err)
	case <-time.After(300 * time.Millisecond):
		// Not an event to wait for: the point is that nothing comes.
	}
	h.fake.openGate(t)
	a, b := <-first, <-second
	if a.err != nil || b.err != nil || !slices.Equal(a.resp.Cancelled, []string{"4242"}) || !slices.Equal(b.resp.Cancelled, a.resp.Cancelled) {
		t.Fatalf("first %+v %v, second %+v %v", a.resp, a.err, b.resp, b.err)
	}
	if n := len(h.fake.callsTo("scancel")); n != 1 {
		t.Errorf("%d scancel calls", n)
	}
}

// TestShutdownIncompleteNamesWhatIsLeft: a submission that did not answer
// and a queue that cannot be read make Shutdown fail, naming the worker
// whose job may be queued. Before, it reported success.
func TestShutdownIncompleteNamesWhatIsLeft(t *testing.T) {
	h := newHarness(t, "sbatch=hang,squeue=fail,scancel=ok", nil)
	h.provision(t, cpuNeed)
	eventually(t, "the sbatch call", func() bool { return len(h.fake.callsTo("sbatch")) == 1 })
	worker := h.status(t).Outstanding[0].Worker
	resp, err := h.p.Shutdown(context.Background(), &shared.ShutdownRequest{Deadline: time.Now().Add(2 * time.Second)})
	if err == nil || !strings.Contains(err.Error(), worker) || !strings.Contains(err.Error(), "shutdown incomplete") {
		t.Fatalf("Shutdown = %+v, %v; want an error naming %s", resp, err, worker)
	}
	t.Logf("Shutdown: %v", err)
}

func TestShutdownWaitsForSubmissionInFlight(t *testing.T) {
	h := newHarness(t, "sbatch=gate,scancel=ok", nil)
	h.provision(t, cpuNeed)
	eventually(t, "the sbatch call", func() bool { return len(h.fake.callsTo("sbatch")) == 1 })

	done := h.shutdownAsync(30 * time.Second)
	h.shutdownBegun(t)
	h.fake.openGate(t)

	var r shutdownResult
	select {
	case r = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Shutdown did not return")
	}
	if r.err != nil || !slices.Equal(r.resp.Cancelled, []string{"4242"}) {
		t.Fatalf("Shutdown = %+v, %v", r.resp, r.err)
	}
	if n := len(h.fake.callsTo("squeue")); n != 0 {
		t.Errorf("%d squeue calls for a submission that answered", n)
	}
	if n := len(h.fake.callsTo("scancel")); n != 1 {
		t.Errorf("%d scancel calls", n)
	}
	if got := kinds(h.host.Events()); !slices.Equal(got, []shared.EventKind{shared.EventWorkerProvisioned, shared.EventWorkerCancelled}) {
		t.Errorf("events = %v", got)
	}
}

func TestShutdownFindsJobOfKilledSubmission(t *testing.T) {
	h := newHarness(t, "sbatch=hang,squeue=list,scancel=ok", nil)
	h.provision(t, cpuNeed)
	eventually(t, "the sbatch call", func() bool { return len(h.fake.callsTo("sbatch")) == 1 })
	worker := h.status(t).Outstanding[0].Worker

	start := time.Now()
	deadline := start.Add(2 * time.Second)
	resp, err := h.p.Shutdown(context.Background(), &shared.ShutdownRequest{Deadline: deadline})
	if took := time.Since(start); took > 2*time.Second+500*time.Millisecond {
		t.Errorf("Shutdown took %s with a 2s deadline", took)
	}
	if err != nil || !slices.Equal(resp.Cancelled, []string{"9001"}) {
		t.Fatalf("Shutdown = %+v, %v\n%s", resp, err, h.logs.String())
	}
	squeues := h.fake.callsTo("squeue")
	if len(squeues) != 1 {
		t.Fatalf("%d squeue calls", len(squeues))
	}
	// The format travels quoted, because the login node's shell reads it.
	if want := []string{"squeue", "-h", "-r", "--name=fluksio-hpc", "-o", "'%i|%T|%r|%S|%k|%u'"}; !slices.Equal(squeues[0].remote(), want) {
		t.Errorf("squeue = %q, want %q", squeues[0].remote(), want)
	}
	scancels := h.fake.callsTo("scancel")
	if len(scancels) != 1 || !slices.Equal(scancels[0].remote(), []string{"scancel", "9001"}) {
		t.Fatalf("scancel calls = %+v", scancels)
	}
	evs := h.host.Events()
	if got := kinds(evs); !slices.Equal(got, []shared.EventKind{shared.EventWorkerProvisionFailed, shared.EventWorkerCancelled}) {
		t.Fatalf("events = %v", got)
	}
	if evs[1].Job != "9001" || evs[1].Worker != worker || evs[1].Profile != "cpu" {
		t.Errorf("cancel event = %+v", evs[1])
	}
	assertTokenHidden(t, h, tokenFor(worker))
}

func TestShutdownScancelFails(t *testing.T) {
	h := newHarness(t, "sbatch=ok,scancel=fail", nil)
	h.provision(t, cpuNeed)
	waitEvents(t, h.host, 1)
	_, err := h.p.Shutdown(context.Background(), &shared.ShutdownRequest{})
	if err == nil || !strings.Contains(err.Error(), "4242") {
		t.Errorf("Shutdown error = %v, want one naming job 4242", err)
	}
}

func TestValidateConfigHasNoSideEffects(t *testing.T) {
	fake := newFakeCluster(t, "sbatch=ok")
	p := New(nil)
	p.sshPath = os.Args[0]
	resp, err := p.ValidateConfig(context.Background(), &shared.ValidateConfigRequest{Name: "hpc", Config: mustJSON(t, baseConfig())})
	if err != nil || len(resp.Diagnostics) != 0 {
		t.Fatalf("ValidateConfig = %+v, %v", resp, err)
	}
	if _, err := p.Provision(context.Background(), &shared.ProvisionRequest{Demand: []shared.Demand{{Need: cpuNeed, Count: 1}}}); !errors.Is(err, shared.ErrNotConfigured) {
		t.Errorf("ValidateConfig configured the provisioner: %v", err)
	}
	if n := len(fake.calls()); n != 0 {
		t.Errorf("%d ssh calls", n)
	}
}

func TestStatus(t *testing.T) {
	h := newHarness(t, "sbatch=ok", nil)
	h.provision(t, gpuNeed)
	waitEvents(t, h.host, 1)
	h.clock.Advance(90 * time.Second)
	st := h.status(t)
	if st.Name != "hpc" || st.Kind != "slurm" || !slices.Equal(st.Profiles, []string{"cpu", "gpu"}) || st.LastError != "" {
		t.Errorf("Status = %+v", st)
	}
	if len(st.Outstanding) != 1 || st.Outstanding[0].Profile != "gpu" || st.Outstanding[0].Job != "4242" || st.Outstanding[0].Age != 90*time.Second {
		t.Errorf("Outstanding = %+v", st.Outstanding)
	}
}

func TestParseJobID(t *testing.T) {
	tests := []struct {
		stdout string
		want   string
	}{
		{"4242\n", "4242"},
		{"4242", "4242"},
		{"7;sandbox\n", "7"},
		{"4242;\n", "4242"},
		{"Welcome to the cluster\n\n4242\n", "4242"},
		{"\n\n 4242 \r\n\n", "4242"},
		{"", ""},
		{"\n\n", ""},
		{"Submitted batch job 17\n", ""},
		{"42a\n", ""},
		{";cluster\n", ""},
		{"-1\n", ""},
		{"4242\nsbatch: warning: something\n", ""},
		{"123456789012345678901\n", ""},
	}
	for _, tc := range tests {
		got, err := queue.ParseJobID(tc.stdout)
		if tc.want == "" {
			if err == nil {
				t.Errorf("queue.ParseJobID(%q) = %q, want an error", tc.stdout, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("queue.ParseJobID(%q) = %q, %v, want %q", tc.stdout, got, err, tc.want)
		}
	}
}

func TestArrivedWhileSubmittingIsNotCancelled(t *testing.T) {
	h := newHarness(t, "sbatch=hang,squeue=list,scancel=ok", nil)
	h.provision(t, cpuNeed)
	eventually(t, "the sbatch call", func() bool { return len(h.fake.callsTo("sbatch")) == 1 })
	worker := h.status(t).Outstanding[0].Worker

	resp, err := h.p.Reconcile(context.Background(), &shared.ReconcileRequest{Attached: []string{worker}})
	if err != nil || !slices.Equal(resp.Arrived, []string{worker}) {
		t.Fatalf("Reconcile = %+v, %v", resp, err)
	}
	sd, err := h.p.Shutdown(context.Background(), &shared.ShutdownRequest{Deadline: time.Now().Add(time.Second)})
	if err != nil || len(sd.Cancelled) != 0 {
		t.Errorf("Shutdown = %+v, %v; an attached worker's job is not to be cancelled", sd, err)
	}
	// One look at the queue for what the cut-short submission may have
	// left, and nothing cancelled.
	if n := len(h.fake.callsTo("scancel")); n != 0 {
		t.Errorf("%d scancel calls", n)
	}
}

// TestNoSbatchAfterShutdownBegan: a request that waits for the first look
// at the queue does not go on to sbatch once Shutdown has begun. Before,
// Shutdown's stopping the look released it straight into sbatch.
func TestNoSbatchAfterShutdownBegan(t *testing.T) {
	h := newUnconfigured(t, "squeue=gate,sbatch=ok,scancel=ok")
	resp, err := h.p.Configure(context.Background(), &shared.ConfigureRequest{Name: "hpc", Config: mustJSON(t, baseConfig()), Host: h.host})
	if err != nil || resp.Diagnostics.HasErrors() {
		t.Fatal(err, resp)
	}
	eventually(t, "the first look at the queue", func() bool { return len(h.fake.callsTo("squeue")) == 1 })
	if r := h.provision(t, cpuNeed); r.Outcome != shared.OutcomeRequested {
		t.Fatalf("Provision = %+v", r)
	}
	done := h.shutdownAsync(10 * time.Second)
	// The controller answers again once Shutdown has begun, so that
	// Shutdown's own look at the queue succeeds.
	h.shutdownBegun(t)
	h.fake.openGate(t)
	if r := <-done; r.err != nil {
		t.Fatalf("Shutdown = %+v, %v", r.resp, r.err)
	}
	if n := len(h.fake.callsTo("sbatch")); n != 0 {
		t.Errorf("%d sbatch calls after Shutdown began", n)
	}
	evs := h.host.Events()
	if len(evs) != 1 || evs[0].Kind != shared.EventWorkerProvisionFailed || !strings.Contains(evs[0].Detail, "shutting down") {
		t.Errorf("events = %+v", evs)
	}
}

// TestIdleAdoptionRests: while nothing is asked for, a queue that cannot
// be read costs maxIdleAdoptFailures more squeues, not one every
// poll_interval for ever; the next Provision wakes the poller.
func TestIdleAdoptionRests(t *testing.T) {
	h := newHarness(t, "squeue=fail,sbatch=ok", nil)
	ctx := context.Background()
	for i := 0; i < 3*maxIdleAdoptFailures && h.p.poll.wanted(); i++ {
		h.p.poll.once(ctx)
	}
	if h.p.poll.wanted() {
		t.Fatalf("after %d failed squeues the idle poller still wants to poll", len(h.fake.callsTo("squeue")))
	}
	if n := len(h.fake.callsTo("squeue")); n != maxIdleAdoptFailures {
		t.Errorf("%d squeue calls while idle; want %d", n, maxIdleAdoptFailures)
	}
	h.provision(t, cpuNeed)
	if !h.p.poll.wanted() {
		t.Error("a Provision did not wake the poller")
	}
}

// TestStaleControlDirsRemoved: the ssh control directory of a plugin that
// was killed stays in /tmp; the next plugin removes it (and asks its
// master to exit), and leaves a live process's alone.
func TestStaleControlDirsRemoved(t *testing.T) {
	// The transport keeps its control directories as /tmp/fxssh-<pid>-*
	// (slurm/sshrun).
	if st, err := os.Stat("/tmp"); err != nil || !st.IsDir() {
		t.Skip("no /tmp: control directories go elsewhere")
	}
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	mk := func(pid int) string {
		dir, err := os.MkdirTemp("/tmp", "fxssh-"+strconv.Itoa(pid)+"-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	stale, live := mk(dead.Process.Pid), mk(os.Getppid())
	h := newHarness(t, "squeue=ok", nil)
	_ = h
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("the dead plugin's control directory %s is still there (%v)", stale, err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("a live process's control directory was removed: %v", err)
	}
}

// shutdownResult is what an asynchronous Shutdown returned.
type shutdownResult struct {
	resp *shared.ShutdownResponse
	err  error
}

// shutdownAsync calls Shutdown with a deadline d from now on a goroutine
// and returns where its result will arrive.
func (h *harness) shutdownAsync(d time.Duration) <-chan shutdownResult {
	done := make(chan shutdownResult, 1)
	go func() {
		resp, err := h.p.Shutdown(context.Background(), &shared.ShutdownRequest{Deadline: time.Now().Add(d)})
		done <- shutdownResult{resp, err}
	}()
	return done
}

// shutdownBegun waits until a Shutdown has begun.
func (h *harness) shutdownBegun(t *testing.T) {
	t.Helper()
	eventually(t, "Shutdown to begin", func() bool {
		h.p.mu.Lock()
		defer h.p.mu.Unlock()
		return h.p.closing.shutdownDone != nil
	})
}

// TestReconcileByChange: a Reconcile by change (contract 2.4) is applied
// to what the last one said: a worker that joined arrives, and counts as
// attached to its profile (Status) until a later change says it left; a
// call with the whole list replaces the set.
func TestReconcileByChange(t *testing.T) {
	h := newHarness(t, "sbatch=ok,scancel=ok", nil)
	ctx := context.Background()
	h.provision(t, cpuNeed)
	h.provision(t, gpuNeed)
	workers := map[string]shared.Event{}
	for _, e := range waitEvents(t, h.host, 2) {
		workers[e.Profile] = e
	}
	cpu, gpu := workers["cpu"].Worker, workers["gpu"].Worker
	attachedTo := func(profile string) int {
		for _, c := range h.status(t).Counts {
			if c.Profile == profile {
				return c.Attached
			}
		}
		return 0
	}
	steps := []struct {
		req        shared.ReconcileRequest
		arrived    []string
		cpuN, gpuN int
	}{
		{shared.ReconcileRequest{Attached: []string{"someone-else"}}, nil, 0, 0},
		{shared.ReconcileRequest{Delta: true, Joined: []string{cpu}}, []string{cpu}, 1, 0},
		// Nothing changed: nothing arrives again, the count stays.
		{shared.ReconcileRequest{Delta: true}, nil, 1, 0},
		{shared.ReconcileRequest{Delta: true, Joined: []string{gpu}, Left: []string{cpu, "someone-else"}}, []string{gpu}, 0, 1},
		// A name that left twice, or joined twice, counts once.
		{shared.ReconcileRequest{Delta: true, Joined: []string{gpu}, Left: []string{cpu}}, nil, 0, 1},
		{shared.ReconcileRequest{Attached: []string{cpu}}, nil, 1, 0},
	}
	for i, s := range steps {
		resp, err := h.p.Reconcile(ctx, &s.req)
		if err != nil || !slices.Equal(resp.Arrived, s.arrived) {
			t.Fatalf("step %d: Reconcile = %+v, %v; want arrived %v", i, resp, err, s.arrived)
		}
		if c, g := attachedTo("cpu"), attachedTo("gpu"); c != s.cpuN || g != s.gpuN {
			t.Errorf("step %d: attached cpu %d gpu %d; want %d and %d", i, c, g, s.cpuN, s.gpuN)
		}
	}
}
