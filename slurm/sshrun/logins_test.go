package sshrun

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/internal/testutil"
)

// TestParseLogin: what ParseLogin makes of each form of entry, and what
// it refuses.
func TestParseLogin(t *testing.T) {
	for _, tc := range []struct {
		entry, dest string
		port        int
	}{
		{"u@h", "u@h", 0},
		{"u@h:2222", "u@h", 2222},
		{"sandbox", "sandbox", 0},
		{"h:22", "h", 22},
		{"u@::1", "u@::1", 0},
		{"u@[::1]:2222", "u@::1", 2222},
		{"[fe80::1]:22", "fe80::1", 22},
	} {
		a, err := ParseLogin(tc.entry)
		if err != nil || a.Dest != tc.dest || a.Port != tc.port {
			t.Errorf("ParseLogin(%q) = %+v %v, want %s port %d", tc.entry, a, err, tc.dest, tc.port)
		}
	}
	for _, tc := range []struct {
		login     Login
		str, host string
	}{
		{Login{Dest: "u@h"}, "u@h", "h"},
		{Login{Dest: "u@h", Port: 2222}, "u@h:2222", "h:2222"},
		{Login{Dest: "u@::1", Port: 2222}, "u@[::1]:2222", "::1:2222"},
		{Login{Dest: "fe80::1", Port: 22}, "[fe80::1]:22", "fe80::1:22"},
	} {
		if tc.login.String() != tc.str || tc.login.Host() != tc.host {
			t.Errorf("%+v: String %q, Host %q; want %q, %q", tc.login, tc.login.String(), tc.login.Host(), tc.str, tc.host)
		}
	}
	for entry, want := range map[string]string{
		"":               "it is empty",
		"u@h x":          "whitespace",
		"-oProxy=x":      "starts with '-'",
		"u@h:0":          "a port is a number from 1 to 65535",
		"u@h;rm":         "is not user@host",
		"u@[::1]:999999": "a port is a number",
	} {
		if _, err := ParseLogin(entry); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseLogin(%q) = %v, want an error saying %q", entry, err, want)
		}
	}
}

// TestLoginStaleOutcomeChangesNothing: a command that began before the
// phase changed (one running through the operator's master as it closed)
// cannot change it back; one begun after can.
func TestLoginStaleOutcomeChangesNothing(t *testing.T) {
	var b loginBook
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	b.note(1, 0, outcomeGotThrough, "", t0, t0, true)
	if ch := b.note(1, 0, outcomeRefused, "Permission denied (publickey).", t0.Add(time.Second), t0.Add(2*time.Second), true); ch.access != AccessRefused {
		t.Fatalf("a refusal: %+v, want refused", ch)
	}
	if ch := b.note(1, 0, outcomeGotThrough, "", t0, t0.Add(3*time.Second), true); ch != (loginChange{}) || b.access != AccessRefused {
		t.Errorf("a command begun before the refusal, through after it, changed %+v (access %v)", ch, b.access)
	}
	if ch := b.note(1, 0, outcomeGotThrough, "", t0.Add(4*time.Second), t0.Add(5*time.Second), true); !ch.accessChanged || ch.access != AccessOpen {
		t.Errorf("a command begun after the refusal got through: %+v, want open again", ch)
	}
}

