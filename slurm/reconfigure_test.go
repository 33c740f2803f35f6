package slurm

import (
	"context"
	"slices"
	"testing"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/internal/queue"
)

// TestReconfigureInPlace: a second Configure replaces caps and profiles,
// keeps the requests outstanding, tries a misconfigured profile again and
// refuses a change to what the transport was built from, keeping the old
// settings; the RPC budget's rate, which the queue keeps, is the new one.
func TestReconfigureInPlace(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, "sbatch=ok", nil)
	h.provisionN(t, cpuNeed, 2)
	h.submitted(t)
	before := len(h.outstanding(t))
	if before == 0 {
		t.Fatal("nothing outstanding after a Provision of 2")
	}
	h.p.mu.Lock()
	h.p.holds.countFailureLocked("gpu", "invalid partition")
	h.p.holds.markMisconfiguredLocked("gpu", "invalid partition")
	h.p.mu.Unlock()

	refused := baseConfig()
	refused["login"] = "bob@elsewhere.example.org"
	refused["max_workers"] = 9
	resp, err := h.p.Configure(ctx, &shared.ConfigureRequest{Name: "hpc", Config: mustJSON(t, refused), Host: h.host})
	if err != nil || !resp.Diagnostics.HasErrors() || !slices.Equal(resp.Diagnostics[0].Path, []string{"login"}) {
		t.Fatalf("a second Configure changing login: %v, %+v; want an error diagnostic at login", err, resp)
	}
	if got := *h.p.settings().MaxWorkers; got == 9 {
		t.Error("a refused Configure changed max_workers")
	}

	next := baseConfig()
	next["max_workers"] = 9
	next["max_rpc_rate"] = 3.5
	next["profile"] = append(next["profile"].([]any), map[string]any{"name": "big", "cpus": 32, "sbatch": []string{"--partition=debug"}})
	resp, err = h.p.Configure(ctx, &shared.ConfigureRequest{Name: "hpc", Config: mustJSON(t, next), Host: h.host})
	if err != nil || resp.Diagnostics.HasErrors() {
		t.Fatalf("a second Configure: %v %+v", err, resp)
	}
	cfg := h.p.settings()
	if *cfg.MaxWorkers != 9 || len(cfg.Profiles) != 3 {
		t.Errorf("after a second Configure max_workers = %d and %d profiles; want 9 and 3", *cfg.MaxWorkers, len(cfg.Profiles))
	}
	if q, ok := h.p.q.(*queue.Queue); !ok || q.MaxRPCRate() != 3.5 {
		t.Errorf("after a second Configure of max_rpc_rate 3.5 the queue's budget keeps another rate")
	}
	if after := len(h.outstanding(t)); after != before {
		t.Errorf("%d requests outstanding after a second Configure, %d before", after, before)
	}
	h.p.mu.Lock()
	held := h.p.holds.backoff["gpu"] != nil && h.p.holds.backoff["gpu"].hold.kind == holdMisconfigured
	h.p.mu.Unlock()
	if held {
		t.Error("profile gpu is still held as misconfigured after a second Configure")
	}
	sr, err := h.p.Shapes(ctx, &shared.ShapesRequest{})
	if err != nil || !slices.ContainsFunc(sr.Shapes, func(s shared.Shape) bool { return s.Profile == "big" }) {
		t.Errorf("Shapes after adding profile big: %+v, %v", sr, err)
	}
}
