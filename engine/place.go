package engine

import (
	"slices"

	"github.com/fluksio/provision/shared"
)

// The placing seam: an engine with a task model of its own (priorities,
// deadlines, data locality, fair shares) decides which waiting task runs
// on which idle worker (Config.Place), and the kit does the rest: it
// asks the provisioners for machines for what stays waiting, hands each
// placed task to its worker, and tells the result. The router's own rule
// (matchOwn: the most demanding need first, each on the smallest idle
// worker that fits) is what runs without one.

// WaitingTask is a need or task that waits for a worker, as Config.Place
// sees it.
type WaitingTask struct {
	// ID is the task's id (Submit) or the need's (Add).
	ID   string
	Need shared.Need
	// Requires are the features a worker must have to run it
	// (WorkerInfo.Features); none for the stand-in's need.
	Requires []string
	// Attempts counts its runs so far whose machine was lost under it.
	Attempts int
}

// Placement puts the waiting task (or need) named Task on the idle
// worker named Worker.
type Placement struct {
	Task   string
	Worker string
}

// matchPlaced asks the embedder's place which waiting need goes on which
// idle worker, and reserves those that hold: a placement whose task
// does not wait, whose worker is not idle, is taken already this pass,
// or does not fit the need or have its features, is left out and
// logged. place is called without p.mu.
func (p *router) matchPlaced(idle []WorkerInfo) ([]plan, []*needState) {
	p.mu.Lock()
	var asked []WaitingTask
	for _, ns := range p.needs {
		if ns.waitsLocked() {
			asked = append(asked, ns.waitingLocked())
		}
	}
	p.mu.Unlock()
	if len(asked) == 0 || len(idle) == 0 {
		return nil, p.waitingNeeds()
	}
	offered := slices.Clone(idle)
	for i := range offered {
		offered[i].Labels, offered[i].Features = slices.Clone(offered[i].Labels), slices.Clone(offered[i].Features)
	}
	placements := p.place(asked, offered)

	byName := make(map[string]WorkerInfo, len(idle))
	for _, w := range idle {
		byName[w.Name] = w
	}
	var plans []plan
	var refused []any
	p.mu.Lock()
	byID := make(map[string]*needState, len(asked))
	for _, ns := range p.needs {
		byID[ns.id] = ns
	}
	for _, pl := range placements {
		ns, w := byID[pl.Task], byName[pl.Worker]
		switch {
		case ns == nil || !ns.waitsLocked():
			refused = append(refused, pl.Task+" does not wait")
		case w.Name == "":
			refused = append(refused, pl.Worker+" is not idle, or placed twice")
		case !ns.fits(w):
			refused = append(refused, pl.Task+" does not fit "+pl.Worker)
		default:
			delete(byName, pl.Worker)
			plans = append(plans, p.reserveLocked(ns, w))
		}
	}
	p.mu.Unlock()
	if len(refused) > 0 {
		p.logger.Warn("placements left out", "placements", refused)
	}
	return plans, p.waitingNeeds()
}

// waitingLocked is ns as Config.Place sees it. p.mu must be held.
func (ns *needState) waitingLocked() WaitingTask {
	wt := WaitingTask{ID: ns.id, Need: ns.need}
	if ns.rec != nil {
		wt.Requires = slices.Clone(ns.rec.requires)
		wt.Attempts = int(ns.lost)
	}
	return wt
}

// waitingNeeds are the needs that wait, in the order they were added.
func (p *router) waitingNeeds() []*needState {
	p.mu.Lock()
	defer p.mu.Unlock()
	var waiting []*needState
	for _, ns := range p.needs {
		if ns.waitsLocked() {
			waiting = append(waiting, ns)
		}
	}
	return waiting
}
