package queue

import (
	"context"
	"os/exec"
	"testing"
	"time"
)

// A command's outcome is told from how it failed: ssh's own exit status
// 255 is the transport, a deadline a timeout, any other exit the
// command's; the histogram counts every call at each bound it is under.
func TestMetricsCommandOutcomes(t *testing.T) {
	q := New(nil, Config{})
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
		q.count([]string{"squeue", "-h"}, start, err, rationed)
	}
	got := q.Commands()
	if len(got) != 1 {
		t.Fatalf("commands %+v, want squeue alone", got)
	}
	cs := got[0]
	if cs.Command != "squeue" || cs.Calls != 4 || cs.Errors != 1 || cs.SSHErrors != 1 || cs.Timeouts != 1 {
		t.Errorf("squeue counted as %+v; want 4 calls, 1 error, 1 ssh error, 1 timeout", cs)
	}
	if last := cs.BucketCounts[len(cs.BucketCounts)-1]; last != 4 || len(cs.Buckets) != len(cs.BucketCounts) {
		t.Errorf("the histogram's last bucket holds %d of 4 calls", last)
	}
}
