package sshrun

import (
	"bytes"
	"regexp"
	"strings"
)

// ssh's decisive line.
//
// When ssh fails, its last line is seldom why. Through a jump host (a
// ProxyCommand or ProxyJump) the hop's ssh says why it failed ("Host key
// verification failed.", "Permission denied (publickey).") on the same
// stderr, and then the outer ssh, whose connection the hop closed, has
// the last word: "kex_exchange_identification: Connection closed by
// remote host", "Connection closed by UNKNOWN port 65535". A changed
// host key is a page of warning, its decisive lines in the middle. So
// an ssh failure is quoted with its decisive lines first (Lead): the
// words a person acts on, then the rest as ssh said it. The lines are
// OpenSSH 9.2's (testdata/stderr, with how each was made).

// decisive are the kinds of ssh's decisive lines, in the order Lead puts
// them when several kinds are there: the host key first (ssh checks it
// before it authenticates), then the authentication, then the
// connection. A kind is its alternatives, best first: of a changed host
// key, the line that names the host, else the banner's.
var decisive = [][]*regexp.Regexp{
	{regexp.MustCompile(`^Host key for \S+ has changed`), regexp.MustCompile(`REMOTE HOST IDENTIFICATION HAS CHANGED`)},
	// Names the host whose key is unknown: with a jump host, which one.
	{regexp.MustCompile(`^No \S+ host key is known for \S+`)},
	{regexp.MustCompile(`^Host key verification failed\.`)},
	{regexp.MustCompile(`Permission denied \(|Too many authentication failures`)},
	{regexp.MustCompile(`Could not resolve hostname`)},
	{regexp.MustCompile(`Connection refused`)},
	{regexp.MustCompile(`Connection timed out`)},
	{regexp.MustCompile(`No route to host`)},
}

// Decisive is ssh's decisive lines in stderr, each trimmed of the
// warning banner's '@' and spaces, joined by newlines in the order of
// decisive's kinds, one line of each kind there is (its first); "" when
// there is none.
func Decisive(stderr []byte) string {
	lines := strings.Split(string(stderr), "\n")
	for i, l := range lines {
		lines[i] = strings.Trim(l, "@ \t\r")
	}
	var picked []string
	for _, kind := range decisive {
	alternatives:
		for _, re := range kind {
			for _, l := range lines {
				if re.MatchString(l) {
					picked = append(picked, l)
					break alternatives
				}
			}
		}
	}
	return strings.Join(picked, "\n")
}

// Lead is stderr with its decisive lines (Decisive) first and the rest
// after them as ssh printed them, the decisive lines' own places left
// out; stderr itself when it has none.
func Lead(stderr []byte) []byte {
	d := Decisive(stderr)
	if d == "" {
		return stderr
	}
	picked := map[string]bool{}
	for _, l := range strings.Split(d, "\n") {
		picked[l] = true
	}
	out := bytes.NewBufferString(d)
	out.WriteByte('\n')
	for _, l := range strings.SplitAfter(string(stderr), "\n") {
		if l != "" && !picked[strings.Trim(l, "@ \t\r\n")] {
			out.WriteString(l)
		}
	}
	return out.Bytes()
}
