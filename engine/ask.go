package engine

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fluksio/provision/engine/internal/supervise"
	"github.com/fluksio/provision/internal/needspec"
	"github.com/fluksio/provision/shared"
)

// asker is the router's side that asks the provisioners for machines:
// the waiting needs are routed to the targets that cover them, each
// target is told its whole demand on a goroutine of its own, and what
// each answers is recorded on the needs and logged when it changes.
//
// It is a part of the router, not a type beside it: its answers are
// written on the router's needs under the router's mu, and a lock of
// its own would be one more to order for nothing gained. It holds what
// only asking touches: the deadline of a call, the targets with a round
// under way, the goroutines of the rounds, and who hears of deadlines
// and bursts. Its methods take p.mu themselves where they touch the
// needs or the targets, and never hold it across a provisioner's call.
type asker struct {
	// p is the router whose needs and targets this reads and changes,
	// under p.mu.
	p *router
	// provisionTimeout bounds one Provision call; set before the first
	// Pass. newRouter sets defaultProvisionTimeout.
	provisionTimeout time.Duration
	// busy names the targets with a round of Provision calls under way;
	// guarded by p.mu.
	busy map[string]bool
	// rounds counts the goroutines asking targets; the router's Close
	// waits for them.
	rounds sync.WaitGroup
	// onDeadline, if set, is told after each Provision call whether the
	// target answered within provisionTimeout (missed true if not), so
	// that a plugin that keeps missing deadlines can be restarted. Set it
	// before the first Pass.
	onDeadline func(target string, missed bool)
	// onBurst, if set, hears of each Provision call that asked for or
	// cancelled machines of a profile. Set it before the first Pass.
	onBurst func(target string, pd shared.ProfileDemand)
	// holding counts the Engine.Together calls under way: while it is
	// above zero, Step asks no provisioner (Pass still does).
	holding atomic.Int32
}

// setTarget adds a target, or replaces the one of the same name: after a
// plugin restarts it has a new client and possibly new shapes. Replacing
// a target clears its down mark.
func (a *asker) setTarget(t target) {
	p := a.p
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rising = true
	p.mismatches.clear(t.Name)
	for i, ts := range p.targets {
		if ts.Name == t.Name {
			p.targets[i] = &targetState{target: t}
			return
		}
	}
	p.targets = append(p.targets, &targetState{target: t})
}

// packs reports whether the named target's workers pack tasks
// (target.Packs); false if there is no such target.
func (a *asker) packs(name string) bool {
	p := a.p
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ts := range p.targets {
		if ts.Name == name {
			return ts.Packs
		}
	}
	return false
}

// shapesOf is the named target's shapes, nil if there is none.
func (a *asker) shapesOf(name string) []shared.Shape {
	p := a.p
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ts := range p.targets {
		if ts.Name == name {
			return slices.Clone(ts.Shapes)
		}
	}
	return nil
}

// removeTarget takes the named target away: a reload removed its
// provisioner. Needs it covered fail over to the others, or wait.
func (a *asker) removeTarget(name string) {
	p := a.p
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rising = true
	p.targets = slices.DeleteFunc(p.targets, func(ts *targetState) bool { return ts.Name == name })
	p.mismatches.clear(name)
}

// setDown marks a target down (skipped by Pass) or up again.
func (a *asker) setDown(name string, down bool) {
	p := a.p
	p.mu.Lock()
	changed := false
	for _, ts := range p.targets {
		if ts.Name == name && ts.down != down {
			ts.down, changed = down, true
		}
	}
	if changed {
		p.rising = true
	}
	p.mu.Unlock()
	if changed {
		p.logger.Info("provisioner marked", "provisioner", name, "down", down)
	}
}

