package conformance_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/fluksio/provision/shared/conformance"
)

// The kit's own test: the shared package's test plugin must pass it.
func TestTestPluginConforms(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "testplugin")
	if out, err := exec.Command("go", "build", "-o", bin, "../testdata/testplugin").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	conformance.Run(t, conformance.Config{
		Binary:  bin,
		Name:    "mem",
		HCL:     `greeting = "hello"`,
		Invalid: []conformance.Invalid{{HCL: `greeting = "boom"`, Path: []string{"greeting"}}},
	})
	_ = os.Remove(bin)
}
