package slurm

// Several login nodes, and a login that needs a person.
//
// A site's login nodes come in pairs or more, and any one of them may be
// down for maintenance. The login setting takes a list: each entry is
// tried in order, one that does not answer is skipped until it answers
// again, and every command (sbatch, squeue, scancel, the look for a job
// whose answer was lost, adoption, the relay) goes through whichever
// answers. That is the ssh transport's (slurm/sshrun); moving on to the
// next login is safe for sbatch too, since ssh's words for a login node
// that does not answer are said before anything runs on it. An sbatch
// whose answer was lost after it ran is never moved: it is looked for by
// its comment, as with one login (demand.go), through whichever login
// answers.
//
// A login node that answers and refuses the login ("Permission denied
// (publickey)", or a host key that is not the one known_hosts has) is a
// different thing: a person has to act. At a site with MFA the plugin
// reuses an operator's ControlMaster (ssh_config's ControlPath,
// multiplex = false), and when that master is gone ssh falls back to a
// key the site refuses; elsewhere the key or known_hosts is wrong. While
// the transport's Access is refused, the provisioner is in the phase
// "login needed" and says what to do. That is weather, not a fault of a
// profile: no profile backs off, no machine is counted failed, and
// Provision asks for nothing (it answers the demand capped, "login
// needed: ..."), so the engine has no reason to try another profile
// behind the same login.
//
// Every refused login knocks on the login node's sshd, which counts it
// against the engine's address (PerSourcePenalties, fail2ban). So the
// login is tried again on the transport's slow backoff alone (a minute
// after the refusal, doubling to 15 minutes; slurm/sshrun owns it, for
// every command: the poll, a submission, adoption, a cancel, the relay,
// Shutdown's look at the queue), never at the poll's pace: until the try
// is due the poller reads nothing, and every other command fails at once
// without running ssh. The first try that gets through ends the phase,
// whatever a person did (a new key, the master opened again), and the
// next Provision asks again. The words are the first refusal's to the
// end, with when the next try is; one log line says when the phase
// begins and one when it ends, never one per attempt.

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/sshrun"
)

// loginNeededPrefix starts every answer and note about a login that
// needs a person, as limitReached does for a limit.
const loginNeededPrefix = "login needed"

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
		// encoding/json names the field (login, bastion) itself.
		return &json.UnmarshalTypeError{Value: "something else", Type: reflect.TypeOf("")}
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
	var more shared.Diagnostics
	s.logins, more = parseLoginList("login", l, loginWords{invalid: "Invalid login", twice: "Login listed twice", one: "login node"},
		func(path []string, e string, a sshrun.Login) *shared.Diagnostic {
			if a.Port != 0 && s.SSHPort != 0 && a.Port != s.SSHPort && len(l.Entries) == 1 {
				d := shared.Errorf(path, "Two ports for the login node",
					"%q names port %d and ssh_port says %d. Keep one: the port in the login, or ssh_port.", e, a.Port, s.SSHPort)
				return &d
			}
			return nil
		})
	return append(diags, more...)
}

// loginWords are what a list of logins' diagnostics call it.
type loginWords struct {
	// invalid and twice are the summaries of an entry that does not
	// parse and of one listed again; one names an entry ("login node").
	invalid, twice, one string
}

// parseLoginList parses each entry of l, the attribute attr, in order,
// with a diagnostic at the string or at each bad element of a list: one
// that does not parse, one check refuses (nil for none), or one listed
// twice. It returns the entries that passed.
func parseLoginList(attr string, l Logins, w loginWords, check func(path []string, entry string, a sshrun.Login) *shared.Diagnostic) ([]sshrun.Login, shared.Diagnostics) {
	var out []sshrun.Login
	var diags shared.Diagnostics
	seen := map[string]int{}
	for i, e := range l.Entries {
		path := []string{attr}
		if l.List {
			path = append(path, strconv.Itoa(i))
		}
		a, err := sshrun.ParseLogin(e)
		if err != nil {
			diags = append(diags, shared.Errorf(path, w.invalid, "%s.", strings.Replace(err.Error(), "the login node", "the "+w.one, 1)))
			continue
		}
		if d := check(path, e, a); d != nil {
			diags = append(diags, *d)
			continue
		}
		if j, dup := seen[a.String()]; dup {
			diags = append(diags, shared.Errorf(path, w.twice,
				"%q is entry %d as well. Each %s once: the list is the order they are tried in.", e, j+1, w.one))
			continue
		}
		seen[a.String()] = i
		out = append(out, a)
	}
	return out, diags
}

