package bench

// Measurement 13: the Slurm plugin at 100, 1,000 and 10,000 machines
// outstanding (issue 30). For each size, one plugin asks for that many
// machines of one profile whose jobs stay pending (one array per
// MaxArraySize tasks), and the harness takes, with all of them in the
// queue: the plugin's resident set; its own CPU time per poll cycle (the
// squeue's output read and judged against the books: the plugin
// process's utime+stime from /proc over whole cycles, per squeue it ran,
// so that ssh and squeue, which are other processes, are not in it); and
// its Shutdown: how many scancel calls it made and how long until squeue
// lists none of its jobs. Each row gives the 10,000/1,000 ratio, which
// must stay at most 12× (linear, with room for noise).
//
// The 10,000 row takes about a minute and a 1.8 MB script on the
// sandbox; BENCH_SCALE_MAX=1000 leaves it out where that is too much.

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
)

// scaleSizes are the sizes measured, smallest first.
var scaleSizes = []int{100, 1000, 10000}

type scaleResult struct {
	n     int
	rssKB int64
	// cpuPerCycle is the plugin's own CPU time per poll cycle.
	cpuPerCycle time.Duration
	cycles      int
	// scancels is how many scancel calls Shutdown made; gone is Shutdown's
	// start until squeue listed none of the jobs; shutdown is Shutdown's
	// own time.
	scancels       int
	gone, shutdown time.Duration
	// submit is the Provision until every job id came back.
	submit time.Duration
}

func scaleMax() int {
	if n, err := strconv.Atoi(os.Getenv("BENCH_SCALE_MAX")); err == nil && n > 0 {
		return n
	}
	return scaleSizes[len(scaleSizes)-1]
}

