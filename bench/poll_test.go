package bench

// Measurement 6: how many Slurm calls a poll cycle costs with 1, 10 and
// 100 requests outstanding. The plugin runs with a short poll_interval
// under an ssh wrapper that logs every call's argv; the calls that run
// squeue are counted over a window of whole cycles. A plugin whose schema
// has no poll_interval does not poll, and the measurement says so.

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

const (
	pollInterval = time.Second
	pollCycles   = 10
)

var pollLevels = []int{1, 10, 100}

type pollResult struct {
	// why is set when the plugin cannot be measured.
	why string
	// perCycle is squeue calls per poll cycle, by requests outstanding.
	perCycle map[int]float64
	calls    map[int]int
	// rpcs is slurmctld's RPCs from the job user per poll cycle, by
	// requests outstanding, as sdiag counts them; meRPCs is the same for
	// one squeue --me of the poll's form before (the baseline), run by
	// hand; rpcWhy says why they are not measured.
	rpcs   map[int]float64
	meRPCs float64
	rpcWhy string
}

func measurePoll(tb testing.TB, e benchEnv) pollResult {
	tb.Helper()
	name := uniqueName("poll")
	tb.Cleanup(func() { e.cancelJobs(tb, name) })
	dir, err := os.MkdirTemp("", "fxb-poll-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	log := filepath.Join(dir, "ssh.log")
	var meRPCs float64
	// The baseline: the poll's squeue as it was, with --me, by hand.
	// Before the plugin starts, so that its polls are not counted.
	if _, ok := e.UserRPCs(); ok {
		rpcBefore, _ := e.UserRPCs()
		for range pollCycles {
			if _, stderr, err := e.runSSH(context.Background(), e.sshArgv(plainSSH, "squeue", "-h", "-r", "--me", "-t", "all",
				"--name=fluksio-"+name, "-o", "'%i|%T|%r|%S|%k'"), nil); err != nil {
				tb.Fatalf("squeue --me: %v: %s", err, stderr)
			}
		}
		rpcAfter, _ := e.UserRPCs()
		meRPCs = float64(rpcAfter-rpcBefore) / pollCycles
	}
	p := launch(tb, wrappedPlugin(tb, e, log, ""), name, nil)
	most := pollLevels[len(pollLevels)-1]
	p.configure(tb, e.slurmConfig(map[string]any{"poll_interval": pollInterval.String()}, e.pendingProfiles("s", most)))
	if !p.has("poll_interval") {
		return pollResult{why: "not available: the plugin's schema has no poll_interval"}
	}

	count := func() int { return wrapperCalls(log, " squeue") }
	res := pollResult{perCycle: map[int]float64{}, calls: map[int]int{}, rpcs: map[int]float64{}, meRPCs: meRPCs}
	names := labels("s", most)
	for _, level := range pollLevels {
		if _, _, failed, detail := provisionAll(tb, p, names[:level], 2*time.Minute); failed > 0 {
			tb.Fatalf("%d submissions failed: %s", failed, detail)
		}
		if n := wrapperCalls(log, " sbatch"); n < level {
			tb.Fatalf("the ssh wrapper logged %d sbatch calls for %d submissions: the plugin did not run it", n, level)
		}
		checkOutstanding(tb, p, level)
		// A new request wakes the poller; let that settle into the
		// steady rhythm before counting.
		time.Sleep(pollInterval * 3 / 2)
		before := count()
		rpcBefore, ok1 := e.UserRPCs()
		time.Sleep(pollCycles * pollInterval)
		res.calls[level] = count() - before
		rpcAfter, ok2 := e.UserRPCs()
		res.perCycle[level] = float64(res.calls[level]) / pollCycles
		if ok1 && ok2 && res.calls[level] > 0 {
			res.rpcs[level] = float64(rpcAfter-rpcBefore) / float64(res.calls[level])
		} else {
			res.rpcWhy = "sdiag gives no count for the job user"
		}
		progress("poll: %d outstanding: %d squeue calls in %d cycles", level, res.calls[level], pollCycles)
	}
	return res
}

// BenchmarkPollCalls reports squeue calls per poll cycle at each level;
// b.N does not apply, as one measurement takes whole poll cycles.
func BenchmarkPollCalls(b *testing.B) {
	r := measurePoll(b, setup(b))
	if r.why != "" {
		b.Skip(r.why)
	}
	for _, l := range pollLevels {
		b.ReportMetric(r.perCycle[l], "squeue/cycle@"+strconv.Itoa(l))
	}
}
