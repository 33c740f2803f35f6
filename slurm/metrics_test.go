package slurm

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
)

// A command's outcome is told from how it failed: ssh's own exit status
// 255 is the transport, a deadline a timeout, any other exit the
// command's; the histogram counts every call at each bound it is under.
func TestMetricsCommandOutcomes(t *testing.T) {
	var m metrics
	run := func(script string, timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		err := exec.CommandContext(ctx, "sh", "-c", script).Run()
		if ctx.Err() != nil {
			err = context.DeadlineExceeded
		}
		return err
	}
	for _, c := range []struct {
		script  string
		timeout time.Duration
	}{{"exit 0", time.Minute}, {"exit 1", time.Minute}, {"exit 255", time.Minute}, {"sleep 5", 50 * time.Millisecond}} {
		start := time.Now()
		err := run(c.script, c.timeout)
		rationed := false
		m.command([]string{"squeue", "-h"}, start, &err, &rationed)
	}
	m.failedMachines("cpu", submitFailureClass(&exec.ExitError{}, "sbatch: error: invalid partition specified: nope"), 3)
	m.failed("cpu", shared.FailureTimedOut)
	got := m.counters()
	if len(got.Commands) != 1 {
		t.Fatalf("commands %+v, want squeue alone", got.Commands)
	}
	cs := got.Commands[0]
	if cs.Command != "squeue" || cs.Calls != 4 || cs.Errors != 1 || cs.SSHErrors != 1 || cs.Timeouts != 1 {
		t.Errorf("squeue counted as %+v; want 4 calls, 1 error, 1 ssh error, 1 timeout", cs)
	}
	if last := cs.BucketCounts[len(cs.BucketCounts)-1]; last != 4 || len(cs.Buckets) != len(cs.BucketCounts) {
		t.Errorf("the histogram's last bucket holds %d of 4 calls", last)
	}
	if len(got.Failures) != 2 || got.Failures[0].Count+got.Failures[1].Count != 4 {
		t.Errorf("failures %+v, want 3 + 1", got.Failures)
	}
}
