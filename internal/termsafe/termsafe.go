// Package termsafe escapes what would change how text reads on a
// terminal: control characters (C0 but tab and newline, DEL, C1),
// bidirectional overrides and isolates (U+202A-U+202E, U+2066-U+2069),
// zero-width and other format characters (U+200B-U+200F, U+2060-U+2064,
// U+FEFF, tags), line and paragraph separators (U+2028, U+2029), and
// bytes that are not UTF-8. Each becomes a visible escape, \u202e for
// U+202E, as Terraform's diagnostics and strconv.QuoteToGraphic show them.
//
// A name from a configuration file or a plugin reaches the operator's
// terminal in a diagnostic or a log line, where a raw U+202E reverses the
// rest of the line and an ESC can rewrite the terminal; those writers
// escape here, once. The escapes are JSON's own (\u00XX, and a surrogate
// pair above U+FFFF), so a JSON line through Writer stays JSON.
package termsafe

import (
	"io"
	"unicode"
	"unicode/utf8"
)

// safe says whether r is shown as itself: graphic characters (letters,
// marks, numbers, punctuation, symbols, spaces) and, when keepLines, tab
// and newline.
func safe(r rune, keepLines bool) bool {
	if r == '\t' || r == '\n' {
		return keepLines
	}
	return unicode.IsGraphic(r)
}

// Escape is s with every character a terminal would act on, or that
// hides or reorders text, written as a visible escape; tabs and newlines
// are kept.
func Escape(s string) string { return escape(s, true) }

// EscapeLine is Escape with tabs and newlines escaped too: for a value
// that must stay on its line (a file name in a diagnostic's first line).
func EscapeLine(s string) string { return escape(s, false) }

func escape(s string, keepLines bool) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || !safe(r, keepLines) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	return string(appendEscaped(make([]byte, 0, len(s)+16), []byte(s), keepLines))
}

const hex = "0123456789abcdef"

// appendEscaped appends b to dst, escaped.
func appendEscaped(dst, b []byte, keepLines bool) []byte {
	u := func(dst []byte, r rune) []byte {
		return append(dst, '\\', 'u', hex[r>>12&0xf], hex[r>>8&0xf], hex[r>>4&0xf], hex[r&0xf])
	}
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		switch {
		case r == utf8.RuneError && size <= 1:
			dst = append(dst, '\\', 'x', hex[b[0]>>4], hex[b[0]&0xf])
		case safe(r, keepLines):
			dst = append(dst, b[:size]...)
		case r > 0xffff:
			r1, r2 := utf16Pair(r)
			dst = u(u(dst, r1), r2)
		default:
			dst = u(dst, r)
		}
		b = b[size:]
	}
	return dst
}

func utf16Pair(r rune) (rune, rune) {
	r -= 0x10000
	return 0xd800 + r>>10&0x3ff, 0xdc00 + r&0x3ff
}

// Writer is w with everything written to it escaped as Escape does,
// tabs and newlines kept. A character cut between two writes (a
// bufio.Writer's flush) is held until the rest comes; Flush-like
// callers that stop mid-character lose nothing but those bytes' escape.
func Writer(w io.Writer) io.Writer { return &writer{w: w} }

type writer struct {
	w io.Writer
	// held is the start of a character the last Write ended in.
	held []byte
}

func (e *writer) Write(p []byte) (int, error) {
	b := p
	if len(e.held) > 0 {
		b = append(e.held, p...)
		e.held = nil
	}
	// A last character not yet whole waits for the next Write.
	if cut := incompleteTail(b); cut > 0 {
		e.held = append([]byte(nil), b[len(b)-cut:]...)
		b = b[:len(b)-cut]
	}
	clean := true
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if (r == utf8.RuneError && size <= 1) || !safe(r, true) {
			clean = false
			break
		}
		i += size
	}
	if !clean {
		b = appendEscaped(make([]byte, 0, len(b)+16), b, true)
	}
	if _, err := e.w.Write(b); err != nil {
		return 0, err
	}
	return len(p), nil
}

// incompleteTail is how many bytes at the end of b begin a UTF-8
// character that is not complete yet: 0 to 3.
func incompleteTail(b []byte) int {
	for n := 1; n <= 3 && n <= len(b); n++ {
		c := b[len(b)-n]
		if c < 0x80 {
			return 0
		}
		if utf8.RuneStart(c) {
			if utf8.FullRune(b[len(b)-n:]) {
				return 0
			}
			return n
		}
	}
	return 0
}