// clock is a clock the test moves.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestFailover: with two login nodes and the first not answering, a
// command goes through the second at once; the first is skipped until its
// retry is due, tried first again then, and used again once it answers.
// Each change is one log line, and Notes say which login is in use. A
// login that refuses makes Access refused, and AccessChanged hears of it
// once, and once of its end.
func TestFailover(t *testing.T) {
	fake := newFakeSSH(t, `for a; do case "$a" in alice@l1|alice@l2) dest=$a;; esac; done
if [ -f "$d/down" ] && grep -qx "$dest" "$d/down"; then echo "ssh: connect to host $dest port 22: Connection refused" >&2; exit 255; fi
if [ -f "$d/refuse" ] && grep -qx "$dest" "$d/refuse"; then echo "$dest: Permission denied (publickey)." >&2; exit 255; fi
echo "$dest"`)
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(fake.dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	clk := &clock{now: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)}
	var logs testutil.Buffer
	var changes []AccessChange
	var mu sync.Mutex
	c := Config{Program: fake.path, Logins: []Login{{Dest: "alice@l1"}, {Dest: "alice@l2"}}, Timeout: 10 * time.Second, Now: clk.Now,
		AccessChanged: func(ch AccessChange) { mu.Lock(); changes = append(changes, ch); mu.Unlock() }}
	tr := New(c, hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Debug}))
	t.Cleanup(func() { tr.Close(context.Background()) })
	run := func() string {
		t.Helper()
		out, stderr, err := tr.Run(context.Background(), nil, "probe")
		if err != nil {
			t.Fatalf("%v: %s", err, stderr)
		}
		return strings.TrimSpace(string(out))
	}
	dests := func(n int) []string {
		var out []string
		for _, argv := range fake.argvs("probe")[n:] {
			out = append(out, argv[slices.Index(argv, "--")+1])
		}
		return out
	}

	write("down", "alice@l1\n")
	if got := run(); got != "alice@l2" {
		t.Fatalf("with l1 down the command ran on %q", got)
	}
	if got := dests(0); !slices.Equal(got, []string{"alice@l1", "alice@l2"}) {
		t.Errorf("the first command went to %v, want l1, then l2", got)
	}
	notes := tr.Notes()
	if len(notes) != 2 || !strings.HasPrefix(notes[0], "login: using alice@l2 (entry 2 of 2)") ||
		!strings.HasPrefix(notes[1], "login: alice@l1 not answering") || !strings.Contains(notes[1], "Connection refused") {
		t.Errorf("Notes = %q, want l2 in use and l1 not answering in ssh's words", notes)
	}
	// Skipped: the next command goes to l2 alone.
	n := len(fake.argvs("probe"))
	run()
	if got := dests(n); !slices.Equal(got, []string{"alice@l2"}) {
		t.Errorf("with l1 skipped, a command went to %v, want l2 alone", got)
	}
	// Its retry due: l1 is tried first again, and, still down, l2 serves.
	clk.Advance(loginRetryFirst + time.Second)
	n = len(fake.argvs("probe"))
	run()
	if got := dests(n); !slices.Equal(got, []string{"alice@l1", "alice@l2"}) {
		t.Errorf("with l1's retry due, a command went to %v, want l1 then l2", got)
	}
	// Back: l1 is used again.
	write("down", "")
	clk.Advance(loginRetryMax)
	n = len(fake.argvs("probe"))
	run()
	if got := dests(n); !slices.Equal(got, []string{"alice@l1"}) {
		t.Errorf("with l1 back, a command went to %v, want l1", got)
	}
	if n := strings.Count(logs.String(), "a login node does not answer"); n != 1 {
		t.Errorf("%d lines say l1 does not answer, want 1 (one per change, not per attempt):\n%s", n, logs.String())
	}
	if n := strings.Count(logs.String(), "a login node answers again"); n != 1 {
		t.Errorf("%d lines say l1 answers again, want 1", n)
	}
	if a := tr.Access(); a.Phase != AccessOpen || len(changes) != 0 {
		t.Errorf("Access %+v after silences alone, changes %+v; want open, none", a, changes)
	}

	// Both refuse: no command gets in, and Access is refused.
	write("refuse", "alice@l1\nalice@l2\n")
	clk.Advance(time.Second)
	if _, _, err := tr.Run(context.Background(), nil, "probe"); err == nil {
		t.Fatal("a command got through two logins that refuse")
	}
	tr.Run(context.Background(), nil, "probe")
	if a := tr.Access(); a.Phase != AccessRefused || !strings.Contains(a.Said, "Permission denied (publickey)") || !a.Since.Equal(clk.Now()) {
		t.Errorf("Access = %+v, want refused since now, in ssh's words", a)
	}
	write("refuse", "")
	clk.Advance(time.Minute)
	run()
	mu.Lock()
	defer mu.Unlock()
	if len(changes) != 2 || changes[0].Now != AccessRefused || changes[0].Was.Phase != AccessOpen ||
		changes[1].Now != AccessOpen || changes[1].Was.Phase != AccessRefused || clk.Now().Sub(changes[1].Was.Since) != time.Minute ||
		Refused([]byte(changes[0].Said)) != RefusedAuth {
		t.Errorf("AccessChanged heard %+v, want refused once, then open again after a minute", changes)
	}
}

