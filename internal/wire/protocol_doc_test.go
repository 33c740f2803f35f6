package wire

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/fluksio/provision/shared"
)

// docs/plugin-protocol.md is what a plugin author in another language
// builds from: the values it states that this package defines must be
// the ones the host uses.
func TestProtocolDocStatesTheValues(t *testing.T) {
	b, err := os.ReadFile("../../docs/plugin-protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	want := []string{
		fmt.Sprintf("| `%s` | the magic cookie `%s`", Handshake.MagicCookieKey, Handshake.MagicCookieValue),
		fmt.Sprintf("comma-separated: `%d`", ProtocolVersion),
		fmt.Sprintf("1|%d|unix|", ProtocolVersion),
		fmt.Sprintf("application protocol `%d`", ProtocolVersion),
		fmt.Sprintf("`contract_version` `%s`", shared.ContractVersion),
		fmt.Sprintf("`domain: %q`", errorDomain),
		fmt.Sprintf("service `%s`", "plugin"),
	}
	for _, w := range wireErrors {
		want = append(want, fmt.Sprintf("| `%s` | %s (%d) |", w.reason, strings.ToUpper(snake(w.code.String())), int(w.code)))
	}
	for _, w := range want {
		if !strings.Contains(doc, w) {
			t.Errorf("docs/plugin-protocol.md does not say %q", w)
		}
	}
}

// snake turns gRPC's code names (FailedPrecondition) into the proto's
// (FAILED_PRECONDITION).
func snake(s string) string {
	var b strings.Builder
	for i, r := range s {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return b.String()
}
