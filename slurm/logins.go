package slurm

// Several login nodes, and a login that needs a person.
//
// A site's login nodes come in pairs or more, and any one of them may be
// down for maintenance. The login setting takes a list: each entry is
// tried in order, one that does not answer (the connection refused or
// timed out, the name not resolving, a jump host that cannot reach it) is
// skipped until it answers again, and every command (sbatch, squeue,
// scancel, the look for a job whose answer was lost, adoption, the relay)
// goes through whichever answers. Moving on to the next login is safe for
// sbatch too: ssh's words for a login node that does not answer are said
// before anything runs on it (neverConnected). An sbatch whose answer was
// lost after it ran is never moved: it is looked for by its comment, as
// with one login (demand.go), through whichever login answers.
//
// A login node that answers and refuses the login ("Permission denied
// (publickey)") is a different thing: at a site with MFA the plugin
// reuses an operator's ControlMaster (ssh_config's ControlPath, multiplex
// = false), and when that master is gone ssh falls back to a key the site
// refuses. Nothing the plugin can do brings it back: the provisioner is
// in the phase "login needed" and says what to run. That is weather, not
// a fault of a profile: no profile backs off, no machine is counted
// failed, and Provision asks for nothing (it answers the demand capped,
// "login needed: ..."), so the engine has no reason to try another
// profile behind the same login. The poller tries the login once a
// poll_interval, and the first command that gets through ends the phase;
// the next Provision asks again. One log line says when the phase begins
// and one when it ends, never one per attempt.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	doubling "github.com/fluksio/provision/internal/backoff"
	"github.com/fluksio/provision/shared"
)

const (
	// loginRetryFirst and loginRetryMax bound how long a login node that
	// did not answer is skipped before it is tried again (it is first in
	// line again then). Doubling, so that one down for the day costs a
	// connection attempt every few minutes, not one per command.
	loginRetryFirst = 10 * time.Second
	loginRetryMax   = 5 * time.Minute
	// loginNeededPrefix starts every answer and note about a login that
	// needs a person, as limitReached does for a limit.
	loginNeededPrefix = "login needed"
)

// Logins is the login setting: one login node, or several tried in order.
// The configuration carries a JSON string or a JSON array of strings
// (shared.TypeStringOrList); List remembers which, so that a diagnostic
// points at the string or at the element.
type Logins struct {
	Entries []string
	List    bool
}

// UnmarshalJSON takes a string or a list of strings; null is no login.
func (l *Logins) UnmarshalJSON(b []byte) error {
	*l = Logins{}
	if string(b) == "null" {
		return nil
	}
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		l.Entries = []string{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return &json.UnmarshalTypeError{Value: "something else", Type: reflect.TypeOf(""), Field: "login"}
	}
	l.Entries, l.List = many, true
	return nil
}

// MarshalJSON writes what was read: a string, or a list.
func (l Logins) MarshalJSON() ([]byte, error) {
	if !l.List && len(l.Entries) == 1 {
		return json.Marshal(l.Entries[0])
	}
	return json.Marshal(l.Entries)
}

// String is the logins as a person would write them, for messages.
func (l Logins) String() string { return strings.Join(l.Entries, ", ") }

// loginAddr is one login node: what ssh is given as its destination, and
// the port when the entry names one (0: ssh_port, or ssh's own choice).
type loginAddr struct {
	dest string
	port int
}

// host is the login node without its user, for messages.
func (a loginAddr) host() string {
	h := a.dest
	if i := strings.LastIndexByte(h, '@'); i >= 0 {
		h = h[i+1:]
	}
	if a.port != 0 {
		return h + ":" + strconv.Itoa(a.port)
	}
	return h
}

// String is the entry as written.
func (a loginAddr) String() string {
	if a.port == 0 {
		return a.dest
	}
	user, host, ok := strings.Cut(a.dest, "@")
	if !ok {
		host, user = user, ""
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if user != "" {
		host = user + "@" + host
	}
	return host + ":" + strconv.Itoa(a.port)
}

// bracketPort is user@[address]:port, the one way an IPv6 address takes a
// port.
var bracketPort = regexp.MustCompile(`^(?:([^@]*)@)?\[([0-9A-Fa-f:.]+)\](?::([0-9]+))?$`)

// parseLogin reads one entry: user@host, user@host:port, a bare host or
// ssh_config alias, or user@[v6 address]:port. A host with more than one
// colon is an IPv6 address without a port.
func parseLogin(entry string) (loginAddr, string) {
	switch {
	case entry == "":
		return loginAddr{}, `it is empty; write the login node as "user@host" or "user@host:port"`
	case strings.ContainsFunc(entry, isSpaceOrControl):
		return loginAddr{}, "it contains whitespace or a control character; write it as user@host or user@host:port"
	case strings.HasPrefix(entry, "-"):
		return loginAddr{}, "it starts with '-', which ssh would read as an option; write it as user@host"
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
		return loginAddr{}, fmt.Sprintf("%q is not user@host: the user may use letters, digits, '.', '_' and '-', and the host letters, digits, '.', '-' and ':' (an IPv6 address with a port goes in brackets: user@[::1]:2222)", entry)
	}
	a := loginAddr{dest: dest}
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return loginAddr{}, fmt.Sprintf("%q has the port %q; a port is a number from 1 to 65535, as in user@host:2222", entry, port)
		}
		a.port = n
	}
	return a, ""
}

