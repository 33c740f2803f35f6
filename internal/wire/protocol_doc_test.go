package wire

import (
	"fmt"
	"os"
	"regexp"
	"slices"
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

// protoFile is the contract's normative source.
const protoFile = "../../shared/proto/provisioner.proto"

// protoContract is what the doc's tables are checked against, read from
// the .proto's text: each rpc with its request and response, each
// message's fields (those of its oneofs included, nested messages'
// not), and each enum's values.
type protoContract struct {
	rpcs     []protoRPC
	messages map[string][]string
	enums    map[string][]string
}

type protoRPC struct {
	name, req, resp       string
	reqStream, respStream bool
}

var (
	rpcLine   = regexp.MustCompile(`^\s*rpc (\w+)\((stream )?(\w+)\) returns \((stream )?(\w+)\)`)
	blockLine = regexp.MustCompile(`^\s*(message|enum|oneof|service) (\w+) \{`)
	fieldLine = regexp.MustCompile(`^\s*(?:repeated |optional )?[\w.]+ (\w+) = \d+`)
	valueLine = regexp.MustCompile(`^\s*([A-Z][A-Z0-9_]*) = -?\d+`)
)

func readProto(t *testing.T) protoContract {
	t.Helper()
	b, err := os.ReadFile(protoFile)
	if err != nil {
		t.Fatal(err)
	}
	c := protoContract{messages: map[string][]string{}, enums: map[string][]string{}}
	type block struct{ kind, name string }
	var stack []block
	// owner is the innermost message or enum: a oneof's fields are its
	// message's.
	owner := func() block {
		for i := len(stack) - 1; i >= 0; i-- {
			if stack[i].kind != "oneof" {
				return stack[i]
			}
		}
		return block{}
	}
	for _, line := range strings.Split(string(b), "\n") {
		line, _, _ = strings.Cut(line, "//")
		if m := rpcLine.FindStringSubmatch(line); m != nil {
			c.rpcs = append(c.rpcs, protoRPC{name: m[1], reqStream: m[2] != "", req: m[3], respStream: m[4] != "", resp: m[5]})
		}
		opens, closes := strings.Contains(line, "{"), strings.Contains(line, "}")
		if m := blockLine.FindStringSubmatch(line); m != nil {
			stack = append(stack, block{m[1], m[2]})
			if m[1] == "message" {
				c.messages[m[2]] = []string{} // an empty message has no fields, and exists
			}
		} else if opens {
			stack = append(stack, block{"other", ""}) // an rpc's options
		}
		if closes && len(stack) > 0 {
			stack = stack[:len(stack)-1] // "message InfoRequest {}" opens and closes
		}
		if opens || closes {
			continue
		}
		switch o := owner(); o.kind {
		case "message":
			if m := fieldLine.FindStringSubmatch(line); m != nil {
				c.messages[o.name] = append(c.messages[o.name], m[1])
			}
		case "enum":
			if m := valueLine.FindStringSubmatch(line); m != nil {
				c.enums[o.name] = append(c.enums[o.name], m[1])
			}
		}
	}
	if len(stack) != 0 {
		t.Fatalf("%s: %d blocks left open; the reader is out of step with the file", protoFile, len(stack))
	}
	return c
}

// docTable is the table after marker in doc: its rows' cells.
func docTable(t *testing.T, doc, marker string) [][]string {
	t.Helper()
	_, after, ok := strings.Cut(doc, marker)
	if !ok {
		t.Fatalf("docs/plugin-protocol.md has no %q", marker)
	}
	var rows [][]string
	for i, line := range strings.Split(after, "\n") {
		line = strings.TrimSpace(line)
		if i == 0 && line == "" {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			if len(rows) > 0 || i > 1 {
				break
			}
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for j := range cells {
			cells[j] = strings.TrimSpace(cells[j])
		}
		rows = append(rows, cells)
	}
	if len(rows) < 2 {
		t.Fatalf("docs/plugin-protocol.md: no table after %q", marker)
	}
	return rows[2:] // past the header and its rule
}

// messageCell is a table cell as the proto makes it: "`Name{a, b}`", with
// "stream " before it for a stream.
func messageCell(stream bool, name string, fields []string) string {
	s := "`" + name + "{" + strings.Join(fields, ", ") + "}`"
	if stream {
		s = "stream " + s
	}
	return s
}

// TestProtocolDocMatchesTheProto: the method table of
// docs/plugin-protocol.md lists exactly the proto's methods, each with
// its request and response and their fields as the proto has them, and
// the conditions table exactly the proto's Condition values. The proto
// is normative; the doc's tables are its copy for readers, and a change
// to one without the other fails here with the row to write.
func TestProtocolDocMatchesTheProto(t *testing.T) {
	b, err := os.ReadFile("../../docs/plugin-protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	c := readProto(t)
	if len(c.rpcs) == 0 || len(c.messages) == 0 {
		t.Fatalf("read no rpc or message from %s", protoFile)
	}

	rows := map[string][]string{}
	for _, r := range docTable(t, doc, "<!-- methods: checked against shared/proto/provisioner.proto -->") {
		name := strings.Trim(r[0], "`")
		if _, dup := rows[name]; dup {
			t.Errorf("the method table lists %s twice", name)
		}
		rows[name] = r
	}
	for _, rpc := range c.rpcs {
		req, resp := messageCell(rpc.reqStream, rpc.req, c.messages[rpc.req]), messageCell(rpc.respStream, rpc.resp, c.messages[rpc.resp])
		r, ok := rows[rpc.name]
		delete(rows, rpc.name)
		switch {
		case !ok:
			t.Errorf("the method table misses the proto's %s; add:\n| `%s` | %s | %s | |", rpc.name, rpc.name, req, resp)
		case len(r) < 3 || r[1] != req || r[2] != resp:
			t.Errorf("the method table's %s is\n  %v\nthe proto's is\n| `%s` | %s | %s |", rpc.name, r, rpc.name, req, resp)
		}
	}
	for name := range rows {
		t.Errorf("the method table lists %s, which the proto does not have", name)
	}

	var listed []string
	for _, r := range docTable(t, doc, "<!-- conditions: checked against shared/proto/provisioner.proto -->") {
		listed = append(listed, strings.Trim(r[0], "`"))
	}
	if want := c.enums["Condition"]; !slices.Equal(listed, want) {
		t.Errorf("the conditions table lists %v; the proto's Condition has %v", listed, want)
	}
}
