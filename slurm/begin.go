package slurm

import (
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
