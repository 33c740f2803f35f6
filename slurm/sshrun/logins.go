package sshrun

import (
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	doubling "github.com/fluksio/provision/internal/backoff"
)

// Several login nodes.
//
// A site's login nodes come in pairs or more, and any one of them may be
// down for maintenance. Each command tries the logins in order; one that
// does not answer (the connection refused or timed out, the name not
// resolving, a jump host that cannot reach it) is skipped until it
// answers again, retried after loginRetryFirst, doubling to
// loginRetryMax. Moving on to the next login is safe for any command:
// ssh's words for a login node that does not answer are said before
// anything runs on it. A command that may have run (it ran out of time,
// the connection dropped) is never moved.
//
// A login node that answers and refuses the login ("Permission denied
// (publickey)", or a host key that is not the one known: "Host key
// verification failed") is a different thing: a person has to act (a new
// key, an operator's MFA master opened again, the known host key
// checked), and nothing the transport can do brings it back. Knocking
// again costs more than it learns: sshd counts each refused login against
// the address (OpenSSH's PerSourcePenalties, a site's fail2ban), and once
// it penalises the engine's host every later try is refused for that
// instead, in other words. So a login that refused is not tried by any
// command until its refusal's retry is due, refusalRetryFirst after the
// refusal, doubling to refusalRetryMax; one command at a time makes that
// try, whatever its caller (a poll, a submission, a cancel, the relay),
// and a command with no other login to go to fails at once, with
// ErrLoginRefused, without running ssh. A try that gets through ends the
// refusal; one that is refused again or fails otherwise (the penalty's
// "Connection closed", a timeout) keeps it, with the first refusal's
// words and time. A timeout or a connection refused by itself is not a
// refusal: that login is silent, above. When no login let a command in
// and one refused it, Access is AccessRefused until a command gets
// through; what that holds back is the caller's. One log line says when
// a login stops answering and one when it answers again, never one per
// attempt.

const (
	// loginRetryFirst and loginRetryMax bound how long a login node that
	// did not answer is skipped before it is tried again (it is first in
	// line again then). Doubling, so that one down for the day costs a
	// connection attempt every few minutes, not one per command.
	loginRetryFirst = 10 * time.Second
	loginRetryMax   = 5 * time.Minute
	// refusalRetryFirst and refusalRetryMax bound how long a login node
	// that refused the login is left alone before it is tried again:
	// three tries in the first seven minutes, then one each quarter of an
	// hour, below any sshd penalty or fail2ban rule's rate, and soon
	// enough after a person's fix.
	refusalRetryFirst = time.Minute
	refusalRetryMax   = 15 * time.Minute
)

// ErrLoginRefused is in the error of a call that a refused login
// stopped: ssh's own refusal, or a call not made because every login it
// could go to refused and none's retry is due yet.
var ErrLoginRefused = errors.New("the login node refused the login")

// Refusal is what a login node's refusal was about, by ssh's words.
type Refusal int

const (
	// NotRefused: ssh said nothing of a refusal.
	NotRefused Refusal = iota
	// RefusedAuth: sshd refused the authentication ("Permission denied
	// (publickey)", "Too many authentication failures"): the key, or the
	// lack of an operator's MFA master.
	RefusedAuth
	// RefusedHostKey: the login node's host key is not the one known
	// ("Host key verification failed"): known_hosts is out of date, or
	// another machine answers at its address.
	RefusedHostKey
)

func (r Refusal) String() string {
	switch r {
	case RefusedAuth:
		return "authentication refused"
	case RefusedHostKey:
		return "host key not the one known"
	}
	return "not refused"
}

// refusalError is a call's error when a refused login stopped it: its
// words are the call's, and errors.Is finds ErrLoginRefused in it.
type refusalError struct{ error }

func (e refusalError) Is(target error) bool { return target == ErrLoginRefused }

// Login is one login node: what ssh is given as its destination, and
// the port when the entry names one (0: Config.Port, or ssh's own
// choice).
type Login struct {
	Dest string
	Port int
}

// Host is the login node without its user, for messages.
func (a Login) Host() string {
	h := a.Dest
	if i := strings.LastIndexByte(h, '@'); i >= 0 {
		h = h[i+1:]
	}
	if a.Port != 0 {
		return h + ":" + strconv.Itoa(a.Port)
	}
	return h
}

