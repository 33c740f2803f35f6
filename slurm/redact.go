package slurm

import (
	"encoding/base64"
	"encoding/hex"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// A job's output is the job's to write, and a profile's prerun may print
// the script's credentials: set -x shows the assignment that gives the
// worker its own ("+ FLUKSIO_WORKER_TOKEN=…"), cat "$0" shows every
// task's, and a wrapper on the login node may echo the script sbatch was
// given. Output is quoted in an event, the log, last_error and the page,
// where the promise is that nothing secret appears (docs/security.md), so
// everything the plugin quotes of a job or of sbatch goes through a
// redactor, which removes credentials three ways, each for what the others
// miss:
//
//   - every run of redactRun bytes or more of a credential the plugin put
//     in the job's script, or of an encoding of it, however the run is
//     cut (the signature alone, a tail -c that begins inside one) and
//     however it is printed: folded across lines, with whitespace,
//     quotes, backslash continuations, control characters or terminal
//     escapes between its characters, percent-encoded, base64-encoded in
//     either alphabet at any of the three byte offsets, with or without
//     padding, or in hex;
//   - anything after a name with TOKEN in it and '=' or ':', and after
//     "Bearer ", however it is spelt: a job adopted from an earlier run,
//     whose credentials this process never saw;
//   - anything shaped like an engine credential, two base64url fields
//     with a 43-character signature (engine/host/credential.go): a
//     credential printed bare by a job adopted from an earlier run.
//
// Output is quoted, redacted, rather than left out, because an exit code
// without the worker's own last line sends the operator to the cluster
// for it (docs/design/slurm-redaction.md).
const redacted = "[redacted]"

// redactRun is the shortest run of a credential, or of an encoding of
// it, that is redacted: every longer run is covered by runs this long.
// Shorter runs are left, so that ordinary words are not.
const redactRun = 8

// redactor removes the credentials it was made with, and their
// encodings, from text. The zero redactor removes credentials by form
// alone. It never changes after newRedactor.
type redactor struct {
	// needles are the credentials and every encoding of each.
	needles []string
	// short are credentials shorter than redactRun, replaced where they
	// appear as they are.
	short []string
}

// newRedactor returns a redactor of secrets (empty ones are skipped).
func newRedactor(secrets []string) redactor {
	var r redactor
	for _, t := range secrets {
		switch {
		case t == "":
		case len(t) < redactRun:
			r.short = append(r.short, t)
		default:
			r.needles = append(r.needles, encodings(t)...)
		}
	}
	return r
}

// encodings are t and the forms it is printed in by tools a job may run
// (base64, basenc, xxd -p, od, a URL's query): what the redactor looks
// for. Percent-encoding and folding are undone in the text instead
// (skeleton), so they are not listed.
func encodings(t string) []string {
	h := hex.EncodeToString([]byte(t))
	out := []string{t, h, strings.ToUpper(h)}
	for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
		for offset := range 3 {
			out = append(out, alignedBase64(enc, t, offset))
		}
	}
	return out
}

// alignedBase64 is the part of the base64 of a text holding t at
// offset (mod 3) that t alone determines: the characters whose six bits
// all come from t, so the same whatever comes before or after it, padded
// or not.
func alignedBase64(enc *base64.Encoding, t string, offset int) string {
	src := make([]byte, offset, offset+len(t))
	src = append(src, t...)
	s := enc.EncodeToString(src)
	// Character i holds bits [6i, 6i+6) of src.
	first := (8*offset + 5) / 6
	last := 8 * len(src) / 6
	return s[first:last]
}

// secretForm matches a value after a TOKEN-named variable or a Bearer;
// group 1 is what stays (the name, the '=', an opening quote).
var secretForm = regexp.MustCompile(`(?i)(\b[a-z0-9_]*token[a-z0-9_]*['"]?\s*[=:]\s*['"]?|\bbearer\s+['"]?)[^\s'"|]+`)

// credentialShape matches what may be an engine credential: a payload
// and a signature of 43 base64url characters (32 bytes), the payload
// possibly cut short by tail -c.
var credentialShape = regexp.MustCompile(`[A-Za-z0-9_-]*\.[A-Za-z0-9_-]{43,}`)

