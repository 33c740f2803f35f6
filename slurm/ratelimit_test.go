package slurm

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
)

// captured is a file capture-rate-limit.sh wrote for Slurm version.
func captured(t *testing.T, version, name string) []byte {
	t.Helper()
	return []byte(fixture(t, filepath.Join("testdata", "slurm-versions", version), name))
}

// TestParseRateLimit reads the limiter from SlurmctldParameters as 24.11.5
// printed it with SANDBOX_RATE_LIMIT=10,1
// (testdata/slurm-versions/capture-rate-limit.sh), and from the forms
// slurm.conf(5) allows: rl_enable alone takes Slurm's defaults, and
// parameters without it are no limiter.
func TestParseRateLimit(t *testing.T) {
	if got, want := parseRateLimit(captured(t, "24.11.5", "ratelimit-show-config.txt")), (rateLimit{on: true, bucket: 10, refill: 1, period: 1}); got != want {
		t.Errorf("24.11.5's configuration: %+v; want %+v", got, want)
	}
	for _, c := range []struct {
		params string
		want   rateLimit
	}{
		{"rl_enable", rateLimit{on: true, bucket: 30, refill: 2, period: 1}},
		{"enable_configless,rl_enable,rl_bucket_size=50,rl_refill_rate=5,rl_refill_period=2", rateLimit{on: true, bucket: 50, refill: 5, period: 2}},
		{"rl_bucket_size=50", rateLimit{}},
		{"(null)", rateLimit{}},
		{"rl_enable,rl_bucket_size=x,rl_refill_rate=0", rateLimit{on: true, bucket: 30, refill: 2, period: 1}},
	} {
		out := []byte("Configuration data as of 2026-12-02T10:00:00\nSlurmctldParameters     = " + c.params + "\nSlurmctldPidFile        = /run/slurmctld.pid\n")
		if got := parseRateLimit(out); got != c.want {
			t.Errorf("SlurmctldParameters = %s: %+v; want %+v", c.params, got, c.want)
		}
	}
	if got := parseRateLimit([]byte("Configuration data as of 2026-12-02T10:00:00\nClusterName = c\n")); got.on {
		t.Errorf("no SlurmctldParameters read as %+v", got)
	}
}

// TestPingRationed: 24.11.5's scontrol show config after another client
// drained the bucket is the configuration and a DOWN; the same with a
// full bucket ends UP; a failure without a configuration is an outage,
// not a rationed ping.
func TestPingRationed(t *testing.T) {
	if !pingRationed(captured(t, "24.11.5", "ratelimit-show-config-drained.txt")) {
		t.Error("the drained configuration's DOWN is not read as a rationed ping")
	}
	if pingRationed(captured(t, "24.11.5", "ratelimit-show-config.txt")) {
		t.Error("a configuration that ends UP is read as a rationed ping")
	}
	if pingRationed([]byte("slurm_load_ctl_conf error: Unable to contact slurm controller (connect failure)\nSlurmctld(primary) at ctl1 is DOWN\n")) {
		t.Error("an unreachable controller is read as a rationed ping")
	}
}

// TestWeighRationed: with the limiter on, a command that answers a
// second slower than its fastest, or runs out of its deadline, was
// rationed, and Status says "rate limited" naming it; a deadline is then
// waiting, not an outage. With the limiter off, slowness is not
// rationing, but a rationed ping still is.
func TestWeighRationed(t *testing.T) {
	p := New(nil)
	if p.weigh("squeue", 100*time.Millisecond, nil, nil) || p.weigh("squeue", 2*time.Second, nil, nil) {
		t.Fatal("a slow squeue without a limiter was taken for rationed")
	}
	if p.waitingTurn(context.DeadlineExceeded) {
		t.Error("a deadline without a limiter is taken for waiting its turn")
	}
	if !p.weigh("scontrol", time.Second, captured(t, "24.11.5", "ratelimit-show-config-drained.txt"), errors.New("exit status 1")) {
		t.Error("a rationed ping before the limiter is known is not rationed")
	}

	p = New(nil)
	p.rationing.limit = rateLimit{on: true, bucket: 10, refill: 1, period: 1}
	p.mu.Lock()
	note := p.rateNoteLocked(p.now())
	p.mu.Unlock()
	if !strings.Contains(note, "no command has waited") || strings.Contains(note, "rate limited") {
		t.Errorf("the note with the limiter on and nothing rationed: %q", note)
	}
	if p.weigh("squeue", 300*time.Millisecond, nil, nil) {
		t.Error("the first squeue was taken for rationed")
	}
	if p.weigh("squeue", time.Second, nil, nil) {
		t.Error("a squeue 0.7 s slower than its fastest was taken for rationed")
	}
	if !p.weigh("squeue", 2300*time.Millisecond, nil, nil) {
		t.Error("a squeue 2 s slower than its fastest was not taken for rationed")
	}
	if !p.weigh("sbatch", 3*time.Second, nil, context.DeadlineExceeded) {
		t.Error("an sbatch cut off by its deadline was not taken for rationed")
	}
	if !p.waitingTurn(context.DeadlineExceeded) || p.waitingTurn(errors.New("exit status 1")) {
		t.Error("with the limiter on, a deadline should be waiting its turn and an exit status not")
	}
	p.mu.Lock()
	note = p.rateNoteLocked(p.now())
	count := p.rationing.count
	p.mu.Unlock()
	if !strings.HasPrefix(note, "rate limited") || !strings.Contains(note, "sbatch") || !strings.Contains(note, "bucket 10, 1 back a second") || count != 2 {
		t.Errorf("after 2 rationed commands: note %q, count %d", note, count)
	}
}

// TestCheckRateLimited is the stand-in beside
// TestIntegrationRateLimitedCheck, for a machine without Slurm 23.02:
// scontrol show config that ends DOWN with exit 1 after the configuration
// is a pass that says the check was rate limited, not "Slurm not
// reachable"; one that printed nothing still fails.
func TestCheckRateLimited(t *testing.T) {
	h := newUnconfigured(t, "scontrol=rationed,sbatch=ok,sh=ok,sacctmgr=none")
	resp, err := h.p.Check(context.Background(), &shared.CheckRequest{Name: "hpc", Config: mustJSON(t, baseConfig())})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range resp.Diagnostics {
		if d.Severity == shared.SeverityError {
			t.Errorf("the check failed: %v %s: %s", d.Path, d.Summary, d.Detail)
		}
	}
	facts := map[string]string{}
	for _, f := range resp.Facts {
		facts[f.Name] = f.Value
	}
	if f := facts["RPC rate limiter"]; !strings.HasPrefix(f, "rate limited: on") || !strings.Contains(f, "10 RPCs at once") || !strings.Contains(f, "poll costs 2 every 1h0m0s") {
		t.Errorf("the limiter's fact: %q", f)
	}
	if facts["MaxArraySize"] != "10001" || facts["cluster"] != "sandbox" {
		t.Errorf("the facts of a rationed configuration were not read: %v", facts)
	}

	h = newUnconfigured(t, "scontrol=fail,sbatch=ok,sh=ok,sacctmgr=none")
	resp, err = h.p.Check(context.Background(), &shared.CheckRequest{Name: "hpc", Config: mustJSON(t, baseConfig())})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(resp.Diagnostics.Error(), "Slurm not reachable") {
		t.Errorf("a controller that printed nothing: %v; want Slurm not reachable", resp.Diagnostics)
	}
}