// String is the entry as written.
func (a Login) String() string {
	if a.Port == 0 {
		return a.Dest
	}
	user, host, ok := strings.Cut(a.Dest, "@")
	if !ok {
		host, user = user, ""
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if user != "" {
		host = user + "@" + host
	}
	return host + ":" + strconv.Itoa(a.Port)
}

var (
	// bracketPort is user@[address]:port, the one way an IPv6 address
	// takes a port.
	bracketPort = regexp.MustCompile(`^(?:([^@]*)@)?\[([0-9A-Fa-f:.]+)\](?::([0-9]+))?$`)
	// loginRE is user@host or a bare host (an ssh_config alias). The host
	// part allows the colons of an IPv6 address.
	loginRE = regexp.MustCompile(`^([A-Za-z0-9._][A-Za-z0-9._-]*@)?[A-Za-z0-9._:][A-Za-z0-9._:-]*$`)
)

// ParseLogin reads one login entry: user@host, user@host:port, a bare
// host or ssh_config alias, or user@[v6 address]:port. A host with more
// than one colon is an IPv6 address without a port. Its error says what
// is wrong with the entry and how to write it.
func ParseLogin(entry string) (Login, error) {
	switch {
	case entry == "":
		return Login{}, errors.New(`it is empty; write the login node as "user@host" or "user@host:port"`)
	case strings.ContainsFunc(entry, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }):
		return Login{}, errors.New("it contains whitespace or a control character; write it as user@host or user@host:port")
	case strings.HasPrefix(entry, "-"):
		return Login{}, errors.New("it starts with '-', which ssh would read as an option; write it as user@host")
	}
	dest, port := entry, ""
	if m := bracketPort.FindStringSubmatch(entry); m != nil {
		dest, port = m[2], m[3]
		if m[1] != "" {
			dest = m[1] + "@" + m[2]
		}
	} else if i := strings.LastIndexByte(entry, ':'); i >= 0 && strings.Count(entry[strings.LastIndexByte(entry, '@')+1:], ":") == 1 {
		dest, port = entry[:i], entry[i+1:]
	}
	if !loginRE.MatchString(dest) {
		return Login{}, fmt.Errorf("%q is not user@host: the user may use letters, digits, '.', '_' and '-', and the host letters, digits, '.', '-' and ':' (an IPv6 address with a port goes in brackets: user@[::1]:2222)", entry)
	}
	a := Login{Dest: dest}
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return Login{}, fmt.Errorf("%q has the port %q; a port is a number from 1 to 65535, as in user@host:2222", entry, port)
		}
		a.Port = n
	}
	return a, nil
}

// loginPhase is where one login node stands, as the last command sent to
// it found it.
type loginPhase int

const (
	// loginUntried (the zero value): nothing has been sent to it yet.
	_ loginPhase = iota
	// loginAnswering: the last command got through (whatever it said).
	loginAnswering
	// loginSilent: it did not answer; skipped until retryAt.
	loginSilent
	// loginRefusing: it answered and refused the login.
	loginRefusing
)

func (ph loginPhase) String() string {
	switch ph {
	case loginAnswering:
		return "answering"
	case loginSilent:
		return "not answering"
	case loginRefusing:
		return "refusing the login"
	}
	return "not tried yet"
}

// AccessPhase is the way to the cluster as a whole, as the last command
// found it.
type AccessPhase int

const (
	// AccessOpen: a login answered last, or none has been tried.
	AccessOpen AccessPhase = iota
	// AccessDown: no login answered the last command, and none refused
	// the login.
	AccessDown
	// AccessRefused: no login let the last command in, and one refused
	// the login: a person has to log in (an MFA master to open).
	AccessRefused
)

func (a AccessPhase) String() string {
	switch a {
	case AccessDown:
		return "down"
	case AccessRefused:
		return "refused"
	}
	return "open"
}

// Access is the way to the cluster and since when it has been so.
type Access struct {
	Phase AccessPhase
	// Since is when Phase began; zero before any change.
	Since time.Time
	// Said is ssh's words from the login that refused, with
	// AccessRefused: its first refusal's, whatever later tries said.
	Said string
	// Refusal is what that refusal was about, with AccessRefused.
	Refusal Refusal
	// NextTry is when a command may next try a login that refused, with
	// AccessRefused: the earliest retry due among them. Until then every
	// command fails at once with ErrLoginRefused.
	NextTry time.Time
}

// AccessChange is one change of Access, as Config.AccessChanged hears
// of it.
type AccessChange struct {
	// Login is the login node of the command that changed it.
	Login Login
	// Was is the access before, with when it began; Now is its new
	// phase, which began as the command ended.
	Was Access
	Now AccessPhase
	// Said is ssh's words from that command.
	Said string
}

