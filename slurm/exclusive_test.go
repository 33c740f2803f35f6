package slurm

import (
	"testing"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/internal/queue"
)

// TestExclusiveShapeIsTheSmallestNode: an exclusive profile's shape is
// the smallest node of its partition, figure by figure, as sinfo shows
// it, so that the engine packs by what its job is given; a profile that
// is not exclusive keeps its own figures, and so does an exclusive one
// whose partition sinfo does not show.
func TestExclusiveShapeIsTheSmallestNode(t *testing.T) {
	groups := queue.ParseNodes("debug*|16|4000|gpu:1\ndebug*|32|8000|gpu:2\nbig|64|512000|gpu:a100:4(S:0-1)\nodd|N/A|N/A|(null)\n")
	for _, tc := range []struct {
		parts      []string
		cpus, gpus int
		mem        int64
		ok         bool
	}{
		{nil, 16, 1, 4000, true},
		{[]string{"debug"}, 16, 1, 4000, true},
		{[]string{"big"}, 64, 4, 512000, true},
		{[]string{"big", "debug"}, 16, 1, 4000, true},
		{[]string{"hidden"}, 0, 0, 0, false},
		{[]string{"odd"}, 0, 0, 0, false},
	} {
		n, ok := smallestNode(groups, tc.parts)
		if ok != tc.ok || (ok && (n.cpus != tc.cpus || n.gpus != tc.gpus || n.memMB != tc.mem)) {
			t.Errorf("%v: %+v %v; want %d cpus, %d gpus, %d MB, %v", tc.parts, n, ok, tc.cpus, tc.gpus, tc.mem, tc.ok)
		}
	}

	node, _ := smallestNode(groups, nil)
	known := &learnt{nodes: map[string]partShape{"whole": node, "plain": node}}
	whole := Profile{Name: "whole", CPUs: 1, Exclusive: true}
	plain := Profile{Name: "plain", CPUs: 1}
	if sh := whole.shape(known); sh.CPUs != 16 || sh.GPUs != 1 || sh.RAMMB != 4000 {
		t.Errorf("exclusive profile's shape %+v; want the node's 16 cpus, 1 gpu, 4000 MB", sh)
	}
	if sh := plain.shape(known); sh.CPUs != 1 || sh.GPUs != 0 || sh.RAMMB != 0 {
		t.Errorf("profile's shape %+v; want its own 1 cpu", sh)
	}
	if sh := whole.shape(nil); sh.CPUs != 1 {
		t.Errorf("exclusive profile's shape with sinfo unread %+v; want its own 1 cpu", sh)
	}
	// Matching goes by the shape too: 8 CPUs fit a whole node of 16.
	s := &settings{Config: Config{Profiles: []Profile{whole}}}
	if _, ok := s.match(shared.Need{CPUs: 8}, known); !ok {
		t.Error("8 cpus do not fit the exclusive profile of a 16-cpu node")
	}
}