// provision tells every target that is up its whole demand: the waiting
// needs routed to it, grouped by need. A need goes to the first target
// that covers it and has not refused it (no fit, an error); a profile
// backing off is routed around inside its target by asking for the next
// fitting shape instead. Targets with no demand are told so too, because
// demand is level-triggered: a provisioner cancels what it has pending
// beyond what it is told, and keeps its warm minimum. Each target is asked
// on a goroutine of its own, and the pass waits at most passWait for them:
// a target that hangs delays only itself, and is not asked again while its
// round lasts.
func (a *asker) provision(ctx context.Context, waiting []*needState) {
	p := a.p
	p.mu.Lock()
	targets := make([]targetState, 0, len(p.targets))
	for _, ts := range p.targets {
		targets = append(targets, *ts)
	}
	p.mu.Unlock()

	rounds := map[string]*round{}
	for _, t := range targets {
		if !t.down {
			rounds[t.Name] = &round{}
		}
	}
	// A worker may have attached since match looked: it is idle and will
	// take a waiting need on the next pass. That need is covered, not
	// wanted; counting it would ask for a machine now and give one up the
	// pass after, when the demand falls back.
	idle, attached := p.engine.IdleAndAttached()
	now := time.Now()
	taken := make([]bool, len(idle))
	// Needs whose profile the engine holds back (backoff.go): each held
	// profile is asked for at most its allowance this pass, and the rest
	// are answered BACKING_OFF here, without asking the plugin.
	type heldNeed struct {
		t      target
		ns     *needState
		need   shared.Need
		o      shared.DemandOutcome
		reason WaitReason
	}
	var held []heldNeed
	routed := map[holdKey]int{}
	// Needs a mismatch holds back (mismatch.go), told so without asking;
	// retried marks the mismatches a need was asked for once their
	// hold passed: one at a time.
	type mismatchedNeed struct {
		target string
		ns     *needState
		words  string
	}
	var mismatched []mismatchedNeed
	retried := map[*mismatch]bool{}
	// What a pass works out for a need depends on the need alone (the
	// targets covering it; a target's profile for it and that profile's
	// hold), and a queue's needs come alike in a row: each is worked out
	// once for the need before, not once for every need waiting.
	var (
		coverNeed  shared.Need
		covering   []targetState
		haveCover  bool
		profTarget string
		profNeed   shared.Need
		profile    string
		profOK     bool
		keep       int
		hold       holdState
	)
	var uncovered []*needState
	p.mu.Lock()
	for _, ns := range waiting {
		covered := false
		for i := range idle {
			if !taken[i] && ns.fitsAt(idle[i], now) {
				taken[i], covered = idle[i].take(ns.need), true
				break
			}
		}
		if covered {
			continue
		}
		if !haveCover || ns.need != coverNeed {
			coverNeed, covering, haveCover = ns.need, nil, true
			for _, t := range targets {
				if t.covers(ns.need) {
					covering = append(covering, t)
				}
			}
		}
		t, ok := a.routeLocked(ns, covering)
		if !ok {
			if len(covering) == 0 && !ns.uncovered {
				ns.uncovered = true
				uncovered = append(uncovered, ns)
			}
			continue
		}
		need := ns.need
		if a := ns.seen(t.Name); a != nil && a.route != nil {
			need = *a.route
		}
		var words string
		if need, words = p.mismatches.route(t.target, ns, need, now, retried); words != "" {
			mismatched = append(mismatched, mismatchedNeed{t.Name, ns, words})
			continue
		}
		if profTarget != t.Name || need != profNeed {
			profTarget, profNeed = t.Name, need
			profile, profOK = profileFor(t.Shapes, need)
			keep = -1
			if profOK {
				keep, hold = p.holds.allowance(t.Name, profile)
			}
		}
		if profOK {
			k := holdKey{t.Name, profile}
			if keep >= 0 && routed[k] >= keep {
				held = append(held, heldNeed{t.target, ns, need, shared.DemandOutcome{Outcome: shared.OutcomeBackingOff, Profile: profile, Detail: holdDetail(hold)}, holdReason(hold)})
				continue
			}
			routed[k]++
		}
		rounds[t.Name].add(need, ns)
	}
	p.mu.Unlock()
	// Logged once p.mu is released: the log may be slow.
	for _, ns := range uncovered {
		p.logger.Warn("no provisioner can start a machine for this need", "need", ns.id, "spec", needspec.Format(ns.need))
	}
	for _, h := range held {
		a.noteDemand(h.t, h.ns, h.need, h.o, wordsOf(h.o), h.reason)
	}
	for _, m := range mismatched {
		a.noteOutcome(m.ns, m.target, ReasonMismatch, outcomeWords{kind: "mismatch", desc: m.words, kv: []any{"outcome", "mismatch"}})
	}
	for _, t := range targets {
		if rd := rounds[t.Name]; rd != nil && t.Packs {
			rd.pack(t.Shapes)
		}
	}
	a.ask(ctx, targets, rounds, attached)
}