// loginState is one login node's phase.
type loginState struct {
	phase loginPhase
	// since is when the phase began.
	since time.Time
	// retryAt is when a silent or refusing login is tried again; fails
	// counts its silences, or its tries since it refused, in a row, for
	// the doubling.
	retryAt time.Time
	fails   int
	// trying is set while one command tries a refusing login whose
	// retry was due, so that no other command knocks beside it.
	trying bool
	// said is ssh's words when it last failed; for a refusing login, its
	// first refusal's.
	said string
	// refusal is what a refusing login's first refusal was about.
	refusal Refusal
}

// loginBook is where each login node stands and which one is in use.
type loginBook struct {
	// mu guards the fields below. It is never held across ssh or a
	// hook, and nothing else is locked under it.
	mu sync.Mutex
	// state is each login's phase, in the configured order; made on first
	// use.
	state []loginState
	// inUse is the login that answered last, -1 before any did.
	inUse int
	// access is the way to the cluster as the last command found it,
	// and accessSince when that began.
	access      AccessPhase
	accessSince time.Time
	// refusedSaid and refusal are the words and kind of the first
	// refusal of the login that refused, while access is AccessRefused.
	refusedSaid string
	refusal     Refusal
}

// initLocked makes the book for n logins. b.mu must be held.
func (b *loginBook) initLocked(n int) {
	if len(b.state) != n {
		b.state = make([]loginState, n)
		b.inUse = -1
	}
}

// order is the logins to try for one command, by index: in the
// configured order, those skipped (silent, their retry not yet due) after
// the rest, as a last resort. A refusing login is left out until its
// retry is due, and while another command tries it.
func (b *loginBook) order(n int, now time.Time) []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.initLocked(n)
	out := make([]int, 0, n)
	var later []int
	for i, st := range b.state {
		switch {
		case st.phase == loginRefusing && (st.trying || now.Before(st.retryAt)):
		case st.phase == loginSilent && now.Before(st.retryAt):
			later = append(later, i)
		default:
			out = append(out, i)
		}
	}
	return append(out, later...)
}

// take claims login i for one command at now: false for a refusing
// login whose retry is not due or that another command is trying; a
// refusing login it gives is marked trying until note hears how the try
// went.
func (b *loginBook) take(n, i int, now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.initLocked(n)
	st := &b.state[i]
	if st.phase != loginRefusing {
		return true
	}
	if st.trying || now.Before(st.retryAt) {
		return false
	}
	st.trying = true
	return true
}

// held is the error of a command that no login could take: each it could
// go to refused, and none's retry is due.
func (b *loginBook) held(what string, logins []Login) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	said, next := b.refusedSaid, time.Time{}
	for _, st := range b.state {
		if st.phase != loginRefusing {
			continue
		}
		if said == "" {
			said = st.said
		}
		if next.IsZero() || st.retryAt.Before(next) {
			next = st.retryAt
		}
	}
	hosts := make([]string, len(logins))
	for i, a := range logins {
		hosts[i] = a.Host()
	}
	return fmt.Errorf("%s on %s: not tried: %w (%s); the next login is tried at %s",
		what, strings.Join(hosts, " or "), ErrLoginRefused, strings.TrimSpace(said), next.UTC().Format(time.RFC3339))
}

// current is the login to use for a long session (a Session): the one
// the last command got through, unless it is skipped now; else the first
// in order that has not refused the login; -1 when every login has. A
// Session never tries a refused login: its ssh's end is not read for
// what it says of the login, so the tries are Run's, one at a time.
func (b *loginBook) current(n int, now time.Time) int {
	order := b.order(n, now)
	b.mu.Lock()
	defer b.mu.Unlock()
	if i := b.inUse; i >= 0 && i < n && b.state[i].phase == loginAnswering {
		return i
	}
	for _, i := range order {
		if b.state[i].phase != loginRefusing {
			return i
		}
	}
	return -1
}

// loginOutcome is what one ssh command said about its login node.
type loginOutcome int

const (
	// outcomeGotThrough: the command ran, whatever it then said.
	outcomeGotThrough loginOutcome = iota
	// outcomeSilent: the login node did not answer; nothing ran.
	outcomeSilent
	// outcomeRefused: it refused the login, or its host key is not the
	// one known; nothing ran.
	outcomeRefused
	// outcomeUnknown: the command may have run (it ran out of time, or
	// the connection dropped); nothing is learnt about the login.
	outcomeUnknown
)

