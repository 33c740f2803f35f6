package slurm

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/sbatch"
)

// --begin in a profile: "do not start this machine before ...". The
// provisioner's own clocks (provision_timeout for the request, the
// --deadline it gives Slurm, the credential's lifetime) count from when a
// job could first start, not from when it was asked for; counted from
// the request, a begin later than provision_timeout would be cancelled
// before it could run, and Slurm refuses a --deadline before the begin
// outright ("Incompatible begin and deadline time specification").
//
// Every form sbatch accepts is read as Slurm's parse_time reads it
// (sbatch.ParseBegin); a value sbatch refuses ("Invalid --begin
// specification") is an error at validate.
//
// A begin is a delay after submission, as Slurm works it out on the login
// node when the job is submitted (sbatch.Begin.At): now+N is N; a date and
// time is that instant less the submission's; a time of day is the next
// one after submission, so submitted just after 16:00, --begin=16:00 (or
// teatime) waits almost a day, and a date without a year (01/10) almost a
// year. Each of the provisioner's clocks counts from that delay, worked
// out when the job is submitted, for every form: the credential is minted
// to last from the begin, --deadline is set from it, and provision_timeout
// counts from it, as for now+N.
//
// A wall-clock form (anything but now±N) is read on the provisioner's
// clock and in its time zone (the plugin's TZ, which is the engine's),
// since sbatch's, on the login node, cannot be read here. Its delay gets
// beginClockMargin more, for clocks that disagree. A cluster whose time
// zone differs reads the begin hours apart; the --deadline (relative to
// submission, so on the cluster's own clock) is then what keeps the
// credential honest: it ends no later than the deadline plus tokenMargin,
// so Slurm either runs the job within its credential or refuses it at
// submission (24.11 and later: "Requested time limit is invalid";
// 22.05 ends it DEADLINE unstarted). A profile without --time gets no
// deadline and has no such guard.

// A credential is minted when its job is submitted, not when it may
// start, and the engine caps its lifetime (credentialCap) counted from
// then. A begin far enough out leaves a worker that can never attach: its
// credential has expired before its job may start (a --begin=now+2days,
// a --begin=2027-01-01T00:00:00 or a --begin=teatime submitted at five
// past four). Such a profile is refused at validate, at its --begin line,
// with the submission that waits longest from the validation on: when its
// job may start and when its credential expires.
//
// Why not a credential with a not-before time: docs/design/slurm-begin.md.

// credentialCap is the longest the engine lets a credential live
// (host.DefaultMaxCredentialTTL; TestCredentialCapIsTheEngines keeps the
// two equal). The plugin cannot ask the engine for it, so it is the
// contract's number.
const credentialCap = 12 * time.Hour

// beginClockMargin is added to a wall-clock begin's delay for a login
// node's clock that disagrees with the provisioner's: NTP keeps them
// within a second; 5 minutes is Kerberos' default tolerance of skew, a
// clock nobody keeps.
const beginClockMargin = 5 * time.Minute

// validateBegin refuses a profile whose --begin, plus the wait in the
// queue (provision_timeout), its time limit and tokenMargin, comes to
// more than its credential will last: the engine's cap, or token_ttl if
// that is shorter. The delay is the longest a job submitted from s.now on
// waits for its begin (sbatch.Begin.LongestWait).
func validateBegin(s *settings, i string, p Profile) shared.Diagnostics {
	v, ok := sbatch.BeginOf(p.Sbatch)
	if !ok {
		return nil
	}
	b, err := sbatch.ParseBegin(v)
	if err != nil {
		return nil // an error at its line already (validateProfile)
	}
	now := s.now
	if now.IsZero() {
		now = time.Now()
	}
	sub, start := b.LongestWait(now)
	delay := start.Sub(sub)
	if delay <= 0 {
		return nil
	}
	if b.Wall() {
		delay += beginClockMargin
	}
	limit, hasLimit := sbatch.TimeLimit(p.Sbatch)
	need := delay + s.provisionTimeout + limit + tokenMargin
	lasts, bound := credentialCap, "the credential's "+fmtHours(credentialCap)+" cap (the engine's)"
	if s.tokenTTL > 0 && s.tokenTTL < lasts {
		lasts, bound = s.tokenTTL, "token_ttl ("+fmtHours(s.tokenTTL)+")"
	}
	if need <= lasts {
		return nil
	}
	// The last --begin is the one sbatch keeps, so the error is there.
	line := 0
	for j, l := range p.Sbatch {
		if _, ok := sbatch.BeginOf([]string{l}); ok {
			line = j
		}
	}
	limitText := "no --time (set one)"
	if hasLimit {
		limitText = "--time " + fmtHours(limit)
	}
	margin, when, todo := "", "", "Bring the begin closer or shorten --time."
	if b.Wall() {
		margin = ", " + fmtHours(beginClockMargin) + " for a login node's clock that disagrees"
		todo = fmt.Sprintf("Bring the begin within %s of when machines are asked for, shorten --time, or write it as now+DURATION.", fmtHours(max(0, lasts-need+delay-beginClockMargin)))
	}
	if r := b.Recurs(); r != "" {
		when = fmt.Sprintf(" (%s: submitted just as it passes, a job waits for the next one)", r)
		todo = "A begin that recurs leaves some submissions waiting that long whatever the time limit: write it as now+DURATION, or as a date and time, or leave it out."
	}
	const stamp = "2006-01-02 15:04:05 MST"
	return shared.Diagnostics{shared.Errorf([]string{"profile", i, "sbatch", strconv.Itoa(line)}, "Begin later than a credential lasts",
		"--begin=%s: the begin plus the time limit must fit %s. Submitted at %s, a job of this profile may start at %s%s; its worker's credential, minted at submission, expires at %s (%s later). "+
			"This profile's jobs need it for %s (the begin's %s, provision_timeout %s, %s, %s for the worker's last report%s), so its worker could never attach, or would be refused before its job ends. %s",
		v, bound, sub.Format(stamp), start.Format(stamp), when, sub.Add(lasts).Format(stamp), fmtHours(lasts),
		fmtHours(need), fmtHours(start.Sub(sub)), fmtHours(s.provisionTimeout), limitText, fmtHours(tokenMargin), margin, todo)}
}

