package queue

import "testing"

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
		if got := RPCCost(c.remote); got != c.want {
			t.Errorf("RPCCost(%q) = %g, want %g", c.remote, got, c.want)
		}
	}
}

// TestBudgetRate: max_rpc_rate, and three quarters of the site's refill
// with a third of its bucket once the limiter is read.
func TestBudgetRate(t *testing.T) {
	for _, c := range []struct {
		max         float64
		limit       RateLimit
		rate, burst float64
	}{
		{1.5, RateLimit{}, 1.5, budgetBurst},
		{1.5, RateLimit{On: true, Bucket: 30, Refill: 2, Period: 1}, 1.5, budgetBurst},
		{1.5, RateLimit{On: true, Bucket: 10, Refill: 1, Period: 1}, 0.75, 10.0 / 3},
		{100, RateLimit{On: true, Bucket: 3, Refill: 4, Period: 2}, 1.5, 1},
	} {
		if rate, burst := budgetRate(c.max, c.limit); rate != c.rate || burst != c.burst {
			t.Errorf("budgetRate(%g, %+v) = %g, %g; want %g, %g", c.max, c.limit, rate, burst, c.rate, c.burst)
		}
	}
}
