package engine

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fluksio/provision/internal/backoff"
	"github.com/fluksio/provision/internal/needspec"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

// A machine asked for a waiting kind of task that attaches and cannot
// take it (its worker lacks a feature the task requires, its job has
// less time left than the task needs, it is smaller than its profile
// says) is evidence that the profile does not serve that kind: asking
// for another would only repeat it, each machine attaching, idling to
// its max_idle and leaving while the next is asked for. So the router
// records a mismatch for the provisioner's profile and the kind, asks
// for no machine of that profile for such tasks while it holds (routing
// them to another profile of the provisioner that fits them, if there
// is one), says why in /status, the progress line and the story, and
// afterwards asks for at most one machine of it at a time for them
// until one takes such a task. The hold doubles with each machine that
// mismatches again, from mismatchHold to maxMismatchHold.
//
// Rejected: asking for one machine per profile and kind before any has
// shown it can take such a task. It would bound a mismatch before the
// first machine too, but every burst would wait a queue's time for its
// first machine before the rest were asked for, which is the cost the
// demand's one submission a burst exists to avoid. The cost of this
// rule: the machines asked for a kind before the first of them attaches
// (up to the kind's waiting tasks, within max_workers and max_pending)
// may all be unusable; after that, one machine a hold.

// mismatchHold is how long a profile is not asked for a kind of task
// after a machine of it could not take one, and maxMismatchHold the
// most that doubles to.
const (
	mismatchHold    = 5 * time.Minute
	maxMismatchHold = time.Hour
)

// maxMismatches bounds the mismatches the router keeps: those whose hold
// passed go first, then the oldest.
const maxMismatches = 1000

// MismatchCause is why a machine could not take the task it was asked
// for.
type MismatchCause string

const (
	// MismatchFeatures: its worker lacks a feature the task requires.
	MismatchFeatures MismatchCause = "features"
	// MismatchTime: its job had less time left than the task's timeout
	// and the worker's end margin.
	MismatchTime MismatchCause = "time"
	// MismatchSize: it attached smaller than the task needs (than its
	// profile said).
	MismatchSize MismatchCause = "size"
)

// Mismatch is a machine that attached for a kind of waiting task and
// could not take it, as Hooks.Mismatch hears it.
type Mismatch struct {
	Provisioner string
	Profile     string
	Worker      string
	// Task is a waiting task (or need) of the kind.
	Task  string
	Cause MismatchCause
	// Detail says it in words.
	Detail string
	// Until is when a machine of the profile may be asked for such a
	// task again (one at a time); Count is how many machines of it have
	// mismatched so.
	Until time.Time
	Count int
}

// needKind is what makes needs alike to the router: the need (its
// lifetime included), the features its task requires and how long it
// may run.
type needKind struct {
	need     shared.Need
	requires string
	runFor   time.Duration
}

// kindOf is ns's kind.
func kindOf(ns *needState) needKind {
	k := needKind{need: ns.need, runFor: ns.runFor()}
	if ns.rec != nil {
		k.requires = requiresKey(ns.rec.requires)
	}
	return k
}

// mismatchKey is a provisioner's profile and a kind of need.
type mismatchKey struct {
	target, profile string
	kind            needKind
}

// mismatchBook is the router's mismatches: the profiles whose machines
// attached and could not take a kind of waiting need. It has no lock of
// its own: it is the router's (router.mismatches, guarded by router.mu),
// and each method is called with router.mu held, never across a call to
// a provisioner.
type mismatchBook struct {
	m map[mismatchKey]*mismatch
}

// mismatch is what the router keeps of one.
type mismatch struct {
	Mismatch
	// words is the need's wait, in /status's words.
	words string
}

// mismatchOf says why w cannot take ns's task at now, false if it can.
func mismatchOf(w WorkerInfo, ns *needState, now time.Time) (MismatchCause, string, bool) {
	switch {
	case ns.rec != nil && !w.has(ns.rec.requires):
		var lacks []string
		for _, f := range ns.rec.requires {
			if !slices.Contains(w.Features, f) {
				lacks = append(lacks, f)
			}
		}
		offers := "none"
		if len(w.Features) > 0 {
			offers = strings.Join(w.Features, ", ")
		}
		return MismatchFeatures, fmt.Sprintf("its worker %s lacks %s, which the task requires (it offers %s)",
			w.Name, strings.Join(lacks, ", "), offers), true
	case !w.shape().Fits(ns.need):
		return MismatchSize, fmt.Sprintf("its worker %s attached with %s, which does not fit %s",
			w.Name, needspec.Format(shared.Need{CPUs: w.CPUs, GPUs: w.GPUs, RAMMB: w.RAMMB}), needspec.Format(ns.need)), true
	case !ns.timeFits(w, now):
		return MismatchTime, fmt.Sprintf("its worker %s's job ends in %s, and the task needs %s (its %s and the worker's %s end margin)",
			w.Name, shortDuration(w.EndsAt.Sub(now)), shortDuration(ns.runFor()+worker.EndMargin),
			shortDuration(ns.runFor()), shortDuration(worker.EndMargin)), true
	}
	return "", "", false
}

