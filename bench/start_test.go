package bench

// Measurement 3: a plugin's start, from Launch to a successful Configure,
// for the Slurm plugin and for the trivial test plugin (the cost of any
// go-plugin process with mutual TLS and a host channel). Also where the
// idle plugins' resident sets are read.

import (
	"testing"
	"time"
)

type startRig struct {
	e    benchEnv
	name string
}

func newStartRig(tb testing.TB, e benchEnv) *startRig {
	r := &startRig{e: e, name: uniqueName("start")}
	tb.Cleanup(func() { e.cancelJobs(tb, r.name) })
	return r
}

// startOnce launches a plugin and configures it, timed; then, untimed,
// reads its VmRSS after settle (if settle > 0) and stops it.
func startOnce(tb testing.TB, path, name string, cfg map[string]any, settle time.Duration) (time.Duration, int64) {
	d, rss, _ := startOnceHeap(tb, path, name, cfg, settle)
	return d, rss
}

// startOnceHeap is startOnce that also reads the plugin's live heap (kB)
// beside its VmRSS.
func startOnceHeap(tb testing.TB, path, name string, cfg map[string]any, settle time.Duration) (time.Duration, int64, int64) {
	tb.Helper()
	t0 := time.Now()
	p, err := launchErr(path, name, nil)
	if err != nil {
		tb.Fatal(err)
	}
	defer p.stop(tb)
	if err := p.configureErr(cfg); err != nil {
		tb.Fatalf("%v\nplugin log:\n%s", err, p.logs.String())
	}
	d := time.Since(t0)
	var rss, heap int64
	if settle > 0 {
		time.Sleep(settle)
		if rss, err = rssKB(p.pl.Pid()); err != nil {
			tb.Fatal(err)
		}
		heap = liveHeapKB(tb, p.prov)
	}
	return d, rss, heap
}

func (r *startRig) slurm(tb testing.TB, settle time.Duration) (time.Duration, int64) {
	cfg := r.e.slurmConfig(nil, []map[string]any{profile("pend", 1, 0, 0, nil, r.e.pendingSbatch())})
	return startOnce(tb, r.e.SlurmBin, r.name, cfg, settle)
}

func (r *startRig) test(tb testing.TB, settle time.Duration) (time.Duration, int64) {
	d, rss, _ := r.testHeap(tb, settle)
	return d, rss
}

// testHeap is test with the plugin's live heap (kB) beside its VmRSS.
func (r *startRig) testHeap(tb testing.TB, settle time.Duration) (time.Duration, int64, int64) {
	return startOnceHeap(tb, r.e.TestBin, r.name, map[string]any{"greeting": "hi"}, settle)
}

type startResult struct {
	slurm, test []time.Duration
	// slurmRSS and testRSS are VmRSS in kB of a freshly configured plugin
	// with nothing outstanding, a second after Configure; slurmHeap and
	// testHeap their live heaps then, as they report them.
	slurmRSS, testRSS   int64
	slurmHeap, testHeap int64
}

// measureStart alternates the two plugins, n starts each.
func measureStart(tb testing.TB, e benchEnv, n int) startResult {
	tb.Helper()
	r := newStartRig(tb, e)
	var res startResult
	for i := range n {
		settle := time.Duration(0)
		if i == n-1 {
			settle = time.Second
		}
		cfg := r.e.slurmConfig(nil, []map[string]any{profile("pend", 1, 0, 0, nil, r.e.pendingSbatch())})
		d, rss, heap := startOnceHeap(tb, r.e.SlurmBin, r.name, cfg, settle)
		res.slurm = append(res.slurm, d)
		res.slurmRSS, res.slurmHeap = max(res.slurmRSS, rss), max(res.slurmHeap, heap)
		d, rss, heap = r.testHeap(tb, settle)
		res.test = append(res.test, d)
		res.testRSS, res.testHeap = max(res.testRSS, rss), max(res.testHeap, heap)
	}
	return res
}

// BenchmarkStart is one launch → configured per op.
func BenchmarkStart(b *testing.B) {
	r := newStartRig(b, setup(b))
	b.Run("slurm", func(b *testing.B) {
		benchOnce(b, func(tb testing.TB) time.Duration { d, _ := r.slurm(tb, 0); return d })
	})
	b.Run("testplugin", func(b *testing.B) {
		benchOnce(b, func(tb testing.TB) time.Duration { d, _ := r.test(tb, 0); return d })
	})
}
