package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// ErrEngineStopped is what Wait returns when the engine stops before
// every task it waits for has ended.
var ErrEngineStopped = errors.New("the engine stopped")

// endFeed tells Wait and the channels of Ended of each task's end, as
// tellTask tells it: a simple engine submits, waits and stops, with no
// loop or hook of its own.
type endFeed struct {
	// mu guards signal, subs and every endSub's queue.
	mu sync.Mutex
	// signal is closed, and replaced, at each task's end: every Wait
	// looks again.
	signal chan struct{}
	subs   map[*endSub]struct{}
	// stop is closed at Stop: Wait returns and Ended's goroutines end.
	stop     chan struct{}
	stopOnce sync.Once
	// wg counts Ended's goroutines; Stop waits for them.
	wg sync.WaitGroup
}

// endSub is one channel of Ended: the ends not yet sent on it, and a
// wake-up for its goroutine.
type endSub struct {
	queue []TaskResult
	wake  chan struct{}
}

func newEndFeed() *endFeed {
	return &endFeed{signal: make(chan struct{}), subs: map[*endSub]struct{}{}, stop: make(chan struct{})}
}

// told hears a task's end.
func (f *endFeed) told(res TaskResult) {
	f.mu.Lock()
	defer f.mu.Unlock()
	close(f.signal)
	f.signal = make(chan struct{})
	for s := range f.subs {
		s.queue = append(s.queue, res)
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// changed is closed at the next task's end.
func (f *endFeed) changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.signal
}

// next takes the oldest end not yet sent to s.
func (f *endFeed) next(s *endSub) (TaskResult, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(s.queue) == 0 {
		return TaskResult{}, false
	}
	res := s.queue[0]
	s.queue[0] = TaskResult{}
	s.queue = s.queue[1:]
	return res, true
}

// close ends every Wait and Ended, and waits for Ended's goroutines.
func (f *endFeed) close() {
	f.stopOnce.Do(func() { close(f.stop) })
	f.wg.Wait()
}

// stateEnded says whether a task in state has ended.
func stateEnded(state TaskState) bool {
	return state != TaskWaiting && state != TaskRunning && state != ""
}

// Wait returns when every task of ids has ended, with their results in
// the order of ids; or with ctx's error when ctx ends first, or
// ErrEngineStopped when the engine stops. An id the engine does not hold
// is ErrNoSuchTask, at once. A task's result is read once it ended, so
// that one forgotten later (the engine keeps the last 10,000 ended) is
// still returned.
func (e *Engine) Wait(ctx context.Context, ids ...string) ([]TaskResult, error) {
	out := make([]TaskResult, len(ids))
	next := 0
	for {
		// The wake-up is taken before the states are read: an end
		// between the two is not missed.
		changed := e.ends.changed()
		for ; next < len(ids); next++ {
			res, ok := e.tasks.result(ids[next])
			if !ok {
				return nil, fmt.Errorf("task %s: %w", ids[next], ErrNoSuchTask)
			}
			if !stateEnded(res.State) {
				break
			}
			out[next] = res
		}
		if next == len(ids) {
			return out, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-e.ends.stop:
			return nil, ErrEngineStopped
		}
	}
}

// Ended returns a channel on which every task that ends from now on is
// sent once, with its result, in the order the engine told their ends.
// The channel is closed when ctx ends or the engine stops; an end not
// received by then is dropped. A reader that falls behind costs memory
// for what waits, never a task's progress.
func (e *Engine) Ended(ctx context.Context) <-chan TaskResult {
	out := make(chan TaskResult)
	s := &endSub{wake: make(chan struct{}, 1)}
	f := e.ends
	f.mu.Lock()
	select {
	case <-f.stop:
		f.mu.Unlock()
		close(out)
		return out
	default:
	}
	f.subs[s] = struct{}{}
	f.wg.Add(1)
	f.mu.Unlock()
	go func() {
		defer f.wg.Done()
		defer close(out)
		defer func() {
			f.mu.Lock()
			delete(f.subs, s)
			f.mu.Unlock()
		}()
		for {
			res, ok := f.next(s)
			if !ok {
				select {
				case <-s.wake:
					continue
				case <-ctx.Done():
					return
				case <-f.stop:
					return
				}
			}
			select {
			case out <- res:
			case <-ctx.Done():
				return
			case <-f.stop:
				return
			}
		}
	}()
	return out
}