// ansiEscape matches a terminal's colour and cursor sequences, which
// programs print even into files.
var ansiEscape = regexp.MustCompile("\x1b\\[[0-9;?]*[ -/]*[@-~]")

// scrub returns s with every credential of r, and every run of
// redactRun bytes of one or of its encodings, every value after a TOKEN=
// or a Bearer, and everything shaped like a credential replaced with
// [redacted].
func (r redactor) scrub(s string) string {
	for _, t := range r.short {
		s = strings.ReplaceAll(s, t, redacted)
	}
	if len(r.needles) > 0 {
		s = r.scrubRuns(s)
	}
	s = secretForm.ReplaceAllString(s, "${1}"+redacted)
	return credentialShape.ReplaceAllStringFunc(s, func(m string) string {
		if i := strings.LastIndexByte(m, '.'); len(m)-i-1 == 43 {
			return redacted
		}
		return m
	})
}

// unit is one byte of a skeleton and the bytes of the text it stands
// for, [from, to).
type unit struct {
	b        byte
	from, to int
}

// skeleton is s as the redactor compares it: without whitespace, control
// and format characters, terminal escapes, quotes and backslashes (what
// folds a credential across lines or splits it in a shell), and with
// percent escapes decoded. Each byte remembers where in s it came from.
func skeleton(s string) []unit {
	escapes := ansiEscape.FindAllStringIndex(s, -1)
	var raw []unit
	for i := 0; i < len(s); {
		if len(escapes) > 0 && i >= escapes[0][0] {
			if i < escapes[0][1] {
				i = escapes[0][1]
			}
			escapes = escapes[1:]
			continue
		}
		c, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case c == '\\', c == '"', c == '\'', unicode.IsSpace(c), unicode.IsControl(c), unicode.Is(unicode.Cf, c):
		default:
			for j := range n {
				raw = append(raw, unit{b: s[i+j], from: i, to: i + n})
			}
		}
		i += n
	}
	out := raw[:0]
	for i := 0; i < len(raw); i++ {
		if raw[i].b == '%' && i+2 < len(raw) && isHex(raw[i+1].b) && isHex(raw[i+2].b) {
			out = append(out, unit{b: unhex(raw[i+1].b)<<4 | unhex(raw[i+2].b), from: raw[i].from, to: raw[i+2].to})
			i += 2
			continue
		}
		out = append(out, raw[i])
	}
	return out
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// window is the redactRun bytes of b from i, as a map key.
func window(b func(int) byte, i int) uint64 {
	var k uint64
	for j := range redactRun {
		k = k<<8 | uint64(b(i+j))
	}
	return k
}

// scrubRuns replaces every stretch of s whose skeleton is covered by runs
// of redactRun bytes of a needle with one [redacted]. The skeleton's runs
// are indexed, and each needle's looked up in them: the text is at most
// a few KiB, the needles of an array's every credential a few hundred.
func (r redactor) scrubRuns(s string) string {
	sk := skeleton(s)
	if len(sk) < redactRun {
		return s
	}
	at := func(i int) byte { return sk[i].b }
	n := len(sk) - redactRun + 1
	// first[k] is where run k first starts in the skeleton, next[i] where
	// the run at i starts again (-1: nowhere).
	first := make(map[uint64]int, n)
	next := make([]int, n)
	for i := n - 1; i >= 0; i-- {
		k := window(at, i)
		if j, ok := first[k]; ok {
			next[i] = j
		} else {
			next[i] = -1
		}
		first[k] = i
	}
	hidden := make([]bool, len(sk))
	found := false
	for _, needle := range r.needles {
		in := func(i int) byte { return needle[i] }
		for j := 0; j+redactRun <= len(needle); j++ {
			for i, ok := first[window(in, j)]; ok && i >= 0; i = next[i] {
				found = true
				for m := i; m < i+redactRun; m++ {
					hidden[m] = true
				}
			}
		}
	}
	if !found {
		return s
	}
	var b strings.Builder
	last := 0
	for i := 0; i < len(sk); {
		if !hidden[i] {
			i++
			continue
		}
		j := i
		for j+1 < len(sk) && hidden[j+1] {
			j++
		}
		b.WriteString(s[last:max(sk[i].from, last)])
		b.WriteString(redacted)
		last = sk[j].to
		i = j + 1
	}
	b.WriteString(s[last:])
	return b.String()
}