func measureScale(tb testing.TB, e benchEnv, n int) scaleResult {
	tb.Helper()
	name := uniqueName(fmt.Sprintf("scale%d", n))
	tb.Cleanup(func() { e.cancelJobs(tb, name) })
	dir, err := os.MkdirTemp("", "fxb-scale-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	log, errLog := dir+"/ssh.log", dir+"/ssh.err"
	p := launch(tb, wrappedPlugin(tb, e, log, errLog), name, nil)
	p.configure(tb, e.slurmConfig(map[string]any{"multiplex": true, "max_workers": n, "max_pending": n, "poll_interval": pollInterval.String(), "submit_timeout": "120s"},
		[]map[string]any{profile("sc", 1, 0, 0, nil, e.pendingSbatch())}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	waitStarted(tb, ctx, p)

	res := scaleResult{n: n}
	from := p.rec.len()
	t0 := time.Now()
	deadline := t0.Add(5 * time.Minute)
	for {
		resp, err := p.prov.Provision(ctx, &shared.ProvisionRequest{Demand: []shared.Demand{{Need: shared.Need{Label: "sc"}, Count: n}}})
		if err != nil {
			tb.Fatalf("Provision: %v", err)
		}
		if pd := resp.Profiles; len(pd) == 1 && pd[0].OnTheWay >= n {
			break
		}
		if time.Now().After(deadline) {
			tb.Fatalf("the %d were not on their way within 5 minutes: %+v", n, resp.Profiles)
		}
		time.Sleep(200 * time.Millisecond)
	}
	got, err := p.rec.waitN(from, n, 5*time.Minute, submitted)
	if err != nil {
		tb.Fatalf("waiting for %d submissions: %v (the host channel dropped %d events)\nplugin log tail:\n%s", n, err, p.pl.DroppedEvents(), tail(p.logs.String(), 20))
	}
	for _, s := range got {
		if s.ev.Kind != shared.EventWorkerProvisioned {
			tb.Fatalf("a machine failed: %s", s.ev.Detail)
		}
		res.submit = max(res.submit, s.at.Sub(t0))
	}
	if q, err := e.queued(name); err != nil || q < n {
		tb.Fatalf("squeue lists %d of the %d machines (%v)", q, n, err)
	}

	// The poller over whole cycles, everything outstanding. The first
	// cycle after the burst is let pass, so that what is counted is the
	// steady state.
	pid := p.pl.Pid()
	waitCalls(tb, log, " squeue", wrapperCalls(log, " squeue")+1, time.Minute)
	before, cpu0 := wrapperCalls(log, " squeue"), cpuTime(tb, pid)
	waitCalls(tb, log, " squeue", before+pollCycles/2, 2*time.Minute)
	// The cycle's own work follows its squeue: wait for the next to start
	// and count the cycles between.
	res.cycles = wrapperCalls(log, " squeue") - before
	res.cpuPerCycle = (cpuTime(tb, pid) - cpu0) / time.Duration(max(1, res.cycles))
	if res.rssKB, err = rssKB(pid); err != nil {
		tb.Fatal(err)
	}

	// Shutdown, as the engine makes it.
	scancels := wrapperCalls(log, " scancel")
	ts := time.Now()
	sctx, scancel := context.WithTimeout(ctx, 2*time.Minute)
	_, err = p.prov.Shutdown(sctx, &shared.ShutdownRequest{Deadline: time.Now().Add(time.Minute)})
	scancel()
	res.shutdown = time.Since(ts)
	if err != nil {
		tb.Fatalf("Shutdown: %v", err)
	}
	res.scancels = wrapperCalls(log, " scancel") - scancels
	for {
		q, err := e.queued(name)
		if err == nil && q == 0 {
			res.gone = time.Since(ts)
			break
		}
		if time.Since(ts) > 2*time.Minute {
			tb.Fatalf("%d of the %d still in squeue 2 minutes after Shutdown (%v)", q, n, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return res
}

// waitCalls waits until the wrapper's log holds n calls containing substr.
func waitCalls(tb testing.TB, log, substr string, n int, timeout time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for wrapperCalls(log, substr) < n {
		if time.Now().After(deadline) {
			tb.Fatalf("%d calls of%s within %s, want %d", wrapperCalls(log, substr), substr, timeout, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cpuTime is a process's own user and system time, from /proc/PID/stat
// (fields 14 and 15, in clock ticks of 1/100 s on Linux).
func cpuTime(tb testing.TB, pid int) time.Duration {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// The command name, field 2, is in parentheses and may hold spaces.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		tb.Fatalf("/proc/%d/stat: %q", pid, s)
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// scaleRows are the table's rows for measurement 13.
func scaleRows(rep *report, rs []scaleResult) {
	by := map[int]scaleResult{}
	var sizes []string
	for _, r := range rs {
		by[r.n] = r
		sizes = append(sizes, strconv.Itoa(r.n))
	}
	big, mid := by[10000], by[1000]
	grows := func(a, b float64) (string, string) {
		if a == 0 || b == 0 {
			return "—", "—"
		}
		v, s := ratio(a, b)
		return s, verdict(v, 12, true, "×")
	}
	figures := func(f func(scaleResult) string) string {
		var out []string
		for _, r := range rs {
			out = append(out, f(r))
		}
		return strings.Join(out, " / ")
	}
	at := strings.Join(sizes, " / ")

	rt, gv := grows(float64(big.rssKB), float64(mid.rssKB))
	rep.add(row{fmt.Sprintf("plugin RSS with %s machines outstanding (10,000: ≤ 60 MB)", at),
		figures(func(r scaleResult) string { return fmt.Sprintf("%.1f MB", mb(r.rssKB)) }), "1,000", rt, "10,000/1,000 ≤ 12×", gv})
	if big.n > 0 {
		rep.add(row{"plugin RSS with 10,000 machines outstanding", fmt.Sprintf("%.1f MB", mb(big.rssKB)), "—", "—", "≤ 60 MB", verdict(mb(big.rssKB), 60, true, "MB")})
	}
	rt, gv = grows(float64(big.cpuPerCycle), float64(mid.cpuPerCycle))
	rep.add(row{fmt.Sprintf("plugin CPU per poll cycle (its one squeue read and judged), %s outstanding", at),
		figures(func(r scaleResult) string { return dur(r.cpuPerCycle) }), "1,000", rt, "10,000/1,000 ≤ 12×", gv})
	if big.n > 0 {
		rep.add(row{"plugin CPU per poll cycle, 10,000 outstanding", dur(big.cpuPerCycle), "—", "—", "≤ 50 ms", verdict(ms(big.cpuPerCycle), 50, true, "ms")})
	}
	rt, gv = grows(float64(big.gone), float64(mid.gone))
	rep.add(row{fmt.Sprintf("Shutdown with %s outstanding → none in squeue", at),
		figures(func(r scaleResult) string { return dur(r.gone) }), "1,000", rt, "10,000/1,000 ≤ 12×", gv})
	for _, r := range rs {
		limit := (r.n + 999) / 1000
		res := "PASS"
		if r.scancels > limit || r.gone > 30*time.Second {
			res = fmt.Sprintf("MISS (%d scancel, %s)", r.scancels, dur(r.gone))
		}
		rep.add(row{fmt.Sprintf("Shutdown of %d outstanding: scancel calls, and all gone from squeue", r.n),
			fmt.Sprintf("%d, %s", r.scancels, dur(r.gone)), "—", "—", fmt.Sprintf("≤ %d, ≤ 30 s", limit), res})
	}
	rep.note("Scale (measurement 13): the poll cycles counted were %s; the plugin's Shutdown call itself took %s; the bursts took %s from the Provision to the last job id.",
		figures(func(r scaleResult) string { return strconv.Itoa(r.cycles) }),
		figures(func(r scaleResult) string { return dur(r.shutdown) }),
		figures(func(r scaleResult) string { return dur(r.submit) }))
}
