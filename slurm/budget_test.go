package slurm

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// TestRPCCost: what each command the plugin runs costs slurmctld, as
// sdiag counted it on 24.11.5 (budget.go).
func TestRPCCost(t *testing.T) {
	for _, c := range []struct {
		remote []string
		want   float64
	}{
		{[]string{"squeue", "-h", "--me", "-o", "%i"}, 3},
		{[]string{"squeue", "-h", "-o", "%i"}, 2},
		{[]string{"squeue", "--only-job-state", "--me"}, 1},
		{[]string{"sbatch", "--parsable"}, 1},
		{[]string{"sbatch", "--test-only"}, 2},
		{[]string{"squeue", "-h", "-j", "7"}, 3},
		{[]string{"sinfo", "-h"}, 2},
		{[]string{"scontrol", "show", "config"}, 2},
		{[]string{"scontrol", "show", "job", "7"}, 1},
		{[]string{"scancel", "7", "8_1", "9"}, 3},
		{[]string{"scancel", "--me", "--name=x"}, 2},
		{[]string{"sacctmgr", "show", "assoc"}, 0},
		{[]string{"sh", "-c", "mkdir -p x"}, 0},
		{nil, 0},
	} {
		if got := rpcCost(c.remote); got != c.want {
			t.Errorf("rpcCost(%q) = %g, want %g", c.remote, got, c.want)
		}
	}
}

// TestBudgetRate: max_rpc_rate, and three quarters of the site's refill
// with a third of its bucket once the limiter is read.
func TestBudgetRate(t *testing.T) {
	for _, c := range []struct {
		max         float64
		limit       rateLimit
		rate, burst float64
	}{
		{1.5, rateLimit{}, 1.5, budgetBurst},
		{1.5, rateLimit{on: true, bucket: 30, refill: 2, period: 1}, 1.5, budgetBurst},
		{1.5, rateLimit{on: true, bucket: 10, refill: 1, period: 1}, 0.75, 10.0 / 3},
		{100, rateLimit{on: true, bucket: 3, refill: 4, period: 2}, 1.5, 1},
	} {
		if rate, burst := budgetRate(c.max, c.limit); rate != c.rate || burst != c.burst {
			t.Errorf("budgetRate(%g, %+v) = %g, %g; want %g, %g", c.max, c.limit, rate, burst, c.rate, c.burst)
		}
	}
}

// TestMaxRPCRateValidated: a max_rpc_rate of 0, below or past the bound
// is an error at the attribute that says what it is.
func TestMaxRPCRateValidated(t *testing.T) {
	for _, v := range []float64{0, -1, 5000} {
		c := baseConfig()
		c["max_rpc_rate"] = v
		_, diags := parseConfig("hpc", mustJSON(t, c))
		if !diags.HasErrors() || fmt.Sprint(diags[0].Path) != "[max_rpc_rate]" || !strings.Contains(diags[0].Detail, "RPCs a second") {
			t.Errorf("max_rpc_rate %g: %+v", v, diags)
		}
	}
	c := baseConfig()
	delete(c, "max_rpc_rate")
	if s, diags := parseConfig("hpc", mustJSON(t, c)); diags.HasErrors() || s.maxRPCRate != defaultMaxRPCRate {
		t.Errorf("unset: %v %+v", s.maxRPCRate, diags)
	}
}

// TestBudgetPacesAndSays: with max_rpc_rate 2, squeues of 3 RPCs each
// past the burst of 10 wait for the budget (a stand-in ssh: the
// provisioner's own pacing, before any command runs), and Status says
// the polls are slower and why. Each login has a budget of its own.
func TestBudgetPacesAndSays(t *testing.T) {
	login := fmt.Sprintf("budget%d@login.example.org", os.Getpid())
	h := newHarness(t, "squeue=ok", func(c map[string]any) {
		c["login"], c["max_rpc_rate"] = login, 2.0
	})
	start := time.Now()
	for range 6 {
		if _, _, err := h.p.call(context.Background(), nil, "squeue", "-h", "--me"); err != nil {
			t.Fatal(err)
		}
	}
	// 18 RPCs: 10 at once, 8 more at 2 a second.
	if took := time.Since(start); took < 3900*time.Millisecond {
		t.Errorf("6 squeues took %s; the budget lets 18 RPCs through no sooner than 4s", took)
	}
	notes := strings.Join(h.status(t).Notes, "\n")
	if !strings.Contains(notes, "polling slower than poll_interval: the RPC budget of "+login) || !strings.Contains(notes, "allows 2 RPCs a second") {
		t.Errorf("Status notes:\n%s\nwant the budget's note", notes)
	}
}
