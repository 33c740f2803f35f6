package queue

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// captured is a file capture-rate-limit.sh wrote for Slurm version
// (slurm/testdata/slurm-versions).
func captured(t *testing.T, version, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "testdata", "slurm-versions", version, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestParseRateLimit reads the limiter from SlurmctldParameters as 24.11.5
// printed it with SANDBOX_RATE_LIMIT=10,1
// (testdata/slurm-versions/capture-rate-limit.sh), and from the forms
// slurm.conf(5) allows: rl_enable alone takes Slurm's defaults, and
// parameters without it are no limiter.
func TestParseRateLimit(t *testing.T) {
	if got, want := ParseRateLimit(captured(t, "24.11.5", "ratelimit-show-config.txt")), (RateLimit{On: true, Bucket: 10, Refill: 1, Period: 1}); got != want {
		t.Errorf("24.11.5's configuration: %+v; want %+v", got, want)
	}
	for _, c := range []struct {
		params string
		want   RateLimit
	}{
		{"rl_enable", RateLimit{On: true, Bucket: 30, Refill: 2, Period: 1}},
		{"enable_configless,rl_enable,rl_bucket_size=50,rl_refill_rate=5,rl_refill_period=2", RateLimit{On: true, Bucket: 50, Refill: 5, Period: 2}},
		{"rl_bucket_size=50", RateLimit{}},
		{"(null)", RateLimit{}},
		{"rl_enable,rl_bucket_size=x,rl_refill_rate=0", RateLimit{On: true, Bucket: 30, Refill: 2, Period: 1}},
	} {
		out := []byte("Configuration data as of 2026-12-02T10:00:00\nSlurmctldParameters     = " + c.params + "\nSlurmctldPidFile        = /run/slurmctld.pid\n")
		if got := ParseRateLimit(out); got != c.want {
			t.Errorf("SlurmctldParameters = %s: %+v; want %+v", c.params, got, c.want)
		}
	}
	if got := ParseRateLimit([]byte("Configuration data as of 2026-12-02T10:00:00\nClusterName = c\n")); got.On {
		t.Errorf("no SlurmctldParameters read as %+v", got)
	}
}

// TestPingRationed: 24.11.5's scontrol show config after another client
// drained the bucket is the configuration and a DOWN; the same with a
// full bucket ends UP; a failure without a configuration is an outage,
// not a rationed ping.
func TestPingRationed(t *testing.T) {
	if !PingRationed(captured(t, "24.11.5", "ratelimit-show-config-drained.txt")) {
		t.Error("the drained configuration's DOWN is not read as a rationed ping")
	}
	if PingRationed(captured(t, "24.11.5", "ratelimit-show-config.txt")) {
		t.Error("a configuration that ends UP is read as a rationed ping")
	}
	if PingRationed([]byte("slurm_load_ctl_conf error: Unable to contact slurm controller (connect failure)\nSlurmctld(primary) at ctl1 is DOWN\n")) {
		t.Error("an unreachable controller is read as a rationed ping")
	}
}

// TestWeighRationed: with the limiter on, a command that answers a
// second slower than its fastest, or runs out of its deadline, was
// rationed, and Status says "rate limited" naming it; a deadline is then
// waiting, not an outage. With the limiter off, slowness is not
// rationing, but a rationed ping still is.
func TestWeighRationed(t *testing.T) {
	q := New(nil, Config{})
	if q.weigh("squeue", 100*time.Millisecond, nil, nil) || q.weigh("squeue", 2*time.Second, nil, nil) {
		t.Fatal("a slow squeue without a limiter was taken for rationed")
	}
	if q.WaitingTurn(context.DeadlineExceeded) {
		t.Error("a deadline without a limiter is taken for waiting its turn")
	}
	if !q.weigh("scontrol", time.Second, captured(t, "24.11.5", "ratelimit-show-config-drained.txt"), errors.New("exit status 1")) {
		t.Error("a rationed ping before the limiter is known is not rationed")
	}

	q = New(nil, Config{})
	q.SetRateLimit(RateLimit{On: true, Bucket: 10, Refill: 1, Period: 1})
	note := q.RateNote(time.Now())
	if !strings.Contains(note, "no command has waited") || strings.Contains(note, "rate limited") {
		t.Errorf("the note with the limiter on and nothing rationed: %q", note)
	}
	if q.weigh("squeue", 300*time.Millisecond, nil, nil) {
		t.Error("the first squeue was taken for rationed")
	}
	if q.weigh("squeue", time.Second, nil, nil) {
		t.Error("a squeue 0.7 s slower than its fastest was taken for rationed")
	}
	if !q.weigh("squeue", 2300*time.Millisecond, nil, nil) {
		t.Error("a squeue 2 s slower than its fastest was not taken for rationed")
	}
	if !q.weigh("sbatch", 3*time.Second, nil, context.DeadlineExceeded) {
		t.Error("an sbatch cut off by its deadline was not taken for rationed")
	}
	if !q.WaitingTurn(context.DeadlineExceeded) || q.WaitingTurn(errors.New("exit status 1")) {
		t.Error("with the limiter on, a deadline should be waiting its turn and an exit status not")
	}
	note = q.RateNote(time.Now())
	q.mu.Lock()
	count := q.rationing.count
	q.mu.Unlock()
	if !strings.HasPrefix(note, "rate limited") || !strings.Contains(note, "sbatch") || !strings.Contains(note, "bucket 10, 1 back a second") || count != 2 {
		t.Errorf("after 2 rationed commands: note %q, count %d", note, count)
	}
}