// ask tells each target that is not still answering the last pass its
// round, each on a goroutine of the router's (rounds), and waits for
// them at most passWait: a slow plugin's answer lands in a later pass.
func (a *asker) ask(ctx context.Context, targets []targetState, rounds map[string]*round, attached map[string][]string) {
	p := a.p
	var started sync.WaitGroup
	for _, t := range targets {
		rd := rounds[t.Name]
		if rd == nil {
			continue
		}
		p.mu.Lock()
		if a.busy[t.Name] {
			p.mu.Unlock()
			continue
		}
		a.busy[t.Name] = true
		p.mu.Unlock()
		started.Add(1)
		a.rounds.Add(1)
		go func() {
			defer a.rounds.Done()
			defer started.Done()
			a.askTarget(ctx, t.target, rd, attached[t.Name])
			p.mu.Lock()
			delete(a.busy, t.Name)
			p.mu.Unlock()
		}()
	}
	done := make(chan struct{})
	go func() {
		started.Wait()
		close(done)
	}()
	timer := time.NewTimer(passWait)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
	case <-ctx.Done():
	}
}

// round is one target's demand in a pass: an entry per distinct need, and
// the waiting needs each entry stands for.
type round struct {
	demand []shared.Demand
	needs  [][]*needState
}

func (r *round) add(n shared.Need, ns *needState) {
	for i, d := range r.demand {
		if d.Need == n {
			r.demand[i].Count++
			r.needs[i] = append(r.needs[i], ns)
			return
		}
	}
	r.demand = append(r.demand, shared.Demand{Need: n, Count: 1})
	r.needs = append(r.needs, []*needState{ns})
}

// pack turns the round's counts of needs into counts of machines, for
// a target whose workers run as many tasks at once as they hold
// (target.Packs): the needs of each entry are so many machines of the
// shape the target would start for them (the smallest that fits, as
// profileFor chooses), each holding as many as fit its CPUs, GPUs and
// memory (a need takes one CPU at least, as a worker's slots count
// it). The entries of one shape share its machines: each machine is a
// fraction per need, the fractions of a shape's entries are summed in
// order, and each entry asks for the machines its part of the sum
// crosses, so that the shape's entries ask for ceil(sum) machines in
// all. 40 one-CPU needs on a 16-CPU shape are 3 machines; 0 are 0.
// Machines that attached with room were counted already, as idle
// workers covering needs (provision); those on their way are the
// plugin's to count against this level, as for any demand.
func (r *round) pack(shapes []shared.Shape) {
	sum := map[string]float64{}
	for i, d := range r.demand {
		s, ok := shapeFor(shapes, d.Need)
		if !ok || d.Count <= 0 {
			continue
		}
		before := sum[s.Profile]
		after := before + float64(d.Count)/float64(perMachine(s, d.Need))
		sum[s.Profile] = after
		r.demand[i].Count = ceilMachines(after) - ceilMachines(before)
	}
}

// ceilMachines is f rounded up, less a rounding error's worth: 16
// sixteenths are one machine, not two.
func ceilMachines(f float64) int { return int(math.Ceil(f - 1e-9)) }

// shapeFor is the first of shapes that fits n (the smallest, as a
// provisioner lists them), as profileFor chooses.
func shapeFor(shapes []shared.Shape, n shared.Need) (shared.Shape, bool) {
	for _, s := range shapes {
		if s.Fits(n) {
			return s, true
		}
	}
	return shared.Shape{}, false
}

// perMachine is how many needs n a machine of shape s holds at once, one at
// least.
func perMachine(s shared.Shape, n shared.Need) int {
	k := s.CPUs / max(1, n.CPUs)
	if n.GPUs > 0 {
		k = min(k, s.GPUs/n.GPUs)
	}
	if n.RAMMB > 0 && s.RAMMB > 0 {
		k = min(k, int(s.RAMMB/n.RAMMB))
	}
	return max(1, k)
}

// routeLocked picks the target a waiting need is asked of this pass
// among covering, the targets that cover it: the first that is up and
// has not refused it. When every covering target has refused it, the
// refusals are forgotten and the first is asked again: what refused may
// have changed (a restart, a backoff over). p.mu must be held.
func (a *asker) routeLocked(ns *needState, covering []targetState) (targetState, bool) {
	for pass := 0; pass < 2; pass++ {
		for _, t := range covering {
			if t.down {
				a := ns.atTarget(t.Name)
				a.asked, a.hasAsked = asked{reason: ReasonProvisionerDown, desc: "down"}, true
				a.logged = loggedOutcome{kind: "down", desc: "down"}
				continue
			}
			if a := ns.seen(t.Name); a == nil || !a.refused {
				return t, true
			}
		}
		for _, a := range ns.at {
			a.refused = false
		}
	}
	return targetState{}, false
}

