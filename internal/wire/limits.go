package wire

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/internal/clip"
	"github.com/fluksio/provision/internal/loglimit"
	"github.com/fluksio/provision/internal/termsafe"

	"github.com/fluksio/provision/shared"
)

// Whatever a plugin sends, the host holds, so it is bounded: a plugin is
// code of other people, and a buggy one is as likely as a hostile one.
//
//   - Every message from a plugin is at most MaxMessageBytes on the wire
//     (go-plugin's default is 2 GB). A larger one fails that call; on the
//     host channel it closes the channel, and the plugin can no longer
//     mint or publish.
//   - An event's fields are cut to MaxEventDetail (detail) and
//     maxEventField (the rest) before anyone sees them.
//   - Status lists at most MaxStatusEntries outstanding jobs and backoffs.
//   - What the plugin logs, or writes to stderr, reaches the engine's log
//     at most logLinesPerSecond lines a second, each cut to maxLogLine
//     bytes; a line says how many were dropped.
const (
	MaxMessageBytes   = 4 << 20
	MaxEventDetail    = 4 << 10
	maxEventField     = 256
	MaxStatusEntries  = 10_000
	logLinesPerSecond = 200
	maxLogLine        = 4 << 10
)

// ClipEvent bounds an event's fields.
func ClipEvent(ev shared.Event) shared.Event {
	ev.Kind = shared.EventKind(clip.Bytes(string(ev.Kind), maxEventField))
	ev.Profile = clip.Bytes(ev.Profile, maxEventField)
	ev.Job = clip.Bytes(ev.Job, maxEventField)
	ev.Worker = clip.Bytes(ev.Worker, maxEventField)
	ev.Detail = clip.Bytes(ev.Detail, MaxEventDetail)
	// A class may become a metric label in the engine, so one outside
	// the contract's is "other", as in the counters; none stays none.
	if ev.Class != "" && !slices.Contains(shared.FailureClasses, ev.Class) {
		ev.Class = "other"
	}
	return ev
}

// clipStatus bounds a plugin's Status.
// maxNotes bounds StatusResponse.Notes: a few lines for an operator.
const maxNotes = 20

func clipStatus(s *shared.StatusResponse) *shared.StatusResponse {
	if s == nil {
		return nil
	}
	if len(s.Outstanding) > MaxStatusEntries {
		s.Outstanding = s.Outstanding[:MaxStatusEntries:MaxStatusEntries]
	}
	if len(s.BackingOff) > MaxStatusEntries {
		s.BackingOff = s.BackingOff[:MaxStatusEntries:MaxStatusEntries]
	}
	if len(s.Profiles) > MaxStatusEntries {
		s.Profiles = s.Profiles[:MaxStatusEntries:MaxStatusEntries]
	}
	if len(s.Counts) > MaxStatusEntries {
		s.Counts = s.Counts[:MaxStatusEntries:MaxStatusEntries]
	}
	for i := range s.Counts {
		if len(s.Counts[i].Submissions) > MaxStatusEntries {
			s.Counts[i].Submissions = s.Counts[i].Submissions[:MaxStatusEntries:MaxStatusEntries]
		}
	}
	if len(s.Notes) > maxNotes {
		s.Notes = s.Notes[:maxNotes:maxNotes]
	}
	for i, n := range s.Notes {
		s.Notes[i] = clip.Bytes(n, MaxEventDetail)
	}
	s.LastError = clip.Bytes(s.LastError, MaxEventDetail)
	s.Counters = clipCounters(s.Counters)
	return s
}

// Bounds on StatusResponse.Counters. They become metric labels in the
// engine, where every distinct value is a time series kept for the
// process's life: a plugin that sent a worker's name as a "command" would
// grow the engine without end. So the counts per profile and class are
// capped, commands are few, a histogram has few buckets, label values are
// short, and a class outside the contract's is "other".
const (
	maxCounterFailures = 1024
	maxCounterCommands = 16
	maxCounterBuckets  = 32
	maxCounterLabel    = 64
)

func clipCounters(c *shared.Counters) *shared.Counters {
	if c == nil {
		return nil
	}
	if len(c.Failures) > maxCounterFailures {
		c.Failures = c.Failures[:maxCounterFailures:maxCounterFailures]
	}
	for i := range c.Failures {
		f := &c.Failures[i]
		f.Profile = clipLabel(f.Profile)
		f.Count = max(0, f.Count)
		if !slices.Contains(shared.FailureClasses, f.Class) {
			f.Class = "other"
		}
	}
	if len(c.Commands) > maxCounterCommands {
		c.Commands = c.Commands[:maxCounterCommands:maxCounterCommands]
	}
	for i := range c.Commands {
		cs := &c.Commands[i]
		cs.Command = clipLabel(cs.Command)
		cs.Calls, cs.Errors, cs.SSHErrors, cs.Timeouts = max(0, cs.Calls), max(0, cs.Errors), max(0, cs.SSHErrors), max(0, cs.Timeouts)
		cs.Rationed = max(0, cs.Rationed)
		cs.DurationSum = max(0, cs.DurationSum)
		// A histogram that does not make sense (too many buckets, bounds
		// out of order, counts that are not cumulative) is dropped, not
		// repaired: the calls and errors still count.
		ok := len(cs.Buckets) == len(cs.BucketCounts) && len(cs.Buckets) <= maxCounterBuckets
		for j := 0; ok && j < len(cs.Buckets); j++ {
			ok = !math.IsNaN(cs.Buckets[j]) && cs.BucketCounts[j] >= 0 && cs.BucketCounts[j] <= cs.Calls &&
				(j == 0 || (cs.Buckets[j] > cs.Buckets[j-1] && cs.BucketCounts[j] >= cs.BucketCounts[j-1]))
		}
		if !ok {
			cs.Buckets, cs.BucketCounts = nil, nil
		}
	}
	return c
}

