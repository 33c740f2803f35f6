package slurm

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/fluksio/provision/shared"
)

func TestFairShares(t *testing.T) {
	for _, tc := range []struct {
		room   int
		shorts []int
		want   []int
	}{
		{8, []int{20, 10}, []int{5, 3}},
		{8, []int{10, 20}, []int{3, 5}},
		{3, []int{1, 100, 1}, []int{1, 1, 1}},
		{2, []int{5, 5, 5}, []int{1, 1, 0}},
		{10, []int{7, 7}, []int{5, 5}},
		{9, []int{30, 2, 2}, []int{7, 1, 1}},
	} {
		got := fairShares(tc.room, tc.shorts)
		sum := 0
		for _, n := range got {
			sum += n
		}
		if !slices.Equal(got, tc.want) || sum > tc.room {
			t.Errorf("fairShares(%d, %v) = %v, want %v", tc.room, tc.shorts, got, tc.want)
		}
	}
}

// TestSharesUnderACap: 20 needs of 1 CPU beside 10 of 2 CPUs under a
// provisioner's max_workers = 8: both profiles get machines in the first
// submission round, by their demand (5 and 3), rather than the first
// profile all 8; every short profile gets one while the room lasts.
func TestSharesUnderACap(t *testing.T) {
	h := newHarness(t, "sbatch=ok,squeue=rows,scancel=ok", func(c map[string]any) {
		c["max_workers"] = 8
		c["profile"] = []any{
			map[string]any{"name": "c1", "cpus": 1, "gpus": 0, "ram_mb": 0, "labels": nil, "sbatch": []string{"--partition=debug"}, "prerun": nil},
			map[string]any{"name": "c2", "cpus": 2, "gpus": 0, "ram_mb": 0, "labels": nil, "sbatch": []string{"--partition=debug"}, "prerun": nil},
		}
	})
	resp, err := h.p.Provision(context.Background(), &shared.ProvisionRequest{Demand: []shared.Demand{
		{Need: shared.Need{CPUs: 1}, Count: 20},
		{Need: shared.Need{CPUs: 2}, Count: 10},
	}})
	if err != nil {
		t.Fatal(err)
	}
	c1, c2 := profileDemand(resp, "c1"), profileDemand(resp, "c2")
	if c1.Requested != 5 || c2.Requested != 3 {
		t.Errorf("first round: c1 %+v, c2 %+v; want 5 and 3 of max_workers 8", c1, c2)
	}
	for _, o := range resp.Outcomes {
		if o.Outcome != shared.OutcomeRequested || o.Profile == "c1" && !strings.Contains(o.Detail, "shared among the profiles short of machines, by their demand; profile c1's share is 5") {
			t.Errorf("outcome %+v; want requested, c1's saying the room is shared", o)
		}
	}
	h.submitted(t)
	if n := len(h.fake.callsTo("sbatch")); n != 2 {
		t.Errorf("%d sbatch calls, want one per profile", n)
	}
}

// TestSharesKeepMinWorkers: a profile's min_workers comes before the
// shares, as coldFirst keeps it warm: 200 wanted of one profile beside
// another's min_workers = 2, under max_pending 64, ask for 62 and 2.
func TestSharesKeepMinWorkers(t *testing.T) {
	h := newHarness(t, "sbatch=ok,squeue=rows,scancel=ok", func(c map[string]any) {
		c["max_pending"] = 64
		c["profile"] = []any{
			map[string]any{"name": "held", "cpus": 1, "gpus": 0, "ram_mb": 100, "labels": nil, "sbatch": []string{"--partition=debug"}, "prerun": nil},
			map[string]any{"name": "warm", "cpus": 1, "gpus": 0, "ram_mb": 100, "labels": []string{"warm"}, "sbatch": []string{"--partition=debug"}, "prerun": nil, "min_workers": 2},
		}
	})
	resp, err := h.p.Provision(context.Background(), &shared.ProvisionRequest{Demand: []shared.Demand{{Need: shared.Need{CPUs: 1}, Count: 200}}})
	if err != nil {
		t.Fatal(err)
	}
	if held, warm := profileDemand(resp, "held"), profileDemand(resp, "warm"); held.Requested != 62 || warm.Requested != 2 {
		t.Errorf("held %+v, warm %+v; want 62 and 2", held, warm)
	}
	h.submitted(t)
}
