package queue

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/fluksio/provision/internal/testutil"
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
		{partitionTimesArgs, 1},
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

// TestPrepayUnkeptBudget: with the budget's directory another user's
// (uid 65534, where TMPDIR leads), Prepay does not mark its context paid,
// and the sbatch run under it is not run: Run says the path and the
// fix, and logs nothing unpaced. With the directory this user's again,
// Prepay pays, and the sbatch under its context costs nothing more.
func TestPrepayUnkeptBudget(t *testing.T) {
	dir := testutil.SquattedBudgetDir(t)
	// No transport: a command that got past the budget would panic.
	q := New(nil, Config{BudgetKey: "u@login", MaxRPCRate: 1000})
	if err := OpenBudget("u@login", 1000); err == nil || !strings.Contains(err.Error(), "rm -r "+dir) {
		t.Errorf("OpenBudget = %v; want the directory refused with its fix", err)
	}
	ctx := q.Prepay(context.Background())
	if ctx.Value(prepaidKey{}) != nil {
		t.Fatal("a budget that cannot be kept was paid")
	}
	_, _, err := q.Run(ctx, nil, "sbatch", "--parsable")
	if err == nil || !strings.Contains(err.Error(), "sbatch not run") || !strings.Contains(err.Error(), dir+" is owned by uid 65534") {
		t.Errorf("Run(sbatch) = %v; want it not run, saying the directory's owner", err)
	}

	if err := os.Chown(dir, 0, 0); err != nil {
		t.Fatal(err)
	}
	ctx = q.Prepay(context.Background())
	if ctx.Value(prepaidKey{}) == nil {
		t.Fatal("a budget that is kept was not paid")
	}
	if err := q.spend(ctx, []string{"sbatch"}); err != nil {
		t.Errorf("the prepaid sbatch: %v", err)
	}
}
