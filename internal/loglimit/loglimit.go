// Package loglimit bounds how many log lines a source may write: at most
// a burst per window, counting the rest, so that the first line let
// through after a gap can say how many were left out. The engine uses it
// for refused requests and dropped connections, and the host SDK for what
// a plugin writes; a flood costs a few lines, not a line per event.
package loglimit

import (
	"sync"
	"time"
)

// Limiter lets Burst lines through per Window. The zero value lets
// nothing through; use New.
type Limiter struct {
	burst  int
	window time.Duration

	mu      sync.Mutex // guards the fields below
	start   time.Time
	n       int
	dropped int
}

// New returns a Limiter of burst lines per window.
func New(burst int, window time.Duration) *Limiter {
	return &Limiter{burst: burst, window: window}
}

// Allow says whether a line may be logged at now and, if so, how many
// lines were left out since the last one that was.
func (l *Limiter) Allow(now time.Time) (ok bool, leftOut int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.start) >= l.window {
		l.start, l.n = now, 0
	}
	if l.n >= l.burst {
		l.dropped++
		return false, 0
	}
	l.n++
	leftOut, l.dropped = l.dropped, 0
	return true, leftOut
}

// Flush returns how many lines were left out since the last one let
// through, and forgets them: for a summary when the source goes quiet or
// stops, which no later Allow would report.
func (l *Limiter) Flush() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.dropped
	l.dropped = 0
	return n
}
