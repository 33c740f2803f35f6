package testutil

import (
	"os"
	"os/exec"
	"testing"
)

// LookPath returns the path of a program a test needs. Without it the
// test is skipped on a developer's machine, and fails in CI (CI set),
// where .ci/run installs everything the tests need: a test that silently
// skips there proves nothing.
func LookPath(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not installed: in CI this is a failure, not a skip (.ci/run installs it)", name)
		}
		t.Skipf("no %s", name)
	}
	return path
}
