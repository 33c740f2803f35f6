// Package clip shortens what a tool said to a bounded length for a log
// line, an event or a status, keeping both ends: a tool's first line says
// what it was doing and its last says what went wrong (ssh's host-key
// banner runs for 700 characters before "Host key verification
// failed."). It owns only that rule; what is worth keeping is its
// callers'.
package clip

import (
	"strings"
	"unicode/utf8"
)

// Ends trims s and keeps at most max runes of it: a third from its
// start and the rest from its end, joined by " … ".
func Ends(s string, max int) string {
	s = strings.TrimSpace(s)
	if utf8.RuneCountInString(s) <= max {
		return s
	}
	const gap = " … "
	r := []rune(s)
	head := (max - len([]rune(gap))) / 3
	tail := max - len([]rune(gap)) - head
	return string(r[:head]) + gap + string(r[len(r)-tail:])
}
