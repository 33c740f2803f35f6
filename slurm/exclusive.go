package slurm

import (
	"context"
	"slices"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/internal/queue"
	"github.com/fluksio/provision/slurm/sbatch"
)

// A profile with exclusive = true asks for whole nodes: its job gets all
// of a node's CPUs and GPUs (--exclusive) and memory (--mem=0), and its
// worker offers what Slurm gave it (--size-from-job). The engine packs
// tasks by a profile's shape, so an exclusive profile's shape is the
// node it will be given: the smallest of its partitions' nodes, figure
// by figure, as sinfo shows them when Shapes is asked (one sinfo, only
// when an exclusive profile exists), so that N one-CPU tasks ask for
// ceil(N / the node's CPUs) machines. Its credentials are minted for
// that shape, and the worker offers no more than its credential allows:
// a job that lands on a larger node of a mixed partition is used as
// large as the smallest. Where sinfo cannot be read, or does not show
// the partition, the shape is the profile's own cpus, gpus and ram_mb.

// smallestNode is the smallest node of the partitions named (the default
// one for nil), figure by figure; ok is false when any of them is not
// shown or not measured.
func smallestNode(groups []queue.NodeGroup, partitions []string) (partShape, bool) {
	if partitions == nil {
		partitions = []string{""}
	}
	var small partShape
	seen := false
	for _, name := range partitions {
		found := false
		for _, g := range groups {
			if (name == "" && !g.Default) || (name != "" && g.Partition != name) {
				continue
			}
			if g.Unmeasured {
				return partShape{}, false
			}
			n := partShape{name: g.Partition, cpus: g.CPUs, gpus: nodeGPUs(g.Gres), memMB: g.MemMB}
			if !seen {
				small, seen = n, true
			}
			small.cpus, small.gpus, small.memMB = min(small.cpus, n.cpus), min(small.gpus, n.gpus), min(small.memMB, n.memMB)
			found = true
		}
		if !found {
			return partShape{}, false
		}
	}
	return small, seen && small.cpus > 0
}

// hasExclusive reports whether a profile of s asks for whole nodes.
func (s *settings) hasExclusive() bool {
	return slices.ContainsFunc(s.Profiles, func(p Profile) bool { return p.Exclusive })
}

// readWholeNodes is the node each exclusive profile of cfg is given, by
// profile name, read with one sinfo; nil when none is exclusive or sinfo
// cannot be read now (the shapes are then the profiles' own figures).
func (p *Provisioner) readWholeNodes(ctx context.Context, cfg *settings) map[string]partShape {
	if !cfg.hasExclusive() {
		return nil
	}
	p.mu.Lock()
	q := p.q
	need, _ := p.loginNeeded(cfg)
	p.mu.Unlock()
	if q == nil || need {
		return nil
	}
	groups, err := q.Nodes(ctx)
	if err != nil {
		cfg.log.Warn("cannot read the nodes' sizes with sinfo; an exclusive profile's shape is its own cpus, gpus and ram_mb until the shapes are listed again",
			"error", err)
		return nil
	}
	out := map[string]partShape{}
	for _, prof := range cfg.Profiles {
		if !prof.Exclusive {
			continue
		}
		if n, ok := smallestNode(groups, profilePartitions(prof)); ok {
			out[prof.Name] = n
		} else {
			cfg.log.Warn("sinfo does not show the nodes of an exclusive profile's partition; its shape is its own cpus, gpus and ram_mb",
				"profile", prof.Name)
		}
	}
	return out
}

// mintShape is the shape prof's credentials are minted for: the shape
// the engine was last told, an exclusive profile's node included.
func (p *Provisioner) mintShape(prof Profile) shared.Shape {
	p.mu.Lock()
	lt := p.learnt
	p.mu.Unlock()
	return prof.shape(lt)
}

// validateExclusive checks exclusive = true against the rest of the
// profile, at its attribute: one node, and no sbatch line that shares it.
func validateExclusive(at func(...string) []string, p Profile) shared.Diagnostics {
	if !p.Exclusive {
		return nil
	}
	var diags shared.Diagnostics
	if p.Nodes > 1 {
		// srun gives each node's worker the same --cpus-per-task, while
		// whole nodes may differ: a job of several is not yet sized node
		// by node.
		diags = append(diags, shared.Errorf(at("exclusive"), "exclusive with nodes above 1",
			"Profile %s asks for whole nodes (exclusive = true) and %d of them in one job (nodes = %d); an exclusive profile is one node a job. Set nodes = 1 (the engine asks for as many machines as the work needs), or remove exclusive.", p.Name, p.Nodes, p.Nodes))
	}
	for j, line := range p.Sbatch {
		for _, o := range sbatch.Opts([]string{line}) {
			if o.Is("--oversubscribe", 's') {
				diags = append(diags, shared.Errorf(at("exclusive"), "exclusive with --oversubscribe",
					"Profile %s asks for whole nodes (exclusive = true), but its sbatch line %d (%q) lets the job share its node (%s). Remove one of them.", p.Name, j+1, line, o.Name()))
			}
		}
	}
	return diags
}
