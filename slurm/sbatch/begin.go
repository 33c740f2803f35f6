package sbatch

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// --begin: every form sbatch accepts is read here as Slurm's parse_time
// (src/common/parse_time.c) reads it: now[{+|-}N[seconds|minutes|hours|
// days|weeks]] (the unit spelt out, singular or plural: Slurm takes no
// other abbreviation), HH:MM[:SS] [AM|PM], midnight, noon, elevenses,
// fika, teatime, today, tomorrow, MMDD[YY], MM/DD[/YY], MM.DD[.YY],
// YYYY-MM-DD[THH:MM[:SS]], those combined (tomorrow 16:00,
// 01/10-08:00), and uts<seconds since the epoch>. A value sbatch refuses
// ("Invalid --begin specification") is an error from ParseBegin.
//
// A begin is a delay after submission, as Slurm works it out on the login
// node when the job is submitted (Begin.At): now+N is N; a date and time
// is that instant less the submission's; a time of day is the next one
// after submission, so submitted just after 16:00, --begin=16:00 (or
// teatime) waits almost a day, and a date without a year (01/10) almost a
// year.

// BeginOf is the --begin value the lines set (the last one, as sbatch
// keeps), if they set one.
func BeginOf(lines []string) (string, bool) {
	var v string
	var ok bool
	for _, o := range Opts(lines) {
		if o.Is("--begin", 'b') && o.HasValue {
			v, ok = strings.TrimSpace(o.Value), true
		}
	}
	return v, ok
}

// RelativeBegin reads Slurm's "now[{+|-}count[units]]" (ParseBegin): the
// delay, 0 for one in the past, and false for any other form.
func RelativeBegin(v string) (time.Duration, bool) {
	b, err := ParseBegin(v)
	if err != nil || b.wall {
		return 0, false
	}
	return b.Delay(time.Time{}), true
}

