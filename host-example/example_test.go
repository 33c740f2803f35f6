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
	path := filepath.Join(t.TempDir(), "config.hcl")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := validateMain([]string{path}, &stdout, &stderr); code != 0 {
		t.Fatalf("validate config.hcl.example: exit %d\n%s", code, stderr.String())
	}
}
