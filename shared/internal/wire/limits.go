package wire

import (
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/internal/loglimit"

	"github.com/fluksio/provision/shared"
)

// Whatever a plugin sends, the host holds: a plugin is code of other
// people, and a buggy one is as likely as a hostile one. Measured before
// these bounds: a Status with 200,000 entries fetched 16 times at once
// took the engine to 3 GB; a 100 MB event was accepted and logged whole;
// 100 MB of stderr went into the engine's log.
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

// clip cuts s to at most n bytes, saying so.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut-- // not in the middle of a UTF-8 sequence
	}
	return s[:cut] + fmt.Sprintf("… [%d bytes cut]", len(s)-cut)
}

// ClipEvent bounds an event's fields.
func ClipEvent(ev shared.Event) shared.Event {
	ev.Kind = shared.EventKind(clip(string(ev.Kind), maxEventField))
	ev.Profile = clip(ev.Profile, maxEventField)
	ev.Job = clip(ev.Job, maxEventField)
	ev.Worker = clip(ev.Worker, maxEventField)
	ev.Detail = clip(ev.Detail, MaxEventDetail)
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
		s.Notes[i] = clip(n, MaxEventDetail)
	}
	s.LastError = clip(s.LastError, MaxEventDetail)
	return s
}

// limitedLogger is a logger whose lines are budgeted and clipped. It
// wraps what a plugin's output goes through: go-plugin's logging of the
// plugin's stderr, and the host's own lines about the plugin.
type limitedLogger struct {
	hclog.Logger
	budget *loglimit.Limiter
}

func LimitLogger(l hclog.Logger) hclog.Logger {
	return &limitedLogger{Logger: l, budget: loglimit.New(logLinesPerSecond, time.Second)}
}

func (l *limitedLogger) Log(level hclog.Level, msg string, args ...any) {
	ok, dropped := l.budget.Allow(time.Now())
	if !ok {
		return
	}
	if dropped > 0 {
		l.Logger.Warn("plugin output over the log budget; lines dropped", "dropped", dropped, "lines_per_second", logLinesPerSecond)
	}
	for i := range args {
		if s, isString := args[i].(string); isString {
			args[i] = clip(s, maxLogLine)
		}
	}
	l.Logger.Log(level, clip(msg, maxLogLine), args...)
}

func (l *limitedLogger) Trace(msg string, args ...any) { l.Log(hclog.Trace, msg, args...) }
func (l *limitedLogger) Debug(msg string, args ...any) { l.Log(hclog.Debug, msg, args...) }
func (l *limitedLogger) Info(msg string, args ...any)  { l.Log(hclog.Info, msg, args...) }
func (l *limitedLogger) Warn(msg string, args ...any)  { l.Log(hclog.Warn, msg, args...) }
func (l *limitedLogger) Error(msg string, args ...any) { l.Log(hclog.Error, msg, args...) }

func (l *limitedLogger) With(args ...any) hclog.Logger {
	return &limitedLogger{Logger: l.Logger.With(args...), budget: l.budget}
}

func (l *limitedLogger) Named(name string) hclog.Logger {
	return &limitedLogger{Logger: l.Logger.Named(name), budget: l.budget}
}

func (l *limitedLogger) ResetNamed(name string) hclog.Logger {
	return &limitedLogger{Logger: l.Logger.ResetNamed(name), budget: l.budget}
}
