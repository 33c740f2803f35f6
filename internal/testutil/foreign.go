package testutil

import (
	"os"
	"testing"

	"github.com/fluksio/provision/slurm/rpcbudget"
)

// ForeignDir makes the directory path (0700) and gives it to uid and gid
// 65534, another user than the test's; the test is skipped unless it
// runs as root, which alone can give a file away.
func ForeignDir(t testing.TB, path string) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("gives a directory to uid 65534: needs root")
	}
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, 65534, 65534); err != nil {
		t.Fatal(err)
	}
}

// SquattedBudgetDir points TMPDIR at a directory of the test's own and
// makes the RPC budget's directory there (rpcbudget.DefaultDir) another
// user's, as a squatter who made it first would; it returns its path.
func SquattedBudgetDir(t *testing.T) string {
	t.Helper()
	t.Setenv("TMPDIR", t.TempDir())
	dir := rpcbudget.DefaultDir()
	ForeignDir(t, dir)
	return dir
}