// validateLogins resolves s.Login into s.logins, with a diagnostic at the
// string, or at each bad element of a list.
func validateLogins(s *settings) shared.Diagnostics {
	var diags shared.Diagnostics
	l := s.Login
	if len(l.Entries) == 0 {
		what := `Set login to the cluster's login node as "user@host"`
		if l.List {
			what = "The login list is empty. " + what + `, or to several as ["user@login1", "user@login2:2222"], tried in order`
		}
		return shared.Diagnostics{shared.Errorf([]string{"login"}, "Missing login", "%s.", what)}
	}
	if !l.List && l.Entries[0] == "" {
		return shared.Diagnostics{shared.Errorf([]string{"login"}, "Missing login", `Set login to the cluster's login node as "user@host".`)}
	}
	seen := map[string]int{}
	for i, e := range l.Entries {
		path := []string{"login"}
		if l.List {
			path = append(path, strconv.Itoa(i))
		}
		a, why := parseLogin(e)
		if why != "" {
			diags = append(diags, shared.Errorf(path, "Invalid login", "%s.", why))
			continue
		}
		if a.port != 0 && s.SSHPort != 0 && a.port != s.SSHPort && len(l.Entries) == 1 {
			diags = append(diags, shared.Errorf(path, "Two ports for the login node",
				"%q names port %d and ssh_port says %d. Keep one: the port in the login, or ssh_port.", e, a.port, s.SSHPort))
			continue
		}
		key := a.String()
		if j, dup := seen[key]; dup {
			diags = append(diags, shared.Errorf(path, "Login listed twice",
				"%q is entry %d as well. Each login node once: the list is the order they are tried in.", e, j+1))
			continue
		}
		seen[key] = i
		s.logins = append(s.logins, a)
	}
	return diags
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

// accessPhase is the provisioner's way to the cluster as a whole.
type accessPhase int

const (
	// accessOpen: a login answered last, or none has been tried.
	accessOpen accessPhase = iota
	// accessDown: no login answered the last command, and none refused
	// the login: weather, each submission fails and backs off as ever.
	accessDown
	// accessLoginNeeded: no login let the last command in, and one
	// refused the login: a person has to log in (an MFA master to open).
	accessLoginNeeded
)

// loginState is one login node's phase.
type loginState struct {
	phase loginPhase
	// since is when the phase began.
	since time.Time
	// retryAt is when a silent login is tried again; fails counts its
	// silences in a row, for the doubling.
	retryAt time.Time
	fails   int
	// said is ssh's words when it last failed.
	said string
}

// loginBook is where each login node stands and which one is in use.
type loginBook struct {
	// mu guards the fields below. It is never held across ssh.
	mu sync.Mutex
	// state is each login's phase, in the configured order; made on first
	// use from the settings, which never change.
	state []loginState
	// inUse is the login that answered last, -1 before any did.
	inUse int
	// access is the way to the cluster as the last command found it,
	// and accessSince when that began.
	access      accessPhase
	accessSince time.Time
	// refusedSaid is ssh's words from the login that refused, while
	// access is accessLoginNeeded.
	refusedSaid string
}

// init makes the book for n logins. b.mu must be held.
func (b *loginBook) initLocked(n int) {
	if len(b.state) != n {
		b.state = make([]loginState, n)
		b.inUse = -1
	}
}

// order is the logins to try for one command, by index: in the
// configured order, those skipped (silent, their retry not yet due) after
// the rest, as a last resort.
func (b *loginBook) order(n int, now time.Time) []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.initLocked(n)
	out := make([]int, 0, n)
	var later []int
	for i, st := range b.state {
		if st.phase == loginSilent && now.Before(st.retryAt) {
			later = append(later, i)
			continue
		}
		out = append(out, i)
	}
	return append(out, later...)
}

