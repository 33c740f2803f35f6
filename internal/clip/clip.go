// Package clip shortens what a tool said to a bounded length for a log
// line, an event or a status, keeping both ends: a tool's first line says
// what it was doing and its last says what went wrong (ssh's host-key
// banner runs for 700 characters before "Host key verification
// failed."), or to a bound on what a peer's words may cost to keep
// (Bytes). It owns only those rules; what is worth keeping is its
// callers'.
package clip

import (
	"fmt"
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

// Bytes keeps at most n bytes of s, cut at a character's start, and
// says how many it cut: a bound on what a peer's words may cost to keep
// (events, statuses, a task's error), where Ends bounds a line to read.
func Bytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("… [%d bytes cut]", len(s)-cut)
}