// TestRemoteSaid: a remote command that exits 255 by itself, ssh's own
// failure status, with words that look like ssh's ("Connection refused"
// from slurmctld), ran: it is not moved to the next login, which would
// run it twice, and its login is not taken for silent.
func TestRemoteSaid(t *testing.T) {
	fake := newFakeSSH(t, `echo "sbatch: error: Batch job submission failed: Unable to contact slurm controller: Connection refused" >&2; exit 255`)
	c := Config{Program: fake.path, Logins: []Login{{Dest: "alice@l1"}, {Dest: "alice@l2"}}, Timeout: 10 * time.Second,
		RemoteSaid: regexp.MustCompile(`(?m)^sbatch: `)}
	tr := newTransport(t, c)
	if _, stderr, err := tr.Run(context.Background(), nil, "sbatch"); err == nil || !strings.Contains(string(stderr), "sbatch: error") {
		t.Fatalf("err %v, stderr %q; want sbatch's failure", err, stderr)
	}
	if n := len(fake.argvs("sbatch")); n != 1 {
		t.Errorf("sbatch ran %d times, want once: its own exit 255 was taken for a login that does not answer", n)
	}
	if notes := tr.Notes(); len(notes) != 0 {
		t.Errorf("Notes = %q, want none", notes)
	}
}

// TestRefusalBackoff: a login that refuses is tried again a minute after
// the refusal, then 2, 4, 8 and 15 minutes after each try, and 15 from
// then on; no command runs ssh between tries: each fails at once with
// ErrLoginRefused and the first refusal's words, as do Access and Notes,
// though later tries are answered with an sshd's penalty of the address
// ("Connection closed"). Once the key is accepted, the next due try gets
// through and ends it all.
func TestRefusalBackoff(t *testing.T) {
	fake := newFakeSSH(t, `if [ -f "$d/penalty" ]; then echo "Connection closed by 10.0.0.1 port 22" >&2; exit 255; fi
if [ -f "$d/refuse" ]; then echo "alice@l1: Permission denied (publickey)." >&2; exit 255; fi
echo ok`)
	touch := func(name string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(fake.dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	clk := &clock{now: start}
	tr := newTransport(t, Config{Program: fake.path, Logins: []Login{{Dest: "alice@l1"}}, Timeout: 10 * time.Second, Now: clk.Now})
	const first = "Permission denied (publickey)"
	tries := func() int { return len(fake.argvs("probe")) }

	touch("refuse")
	_, _, err := tr.Run(context.Background(), nil, "probe")
	if !errors.Is(err, ErrLoginRefused) || tries() != 1 {
		t.Fatalf("the first refusal: err %v after %d ssh, want ErrLoginRefused after 1", err, tries())
	}
	// From now on the login node punishes the address, in other words.
	touch("penalty")
	var gaps []time.Duration
	last := clk.Now()
	for clk.Now().Sub(start) < 45*time.Minute {
		a := tr.Access()
		if a.Phase != AccessRefused || a.Refusal != RefusedAuth || !strings.Contains(a.Said, first) || !a.Since.Equal(start) {
			t.Fatalf("Access %+v, want refused since %s in the first refusal's words", a, start)
		}
		if notes := tr.Notes(); len(notes) != 1 || !strings.Contains(notes[0], first) || !strings.Contains(notes[0], a.NextTry.Format(time.RFC3339)) {
			t.Errorf("Notes %q, want the first refusal's words and the next try", notes)
		}
		// Up to a second before the try is due: nothing runs.
		clk.Advance(a.NextTry.Sub(clk.Now()) - time.Second)
		n := tries()
		_, _, err := tr.Run(context.Background(), nil, "probe")
		if !errors.Is(err, ErrLoginRefused) || !strings.Contains(err.Error(), first) || tries() != n {
			t.Fatalf("before the try is due: err %v after %d more ssh, want ErrLoginRefused in the first words and no ssh", err, tries()-n)
		}
		clk.Advance(time.Second)
		tr.Run(context.Background(), nil, "probe")
		if tries() != n+1 {
			t.Fatalf("the due try ran ssh %d times, want once", tries()-n)
		}
		gaps = append(gaps, clk.Now().Sub(last))
		last = clk.Now()
	}
	want := []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 8 * time.Minute, 15 * time.Minute, 15 * time.Minute}
	if !slices.Equal(gaps[:min(len(gaps), len(want))], want) {
		t.Errorf("tries %v apart, want %v (a minute, doubling to 15)", gaps, want)
	}

	// A new key: the next due try gets through, and commands run again.
	os.Remove(filepath.Join(fake.dir, "penalty"))
	os.Remove(filepath.Join(fake.dir, "refuse"))
	clk.Advance(tr.Access().NextTry.Sub(clk.Now()))
	if out, _, err := tr.Run(context.Background(), nil, "probe"); err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("the try after the fix: %q, %v", out, err)
	}
	if a := tr.Access(); a.Phase != AccessOpen {
		t.Errorf("Access %+v after a login got through, want open", a)
	}
	n := tries()
	tr.Run(context.Background(), nil, "probe")
	if tries() != n+1 {
		t.Errorf("a command after the fix ran ssh %d times, want once", tries()-n)
	}
}

