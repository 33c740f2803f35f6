package slurm

import (
	"cmp"
	"slices"

	"github.com/fluksio/provision/shared"
)

// sortProfiles puts profiles in match order, smallest first: GPUs are the
// scarcest resource on a cluster, then CPUs, then memory. The sort is
// stable, so profiles of equal size keep the order they were written in.
func sortProfiles(ps []Profile) {
	slices.SortStableFunc(ps, func(a, b Profile) int {
		return cmp.Or(cmp.Compare(a.GPUs, b.GPUs), cmp.Compare(a.CPUs, b.CPUs), cmp.Compare(a.RAMMB, b.RAMMB))
	})
}

// shape is what a worker started from the profile would offer.
func (p Profile) shape() shared.Shape {
	return shared.Shape{Profile: p.Name, CPUs: p.CPUs, GPUs: p.GPUs, RAMMB: p.RAMMB, Labels: slices.Clone(p.Labels)}
}

// match returns the smallest profile that fits the need. The profiles are
// already in match order, so the first that fits is the smallest.
func (s *settings) match(n shared.Need) (Profile, bool) {
	for _, p := range s.Profiles {
		if p.shape().Fits(n) {
			return p, true
		}
	}
	return Profile{}, false
}

// shapes lists the shapes that carry a label, all of them for an empty
// label, in match order.
func (s *settings) shapes(label string) []shared.Shape {
	var out []shared.Shape
	for _, p := range s.Profiles {
		if sh := p.shape(); label == "" || sh.HasLabel(label) {
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
