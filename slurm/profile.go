package slurm

import (
	"cmp"
	"slices"
	"time"

	"github.com/fluksio/provision/shared"
)

// sortProfiles puts profiles in match order, smallest first: GPUs are the
// scarcest resource on a cluster, then CPUs, then memory. A profile
// that asks for whole nodes (exclusive) comes after every other: its
// figures are what it asks for, not the node it is given, and a need a
// profile of its own size holds should not take a node. The sort is
// stable, so profiles of equal size keep the order they were written in.
func sortProfiles(ps []Profile) {
	slices.SortStableFunc(ps, func(a, b Profile) int {
		return cmp.Or(cmpBool(a.Exclusive, b.Exclusive), cmp.Compare(a.GPUs, b.GPUs), cmp.Compare(a.CPUs, b.CPUs), cmp.Compare(a.RAMMB, b.RAMMB))
	})
}

// cmpBool orders false before true.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// lifetime is how long a profile's machines last, with its words
// (shared.Shape's Lifetime and LifetimeFrom).
type lifetime struct {
	d    time.Duration
	from string
}

// lifetimes are the profiles' lifetimes by name, as Shapes last worked
// them out (partitiontimes.go); a profile not in it lasts its --time,
// or an unknown time.
type lifetimes map[string]lifetime

// learnt is what Shapes last read of the cluster for the profiles: their
// lifetimes, and the node an exclusive profile's job is given
// (exclusive.go), by profile name. A nil *learnt knows nothing.
type learnt struct {
	lifetimes lifetimes
	nodes     map[string]partShape
}

// shape is what a worker started from the profile would offer, lasting
// what lt says (its --time where lt does not say); an exclusive
// profile's is its node's, where lt knows it.
func (p Profile) shape(lt *learnt) shared.Shape {
	sh := shared.Shape{Profile: p.Name, CPUs: p.CPUs, GPUs: p.GPUs, RAMMB: p.RAMMB, Labels: slices.Clone(p.Labels)}
	var l lifetime
	ok := false
	if lt != nil {
		l, ok = lt.lifetimes[p.Name]
		if n, known := lt.nodes[p.Name]; known && p.Exclusive {
			sh.CPUs, sh.GPUs, sh.RAMMB = max(sh.CPUs, n.cpus), max(sh.GPUs, n.gpus), max(sh.RAMMB, n.memMB)
		}
	}
	if !ok {
		if d, from, known := profileLifetime(p, nil); known {
			l = lifetime{d, from}
		}
	}
	sh.Lifetime, sh.LifetimeFrom = l.d, l.from
	return sh
}

// match returns the smallest profile that fits the need, its lifetime
// from lt included. The profiles are already in match order, so the
// first that fits is the smallest.
func (s *settings) match(n shared.Need, lt *learnt) (Profile, bool) {
	for _, p := range s.Profiles {
		if p.shape(lt).Fits(n) {
			return p, true
		}
	}
	return Profile{}, false
}

// shapes lists the shapes that carry a label, all of them for an empty
// label, in match order, lasting what lt says.
func (s *settings) shapes(label string, lt *learnt) []shared.Shape {
	var out []shared.Shape
	for _, p := range s.Profiles {
		if sh := p.shape(lt); label == "" || sh.HasLabel(label) {
			out = append(out, sh)
		}
	}
	return out
}

// profile is the configured profile of that name.
func (s *settings) profile(name string) (Profile, bool) {
	for _, p := range s.Profiles {
		if p.Name == name {
			return p, true
		}
	}
	return Profile{}, false
}