// TestHostKeyRefused: a host key that is not the one known is a refusal,
// not a login node that does not answer: Access is refused, what about
// says so, and the login is left alone until its retry is due, Sessions
// (the relay's) included.
func TestHostKeyRefused(t *testing.T) {
	fake := newFakeSSH(t, `echo "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@
@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @
Host key verification failed." >&2; exit 255`)
	clk := &clock{now: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)}
	tr := newTransport(t, Config{Program: fake.path, Logins: []Login{{Dest: "alice@l1"}}, Timeout: 10 * time.Second, Now: clk.Now})
	if _, _, err := tr.Run(context.Background(), nil, "probe"); !errors.Is(err, ErrLoginRefused) {
		t.Fatalf("err %v, want ErrLoginRefused", err)
	}
	a := tr.Access()
	if a.Phase != AccessRefused || a.Refusal != RefusedHostKey || !strings.Contains(a.Said, "Host key verification failed") ||
		!a.NextTry.Equal(clk.Now().Add(refusalRetryFirst)) {
		t.Fatalf("Access %+v, want refused for the host key, tried again in a minute", a)
	}
	clk.Advance(30 * time.Second)
	if _, _, err := tr.Run(context.Background(), nil, "probe"); !errors.Is(err, ErrLoginRefused) {
		t.Errorf("a command before the retry: %v, want ErrLoginRefused", err)
	}
	if s, err := tr.Start(context.Background(), io.Discard, "relay"); !errors.Is(err, ErrLoginRefused) {
		if s != nil {
			s.Close()
		}
		t.Errorf("a Session while the login is refused: %v, want ErrLoginRefused", err)
	}
	if n := len(fake.argvs("probe")) + len(fake.argvs("relay")); n != 1 {
		t.Errorf("ssh ran %d times, want once (the refusal)", n)
	}
	for _, tc := range []struct {
		said string
		want Refusal
	}{
		{"alice@l1: Permission denied (publickey,keyboard-interactive).", RefusedAuth},
		{"Received disconnect from 10.0.0.1 port 22:2: Too many authentication failures", RefusedAuth},
		{"Host key verification failed.", RefusedHostKey},
		{"ssh: connect to host l1 port 22: Connection refused", NotRefused},
		{"Connection timed out during banner exchange", NotRefused},
		{"kex_exchange_identification: Connection closed by remote host", NotRefused},
	} {
		if got := Refused([]byte(tc.said)); got != tc.want {
			t.Errorf("Refused(%q) = %s, want %s", tc.said, got, tc.want)
		}
	}
}
