package slurm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fluksio/provision/shared"
)

// TestRelayRefusesAnotherPlatform runs the relay's check script, as the
// login node's shell would, where uname says the machine is of another
// architecture: it exits exitWrongPlatform and says what it found. The
// real login node is this machine's own kind, so a uname on PATH stands
// in for the other one.
func TestRelayRefusesAnotherPlatform(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "uname"), []byte("#!/bin/sh\necho 'Linux sparc64'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", relayCheckScript(strings.Repeat("ab", 32)))
	cmd.Env = []string{"PATH=" + dir + ":/usr/bin:/bin", "HOME=" + t.TempDir()}
	out, err := cmd.CombinedOutput()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != exitWrongPlatform || !strings.Contains(string(out), "the login node is Linux sparc64, and the plugin binary is for "+uname()) {
		t.Errorf("check on another platform: %v, said %q; want exit %d saying both", err, out, exitWrongPlatform)
	}

	// This platform, no cached binary: exitNoBinary, so that it is
	// copied. With a wrong file in its place: the same.
	home := t.TempDir()
	cmd = exec.Command("sh", "-c", relayCheckScript(strings.Repeat("ab", 32)))
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + home}
	if err := cmd.Run(); err == nil || err.(*exec.ExitError).ExitCode() != exitNoBinary {
		t.Errorf("check without the binary: %v, want exit %d", err, exitNoBinary)
	}
	os.MkdirAll(filepath.Join(home, relayCacheDir), 0o700)
	os.WriteFile(filepath.Join(home, relayCacheDir, relayFile(strings.Repeat("ab", 32))), []byte("not it"), 0o700)
	cmd = exec.Command("sh", "-c", relayCheckScript(strings.Repeat("ab", 32)))
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + home}
	if err := cmd.Run(); err == nil || err.(*exec.ExitError).ExitCode() != exitNoBinary {
		t.Errorf("check with another file in its place: %v, want exit %d", err, exitNoBinary)
	}
}

// TestRelayNeedsTheEngineAddress: reach = "relay" from an engine that
// does not say where it listens is a configuration error, not a relay
// that dials nowhere.
func TestRelayNeedsTheEngineAddress(t *testing.T) {
	h := newUnconfigured(t, "sbatch=ok")
	cfg := baseConfig()
	cfg["reach"] = "relay"
	resp, err := h.p.Configure(context.Background(), &shared.ConfigureRequest{Name: "hpc", Config: mustJSON(t, cfg), Host: h.host})
	if err != nil || !resp.Diagnostics.HasErrors() || !strings.Contains(resp.Diagnostics.Error(), "did not say where it listens") {
		t.Errorf("Configure: %v %v; want an error saying the engine address is missing", err, resp.Diagnostics)
	}
	for _, bad := range []string{"127.0.0.1:8470", "udp:127.0.0.1:1", "unix:"} {
		if _, _, err := engineAddress(bad); err == nil {
			t.Errorf("engineAddress(%q) accepted", bad)
		}
	}
}