// current is the login to use for a long session (the relay's): the one
// the last command got through, unless it is skipped now; else the first
// in order.
func (b *loginBook) current(n int, now time.Time) int {
	order := b.order(n, now)
	b.mu.Lock()
	defer b.mu.Unlock()
	if i := b.inUse; i >= 0 && i < n && b.state[i].phase == loginAnswering {
		return i
	}
	return order[0]
}

// loginOutcome is what one ssh command said about its login node.
type loginOutcome int

const (
	// outcomeGotThrough: the command ran, whatever it then said.
	outcomeGotThrough loginOutcome = iota
	// outcomeSilent: the login node did not answer; nothing ran.
	outcomeSilent
	// outcomeRefused: it refused the login; nothing ran.
	outcomeRefused
	// outcomeUnknown: the command may have run (it ran out of time, or
	// the connection dropped); nothing is learnt about the login.
	outcomeUnknown
)

var (
	// loginRefusedRE is sshd refusing the login: the key (or the lack of
	// an MFA master) is not enough.
	loginRefusedRE = regexp.MustCompile(`Permission denied \(|Too many authentication failures`)
	// loginSilentRE is a login node that does not answer, in ssh's words,
	// said before anything ran on it: the connection refused, timed out
	// or dropped during the handshake, the name not resolving, the host
	// unreachable, a jump host that could not reach it, or a host key
	// that is not the one known (another machine answers at its address).
	loginSilentRE = regexp.MustCompile(`Connection refused|Could not resolve hostname|No route to host|Network is unreachable|` +
		`port \d+: Connection timed out|Connection timed out during banner exchange|kex_exchange_identification|` +
		`Connection closed by \S+ port \d+|Connection reset by \S+ port \d+|stdio forwarding failed|Host key verification failed`)
)

