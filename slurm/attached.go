package slurm

import (
	"maps"

	"github.com/fluksio/provision/shared"
)

// attachedWorkers is what the engine last said of the attached workers
// (Provision, Reconcile). Its fields are guarded by p.mu.
type attachedWorkers struct {
	// p is the provisioner whose books this reads and changes, under p.mu.
	p *Provisioner

	// attached counts each profile's attached workers, as the engine
	// last said (Provision, Reconcile).
	attached map[string]int
	// reconciled is the set of attached workers Reconcile last heard of,
	// and reconciledBy its count by profile: a Reconcile by change
	// (contract 2.4) applies its joined and left to them, one carrying the
	// whole list replaces them. Both are nil until the first Reconcile.
	reconciled   map[string]struct{}
	reconciledBy map[string]int
}

// reconcileAttachedLocked takes in what a Reconcile says is attached,
// the whole list or the change since the last call (contract 2.4), and
// forgets the requests whose worker arrived. Arrivals in a change are
// among those that joined: a request's worker cannot have attached
// before the last call without being in it.
func (aw *attachedWorkers) reconcileAttachedLocked(cfg *settings, req *shared.ReconcileRequest) []string {
	p := aw.p
	if !req.Delta || aw.reconciled == nil {
		// A change with nothing to apply it to cannot come from an engine
		// that keeps the contract; taken as the whole list, it is the
		// best this process knows.
		names := req.Attached
		if req.Delta {
			names = req.Joined
		}
		aw.reconciled = make(map[string]struct{}, len(names))
		for _, w := range names {
			aw.reconciled[w] = struct{}{}
		}
		aw.reconciledBy = cfg.attachedByProfile(names)
		aw.attached = maps.Clone(aw.reconciledBy)
		for w := range p.ends.attachedJobs {
			if _, ok := aw.reconciled[w]; !ok {
				p.ends.departLocked(w)
			}
		}
		return p.arrivedLocked(names)
	}
	for _, w := range req.Left {
		p.ends.departLocked(w)
		if _, ok := aw.reconciled[w]; !ok {
			continue
		}
		delete(aw.reconciled, w)
		if profile, why := cfg.profileOf(w); why == "" {
			aw.reconciledBy[profile]--
		}
	}
	for _, w := range req.Joined {
		if _, ok := aw.reconciled[w]; ok {
			continue
		}
		aw.reconciled[w] = struct{}{}
		if profile, why := cfg.profileOf(w); why == "" {
			aw.reconciledBy[profile]++
		}
	}
	aw.attached = maps.Clone(aw.reconciledBy)
	return p.arrivedLocked(req.Joined)
}