// clipLabel cuts a label value to maxCounterLabel bytes, without the
// note clip adds (a label is an identifier, not prose).
func clipLabel(s string) string {
	if len(s) <= maxCounterLabel {
		return s
	}
	cut := maxCounterLabel
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return s[:cut]
}

// limitedLogger is a logger whose lines are budgeted and clipped. It
// wraps what a plugin's output goes through: go-plugin's logging of the
// plugin's stderr, and the host's own lines about the plugin.
type limitedLogger struct {
	hclog.Logger
	budget  *loglimit.Limiter
	repeats *repeats
}

// repeatWindow is how long the same line, word for word, is held back
// after it was last let through. A plugin that says the same thing every
// poll (the queue still cannot be read, a job still pends) is worth a line
// a minute, with a count, not a line a poll.
const repeatWindow = time.Minute

// repeats remembers the last line let through, across every copy of one
// LimitLogger (With and Named share it).
type repeats struct {
	mu   sync.Mutex // guards the fields below
	key  string
	msg  string
	at   time.Time
	held int
}

// LimitLogger wraps l so that a plugin's output costs a bounded number of
// lines: a budget a second, lines clipped, and a line identical to the
// previous one held back for repeatWindow and counted.
func LimitLogger(l hclog.Logger) hclog.Logger {
	return &limitedLogger{Logger: l, budget: loglimit.New(logLinesPerSecond, time.Second), repeats: &repeats{}}
}

// repeated says whether the line is the one last let through, within
// repeatWindow; if not, it becomes the last one, and held is how many
// copies of the previous one were held back.
func (r *repeats) repeated(key, msg string, now time.Time) (yes bool, held int, heldMsg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if key == r.key && now.Sub(r.at) < repeatWindow {
		r.held++
		return true, 0, ""
	}
	held, heldMsg = r.held, r.msg
	r.key, r.msg, r.at, r.held = key, msg, now, 0
	return false, held, heldMsg
}

func (l *limitedLogger) Log(level hclog.Level, msg string, args ...any) {
	now := time.Now()
	// go-plugin appends the plugin's own timestamp to each line it
	// relays; the engine's logger stamps the line again, milliseconds
	// later. One timestamp a line is enough, and it is the engine's.
	if n := len(args); n >= 2 && args[n-2] == "timestamp" {
		args = args[:n-2]
	}
	key := l.Logger.Name() + "\x00" + level.String() + "\x00" + msg + "\x00" + fmt.Sprint(args...)
	same, held, heldMsg := l.repeats.repeated(key, msg, now)
	if same {
		return
	}
	ok, dropped := l.budget.Allow(now)
	if !ok {
		return
	}
	if held > 0 {
		l.Logger.Info("the line before was repeated; copies held back", "line", clip.Bytes(heldMsg, maxLogLine), "copies", held)
	}
	if dropped > 0 {
		l.Logger.Warn("plugin output over the log budget; lines dropped", "dropped", dropped, "lines_per_second", logLinesPerSecond)
	}
	// What a plugin says is escaped (termsafe) before the engine's logger
	// writes it: hclog writes a message and keys as they are, and a value
	// in JSON as encoding/json leaves it (U+202E, C1 and DEL raw).
	for i := range args {
		switch v := args[i].(type) {
		case string:
			args[i] = termsafe.Escape(clip.Bytes(v, maxLogLine))
		case nil, bool, int, int64, float64:
		default:
			args[i] = termsafe.Escape(clip.Bytes(fmt.Sprint(v), maxLogLine))
		}
	}
	l.Logger.Log(level, termsafe.Escape(clip.Bytes(msg, maxLogLine)), args...)
}

func (l *limitedLogger) Trace(msg string, args ...any) { l.Log(hclog.Trace, msg, args...) }
func (l *limitedLogger) Debug(msg string, args ...any) { l.Log(hclog.Debug, msg, args...) }
func (l *limitedLogger) Info(msg string, args ...any)  { l.Log(hclog.Info, msg, args...) }
func (l *limitedLogger) Warn(msg string, args ...any)  { l.Log(hclog.Warn, msg, args...) }
func (l *limitedLogger) Error(msg string, args ...any) { l.Log(hclog.Error, msg, args...) }

func (l *limitedLogger) With(args ...any) hclog.Logger {
	return &limitedLogger{Logger: l.Logger.With(args...), budget: l.budget, repeats: l.repeats}
}

func (l *limitedLogger) Named(name string) hclog.Logger {
	return &limitedLogger{Logger: l.Logger.Named(termsafe.EscapeLine(name)), budget: l.budget, repeats: l.repeats}
}

func (l *limitedLogger) ResetNamed(name string) hclog.Logger {
	return &limitedLogger{Logger: l.Logger.ResetNamed(termsafe.EscapeLine(name)), budget: l.budget, repeats: l.repeats}
}