// askTarget tells one target its demand and records, need by need, what
// it did. A profile backing off makes its needs ask for the next fitting
// shape from the next pass on, so that a larger profile that works serves
// them instead of their waiting on the broken one; a need the target
// cannot fit, or a call that fails, is routed to the next covering target.
func (a *asker) askTarget(ctx context.Context, t target, rd *round, attached []string) {
	p := a.p
	callCtx, cancel := context.WithTimeout(ctx, a.provisionTimeout)
	resp, err := t.P.Provision(callCtx, &shared.ProvisionRequest{Demand: rd.demand, Attached: attached})
	// The pass's own end cuts the call short (supervise.Ended).
	cutShort := supervise.Ended(ctx)
	missed := !cutShort && supervise.MissedDeadline(callCtx, err)
	cancel()
	if a.onDeadline != nil {
		a.onDeadline(t.Name, missed)
	}
	if missed {
		err = fmt.Errorf("no answer within %s", a.provisionTimeout)
	}
	if err != nil && cutShort {
		// The pass itself was cut short (the run is over, the engine
		// stops): the provisioner said nothing, and each need keeps its
		// last answer, such as "login needed", not the cut's words.
		return
	}
	if err == nil && len(resp.Outcomes) != len(rd.demand) {
		err = fmt.Errorf("%d outcomes for %d demand entries", len(resp.Outcomes), len(rd.demand))
	}
	if err != nil {
		for _, needs := range rd.needs {
			for _, ns := range needs {
				a.refuse(ns, t.Name)
				a.noteOutcome(ns, t.Name, ReasonError, outcomeWords{kind: "error", desc: "error: " + err.Error(), kv: []any{"error", err}})
			}
		}
		return
	}
	p.holds.reported(t.Name, resp.Profiles)
	a.noteProfiles(t.Name, resp.Profiles)
	for i, o := range resp.Outcomes {
		// One description an outcome, shared by its needs: a burst of
		// 10,000 is one outcome.
		words := wordsOf(o)
		switch o.Outcome {
		case shared.OutcomeNoFit, shared.OutcomeBackingOff:
			// Each need is routed anew.
			for _, ns := range rd.needs[i] {
				a.noteDemand(t, ns, rd.demand[i].Need, o, words, reasonOf(o))
			}
		default:
			if o.Profile != "" {
				p.mu.Lock()
				for _, ns := range rd.needs[i] {
					ns.atTarget(t.Name).profile = o.Profile
				}
				p.mu.Unlock()
			}
			a.noteOutcomes(rd.needs[i], t.Name, reasonOf(o), words, true)
		}
	}
}

// outcomeWords is an outcome as the status page says it (desc) and as
// the log records it (kv).
type outcomeWords struct {
	// kind is what makes the outcome another one to an operator
	// reading the log (the outcome and its profile, "error",
	// "mismatch"); desc is the whole of it, kind and detail.
	kind, desc string
	kv         []any
}

func wordsOf(o shared.DemandOutcome) outcomeWords {
	kind := o.Outcome.String()
	if o.Profile != "" {
		kind += " " + o.Profile
	}
	desc := kind
	if o.Detail != "" {
		desc += ": " + o.Detail
	}
	return outcomeWords{kind: kind, desc: desc, kv: []any{"outcome", o.Outcome.String(), "profile", o.Profile, "detail", o.Detail}}
}

// noteDemand records what a target did about one need: o, in words.
func (a *asker) noteDemand(t target, ns *needState, asked shared.Need, o shared.DemandOutcome, words outcomeWords, reason WaitReason) {
	p := a.p
	switch o.Outcome {
	case shared.OutcomeNoFit:
		a.refuse(ns, t.Name)
	case shared.OutcomeBackingOff:
		// Ask for the next fitting shape from the next pass on. The
		// smallest profile that fits it is its own, unless one that fits
		// it is tried already; then a later pass tries the one after.
		p.mu.Lock()
		at := ns.atTarget(t.Name)
		if at.tried == nil {
			at.tried = map[string]bool{}
		}
		at.tried[o.Profile] = true
		next, ok := nextShape(t.Shapes, ns.need, at.tried)
		var route failover
		if ok {
			at.tried[next.Profile] = true
			at.route = &shared.Need{CPUs: max(asked.CPUs, next.CPUs), GPUs: max(asked.GPUs, next.GPUs),
				RAMMB: max(asked.RAMMB, next.RAMMB), Label: ns.need.Label, Lifetime: max(asked.Lifetime, next.Lifetime)}
			route = failover{from: o.Profile, to: next.Profile}
		} else {
			// Every shape backs off: back to the smallest, and let the
			// other targets have a go.
			at.route, at.tried, at.refused = nil, nil, true
		}
		changed := route != (failover{}) && at.failover != route
		if route != (failover{}) {
			at.failover = route
		}
		// Asked elsewhere from the next pass on.
		p.rising = true
		p.mu.Unlock()
		if changed {
			p.logger.Warn("profile backing off; asking for the next fitting profile instead", "need", ns.id, "provisioner", t.Name,
				"failed_over_from", o.Profile, "profile", next.Profile)
		}
	}
	a.noteOutcomes([]*needState{ns}, t.Name, reason, words, o.Outcome != shared.OutcomeBackingOff)
}

