package slurm

import (
	"fmt"
	"strconv"
	"strings"
	"time"
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
