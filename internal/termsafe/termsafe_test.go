package termsafe

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode"
)

// Raw is the first character in s a terminal would act on, or that
// hides or reorders text, and false when there is none: what no
// escaped output may hold.
func Raw(s string) (rune, bool) {
	for _, r := range s {
		if r != '\n' && r != '\t' && !unicode.IsGraphic(r) {
			return r, true
		}
	}
	return 0, false
}

// TestEscape: each class of character that changes how a line reads is
// shown as a visible escape, and printable text (accents, CJK, emoji,
// spaces) is left alone.
func TestEscape(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"hpc\u202etxt.exe", `hpc\u202etxt.exe`},                           // RLO, the attack's
		{"a\u202ab\u202bc\u202cd\u202de", `a\u202ab\u202bc\u202cd\u202de`}, // the other embeddings and overrides
		{"\u2066x\u2067y\u2068z\u2069", `\u2066x\u2067y\u2068z\u2069`},     // isolates
		{"a\u200bb\u200cc\u200dd\u200ee\u200ff\u2060g\ufeff", `a\u200bb\u200cc\u200dd\u200ee\u200ff\u2060g\ufeff`},
		{"x\u2028y\u2029z", `x\u2028y\u2029z`},
		{"\x1b[31mred\x07\r\x00", `\u001b[31mred\u0007\u000d\u0000`},
		{"del\x7f c1\u0085\u009b", `del\u007f c1\u0085\u009b`},
		{"tag\U000E0041", `tag\udb40\udc41`},
		{"bad\xffutf8", `bad\xffutf8`},
		{"tab\tand\nnewline", "tab\tand\nnewline"},
		{"café 中文 🚀 a\u00a0b", "café 中文 🚀 a\u00a0b"},
	} {
		got := Escape(c.in)
		if got != c.want {
			t.Errorf("Escape(%q) = %q; want %q", c.in, got, c.want)
		}
		if r, ok := Raw(got); ok {
			t.Errorf("Escape(%q) holds %U raw", c.in, r)
		}
	}
	if got := EscapeLine("a\nb\tc"); got != `a\u000ab\u0009c` {
		t.Errorf("EscapeLine kept a line break or tab: %q", got)
	}
	// What a worker sends (a host name, an output): text of any script
	// kept, and what would start a line or drive a terminal escaped.
	if got := EscapeLine("nœud-01 計算"); got != "nœud-01 計算" {
		t.Errorf("EscapeLine changed printable text: %q", got)
	}
	if got := EscapeLine("a\xffb\u2028c\td\x1b"); got != `a\xffb\u2028c\u0009d\u001b` {
		t.Errorf("EscapeLine(%q) = %q", "a\xffb\u2028c\td\x1b", got)
	}
}

// TestWriter: a logger's or the diagnostics' output is escaped whole; a
// character cut between two writes (a bufio flush) comes out whole; and
// JSON passed through still decodes to the text it held.
func TestWriter(t *testing.T) {
	var buf bytes.Buffer
	w := Writer(&buf)
	in := []byte("ok é \u202e end\n")
	for i := range in {
		if _, err := w.Write(in[i : i+1]); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := buf.String(), "ok é \\u202e end\n"; got != want {
		t.Errorf("byte by byte: %q; want %q", got, want)
	}

	buf.Reset()
	name := "hpc\u202etxt\x7f\u0085\u2066.exe"
	if err := json.NewEncoder(Writer(&buf)).Encode(map[string]string{"name": name}); err != nil {
		t.Fatal(err)
	}
	if r, ok := Raw(buf.String()); ok {
		t.Errorf("JSON through Writer holds %U raw: %q", r, buf.String())
	}
	var back map[string]string
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil || back["name"] != name {
		t.Errorf("JSON through Writer reads back %q, %v; want %q", back["name"], err, name)
	}
	if !strings.Contains(buf.String(), `\u202e`) {
		t.Errorf("no \\u202e in %q", buf.String())
	}
}
