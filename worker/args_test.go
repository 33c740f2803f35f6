package worker

import (
	"io"
	"slices"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
)

// TestArgsRoundTrip: the command line a provisioner builds from
// shared.WorkerArgs is read back by the worker as the same machine, so
// the contract's two halves cannot drift apart.
func TestArgsRoundTrip(t *testing.T) {
	in := shared.WorkerArgs{URL: "https://engine:8470/", EngineCertSHA256: "ab12", CPUs: 8, GPUs: 2, RAMMB: 64000,
		Labels: []string{"a100", "ib"}, MaxIdle: 1500 * time.Millisecond, ArtifactURL: "https://artifacts"}
	env := func(k string) string {
		if k == shared.WorkerTokenEnv {
			return "tok"
		}
		return ""
	}
	cfg, err := ParseArgs(in.Argv(), env, io.Discard, io.Discard)
	if err != nil {
		t.Fatalf("ParseArgs(%q): %v", in.Argv(), err)
	}
	if cfg.url.String() != in.URL || cfg.engineCertSHA256 != in.EngineCertSHA256 || cfg.cpus != in.CPUs || cfg.gpus != in.GPUs ||
		cfg.ramMB != in.RAMMB || !slices.Equal(cfg.labels, in.Labels) || cfg.artifactURL != in.ArtifactURL || cfg.token != "tok" {
		t.Errorf("read back %+v from %q", cfg, in.Argv())
	}
	// Whole seconds, rounded up: never less idle time than asked for.
	if cfg.maxIdle != 2*time.Second {
		t.Errorf("max idle %s from %s; want 2s", cfg.maxIdle, in.MaxIdle)
	}
}
