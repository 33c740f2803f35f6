package slurm

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

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
		if _, _, err := h.p.q.Run(context.Background(), nil, "squeue", "-h", "--me"); err != nil {
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