var (
	// authRefusedRE is sshd refusing the login: the key (or the lack of
	// an MFA master) is not enough.
	authRefusedRE = regexp.MustCompile(`Permission denied \(|Too many authentication failures`)
	// hostKeyRefusedRE is ssh refusing the login node's host key: it is
	// not the one known_hosts has for it, or there is none.
	hostKeyRefusedRE = regexp.MustCompile(`Host key verification failed`)
	// loginSilentRE is a login node that does not answer, in ssh's words,
	// said before anything ran on it: the connection refused, timed out
	// or dropped during the handshake (as sshd's penalty of an address
	// does), the name not resolving, the host unreachable, or a jump host
	// that could not reach it.
	loginSilentRE = regexp.MustCompile(`Connection refused|Could not resolve hostname|No route to host|Network is unreachable|` +
		`port \d+: Connection timed out|Connection timed out during banner exchange|kex_exchange_identification|` +
		`Connection closed by \S+ port \d+|Connection reset by \S+ port \d+|stdio forwarding failed`)
	// neverRanRE is ssh failing before it could run anything.
	neverRanRE = regexp.MustCompile(`Connection refused|Could not resolve hostname|Host key verification failed|Permission denied \(|` +
		`No route to host|Network is unreachable|port \d+: Connection timed out|Connection timed out during banner exchange|kex_exchange_identification|` +
		`Too many authentication failures|ControlPath too long|Bad configuration option|Bad owner or permissions`)
)

// Refused reads ssh's words for a refusal of the login: of the
// authentication, or of the login node's host key. A host key that is
// not the one known is checked before the authentication, so it is read
// first.
func Refused(said []byte) Refusal {
	switch {
	case hostKeyRefusedRE.Match(said):
		return RefusedHostKey
	case authRefusedRE.Match(said):
		return RefusedAuth
	}
	return NotRefused
}

// NeverRan reports whether ssh's stderr says it failed before it could
// run anything: it never connected, or was refused, or could not read
// its own settings.
func NeverRan(stderr []byte) bool { return neverRanRE.Match(stderr) }

