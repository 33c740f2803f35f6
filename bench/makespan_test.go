package bench

// Measurement 11: makespan. A hundred tasks of five seconds each run
// through the real engine (host-example, Slurm plugin, real workers) from
// its start to "all 100 need(s) served", beside the floor measured in the
// same run: one raw sbatch --array=0-99 of sleep 5, from its submission
// until the queue is empty. The same flow with max_pending = 1, the seed's
// one-at-a-time behaviour, runs beside them. The sandbox has few CPUs, so
// all three are bounded by them alike.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

const (
	makespanTasks = 100
	makespanWork  = 5 * time.Second
)

type makespanResult struct {
	ours, oneAtATime, floor time.Duration
}

// makespanFlow runs host-example with the hundred needs and returns how
// long it took to serve them.
func makespanFlow(tb testing.TB, e benchEnv, maxPending int) time.Duration {
	tb.Helper()
	config := func(name string, port int) string {
		return e.EngineConfig(port, dirOf(e.SlurmBin), name, []string{e.HostBin, "worker"}, fmt.Sprintf(`  max_workers = %d
  max_pending = %d
  profile "cpu" {
    cpus   = 1
    ram_mb = 100
    sbatch = ["--partition=%s", "--time=00:10:00", "--output=/dev/null"]
  }
`, makespanTasks, maxPending, e.Partition))
	}
	h := startHostWith(tb, e, "span", config, "-need", fmt.Sprintf("cpus=1,count=%d,work=%s", makespanTasks, makespanWork), "-timeout", "10m")
	served := h.wait(tb, fmt.Sprintf("all %d need(s) served", makespanTasks), 10*time.Minute)
	h.exited(tb, 2*time.Minute)
	return served.at.Sub(h.started)
}

// makespanFloor submits one array of sleeps and waits for the queue to
// empty.
func makespanFloor(tb testing.TB, e benchEnv) time.Duration {
	tb.Helper()
	name := uniqueName("spanfloor")
	tb.Cleanup(func() { e.cancelJobs(tb, name) })
	script := fmt.Sprintf("#!/bin/sh\n#SBATCH --job-name=fluksio-%s\n#SBATCH --array=0-%d\n#SBATCH --cpus-per-task=1\n#SBATCH --mem=100M\n#SBATCH --partition=%s\n#SBATCH --time=00:05:00\n#SBATCH --output=/dev/null\nsleep %d\n",
		name, makespanTasks-1, e.Partition, int(makespanWork.Seconds()))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	t0 := time.Now()
	if _, err := e.sbatch(ctx, plainSSH, []byte(script)); err != nil {
		tb.Fatal(err)
	}
	for {
		n, err := e.queued(name)
		if err != nil {
			tb.Fatal(err)
		}
		if n == 0 {
			return time.Since(t0)
		}
		if ctx.Err() != nil {
			tb.Fatalf("the array of sleeps did not finish within 10 minutes (%d left)", n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func measureMakespan(tb testing.TB, e benchEnv) makespanResult {
	tb.Helper()
	var r makespanResult
	r.floor = makespanFloor(tb, e)
	r.ours = makespanFlow(tb, e, makespanTasks)
	r.oneAtATime = makespanFlow(tb, e, 1)
	return r
}

func makespanRows(rep *report, m makespanResult) {
	v, rt := ratio(float64(m.ours), float64(m.floor))
	rep.add(row{fmt.Sprintf("makespan of %d tasks × %s through host-example vs one raw sbatch --array of sleeps (floor)", makespanTasks, makespanWork),
		dur(m.ours), dur(m.floor), rt, "≤ 1.3×", verdict(v, 1.3, true, "×")})
	_, rt1 := ratio(float64(m.oneAtATime), float64(m.floor))
	rep.add(row{"the same flow with max_pending = 1 (the seed's one request at a time) vs the floor",
		dur(m.oneAtATime), dur(m.floor), rt1, "—", "info"})
}

func dirOf(path string) string { return path[:strings.LastIndexByte(path, '/')] }