// Begin is a --begin value as Slurm's parse_time reads it: the words in
// order, replayed against the clock of the submission (At).
type Begin struct {
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

// ParseBegin reads v as Slurm's _parse_time (src/common/parse_time.c)
// does, word by word, and says where and why it cannot, as sbatch would
// refuse it.
func ParseBegin(v string) (*Begin, error) {
	if hasFoldAt(v, 0, "uts") {
		n, err := strconv.ParseInt(strings.TrimLeft(v[3:], " \t"), 10, 64)
		if err != nil || n < 1000000 {
			return nil, refusedAt(3, "uts takes the seconds since 1970, at least 1000000")
		}
		return &Begin{uts: time.Unix(n, 0), wall: true}, nil
	}
	b := &Begin{}
	for pos := 0; byteAt(v, pos) != 0 && byteAt(v, pos) != '\n'; pos++ {
		c := byteAt(v, pos)
		if c == ' ' || c == '\t' || c == '-' || c == 'T' {
			continue
		}
		named := func(w string, h int) bool {
			if !hasFoldAt(v, pos, w) {
				return false
			}
			b.toks = append(b.toks, beginTok{kind: 't', hour: h, named: true})
			pos += len(w) - 1
			return true
		}
		switch {
		case hasFoldAt(v, pos, "today"):
			b.toks = append(b.toks, beginTok{kind: 'd'})
			pos += 4
			continue
		case hasFoldAt(v, pos, "tomorrow"):
			b.toks = append(b.toks, beginTok{kind: 'm'})
			pos += 7
			continue
		case named("midnight", 0), named("noon", 12), named("elevenses", 11), named("fika", 15), named("teatime", 16):
			continue
		}
		// Any other word has a reader of its own, which says where it
		// ends: now±N, a time of day, or a date.
		read := beginDate
		switch {
		case hasFoldAt(v, pos, "now"):
			read = beginNow
		case c < '0' || c > '9':
			return nil, refusedAt(pos, fmt.Sprintf("%q starts no date, time or keyword", c))
		case byteAt(v, pos+1) == ':' || byteAt(v, pos+2) == ':':
			read = beginClock
		}
		t, end, err := read(v, pos)
		if err != nil {
			return nil, err
		}
		b.toks, pos = append(b.toks, t), end
	}
	if len(b.toks) == 0 {
		return nil, refusedAt(0, "no date, time or now+N")
	}
	for _, t := range b.toks {
		if t.kind != 'n' {
			b.wall = true
		}
	}
	return b, nil
}

// byteAt is v's byte at i, and 0 outside v, as parse_time reads the NUL
// that ends its string.
func byteAt(v string, i int) byte {
	if i < 0 || i >= len(v) {
		return 0
	}
	return v[i]
}

// hasFoldAt reports whether v has the word w at i, in any case.
func hasFoldAt(v string, i int, w string) bool {
	return i >= 0 && i+len(w) <= len(v) && strings.EqualFold(v[i:i+len(w)], w)
}

// refusedAt is sbatch refusing a --begin value at pos, for why.
func refusedAt(pos int, why string) error {
	return fmt.Errorf("sbatch refuses it at position %d (%s)", pos, why)
}

// beginNow is the word now at pos with its sign and count, if any: the
// token and where it ends.
func beginNow(v string, pos int) (beginTok, int, error) {
	var delta int64
	for i := pos + 3; ; i++ {
		ci := byteAt(v, i)
		if ci == '+' || ci == '-' {
			// parse_time adds the index to pos, which is the same only
			// when now comes first.
			pos += i
			var err error
			if delta, pos, err = beginDelta(v, pos); err != nil {
				return beginTok{}, 0, err
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
		return beginTok{}, 0, refusedAt(pos+i, "now takes +N or -N and a unit")
	}
	return beginTok{kind: 'n', delta: time.Duration(delta) * time.Second}, pos, nil
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
		return 0, off - 1, refusedAt(off, fmt.Sprintf("%q is not a unit: seconds, minutes, hours, days or weeks, spelt out", v[off:]))
	}
	if digits == 0 {
		return 0, off - 1, refusedAt(off, "no count after the sign")
	}
	return cnt, off - 1, nil
}

// beginScan is one word of a --begin value being read, as parse_time's
// _get_time and _get_date read it: v is the value, and off where the
// reading is, which each step moves on and a refusal names.
type beginScan struct {
	v   string
	off int
}

func (s *beginScan) at(i int) byte { return byteAt(s.v, i) }

func (s *beginScan) isDigit(i int) bool { return s.at(i) >= '0' && s.at(i) <= '9' }

// num is the digit at i as a number.
func (s *beginScan) num(i int) int { return int(s.at(i)) - '0' }

// refuse is the word refused at off, for why.
func (s *beginScan) refuse(why string) (beginTok, int, error) {
	return beginTok{}, 0, refusedAt(s.off, why)
}

// beginClock is parse_time's _get_time: HH:MM[:SS] [AM|PM] at pos.
func beginClock(v string, pos int) (beginTok, int, error) {
	s := &beginScan{v: v, off: pos}
	if !s.isDigit(s.off) {
		return s.refuse("an hour is a digit or two")
	}
	hr := s.num(s.off)
	s.off++
	if s.at(s.off) != ':' {
		if !s.isDigit(s.off) {
			return s.refuse("an hour is a digit or two")
		}
		hr, s.off = hr*10+s.num(s.off), s.off+1
	}
	if hr > 23 {
		s.off -= 2
		return s.refuse("an hour is 0 to 23")
	}
	if s.at(s.off) != ':' {
		return s.refuse("HH:MM")
	}
	s.off++
	mn, why := s.sixty("minutes")
	if why != "" {
		return s.refuse(why)
	}
	sec := 0
	if s.at(s.off) == ':' {
		s.off++
		if sec, why = s.sixty("seconds"); why != "" {
			return s.refuse(why)
		}
	}
	if hr, why = s.meridiem(hr); why != "" {
		return s.refuse(why)
	}
	return beginTok{kind: 't', hour: hr, min: mn, sec: sec}, s.off - 1, nil
}

// sixty reads the two digits of minutes or seconds (what) at off, 00 to
// 59, and moves past them; why is sbatch's refusal of anything else,
// with off left where they begin.
func (s *beginScan) sixty(what string) (n int, why string) {
	if !s.isDigit(s.off) || !s.isDigit(s.off+1) {
		return 0, what + " are two digits"
	}
	n = s.num(s.off)*10 + s.num(s.off+1)
	if n > 59 {
		return 0, what + " are 00 to 59"
	}
	s.off += 2
	return n, ""
}

// meridiem reads the white space after a time and an AM or PM there, if
// any, and is hr on the 24-hour clock; why is sbatch's refusal of an hour
// that AM or PM does not take.
func (s *beginScan) meridiem(hr int) (int, string) {
	for c := s.at(s.off); c == ' ' || c == '\t' || c == '\v' || c == '\f' || c == '\r' || c == '\n'; c = s.at(s.off) {
		s.off++
	}
	switch {
	case hasFoldAt(s.v, s.off, "pm"):
		hr += 12
		if hr > 23 {
			if hr != 24 {
				return 0, "a PM hour is 1 to 12"
			}
			hr = 12
		}
		s.off += 2
	case hasFoldAt(s.v, s.off, "am"):
		if hr > 11 {
			if hr != 12 {
				return 0, "an AM hour is 1 to 12"
			}
			hr = 0
		}
		s.off += 2
	}
	return hr, ""
}

// beginDate is parse_time's _get_date: YYYY-MM-DD, or MMDD[YY],
// MM/DD[/YY] or MM.DD[.YY], at pos.
func beginDate(v string, pos int) (beginTok, int, error) {
	s := &beginScan{v: v, off: pos}
	t := beginTok{kind: 'D', yr: -1}
	if len(v) >= s.off+7 && s.at(s.off+4) == '-' && s.at(s.off+7) == '-' {
		yr := 0
		for k := 0; k < 4; k++ {
			if !s.isDigit(s.off) {
				return s.refuse("a year is four digits")
			}
			yr, s.off = yr*10+s.num(s.off), s.off+1
		}
		s.off++
		mon, ok := s.field(1, 12)
		if !ok {
			return s.refuse("a month is 1 to 12")
		}
		s.off++
		if !s.isDigit(s.off) {
			return s.refuse("a day is a digit or two")
		}
		day, ok := s.field(1, 31)
		if !ok {
			return s.refuse("a day is 1 to 31")
		}
		t.month, t.day, t.yr, t.hasYear = mon-1, day, yr-1900, true
		return t, s.off - 1, nil
	}
	mon, ok := s.field(1, 12)
	if !ok {
		return s.refuse("a month is 1 to 12")
	}
	if s.at(s.off) == '.' || s.at(s.off) == '/' {
		s.off++
	}
	if !s.isDigit(s.off) {
		return s.refuse("a day is a digit or two")
	}
	day, ok := s.field(1, 31)
	if !ok {
		return s.refuse("a day is 1 to 31")
	}
	if s.at(s.off) == '.' || s.at(s.off) == '/' {
		s.off++
	}
	if s.isDigit(s.off) {
		yr := s.num(s.off)
		s.off++
		if !s.isDigit(s.off) {
			return s.refuse("a year here is two digits")
		}
		yr, s.off = yr*10+s.num(s.off), s.off+1
		// parse_time takes a year of 00 for none.
		if yr != 0 {
			t.yr, t.hasYear = yr+100, true
		}
	}
	t.month, t.day = mon-1, day
	return t, s.off - 1, nil
}

// field reads a month or a day at off, one digit or two, as _get_date
// does; out of lo..hi, off is put back where it began.
func (s *beginScan) field(lo, hi int) (int, bool) {
	n := s.num(s.off)
	s.off++
	if s.isDigit(s.off) {
		n, s.off = n*10+s.num(s.off), s.off+1
	}
	if n < lo || n > hi {
		s.off -= 2
		return 0, false
	}
	return n, true
}

// Wall is true for every form but now±N: it is read on a clock, the
// submitting host's, in its time zone.
func (b *Begin) Wall() bool { return b.wall }

// At is when a job submitted at now may start, as sbatch on a host whose
// clock reads now, in now's time zone, works it out (parse_time with
// past = 0).
func (b *Begin) At(now time.Time) time.Time {
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

// Delay is how long after at a job submitted then may start: 0 for no
// begin (b nil) or one already past.
func (b *Begin) Delay(at time.Time) time.Duration {
	if b == nil {
		return 0
	}
	if !b.wall {
		return max(0, b.toks[len(b.toks)-1].delta)
	}
	return max(0, b.At(at).Sub(at))
}

// LongestWait is the submission from now on whose job waits longest for
// its begin, and when that job may start. A begin's wait falls as
// submission nears it and jumps when a time of day, a day or a date
// passes, which parse_time sees to the minute; so the longest is at now
// or at the start of a minute, and every wait recurs within a day, or a
// year for a date without one, whose jump is at the date itself.
func (b *Begin) LongestWait(now time.Time) (sub, start time.Time) {
	sub, start = now, b.At(now)
	if !b.wall {
		return now, now.Add(b.Delay(now))
	}
	try := func(s time.Time) {
		if st := b.At(s); st.Sub(s) > start.Sub(sub) {
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
	if first := b.At(now); first.After(now) {
		try(first.Truncate(time.Minute))
	}
	return sub, start
}

// fixedDate is true when the begin names its year: one instant, whose
// wait only falls.
func (b *Begin) fixedDate() bool {
	for _, t := range b.toks {
		if t.kind == 'D' && t.hasYear {
			return true
		}
	}
	return false
}

// Recurs says how a wall-clock begin comes round again, "" for one that
// does not: a time of day every day, a date without a year every year.
func (b *Begin) Recurs() string {
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
