package plugin

import (
	"os"
	"strings"
	"testing"
)

// docs/plugin-protocol.md names the log-level variable a host sets.
func TestProtocolDocNamesTheLogLevelVariable(t *testing.T) {
	b, err := os.ReadFile("../../docs/plugin-protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "| `"+LogLevelEnv+"` |") {
		t.Errorf("docs/plugin-protocol.md does not name %s", LogLevelEnv)
	}
	if orphanShutdownTimeout.Seconds() > 3 || parentPollInterval.Seconds() > 1 {
		t.Errorf("the Go SDK takes longer than the 3 s (and 1 s to notice) the document asks of every plugin")
	}
}
