package engine

import (
	"context"
	"sync"
)

// The run loop has one owner. By default it is the engine's own: Start
// begins it on a goroutine of the engine's, and Stop ends it, so that
// an engine submits, waits (Wait, Ended) and stops with no loop of its
// own. An engine that calls Run before Start owns it instead (as the
// tests of the kit and engines that pace the loop do), and Start then
// starts none. Run called while the engine's own loop runs passes
// nothing itself: it waits for done, asked after each of the loop's
// passes. Rejected: a second loop beside the first, which would take
// the wake-ups the first waits for, and run done's check a pass late.

// loopOwner is who runs the passes.
type loopOwner int

const (
	noLoop     loopOwner = iota
	manualLoop           // Run's caller
	ownLoop              // the engine, from Start to Stop
)

// runLoop is the run loop's owner and the signal of its passes.
type runLoop struct {
	// mu guards owner, signal and stop.
	mu    sync.Mutex
	owner loopOwner
	// signal is closed, and replaced, after each pass: Run's waits
	// ask done again.
	signal chan struct{}
	// stop ends the engine's own loop; done is closed when it has.
	stop context.CancelFunc
	done chan struct{}
}

// take makes who the owner, unless the loop has one.
func (l *runLoop) take(who loopOwner) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.owner != noLoop {
		return false
	}
	l.owner = who
	return true
}

// release gives the loop up (Run's return).
func (l *runLoop) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.owner = noLoop
}

// passed says a pass ended.
func (l *runLoop) passed() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.signal != nil {
		close(l.signal)
	}
	l.signal = make(chan struct{})
}

// next is closed at the end of the next pass.
func (l *runLoop) next() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.signal == nil {
		l.signal = make(chan struct{})
	}
	return l.signal
}

// await is Run while the engine's own loop passes: done is asked now
// and after each pass, until it says so or ctx ends.
func (l *runLoop) await(ctx context.Context, done func() bool) bool {
	for {
		next := l.next()
		if done != nil && done() {
			return true
		}
		select {
		case <-next:
		case <-ctx.Done():
			return false
		}
	}
}

// startOwn begins the engine's own loop, unless Run's caller owns it.
func (e *Engine) startOwn() {
	if !e.loop.take(ownLoop) {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	e.loop.mu.Lock()
	e.loop.stop, e.loop.done = cancel, done
	e.loop.mu.Unlock()
	go func() {
		defer close(done)
		e.loopPasses(ctx, nil)
	}()
}

// stopOwn ends the engine's own loop and waits for it; nothing when
// there is none.
func (e *Engine) stopOwn() {
	e.loop.mu.Lock()
	stop, done := e.loop.stop, e.loop.done
	e.loop.stop, e.loop.done = nil, nil
	e.loop.mu.Unlock()
	if stop == nil {
		return
	}
	stop()
	<-done
	e.loop.release()
}
