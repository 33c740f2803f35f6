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
// Every form sbatch accepts is read here as Slurm's parse_time
// (src/common/parse_time.c) reads it: now[{+|-}N[seconds|minutes|hours|
// days|weeks]] (the unit spelt out, singular or plural: Slurm takes no
// other abbreviation), HH:MM[:SS] [AM|PM], midnight, noon, elevenses,
// fika, teatime, today, tomorrow, MMDD[YY], MM/DD[/YY], MM.DD[.YY],
// YYYY-MM-DD[THH:MM[:SS]], those combined (tomorrow 16:00,
// 01/10-08:00), and uts<seconds since the epoch>. A value sbatch refuses
// ("Invalid --begin specification") is an error at validate.
//
// A begin is a delay after submission, as Slurm works it out on the login
// node when the job is submitted (beginSpec.at): now+N is N; a date and
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

// beginClockMargin is added to a wall-clock begin's delay for a login
// node's clock that disagrees with the provisioner's: NTP keeps them
// within a second; 5 minutes is Kerberos' default tolerance of skew, a
// clock nobody keeps.
const beginClockMargin = 5 * time.Minute

// validateBegin refuses a profile whose --begin, plus the wait in the
// queue (provision_timeout), its time limit and tokenMargin, comes to
// more than its credential will last: the engine's cap, or token_ttl if
// that is shorter. The delay is the longest a job submitted from s.now on
// waits for its begin (beginSpec.longestWait).
func validateBegin(s *settings, i string, p Profile) shared.Diagnostics {
	v, ok := beginOf(p.Sbatch)
	if !ok {
		return nil
	}
	b, err := parseBegin(v)
	if err != nil {
		return nil // an error at its line already (validateProfile)
	}
	now := s.now
	if now.IsZero() {
		now = time.Now()
	}
	sub, start := b.longestWait(now)
	delay := start.Sub(sub)
	if delay <= 0 {
		return nil
	}
	if b.wall {
		delay += beginClockMargin
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
	limitText := "no --time (set one)"
	if hasLimit {
		limitText = "--time " + fmtHours(limit)
	}
	margin, when, todo := "", "", "Bring the begin closer or shorten --time."
	if b.wall {
		margin = ", " + fmtHours(beginClockMargin) + " for a login node's clock that disagrees"
		todo = fmt.Sprintf("Bring the begin within %s of when machines are asked for, shorten --time, or write it as now+DURATION.", fmtHours(max(0, lasts-need+delay-beginClockMargin)))
	}
	if r := b.recurs(); r != "" {
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

// beginSpecOf is prof's --begin read, nil when it has none (or one that
// validation refused); parseConfig read it once into s.begins.
func (s *settings) beginSpecOf(prof Profile) *beginSpec {
	if b, ok := s.begins[prof.Name]; ok {
		return b
	}
	v, ok := beginOf(prof.Sbatch)
	if !ok {
		return nil
	}
	b, err := parseBegin(v)
	if err != nil {
		return nil
	}
	return b
}

// beginDelayAt is how long after at a job of prof submitted at at may
// start: 0 without --begin; for a wall-clock begin, the time until it on
// the provisioner's clock plus beginClockMargin.
func (s *settings) beginDelayAt(prof Profile, at time.Time) time.Duration {
	return s.beginSpecOf(prof).delayAt(at)
}

// beginDelayOf is beginDelayAt for the profile named profile, as
// Reconcile asks it of every outstanding request.
func (s *settings) beginDelayOf(profile string, at time.Time) time.Duration {
	return s.begins[profile].delayAt(at)
}

// beginDelay is how long after submission the profile's jobs may start
// when that does not depend on when they are submitted: 0 without
// --begin, the delay of a now+N begin, and false for any other.
func beginDelay(lines []string) (time.Duration, bool) {
	v, ok := beginOf(lines)
	if !ok {
		return 0, true
	}
	return relativeBegin(v)
}

// relativeBegin reads Slurm's "now[{+|-}count[units]]" (parseBegin): the
// delay, 0 for one in the past, and false for any other form.
func relativeBegin(v string) (time.Duration, bool) {
	b, err := parseBegin(v)
	if err != nil || b.wall {
		return 0, false
	}
	return b.delayAt(time.Time{}), true
}

// beginSpec is a --begin value as Slurm's parse_time reads it: the words
// in order, replayed against the clock of the submission (at).
type beginSpec struct {
	toks []beginTok
	// uts is set for "uts<seconds>", an instant.
	uts time.Time
	// wall is true for every form but now±N: it is read on a clock.
	wall bool
}

// beginTok is one word: now±delta, today, tomorrow, a time of day, or a
// date (year -1 when not given).
type beginTok struct {
	kind           byte // 'n', 'd' (today), 'm' (tomorrow), 't', 'D'
	delta          time.Duration
	hour, min, sec int
	month, day, yr int // month 0-11, yr since 1900, -1 when not given
	hasYear, named bool
}

// beginUnits are parse_time's units, in its order: the first whose whole
// name starts the rest of the value is taken.
var beginUnits = []struct {
	name string
	mult int64
}{
	{"seconds", 1}, {"second", 1}, {"minutes", 60}, {"minute", 60}, {"hours", 3600}, {"hour", 3600},
	{"days", 86400}, {"day", 86400}, {"weeks", 604800}, {"week", 604800},
}

// maxBeginCount bounds a now+N count, far beyond any credential, so that
// the delay stays a time.Duration (Slurm's own long would wrap).
const maxBeginCount = 1 << 32

// parseBegin reads v as Slurm's _parse_time (parse_time.c) does, word by
// word, and says where and why it cannot, as sbatch would refuse it.
func parseBegin(v string) (*beginSpec, error) {
	at := func(i int) byte {
		if i < 0 || i >= len(v) {
			return 0
		}
		return v[i]
	}
	hasFold := func(i int, w string) bool {
		return i >= 0 && i+len(w) <= len(v) && strings.EqualFold(v[i:i+len(w)], w)
	}
	digit := func(c byte) bool { return c >= '0' && c <= '9' }
	bad := func(pos int, why string) error {
		return fmt.Errorf("sbatch refuses it at position %d (%s)", pos, why)
	}
	if hasFold(0, "uts") {
		n, err := strconv.ParseInt(strings.TrimLeft(v[3:], " \t"), 10, 64)
		if err != nil || n < 1000000 {
			return nil, bad(3, "uts takes the seconds since 1970, at least 1000000")
		}
		return &beginSpec{uts: time.Unix(n, 0), wall: true}, nil
	}
	b := &beginSpec{}
	for pos := 0; at(pos) != 0 && at(pos) != '\n'; pos++ {
		c := at(pos)
		if c == ' ' || c == '\t' || c == '-' || c == 'T' {
			continue
		}
		named := func(w string, h int) bool {
			if !hasFold(pos, w) {
				return false
			}
			b.toks = append(b.toks, beginTok{kind: 't', hour: h, named: true})
			pos += len(w) - 1
			return true
		}
		switch {
		case hasFold(pos, "today"):
			b.toks = append(b.toks, beginTok{kind: 'd'})
			pos += 4
			continue
		case hasFold(pos, "tomorrow"):
			b.toks = append(b.toks, beginTok{kind: 'm'})
			pos += 7
			continue
		case named("midnight", 0), named("noon", 12), named("elevenses", 11), named("fika", 15), named("teatime", 16):
			continue
		case hasFold(pos, "now"):
			var delta int64
			for i := pos + 3; ; i++ {
				ci := at(i)
				if ci == '+' || ci == '-' {
					// parse_time adds the index to pos, which is the
					// same only when now comes first.
					pos += i
					var err error
					if delta, pos, err = beginDelta(v, pos); err != nil {
						return nil, err
					}
					if ci == '-' {
						delta = -delta
					}
					break
				}
				if ci == ' ' || ci == '\t' {
					continue
				}
				if ci == 0 || ci == '\n' {
					pos += i - 1
					break
				}
				return nil, bad(pos+i, "now takes +N or -N and a unit")
			}
			b.toks = append(b.toks, beginTok{kind: 'n', delta: time.Duration(delta) * time.Second})
			continue
		}
		if !digit(c) {
			return nil, bad(pos, fmt.Sprintf("%q starts no date, time or keyword", c))
		}
		if at(pos+1) == ':' || at(pos+2) == ':' {
			t, end, err := beginClock(v, pos)
			if err != nil {
				return nil, err
			}
			b.toks, pos = append(b.toks, t), end
			continue
		}
		t, end, err := beginDate(v, pos)
		if err != nil {
			return nil, err
		}
		b.toks, pos = append(b.toks, t), end
	}
	if len(b.toks) == 0 {
		return nil, bad(0, "no date, time or now+N")
	}
	for _, t := range b.toks {
		if t.kind != 'n' {
			b.wall = true
		}
	}
	return b, nil
}

// beginDelta is parse_time's _get_delta: the count after the sign at
// pos, in seconds, and where it ends.
func beginDelta(v string, pos int) (int64, int, error) {
	var cnt int64
	digits := 0
	off := pos + 1
	for ; off < len(v) && v[off] != '\n'; off++ {
		if c := v[off]; c == ' ' || c == '\t' || c == '\v' || c == '\f' || c == '\r' {
			continue
		}
		unit := false
		for _, u := range beginUnits {
			if off+len(u.name) <= len(v) && strings.EqualFold(v[off:off+len(u.name)], u.name) {
				off += len(u.name)
				cnt = min(cnt*u.mult, maxBeginCount)
				unit = true
				break
			}
		}
		if unit {
			break
		}
		if c := v[off]; c >= '0' && c <= '9' {
			cnt = min(cnt*10+int64(c-'0'), maxBeginCount)
			digits++
			continue
		}
		return 0, off - 1, fmt.Errorf("sbatch refuses it at position %d (%q is not a unit: seconds, minutes, hours, days or weeks, spelt out)", off, v[off:])
	}
	if digits == 0 {
		return 0, off - 1, fmt.Errorf("sbatch refuses it at position %d (no count after the sign)", off)
	}
	return cnt, off - 1, nil
}

// beginClock is parse_time's _get_time: HH:MM[:SS] [AM|PM] at pos.
func beginClock(v string, pos int) (beginTok, int, error) {
	at := func(i int) byte {
		if i >= len(v) {
			return 0
		}
		return v[i]
	}
	digit := func(i int) (int, bool) {
		c := at(i)
		return int(c - '0'), c >= '0' && c <= '9'
	}
	off := pos
	bad := func(why string) (beginTok, int, error) {
		return beginTok{}, 0, fmt.Errorf("sbatch refuses it at position %d (%s)", off, why)
	}
	hr, ok := digit(off)
	if !ok {
		return bad("an hour is a digit or two")
	}
	off++
	if at(off) != ':' {
		d, ok := digit(off)
		if !ok {
			return bad("an hour is a digit or two")
		}
		hr, off = hr*10+d, off+1
	}
	if hr > 23 {
		off -= 2
		return bad("an hour is 0 to 23")
	}
	if at(off) != ':' {
		return bad("HH:MM")
	}
	off++
	m1, ok1 := digit(off)
	m2, ok2 := digit(off + 1)
	if !ok1 || !ok2 {
		return bad("minutes are two digits")
	}
	mn := m1*10 + m2
	off += 2
	if mn > 59 {
		off -= 2
		return bad("minutes are 00 to 59")
	}
	sec := 0
	if at(off) == ':' {
		off++
		s1, ok1 := digit(off)
		s2, ok2 := digit(off + 1)
		if !ok1 || !ok2 {
			return bad("seconds are two digits")
		}
		sec = s1*10 + s2
		off += 2
		if sec > 59 {
			off -= 2
			return bad("seconds are 00 to 59")
		}
	}
	for c := at(off); c == ' ' || c == '\t' || c == '\v' || c == '\f' || c == '\r' || c == '\n'; c = at(off) {
		off++
	}
	switch {
	case off+2 <= len(v) && strings.EqualFold(v[off:off+2], "pm"):
		hr += 12
		if hr > 23 {
			if hr != 24 {
				return bad("a PM hour is 1 to 12")
			}
			hr = 12
		}
		off += 2
	case off+2 <= len(v) && strings.EqualFold(v[off:off+2], "am"):
		if hr > 11 {
			if hr != 12 {
				return bad("an AM hour is 1 to 12")
			}
			hr = 0
		}
		off += 2
	}
	return beginTok{kind: 't', hour: hr, min: mn, sec: sec}, off - 1, nil
}

// beginDate is parse_time's _get_date: YYYY-MM-DD, or MMDD[YY],
// MM/DD[/YY] or MM.DD[.YY], at pos.
func beginDate(v string, pos int) (beginTok, int, error) {
	at := func(i int) byte {
		if i >= len(v) {
			return 0
		}
		return v[i]
	}
	digit := func(i int) bool { return at(i) >= '0' && at(i) <= '9' }
	num := func(i int) int { return int(at(i)) - '0' }
	off := pos
	bad := func(why string) (beginTok, int, error) {
		return beginTok{}, 0, fmt.Errorf("sbatch refuses it at position %d (%s)", off, why)
	}
	t := beginTok{kind: 'D', yr: -1}
	if len(v) >= off+7 && at(off+4) == '-' && at(off+7) == '-' {
		yr := 0
		for k := 0; k < 4; k++ {
			if !digit(off) {
				return bad("a year is four digits")
			}
			yr, off = yr*10+num(off), off+1
		}
		off++
		mon := num(off)
		off++
		if digit(off) {
			mon, off = mon*10+num(off), off+1
		}
		if mon < 1 || mon > 12 {
			off -= 2
			return bad("a month is 1 to 12")
		}
		off++
		if !digit(off) {
			return bad("a day is a digit or two")
		}
		day := num(off)
		off++
		if digit(off) {
			day, off = day*10+num(off), off+1
		}
		if day < 1 || day > 31 {
			off -= 2
			return bad("a day is 1 to 31")
		}
		t.month, t.day, t.yr, t.hasYear = mon-1, day, yr-1900, true
		return t, off - 1, nil
	}
	mon := num(off)
	off++
	if digit(off) {
		mon, off = mon*10+num(off), off+1
	}
	if mon < 1 || mon > 12 {
		off -= 2
		return bad("a month is 1 to 12")
	}
	if at(off) == '.' || at(off) == '/' {
		off++
	}
	if !digit(off) {
		return bad("a day is a digit or two")
	}
	day := num(off)
	off++
	if digit(off) {
		day, off = day*10+num(off), off+1
	}
	if day < 1 || day > 31 {
		off -= 2
		return bad("a day is 1 to 31")
	}
	if at(off) == '.' || at(off) == '/' {
		off++
	}
	if digit(off) {
		yr := num(off)
		off++
		if !digit(off) {
			return bad("a year here is two digits")
		}
		yr, off = yr*10+num(off), off+1
		// parse_time takes a year of 00 for none.
		if yr != 0 {
			t.yr, t.hasYear = yr+100, true
		}
	}
	t.month, t.day = mon-1, day
	return t, off - 1, nil
}

// at is when a job submitted at now may start, as sbatch on a host whose
// clock reads now, in now's time zone, works it out (parse_time with
// past = 0).
func (b *beginSpec) at(now time.Time) time.Time {
	if !b.uts.IsZero() {
		return b.uts.In(now.Location())
	}
	loc := now.Location()
	hour, minute, second := -1, -1, 0
	month, mday, year := -1, -1, -1
	date := func(t time.Time) {
		month, mday, year = int(t.Month())-1, t.Day(), t.Year()-1900
	}
	for _, t := range b.toks {
		switch t.kind {
		case 'd':
			date(now)
		case 'm':
			date(now.Add(24 * time.Hour))
		case 'n':
			later := now.Add(t.delta)
			date(later)
			hour, minute, second = later.Hour(), later.Minute(), later.Second()
		case 't':
			hour, minute, second = t.hour, t.min, t.sec
		case 'D':
			month, mday = t.month, t.day
			if t.hasYear {
				year = t.yr
			}
		}
	}
	nowMon, nowDay, nowHour, nowMin := int(now.Month())-1, now.Day(), now.Hour(), now.Minute()
	switch {
	case hour == -1:
		hour, minute = 0, 0
	case month == -1:
		if hour > nowHour || hour == nowHour && minute > nowMin {
			date(now)
		} else {
			date(now.Add(24 * time.Hour))
		}
	}
	if year == -1 {
		if month > nowMon || month == nowMon && (mday > nowDay || mday == nowDay && (hour > nowHour || hour == nowHour && minute > nowMin)) {
			year = now.Year() - 1900
		} else {
			year = now.Year() - 1900 + 1
		}
	}
	return time.Date(year+1900, time.Month(month+1), mday, hour, minute, second, 0, loc)
}

// delayAt is how long after at a job submitted then may start: 0 for no
// begin (b nil) or one already past; a wall-clock begin gets
// beginClockMargin more.
func (b *beginSpec) delayAt(at time.Time) time.Duration {
	if b == nil {
		return 0
	}
	if !b.wall {
		return max(0, b.toks[len(b.toks)-1].delta)
	}
	return max(0, b.at(at).Sub(at)) + beginClockMargin
}

// longestWait is the submission from now on whose job waits longest for
// its begin, and when that job may start. A begin's wait falls as
// submission nears it and jumps when a time of day, a day or a date
// passes, which parse_time sees to the minute; so the longest is at now
// or at the start of a minute, and every wait recurs within a day, or a
// year for a date without one, whose jump is at the date itself.
func (b *beginSpec) longestWait(now time.Time) (sub, start time.Time) {
	sub, start = now, b.at(now)
	if !b.wall {
		return now, now.Add(b.delayAt(now))
	}
	try := func(s time.Time) {
		if st := b.at(s); st.Sub(s) > start.Sub(sub) {
			sub, start = s, st
		}
	}
	if !b.uts.IsZero() || b.fixedDate() {
		return sub, start
	}
	next := now.Truncate(time.Minute)
	for k := 1; k <= 25*60; k++ {
		try(next.Add(time.Duration(k) * time.Minute))
	}
	if first := b.at(now); first.After(now) {
		try(first.Truncate(time.Minute))
	}
	return sub, start
}

// fixedDate is true when the begin names its year: one instant, whose
// wait only falls.
func (b *beginSpec) fixedDate() bool {
	for _, t := range b.toks {
		if t.kind == 'D' && t.hasYear {
			return true
		}
	}
	return false
}

// recurs says how a wall-clock begin comes round again, "" for one that
// does not: a time of day every day, a date without a year every year.
func (b *beginSpec) recurs() string {
	if !b.wall || !b.uts.IsZero() || b.fixedDate() {
		return ""
	}
	for _, t := range b.toks {
		if t.kind == 'D' {
			return "a date without a year comes every year"
		}
	}
	return "a time of day comes every day"
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
