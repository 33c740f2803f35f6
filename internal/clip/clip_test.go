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
