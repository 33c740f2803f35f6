package bench

// Measurement 5: Reconcile end to end through the RPC, with 10,000
// attached workers and 1,000 requests outstanding, and at a tenth of
// that. The attached names are other provisioners' workers, so no call
// changes anything and every call does the same work: the steady state
// of an engine reconciling every few seconds. The outstanding requests
// are real pending jobs, submitted through the plugin. Also where the
// resident set of a plugin with 1,000 outstanding is read.

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/shared"
)

// otherWorkers are n attached names that are not this plugin's.
func otherWorkers(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("elsewhere-cpu-%08x", i)
	}
	return out
}

// reconcileLoop is the benchmark body: b.N Reconcile calls.
func reconcileLoop(p *plug, attached []string) func(*testing.B) {
	return func(b *testing.B) {
		ctx := context.Background()
		req := &shared.ReconcileRequest{Attached: attached}
		for range b.N {
			resp, err := p.prov.Reconcile(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			if len(resp.Arrived)+len(resp.Expired) != 0 {
				b.Fatalf("Reconcile changed something: %+v", resp)
			}
		}
	}
}

// reconcileByChangeLoop is the benchmark body of Reconcile as the engine
// makes it (host.AttachedTracker, contract 2.4): b.N calls, each with
// one worker joining and one leaving among the attached, so each carries
// a change of two names and the tracker diffs the whole list. The first
// call, which carries the whole list, is made before the timing.
func reconcileByChangeLoop(p *plug, attached []string) func(*testing.B) {
	return func(b *testing.B) {
		ctx := context.Background()
		info, err := p.prov.Info(ctx, &shared.InfoRequest{})
		if err != nil {
			b.Fatal(err)
		}
		tr := host.NewAttachedTracker(info, time.Hour)
		// Two lists a name apart, taken in turn.
		lists := [2][]string{attached, append(slices.Clone(attached[1:]), "elsewhere-zzz-joined")}
		call := func(list []string) {
			req := tr.Request(list, time.Now())
			resp, err := p.prov.Reconcile(ctx, req)
			tr.Answered(req, err == nil, time.Now())
			if err != nil {
				b.Fatal(err)
			}
			if len(resp.Arrived)+len(resp.Expired) != 0 {
				b.Fatalf("Reconcile changed something: %+v", resp)
			}
		}
		call(lists[1])
		b.ResetTimer()
		for i := range b.N {
			call(lists[i%2])
		}
	}
}

// checkOutstanding makes sure the plugin has n requests outstanding, each
// with a job id.
func checkOutstanding(tb testing.TB, p *plug, n int) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	st, err := p.prov.Status(ctx, &shared.StatusRequest{})
	if err != nil {
		tb.Fatal(err)
	}
	jobs := 0
	for _, o := range st.Outstanding {
		if o.Job != "" {
			jobs++
		}
	}
	if jobs != n {
		tb.Fatalf("%d requests outstanding with a job, want %d", jobs, n)
	}
}

// bigRig is a plugin with 1,000 profiles, all outstanding.
type bigRig struct {
	p *plug
	// submit is how long the 1,000 submissions took.
	submit         time.Duration
	failed         int
	rss, heap      int64 // kB: VmRSS and the live heap it reports
	queued, wanted int
}

const bigSize = 1000

func newBigRig(tb testing.TB, e benchEnv) *bigRig {
	tb.Helper()
	name := uniqueName("big")
	tb.Cleanup(func() { e.cancelJobs(tb, name) })
	r := &bigRig{p: launch(tb, e.SlurmBin, name, nil), wanted: bigSize}
	r.p.configure(tb, e.slurmConfig(map[string]any{"multiplex": true, "max_sessions": 8}, e.pendingProfiles("r", bigSize)))
	var ok int
	r.submit, ok, r.failed, _ = provisionAll(tb, r.p, labels("r", bigSize), 5*time.Minute)
	if r.failed > 0 {
		tb.Fatalf("%d of %d submissions failed", r.failed, ok+r.failed)
	}
	checkOutstanding(tb, r.p, bigSize)
	var err error
	if r.queued, err = e.queued(name); err != nil {
		tb.Fatal(err)
	}
	if r.rss, err = rssKB(r.p.pl.Pid()); err != nil {
		tb.Fatal(err)
	}
	r.heap = liveHeapKB(tb, r.p.prov)
	return r
}

// BenchmarkReconcile is one Reconcile per op at both scales. The
// outstanding requests are set up once, before either is timed.
func BenchmarkReconcile(b *testing.B) {
	e := setup(b)
	small := newBurstRig(b, e)
	small.burst(b)
	checkOutstanding(b, small.p, burstSize)
	big := newBigRig(b, e)
	b.Run("attached=1000,outstanding=100", reconcileLoop(small.p, otherWorkers(1000)))
	b.Run("attached=10000,outstanding=1000", reconcileLoop(big.p, otherWorkers(10000)))
}
