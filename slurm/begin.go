package slurm

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fluksio/provision/shared"
)

// --begin in a profile: "do not start this machine before ...". The
// provisioner's own clocks (provision_timeout for the request, the
// --deadline it gives Slurm, the credential's lifetime) count from when a
// job could first start, not from when it was asked for; counted from
// the request, a begin later than provision_timeout would be cancelled
// before it could run, and Slurm refuses a --deadline before the begin
// outright ("Incompatible begin and deadline time specification").
//
// A begin relative to submission (now+90minutes) moves those clocks by
// its delay. A begin at a wall-clock time (16:00, 2027-01-10T08:00,
// tomorrow) cannot be turned into a delay here: it is the cluster's clock
// and time zone, not the engine's. Such a profile gets no --deadline and
// its requests are held for provision_timeout from the request; validation
// says both (beginWarning).

// A credential is minted when its job is submitted, not when it may
// start, and the engine caps its lifetime (credentialCap) counted from
// then. A begin far enough out leaves a worker that can never attach: its
// credential has expired before its job may start (issue 24: a
// --begin=now+2days validated, and its worker was refused for ever). Such
// a profile is refused at validate, at its --begin line, rather than
// minted a credential that lasts from the begin.
//
// Rejected: a credential with a not-before time, good for 12 hours from
// the begin. It would need a new token version and a second clock in the
// engine's check, and would leave a credential that opens nothing for days
// in the spool, to be used the moment it does; a machine wanted two days
// from now is better asked for then.

// credentialCap is the longest the engine lets a credential live
// (host.DefaultMaxCredentialTTL; TestCredentialCapIsTheEngines keeps the
// two equal). The plugin cannot ask the engine for it, so it is the
// contract's number.
const credentialCap = 12 * time.Hour

// validateBegin refuses a profile whose relative --begin, plus the wait
// in the queue (provision_timeout), its time limit and tokenMargin, comes
// to more than its credential will last: the engine's cap, or token_ttl
// if that is shorter. A wall-clock begin cannot be counted here; its
// warning (validateProfile) says what it risks.
func validateBegin(s *settings, i string, p Profile) shared.Diagnostics {
	delay, relative := beginDelay(p.Sbatch)
	if !relative || delay <= 0 {
		return nil
	}
	limit, hasLimit := timeLimit(p.Sbatch)
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
		if _, ok := beginOf([]string{l}); ok {
			line = j
		}
	}
	v, _ := beginOf(p.Sbatch)
	limitText := "no --time (set one)"
	if hasLimit {
		limitText = "--time " + fmtHours(limit)
	}
	return shared.Diagnostics{shared.Errorf([]string{"profile", i, "sbatch", strconv.Itoa(line)}, "Begin later than a credential lasts",
		"--begin=%s: the begin plus the time limit must fit %s. A worker's credential is minted when its job is submitted and lasts %s from then; this profile's jobs need it for %s (the begin's %s, provision_timeout %s, %s, and %s for the worker's last report), so its worker could never attach, or would be refused before its job ends. Bring the begin closer or shorten --time.",
		v, bound, fmtHours(lasts), fmtHours(need), fmtHours(delay), fmtHours(s.provisionTimeout), limitText, fmtHours(tokenMargin))}
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

// beginOf is the profile's --begin value, if it sets one.
func beginOf(lines []string) (string, bool) {
	var v string
	var ok bool
	for _, o := range sbatchOpts(lines) {
		if o.is("--begin", 'b') && o.hasValue {
			v, ok = strings.TrimSpace(o.value), true
		}
	}
	return v, ok
}

// beginDelay is how long after submission the profile's jobs may start:
// 0 without --begin, the delay of a now+N begin, and false for a begin
// at a wall-clock time.
func beginDelay(lines []string) (time.Duration, bool) {
	v, ok := beginOf(lines)
	if !ok {
		return 0, true
	}
	return relativeBegin(v)
}

// relativeBegin reads Slurm's "now[+count[units]]", units being seconds
// (the default), minutes, hours, days or weeks, spelt out or cut short as
// Slurm allows (sec, min, hour, day, week, with or without an s).
func relativeBegin(v string) (time.Duration, bool) {
	rest, ok := strings.CutPrefix(strings.ToLower(v), "now")
	if !ok {
		return 0, false
	}
	if rest == "" {
		return 0, true
	}
	rest, ok = strings.CutPrefix(rest, "+")
	if !ok {
		return 0, false
	}
	i := 0
	for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
		i++
	}
	n, err := strconv.ParseInt(rest[:i], 10, 32)
	if err != nil {
		return 0, false
	}
	unit := time.Second
	switch strings.TrimSuffix(rest[i:], "s") {
	case "", "sec", "second":
	case "min", "minute":
		unit = time.Minute
	case "hour":
		unit = time.Hour
	case "day":
		unit = 24 * time.Hour
	case "week":
		unit = 7 * 24 * time.Hour
	default:
		return 0, false
	}
	return time.Duration(n) * unit, true
}

// beginDelayOf is the delay of profile's --begin, 0 when it has none or
// it is not relative; parseConfig worked it out.
func (s *settings) beginDelayOf(profile string) time.Duration {
	return s.beginDelays[profile]
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
	d, relative := relativeBegin(strings.TrimSpace(v))
	limit, hasLimit := timeLimit(lines)
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
	if !strings.Contains(strings.ToLower(said), "requested time limit is invalid") || !deadlineOptions.setBy(prof.Sbatch) {
		return ""
	}
	return " (Slurm 24.11 and later say this too of a --deadline sooner than now + --time: check the profile's --deadline against its time limit.)"
}