// classifyLogin reads one ssh command's end for what it says about the
// login node. ssh exits 255 for its own failures, with nothing on stdout.
func classifyLogin(err error, stdout, stderr []byte) loginOutcome {
	if err == nil {
		return outcomeGotThrough
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 255 || len(stdout) > 0 || sbatchSaid.Match(stderr) {
		if errors.As(err, &ee) && ee.ExitCode() != 255 {
			return outcomeGotThrough
		}
		return outcomeUnknown
	}
	switch {
	case loginRefusedRE.Match(stderr):
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
	access        accessPhase
	was           accessPhase
	since         time.Time
}

// note records what one command found at login i. tried and last say
// whether this was the last login the command could try; access is
// judged on the last one, or on a login that got through.
//
// started is when the command began: one that began before the login's or
// the whole's phase last changed cannot change it back. A command that
// was running through an operator's master as it closed succeeds after
// the first refusal; without this the phase would flap, with a log line
// each way.
func (b *loginBook) note(n, i int, out loginOutcome, said string, started, now time.Time, last bool) loginChange {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.initLocked(n)
	st := &b.state[i]
	var ch loginChange
	if phase, ok := outcomePhase[out]; ok && phase != st.phase && started.Before(st.since) {
		return ch
	}
	switch out {
	case outcomeGotThrough:
		ch.back = st.phase == loginSilent || st.phase == loginRefusing
		if st.phase != loginAnswering {
			st.since = now
		}
		st.phase, st.fails, st.said = loginAnswering, 0, ""
		b.inUse = i
	case outcomeSilent:
		ch.silent = st.phase != loginSilent
		if st.phase != loginSilent {
			st.since = now
		}
		st.phase = loginSilent
		st.fails++
		st.retryAt = now.Add(doubling.Delay(loginRetryFirst, loginRetryMax, st.fails))
		st.said = truncate(said)
	case outcomeRefused:
		if st.phase != loginRefusing {
			st.since = now
		}
		st.phase, st.fails, st.said = loginRefusing, 0, truncate(said)
	default:
		return ch
	}
	var access accessPhase
	switch {
	case out == outcomeGotThrough:
		access = accessOpen
	case !last:
		return ch
	default:
		// No login let this command in: login needed if any refused it.
		access = accessDown
		for _, s := range b.state {
			if s.phase == loginRefusing {
				access = accessLoginNeeded
				b.refusedSaid = s.said
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

// loginNeeded reports whether a person has to log in, and the words to
// say so.
func (p *Provisioner) loginNeeded(cfg *settings) (bool, string) {
	b := &p.logins
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.access != accessLoginNeeded {
		return false, ""
	}
	return true, loginNeededDetail(cfg, b.refusedSaid, b.accessSince)
}

// loginNeededDetail says that a login is needed, since when, and what to
// do: with multiplex off (the MFA recipe), the operator's ssh that opens
// the master ssh_config's ControlPath names; with the plugin's own
// connections, the key and authorized_keys to check.
func loginNeededDetail(cfg *settings, said string, since time.Time) string {
	head := fmt.Sprintf("%s: the login node refused the login (%s) since %s; nothing is asked for until a login gets through",
		loginNeededPrefix, strings.TrimSpace(said), since.UTC().Format(time.RFC3339))
	const tail = "; the provisioner tries again every poll_interval and carries on by itself"
	if cfg.multiplex {
		return head + ". Check ssh_key and that its public half is in the user's authorized_keys (host-example validate -check tries the login)" + tail
	}
	return head + ". Log in as the operator to open the shared connection again (run `" + masterCommand(cfg) +
		"` and answer its prompts; ssh_config's ControlPath names the socket)" + tail
}

// masterCommand is the ssh that opens an operator's master to the first
// login node with the plugin's ssh settings.
func masterCommand(cfg *settings) string {
	run := "ssh"
	if cfg.SSHConfig != "" {
		run += " -F " + cfg.SSHConfig
	}
	a := cfg.firstLogin()
	if a.port != 0 {
		run += " -p " + strconv.Itoa(a.port)
	} else if cfg.SSHPort != 0 {
		run += " -p " + strconv.Itoa(cfg.SSHPort)
	}
	return run + " -o ControlMaster=yes -o ControlPersist=yes -fN " + a.dest
}

// loginNotes are the logins' lines in Status: which login is in use, and
// each that is not answering or refusing, with ssh's words. One login
// that answers says nothing.
func (p *Provisioner) loginNotes(cfg *settings) []string {
	b := &p.logins
	b.mu.Lock()
	defer b.mu.Unlock()
	logins := cfg.loginList()
	b.initLocked(len(logins))
	var notes []string
	if b.access == accessLoginNeeded {
		notes = append(notes, loginNeededDetail(cfg, b.refusedSaid, b.accessSince))
	}
	if len(logins) > 1 && b.inUse >= 0 {
		notes = append(notes, fmt.Sprintf("login: using %s (entry %d of %d) since %s", logins[b.inUse], b.inUse+1, len(logins),
			b.state[b.inUse].since.UTC().Format(time.RFC3339)))
	}
	for i, st := range b.state {
		if st.phase != loginSilent && st.phase != loginRefusing {
			continue
		}
		n := fmt.Sprintf("login: %s %s since %s (%s)", logins[i], st.phase, st.since.UTC().Format(time.RFC3339), st.said)
		if st.phase == loginSilent && len(logins) > 1 {
			n += "; skipped until " + st.retryAt.UTC().Format(time.RFC3339)
		}
		notes = append(notes, n)
	}
	return notes
}

// logLoginChange writes the one line a change of a login's or of the
// whole's phase gets.
func (p *Provisioner) logLoginChange(cfg *settings, i int, ch loginChange, said string) {
	log := p.sshLog(cfg)
	logins := cfg.loginList()
	a := logins[i]
	if ch.silent && len(logins) > 1 {
		log.Warn("a login node does not answer; skipping it until it does", "login", a.String(), "said", truncate(said))
	}
	if ch.back && len(logins) > 1 {
		log.Info("a login node answers again", "login", a.String())
	}
	if !ch.accessChanged {
		return
	}
	switch {
	case ch.access == accessLoginNeeded:
		ok, detail := p.loginNeeded(cfg)
		if ok {
			log.Error("login needed: the login node refused the login; asking for nothing until a login gets through", "login", a.String(), "said", truncate(said), "detail", detail)
		}
	case ch.was == accessLoginNeeded && ch.access == accessOpen:
		log.Info("logged in again: the login node lets commands in", "login", a.String(), "login_needed_for", p.now().Sub(ch.since).Round(time.Second).String())
	}
}

// withdrawForLogin takes back the machines of a submission that a login
// refusal stopped before it reached the cluster, when a login is needed
// now: they were never asked for and never announced, so nothing failed
// and nothing backs off; the demand is answered "login needed" until a
// login gets through. It reports whether it took them back.
func (p *Provisioner) withdrawForLogin(cfg *settings, live []*request, said string) bool {
	if !loginRefusedRE.MatchString(said) {
		return false
	}
	needed, detail := p.loginNeeded(cfg)
	if !needed {
		return false
	}
	p.mu.Lock()
	p.lastErr = truncate(detail)
	for _, r := range live {
		if p.outstanding[r.worker] == r {
			delete(p.outstanding, r.worker)
		}
		if r.phase != phaseArrived {
			r.phase = phaseFailed
		}
	}
	p.mu.Unlock()
	cfg.log.Debug("a submission was stopped by the login refusal; asking again once a login gets through", "profile", live[0].profile, "machines", len(live))
	p.wakePoller()
	return true
}