// loginNeeded reports whether a person has to log in (the transport's
// Access is refused), and the words to say so. It may be called with
// p.mu held: the transport's lock is taken under it, never the other way
// round.
func (p *Provisioner) loginNeeded(cfg *settings) (bool, string) {
	if p.q == nil {
		return false, ""
	}
	a := p.q.Transport().Access()
	if a.Phase != sshrun.AccessRefused {
		return false, ""
	}
	return true, loginNeededDetail(cfg, a)
}

// loginNeededDetail says that a login is needed, since when, what to do
// and when it is tried again: for a host key, known_hosts to check; with
// multiplex off (the MFA recipe), the operator's ssh that opens the
// master ssh_config's ControlPath names; with the plugin's own
// connections, the key and authorized_keys to check.
func loginNeededDetail(cfg *settings, a sshrun.Access) string {
	head := fmt.Sprintf("%s: the login node refused the login (%s) since %s; nothing is asked for until a login gets through",
		loginNeededPrefix, strings.TrimSpace(a.Said), a.Since.UTC().Format(time.RFC3339))
	tail := "; the login is tried again at " + a.NextTry.UTC().Format(time.RFC3339) +
		" (a minute after the refusal, doubling to 15 minutes, so that the login node's sshd does not penalise this address) and the provisioner carries on by itself once it gets through"
	switch {
	case a.Refusal == sshrun.RefusedHostKey && len(cfg.bastions) > 0:
		return head + ". Check known_hosts: the host key of the host ssh names, the bastion or the login node, is not the one it has; with bastion set it holds both (compare `ssh-keyscan` of that host with the site's published fingerprint before you trust it; host-example validate -check tries the login)" + tail
	case a.Refusal == sshrun.RefusedHostKey:
		return head + ". Check known_hosts: the login node's host key is not the one it has (compare `ssh-keyscan` of the login node with the site's published fingerprint before you trust it; host-example validate -check tries the login)" + tail
	case cfg.multiplex:
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
	if a.Port != 0 {
		run += " -p " + strconv.Itoa(a.Port)
	} else if cfg.SSHPort != 0 {
		run += " -p " + strconv.Itoa(cfg.SSHPort)
	}
	return run + " -o ControlMaster=yes -o ControlPersist=yes -fN " + a.Dest
}

// loginNotes are the logins' lines in Status: that a login is needed,
// then the transport's (which login is in use, and each that is not
// answering or refusing, with ssh's words). One login that answers says
// nothing.
func (p *Provisioner) loginNotes(cfg *settings) []string {
	if p.q == nil {
		return nil
	}
	var notes []string
	if needed, detail := p.loginNeeded(cfg); needed {
		notes = append(notes, detail)
	}
	return append(notes, p.q.Transport().Notes()...)
}

// accessChanged writes the one line a change of the way in gets: when a
// login becomes needed, and when one gets through again. The transport
// calls it after the command that found the change, with no lock held.
func (p *Provisioner) accessChanged(cfg *settings, ch sshrun.AccessChange) {
	log := cfg.log
	if log == nil {
		log = p.logger
	}
	switch {
	case ch.Now == sshrun.AccessRefused:
		if needed, detail := p.loginNeeded(cfg); needed {
			log.Error("login needed: the login node refused the login; asking for nothing until a login gets through", "login", ch.Login.String(), "said", truncate(ch.Said), "detail", detail)
		}
	case ch.Was.Phase == sshrun.AccessRefused && ch.Now == sshrun.AccessOpen:
		log.Info("logged in again: the login node lets commands in", "login", ch.Login.String(), "login_needed_for", p.now().Sub(ch.Was.Since).Round(time.Second).String())
	}
}

// withdrawForLogin takes back the machines of a submission that a login
// refusal stopped before it reached the cluster (err holds
// sshrun.ErrLoginRefused), when a login is needed now: they were never
// asked for and never announced, so nothing failed and nothing backs
// off; the demand is answered "login needed" until a login gets through.
// It reports whether it took them back.
func (su *submitter) withdrawForLogin(cfg *settings, live []*request, err error) bool {
	p := su.p
	if !errors.Is(err, sshrun.ErrLoginRefused) {
		return false
	}
	needed, detail := p.loginNeeded(cfg)
	if !needed {
		return false
	}
	p.mu.Lock()
	p.lastErr = truncate(detail)
	su.withdrawLocked(live)
	p.mu.Unlock()
	cfg.log.Debug("a submission was stopped by the login refusal; asking again once a login gets through", "profile", live[0].profile, "machines", len(live))
	p.poll.wake()
	return true
}
