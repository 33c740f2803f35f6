package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fluksio/provision/internal/sandboxtest"
)

// TestConfigExampleIsValid keeps config.hcl.example honest: what
// docs/operators.md points operators at must pass validate against the
// real plugin.
func TestConfigExampleIsValid(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(sandboxtest.ModuleRoot(), "config.hcl.example"))
	if err != nil {
		t.Fatal(err)
	}
	plugin := sandboxtest.Binary(t, "plugin", "provisioner-slurm")
	text := strings.Replace(string(src), `plugin_dir = "bin"`, `plugin_dir = "`+filepath.Dir(plugin)+`"`, 1)
	if text == string(src) {
		t.Fatal(`config.hcl.example no longer says plugin_dir = "bin"; update this test`)
	}
	// Its ssh_key and known_hosts are an operator's to make; validate
	// says they are missing until they are there.
	path := filepath.Join(t.TempDir(), "config.hcl")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := validateMain([]string{path}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "ssh_key names /etc/fluksio/ssh/id_ed25519, which does not exist") {
		t.Errorf("validate config.hcl.example without its key: exit %d, want 1 and the key said missing\n%s", code, stderr.String())
	}
	keys := t.TempDir()
	for _, f := range []string{"id_ed25519", "known_hosts"} {
		if err := os.WriteFile(filepath.Join(keys, f), []byte("x\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(text, "/etc/fluksio/ssh/", keys+"/")), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout.Reset()
	stderr.Reset()
	if code := validateMain([]string{path}, &stdout, &stderr); code != 0 {
		t.Fatalf("validate config.hcl.example: exit %d\n%s", code, stderr.String())
	}
}
