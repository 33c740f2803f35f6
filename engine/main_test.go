package engine

import (
	"os"
	"testing"

	"github.com/fluksio/provision/internal/sandboxtest"
)

// TestMain removes the binaries sandboxtest.Binary built for this
// package's tests (the engine a credential test runs), which outlive
// any one test.
func TestMain(m *testing.M) {
	os.Exit(sandboxtest.Run(m))
}
