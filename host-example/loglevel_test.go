package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fluksio/provision/internal/testutil"
	"github.com/fluksio/provision/shared/plugin"
)

// TestEveryCommandSetsThePluginLogLevel runs each command that starts a
// plugin, with the Go reference plugin writing down the
// FLUKSIO_PLUGIN_LOG_LEVEL it was started with: every one must set it
// (docs/plugin-protocol.md, section 1). validate, validate -check and
// script left it unset, though the doc said it was set. The port range
// it gets must be the one the doc states (it said 0).
func TestEveryCommandSetsThePluginLogLevel(t *testing.T) {
	bin := testutil.BuildTestPlugin(t)
	dir := t.TempDir()
	// The engine's environment may set it for its plugins; here it must
	// come from the command.
	t.Setenv(plugin.LogLevelEnv, "")
	os.Unsetenv(plugin.LogLevelEnv)
	cfg := filepath.Join(dir, "engine.hcl")
	body := fmt.Sprintf("engine {\n  listen = \"127.0.0.1:0\"\n}\nprovisioner \"memory\" \"mem\" {\n  plugin = %q\n  greeting = \"hi\"\n}\n", bin)
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		main func([]string, io.Writer, io.Writer) int
		args []string
		want string
	}{
		{"validate", validateMain, []string{cfg}, "info"},
		{"validate -check", validateMain, []string{"-check", cfg}, "info"},
		{"script", scriptMain, []string{"-config", cfg, "-profile", "small"}, "info"},
		{"run", runMain, []string{"-config", cfg, "-log-level", "debug", "-need", "cpus=1", "-timeout", "1s"}, "debug"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "env")
			t.Setenv("TESTPLUGIN_ENV_FILE", file)
			tc.main(tc.args, io.Discard, io.Discard) // its outcome is not the point
			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatalf("the plugin wrote nothing: was it started? %v", err)
			}
			got := string(b)
			if want := plugin.LogLevelEnv + "=" + tc.want + "\n"; !strings.Contains(got, want) {
				t.Errorf("%s started the plugin with %q, want %s", tc.name, got, strings.TrimSpace(want))
			}
			if !strings.Contains(got, "PLUGIN_MIN_PORT=10000\nPLUGIN_MAX_PORT=25000\n") {
				t.Errorf("%s started the plugin with %q, want the ports the doc states", tc.name, got)
			}
		})
	}
	doc, err := os.ReadFile("../docs/plugin-protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "| `PLUGIN_MIN_PORT`, `PLUGIN_MAX_PORT` | `10000` and `25000`") {
		t.Error("docs/plugin-protocol.md does not state the port range the host sets")
	}
}
