package slurm

import (
	"context"
	"strings"
	"testing"

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