// classify reads one ssh command's end for what it says about the login
// node. ssh exits 255 for its own failures, with nothing on stdout.
func (t *Transport) classify(err error, stdout, stderr []byte) loginOutcome {
	if err == nil {
		return outcomeGotThrough
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 255 || len(stdout) > 0 || (t.cfg.RemoteSaid != nil && t.cfg.RemoteSaid.Match(stderr)) {
		if errors.As(err, &ee) && ee.ExitCode() != 255 {
			return outcomeGotThrough
		}
		return outcomeUnknown
	}
	switch {
	case Refused(stderr) != NotRefused:
		return outcomeRefused
	case loginSilentRE.Match(stderr):
		return outcomeSilent
	}
	return outcomeUnknown
}

// outcomePhase is the phase each outcome puts its login in.
var outcomePhase = map[loginOutcome]loginPhase{outcomeGotThrough: loginAnswering, outcomeSilent: loginSilent, outcomeRefused: loginRefusing}

// loginChange is what a command's outcome changed, for the one log line
// each change gets.
type loginChange struct {
	// silent and back are set when login i stopped or started answering.
	silent, back bool
	// access is the new phase of the whole, when it changed.
	accessChanged bool
	access        AccessPhase
	was           AccessPhase
	since         time.Time
}

// note records what one command found at login i. last says whether
// this was the last login the command could try; access is judged on the
// last one, or on a login that got through.
//
// started is when the command began: one that began before the login's or
// the whole's phase last changed cannot change it back. A command that
// was running through an operator's master as it closed succeeds after
// the first refusal; without this the phase would flap, with a log line
// each way.
//
// A refusing login stays refusing, with its first refusal's words, until
// a command gets through: a try refused again, or failing otherwise (an
// sshd that penalises the address closes the connection before it says
// why), only pushes its next try back.
func (b *loginBook) note(n, i int, out loginOutcome, said string, started, now time.Time, last bool) loginChange {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.initLocked(n)
	st := &b.state[i]
	st.trying = false
	var ch loginChange
	if phase, ok := outcomePhase[out]; ok && phase != st.phase && started.Before(st.since) {
		return ch
	}
	if st.phase == loginRefusing && out != outcomeGotThrough {
		if started.Before(st.since) {
			// In flight when the login first refused: not a try.
			return ch
		}
		// A try of a refused login that did not get through.
		st.fails++
		st.retryAt = now.Add(doubling.Delay(refusalRetryFirst, refusalRetryMax, st.fails))
		if out == outcomeUnknown {
			return ch
		}
		out = outcomeRefused
	}
	switch out {
	case outcomeGotThrough:
		ch.back = st.phase == loginSilent || st.phase == loginRefusing
		if st.phase != loginAnswering {
			st.since = now
		}
		st.phase, st.fails, st.said, st.refusal = loginAnswering, 0, "", NotRefused
		b.inUse = i
	case outcomeSilent:
		ch.silent = st.phase != loginSilent
		if st.phase != loginSilent {
			st.since = now
		}
		st.phase = loginSilent
		st.fails++
		st.retryAt = now.Add(doubling.Delay(loginRetryFirst, loginRetryMax, st.fails))
		st.said = shorten(said)
	case outcomeRefused:
		if st.phase != loginRefusing {
			st.since = now
			st.phase, st.fails, st.said, st.refusal = loginRefusing, 1, shorten(said), Refused([]byte(said))
			st.retryAt = now.Add(doubling.Delay(refusalRetryFirst, refusalRetryMax, st.fails))
		}
	default:
		return ch
	}
	var access AccessPhase
	switch {
	case out == outcomeGotThrough:
		access = AccessOpen
	case !last:
		return ch
	default:
		// No login let this command in: refused if any refused it.
		access = AccessDown
		for _, s := range b.state {
			if s.phase == loginRefusing {
				access = AccessRefused
				if b.access != AccessRefused {
					b.refusedSaid, b.refusal = s.said, s.refusal
				}
				break
			}
		}
	}
	if access != b.access && started.Before(b.accessSince) {
		return ch
	}
	if access != b.access {
		ch.accessChanged, ch.access, ch.was, ch.since = true, access, b.access, b.accessSince
		b.access, b.accessSince = access, now
	}
	return ch
}

// changed writes the one line a change of a login's phase gets, and
// tells AccessChanged of a change of the whole's.
func (t *Transport) changed(i int, ch loginChange, said string) {
	a := t.cfg.Logins[i]
	several := len(t.cfg.Logins) > 1
	if ch.silent && several {
		t.log.Warn("a login node does not answer; skipping it until it does", "login", a.String(), "said", shorten(said))
	}
	if ch.back && several {
		t.log.Info("a login node answers again", "login", a.String())
	}
	if ch.accessChanged && t.cfg.AccessChanged != nil {
		t.cfg.AccessChanged(AccessChange{Login: a, Was: Access{Phase: ch.was, Since: ch.since}, Now: ch.access, Said: said})
	}
}

// Access is the way to the cluster as the last command found it.
func (t *Transport) Access() Access {
	b := &t.logins
	b.mu.Lock()
	defer b.mu.Unlock()
	a := Access{Phase: b.access, Since: b.accessSince}
	if a.Phase == AccessRefused {
		a.Said, a.Refusal = b.refusedSaid, b.refusal
		for _, st := range b.state {
			if st.phase == loginRefusing && (a.NextTry.IsZero() || st.retryAt.Before(a.NextTry)) {
				a.NextTry = st.retryAt
			}
		}
	}
	return a
}

// Notes are the logins' lines for a status page: which login is in use,
// when there are several, and each that is not answering or refusing,
// with ssh's words. One login that answers says nothing.
func (t *Transport) Notes() []string {
	b := &t.logins
	b.mu.Lock()
	defer b.mu.Unlock()
	logins := t.cfg.Logins
	b.initLocked(len(logins))
	var notes []string
	if len(logins) > 1 && b.inUse >= 0 {
		notes = append(notes, fmt.Sprintf("login: using %s (entry %d of %d) since %s", logins[b.inUse], b.inUse+1, len(logins),
			b.state[b.inUse].since.UTC().Format(time.RFC3339)))
	}
	for i, st := range b.state {
		if st.phase != loginSilent && st.phase != loginRefusing {
			continue
		}
		n := fmt.Sprintf("login: %s %s since %s (%s)", logins[i], st.phase, st.since.UTC().Format(time.RFC3339), st.said)
		switch {
		case st.phase == loginRefusing:
			n += "; tried again at " + st.retryAt.UTC().Format(time.RFC3339)
		case len(logins) > 1:
			n += "; skipped until " + st.retryAt.UTC().Format(time.RFC3339)
		}
		notes = append(notes, n)
	}
	return notes
}