// note records, for each idle worker no waiting need took (left) that
// has never taken a task, the kinds of need waiting that were asked of
// its profile and that it cannot take (unfit, one need of each kind): a
// mismatch. A worker of a kind's mismatch already recorded counts again
// only once the hold passed (the machine asked afterwards). It returns
// the mismatches new or renewed, to be told.
func (b *mismatchBook) note(left []WorkerInfo, unfit []*needState, now time.Time) []Mismatch {
	var told []Mismatch
	for _, w := range left {
		if w.Profile == "" || w.took {
			// A machine that took a task was not asked in vain.
			continue
		}
		for _, ns := range unfit {
			a := ns.seen(w.Provisioner)
			if a == nil || a.profile != w.Profile {
				continue
			}
			cause, detail, ok := mismatchOf(w, ns, now)
			if !ok {
				continue
			}
			key := mismatchKey{w.Provisioner, w.Profile, kindOf(ns)}
			m := b.m[key]
			switch {
			case m == nil:
				b.prune()
				m = &mismatch{}
				b.m[key] = m
			case m.Worker == w.Name || now.Before(m.Until):
				// The same machine again, or one asked before the hold:
				// the same evidence.
				continue
			}
			m.Count++
			m.Provisioner, m.Profile, m.Worker, m.Task = w.Provisioner, w.Profile, w.Name, ns.id
			m.Cause, m.Detail, m.Until = cause, detail, now.Add(backoff.Delay(mismatchHold, maxMismatchHold, m.Count))
			m.words = fmt.Sprintf("mismatch: a %s machine attached and could not take it: %s; no other %s machine is asked for such tasks before %s, then one at a time",
				w.Profile, detail, w.Profile, m.Until.UTC().Format(time.TimeOnly))
			told = append(told, m.Mismatch)
		}
	}
	return told
}

// prune makes room for one more mismatch: those whose hold passed
// longest ago go first.
func (b *mismatchBook) prune() {
	for len(b.m) >= maxMismatches {
		var oldest mismatchKey
		var at time.Time
		first := true
		for k, m := range b.m {
			if first || m.Until.Before(at) {
				oldest, at, first = k, m.Until, false
			}
		}
		delete(b.m, oldest)
	}
}

// served forgets the mismatch of w's profile for ns's kind: a machine
// of it took such a task.
func (b *mismatchBook) served(w WorkerInfo, ns *needState) {
	if len(b.m) == 0 {
		return
	}
	delete(b.m, mismatchKey{w.Provisioner, w.Profile, kindOf(ns)})
}

// get is the mismatch of target's profile for ns's kind, nil if none.
func (b *mismatchBook) get(target, profile string, ns *needState) *mismatch {
	if len(b.m) == 0 {
		return nil
	}
	return b.m[mismatchKey{target, profile, kindOf(ns)}]
}

// clear forgets target's mismatches: its plugin came up again, with
// shapes that may be new, or it is gone.
func (b *mismatchBook) clear(target string) {
	for k := range b.m {
		if k.target == target {
			delete(b.m, k)
		}
	}
}

// route is the need to ask t for ns with, need unless a mismatch holds
// the profile need maps to: then ns's need pinned (by label) to another
// of t's profiles that fits it and holds no mismatch for its kind, or,
// past the mismatch's hold, need for one need a pass (retried marks
// them); else words says why nothing is asked.
func (b *mismatchBook) route(t target, ns *needState, need shared.Need, now time.Time, retried map[*mismatch]bool) (shared.Need, string) {
	if len(b.m) == 0 {
		return need, ""
	}
	profile, ok := profileFor(t.Shapes, need)
	if !ok {
		return need, ""
	}
	m := b.get(t.Name, profile, ns)
	if m == nil {
		return need, ""
	}
	for _, s := range t.Shapes {
		if s.Profile != profile && s.Fits(ns.need) && b.get(t.Name, s.Profile, ns) == nil {
			pinned := ns.need
			pinned.Label = s.Profile
			return pinned, ""
		}
	}
	if !now.Before(m.Until) && !retried[m] {
		retried[m] = true
		return need, ""
	}
	return need, m.words
}