// fmtHours writes d as Go does, without a trailing "0s" or "0m0s".
func fmtHours(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// beginSpecOf is prof's --begin read, nil when it has none (or one that
// validation refused); parseConfig read it once into s.begins.
func (s *settings) beginSpecOf(prof Profile) *sbatch.Begin {
	if b, ok := s.begins[prof.Name]; ok {
		return b
	}
	v, ok := sbatch.BeginOf(prof.Sbatch)
	if !ok {
		return nil
	}
	b, err := sbatch.ParseBegin(v)
	if err != nil {
		return nil
	}
	return b
}

// beginDelayAt is how long after at a job of prof submitted at at may
// start: 0 without --begin; for a wall-clock begin, the time until it on
// the provisioner's clock plus beginClockMargin.
func (s *settings) beginDelayAt(prof Profile, at time.Time) time.Duration {
	return delayAt(s.beginSpecOf(prof), at)
}

// beginDelayOf is beginDelayAt for the profile named profile, as
// Reconcile asks it of every outstanding request.
func (s *settings) beginDelayOf(profile string, at time.Time) time.Duration {
	return delayAt(s.begins[profile], at)
}

// delayAt is how long after at a job submitted then may start under b:
// 0 for no begin (b nil) or one already past; a wall-clock begin gets
// beginClockMargin more.
func delayAt(b *sbatch.Begin, at time.Time) time.Duration {
	if b == nil {
		return 0
	}
	if b.Wall() {
		return b.Delay(at) + beginClockMargin
	}
	return b.Delay(at)
}

// beginDelay is how long after submission the profile's jobs may start
// when that does not depend on when they are submitted: 0 without
// --begin, the delay of a now+N begin, and false for any other.
func beginDelay(lines []string) (time.Duration, bool) {
	v, ok := sbatch.BeginOf(lines)
	if !ok {
		return 0, true
	}
	return sbatch.RelativeBegin(v)
}

// deadlineTooSoon says what is wrong with a profile's own --deadline=v
// that comes before its job could end: a relative deadline shorter than
// the begin's delay plus the time limit. Slurm 24.11 and later refuse
// such a job at submission ("Requested time limit is invalid (missing or
// exceeds some limit)", which names neither option); 22.05 takes it and
// the job ends DEADLINE without running (testdata/slurm-versions). Either
// way no machine comes of it, so it is refused here on every version. A
// wall-clock deadline is the cluster's clock, which validation cannot
// read; `validate -check` asks the cluster.
func deadlineTooSoon(lines []string, v string) string {
	d, relative := sbatch.RelativeBegin(strings.TrimSpace(v))
	limit, hasLimit := sbatch.TimeLimit(lines)
	if !relative || !hasLimit {
		return ""
	}
	delay, _ := beginDelay(lines)
	if d >= delay+limit {
		return ""
	}
	what := "the time limit (" + limit.String() + ")"
	if delay > 0 {
		what = "the begin's delay (" + delay.String() + ") plus " + what
	}
	return fmt.Sprintf("--deadline=%s is %s after submission, sooner than %s: Slurm 24.11 and later refuse such a job (\"Requested time limit is invalid\"), and 22.05 ends it DEADLINE before it runs. "+
		"Give a deadline of at least now+%d seconds, shorten --time, or leave --deadline out and the provisioner sets one from provision_timeout.", v, d, what, int64((delay+limit)/time.Second))
}

// deadlineHint is what to add to Slurm's words when a profile with its
// own --deadline is refused with "Requested time limit is invalid": on
// 24.11 and later that is also the answer to a deadline sooner than the
// time limit, and the words name neither option.
func deadlineHint(prof Profile, said string) string {
	if !strings.Contains(strings.ToLower(said), "requested time limit is invalid") || !prof.options().deadline {
		return ""
	}
	return " (Slurm 24.11 and later say this too of a --deadline sooner than now + --time: check the profile's --deadline against its time limit.)"
}
