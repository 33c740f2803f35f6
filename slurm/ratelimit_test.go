package slurm

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
)

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

// TestCheckWaitsItsOwnTime: with submit_timeout = "3s" and a controller
// whose answer comes 4 s late (a rationing one, its bucket drained by
// the user's other clients), a check given 30 s waits for it and
// passes, with the cluster's facts; given 2 s, it says it waited that
// long and names -check-timeout, not submit_timeout.
func TestCheckWaitsItsOwnTime(t *testing.T) {
	cfg := baseConfig()
	cfg["submit_timeout"] = "3s"
	h := newUnconfigured(t, "scontrol=slow,sbatch=ok,sh=ok,sacctmgr=none")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := h.p.Check(ctx, &shared.CheckRequest{Name: "hpc", Config: mustJSON(t, cfg)})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Diagnostics.HasErrors() {
		t.Errorf("a check of 30 s on a controller 4 s late: %v; want it to wait", resp.Diagnostics)
	}
	if !slices.ContainsFunc(resp.Facts, func(f shared.Fact) bool { return f.Name == "MaxArraySize" && f.Value == "1001" }) {
		t.Errorf("the facts %v; want MaxArraySize read", resp.Facts)
	}

	short, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel2()
	resp, err = h.p.Check(short, &shared.CheckRequest{Name: "hpc", Config: mustJSON(t, cfg)})
	if err != nil {
		t.Fatal(err)
	}
	if d := resp.Diagnostics.Error(); !strings.Contains(d, "-check-timeout") || strings.Contains(d, "raise submit_timeout") {
		t.Errorf("a check of 2 s: %q; want it to name -check-timeout", d)
	}
}
