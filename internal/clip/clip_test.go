package clip

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestEnds(t *testing.T) {
	if got := Ends("  short  ", 20); got != "short" {
		t.Errorf("short: %q", got)
	}
	long := "ssh: banner " + strings.Repeat("é", 700) + " Host key verification failed."
	got := Ends(long, 120)
	if n := utf8.RuneCountInString(got); n != 120 {
		t.Errorf("%d runes, want 120", n)
	}
	if !strings.HasPrefix(got, "ssh: banner") || !strings.HasSuffix(got, "Host key verification failed.") || !strings.Contains(got, " … ") {
		t.Errorf("both ends not kept: %q", got)
	}
}

func TestBytes(t *testing.T) {
	if got := Bytes("short", 10); got != "short" {
		t.Errorf("short: %q", got)
	}
	// A cut that would fall inside "é" (2 bytes) moves to its start.
	s := strings.Repeat("a", 9) + "é" + strings.Repeat("b", 20)
	got := Bytes(s, 10)
	if want := strings.Repeat("a", 9) + "… [22 bytes cut]"; got != want {
		t.Errorf("Bytes = %q; want %q", got, want)
	}
	if !utf8.ValidString(got) {
		t.Errorf("%q is not valid UTF-8", got)
	}
}
