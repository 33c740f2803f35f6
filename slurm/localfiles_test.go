package slurm

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fluksio/provision/shared"
)

// TestShippedWorkerOthersCanWrite: with worker_command unset, a worker to
// ship of mode 0777 beside the plugin is refused at worker_command by
// validation, saying its path, its mode and chmod go-w PATH; at 0755 it
// passes, and with worker_command set it is not looked at.
func TestShippedWorkerOthersCanWrite(t *testing.T) {
	p := New(nil)
	p.workerDir = t.TempDir()
	worker := filepath.Join(p.workerDir, workerProgram+"-linux-amd64")
	if err := os.WriteFile(worker, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	validate := func(cfg map[string]any) shared.Diagnostics {
		t.Helper()
		resp, err := p.ValidateConfig(context.Background(), &shared.ValidateConfigRequest{Name: "hpc", Config: mustJSON(t, cfg)})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Diagnostics
	}
	shipped := baseConfig()
	delete(shipped, "worker_command")
	if d := validate(shipped); len(d) != 0 {
		t.Fatalf("a 0755 worker to ship: %v", d)
	}
	if err := os.Chmod(worker, 0o777); err != nil {
		t.Fatal(err)
	}
	d := validate(shipped)
	if len(d) != 1 || strings.Join(d[0].Path, ".") != "worker_command" || d[0].Summary != "Worker to ship others can write" ||
		!strings.Contains(d[0].Detail, worker+" is writable by group or others (mode 0777)") || !strings.Contains(d[0].Detail, "chmod go-w "+worker) {
		t.Errorf("a 0777 worker to ship: %v", d)
	}
	if d := validate(baseConfig()); len(d) != 0 {
		t.Errorf("with worker_command set, the worker to ship was looked at: %v", d)
	}
}
