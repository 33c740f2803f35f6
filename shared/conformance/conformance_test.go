package conformance_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fluksio/provision/shared/conformance"
)

// buildTestPlugin builds the shared package's test plugin into dir.
func buildTestPlugin(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "testplugin")
	if out, err := exec.Command("go", "build", "-o", bin, "../../examples/testplugin").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// The kit's own test: the shared package's test plugin must pass it.
func TestTestPluginConforms(t *testing.T) {
	if bin := os.Getenv("CONFORMANCE_FAILING_PLUGIN"); bin != "" {
		// Run by TestKitFailsAFailedProvision: the same plugin, told to
		// fail every Provision the way a rejected submission does.
		conformance.Run(t, conformance.Config{
			Binary: bin, Name: "mem",
			HCL: "greeting = \"hello\"\nfail_provision = true",
		})
		return
	}
	bin := buildTestPlugin(t, t.TempDir())
	conformance.Run(t, conformance.Config{
		Binary:  bin,
		Name:    "mem",
		HCL:     `greeting = "hello"`,
		Invalid: []conformance.Invalid{{HCL: `greeting = "boom"`, Path: []string{"greeting"}}},
	})
}

// TestKitFailsAFailedProvision runs the kit, in a child test process,
// against a plugin whose Provision fails (worker_provision_failed): the
// kit must fail and say so.
func TestKitFailsAFailedProvision(t *testing.T) {
	bin := buildTestPlugin(t, t.TempDir())
	cmd := exec.Command(os.Args[0], "-test.run=^TestTestPluginConforms$", "-test.v")
	cmd.Env = append(os.Environ(), "CONFORMANCE_FAILING_PLUGIN="+bin)
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the kit passed a plugin whose Provision fails:\n%s", out)
	}
	if !strings.Contains(string(out), "--- FAIL: TestTestPluginConforms/provision") || !strings.Contains(string(out), "Provision failed: worker_provision_failed") {
		t.Errorf("the kit failed, but not on Provision:\n%s", out)
	}
}
