package bench

// Measurement 1: one submission, from the engine's Provision call to the
// worker_provisioned event that carries the job id, over the real plugin
// with multiplexing on; beside a plain ssh sbatch (a connection of its
// own) and an ssh sbatch through a ControlMaster this harness started
// (the floor for anything that shells out to ssh).

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
)

// provisionRig is a configured plugin with one pending-only profile,
// warmed by one submission.
type provisionRig struct {
	e    benchEnv
	p    *plug
	name string
}

func newProvisionRig(tb testing.TB, e benchEnv) *provisionRig {
	tb.Helper()
	r := &provisionRig{e: e, name: uniqueName("prov")}
	tb.Cleanup(func() { e.cancelJobs(tb, r.name) })
	r.p = launch(tb, e.SlurmBin, r.name, nil)
	r.p.configure(tb, e.slurmConfig(map[string]any{"multiplex": true},
		[]map[string]any{profile("pend", 1, 0, 0, nil, e.pendingSbatch())}))
	r.once(tb) // warm: the first call opens the shared connection
	return r
}

// once provisions, waits for the event and tells the plugin the worker
// attached, so the profile is free for the next call.
func (r *provisionRig) once(tb testing.TB) time.Duration {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	from := r.p.rec.len()
	t0 := time.Now()
	resp, err := r.p.prov.Provision(ctx, &shared.ProvisionRequest{Demand: []shared.Demand{{Need: shared.Need{CPUs: 1}, Count: 1}}})
	if err != nil {
		tb.Fatalf("Provision: %v", err)
	}
	if o := resp.Outcomes[0]; o.Outcome != shared.OutcomeRequested {
		tb.Fatalf("Provision: %s %s", o.Outcome, o.Detail)
	}
	got, err := r.p.rec.waitN(from, 1, eventTimeout, submitted)
	if err != nil {
		tb.Fatalf("waiting for the submission: %v\nplugin log:\n%s", err, r.p.logs.String())
	}
	ev := got[0]
	if ev.ev.Kind != shared.EventWorkerProvisioned {
		tb.Fatalf("submission failed: %s", ev.ev.Detail)
	}
	d := ev.at.Sub(t0)
	rec, err := r.p.prov.Reconcile(ctx, &shared.ReconcileRequest{Attached: []string{ev.ev.Worker}})
	if err != nil || len(rec.Arrived) != 1 {
		tb.Fatalf("Reconcile did not forget %s: %+v, %v", ev.ev.Worker, rec, err)
	}
	return d
}

// rawRig submits the same kind of script with ssh sbatch --parsable
// itself: plain, or through its own ControlMaster.
type rawRig struct {
	e    benchEnv
	name string
	mux  []string
	n    int
}

func newRawRig(tb testing.TB, e benchEnv, viaMaster bool) *rawRig {
	tb.Helper()
	r := &rawRig{e: e, name: uniqueName("raw"), mux: plainSSH}
	tb.Cleanup(func() { e.cancelJobs(tb, r.name) })
	if viaMaster {
		r.mux = startMaster(tb, e).args()
	}
	r.once(tb) // the same warm-up as the plugin gets
	return r
}

func (r *rawRig) once(tb testing.TB) time.Duration {
	tb.Helper()
	r.n++
	script := baselineScript(r.name, fmt.Sprintf("%s-w%d", r.name, r.n), r.e.pendingSbatch())
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	t0 := time.Now()
	if _, err := r.e.sbatch(ctx, r.mux, script); err != nil {
		tb.Fatal(err)
	}
	return time.Since(t0)
}

type provisionResult struct {
	plugin, plain, mux []time.Duration
	// idleRSS is the plugin's VmRSS in kB after the run, nothing
	// outstanding; idleHeap its live heap then.
	idleRSS, idleHeap int64
}

// measureProvision takes n samples of each, interleaved so that whatever
// else the machine does falls on all three alike.
func measureProvision(tb testing.TB, e benchEnv, n int) provisionResult {
	tb.Helper()
	plugin := newProvisionRig(tb, e)
	plain := newRawRig(tb, e, false)
	mux := newRawRig(tb, e, true)
	var res provisionResult
	for range n {
		res.plugin = append(res.plugin, plugin.once(tb))
		res.plain = append(res.plain, plain.once(tb))
		res.mux = append(res.mux, mux.once(tb))
	}
	rss, err := rssKB(plugin.p.pl.Pid())
	if err != nil {
		tb.Fatal(err)
	}
	res.idleRSS = rss
	res.idleHeap = liveHeapKB(tb, plugin.p.prov)
	return res
}

// BenchmarkProvision is one submission per op: provision → job id over
// the plugin, and the two ssh baselines.
func BenchmarkProvision(b *testing.B) {
	e := setup(b)
	plugin := newProvisionRig(b, e)
	plain := newRawRig(b, e, false)
	mux := newRawRig(b, e, true)
	b.Run("plugin", func(b *testing.B) { benchOnce(b, plugin.once) })
	b.Run("plain-ssh", func(b *testing.B) { benchOnce(b, plain.once) })
	b.Run("controlmaster-ssh", func(b *testing.B) { benchOnce(b, mux.once) })
}

// benchOnce runs once b.N times and reports the median and the spread.
func benchOnce(b *testing.B, once func(testing.TB) time.Duration) {
	b.ResetTimer()
	var ds []time.Duration
	for range b.N {
		ds = append(ds, once(b))
	}
	b.StopTimer()
	lo, hi := spread(ds)
	b.ReportMetric(ms(median(ds)), "ms-median")
	b.ReportMetric(ms(lo), "ms-min")
	b.ReportMetric(ms(hi), "ms-max")
}