// refuse routes ns away from target until every covering target has
// refused it.
func (a *asker) refuse(ns *needState, target string) {
	p := a.p
	p.mu.Lock()
	ns.atTarget(target).refused = true
	p.rising = true
	p.mu.Unlock()
}

// noteProfiles keeps what a target said about its profiles, for the
// story and GET /status, and logs a burst when one was asked for.
func (a *asker) noteProfiles(target string, profiles []shared.ProfileDemand) {
	p := a.p
	for _, pd := range profiles {
		if pd.Requested > 0 || pd.Cancelled > 0 {
			p.logger.Info("provisioner asked for machines", "provisioner", target, "profile", pd.Profile, "wanted", pd.Wanted,
				"requested", pd.Requested, "submissions", pd.Submissions, "cancelled", pd.Cancelled, "on_the_way", pd.OnTheWay, "attached", pd.Attached)
			if a.onBurst != nil {
				a.onBurst(target, pd)
			}
		}
	}
}

// nextShape is the first of shapes, in the provisioner's match order,
// that fits n and whose profile has not been tried.
func nextShape(shapes []shared.Shape, n shared.Need, tried map[string]bool) (shared.Shape, bool) {
	for _, s := range shapes {
		if !tried[s.Profile] && s.Fits(n) {
			return s, true
		}
	}
	return shared.Shape{}, false
}

// busyWith reports whether a round of Provision calls to target is under
// way.
func (a *asker) busyWith(target string) bool {
	p := a.p
	p.mu.Lock()
	defer p.mu.Unlock()
	return a.busy[target]
}

// relogDetail is how often a need is logged again when only a
// provisioner's free-text detail changed, not its outcome or profile. A
// detail is the plugin's to word, and one that carries an age or a count
// changes every pass; the outcome is what an operator follows.
const relogDetail = time.Minute

// loggedOutcome is what was last logged of a need at a target: its kind
// (the outcome and profile, desc up to the detail), desc, and when.
type loggedOutcome struct {
	kind, desc string
	at         time.Time
}

// noteOutcome records what a target said about a need and logs it when
// it says something new: another outcome or profile at once, an error at
// once, a new detail of the same outcome at most every relogDetail.
func (a *asker) noteOutcome(ns *needState, target string, reason WaitReason, words outcomeWords) {
	a.noteOutcomes([]*needState{ns}, target, reason, words, false)
}

// noteOutcomes is noteOutcome for needs told the same outcome, under
// one hold of p.mu; with failedOver, a need that was failed over to
// another profile says so before desc. The needs it logs are one line:
// the first need's, with how many and the last when there are more (a
// queue of 100,000 alike tasks was 100,000 lines on its first pass).
func (a *asker) noteOutcomes(needs []*needState, target string, reason WaitReason, words outcomeWords, failedOver bool) {
	p := a.p
	now := time.Now()
	var firstID, lastID string
	logged := 0
	p.mu.Lock()
	for _, ns := range needs {
		at := ns.atTarget(target)
		d, k := words.desc, words.kind
		if failedOver && at.failover != (failover{}) {
			k = "failed over (" + at.failover.String() + ")"
			d = k + ": " + words.desc
		}
		at.asked, at.hasAsked = asked{reason: reason, desc: d}, true
		last := at.logged
		changed := d != last.desc &&
			(k != last.kind || reason == ReasonError || now.Sub(last.at) >= relogDetail)
		if changed {
			at.logged = loggedOutcome{kind: k, desc: d, at: now}
			if logged == 0 {
				firstID = ns.id
			}
			lastID = ns.id
			logged++
		}
	}
	p.mu.Unlock()
	if logged == 0 {
		return
	}
	args := []any{"need", firstID}
	if logged > 1 {
		args = append(args, "needs", logged, "last_need", lastID)
	}
	args = append(append(args, "provisioner", target), words.kv...)
	if reason == ReasonError {
		p.logger.Error("could not ask for a machine", args...)
		return
	}
	p.logger.Debug("asked for a machine", args...)
}

// failover is a route around a backing-off profile: its need is asked
// for as a machine of to instead of from.
type failover struct{ from, to string }

func (f failover) String() string { return f.from + " -> " + f.to }
