package slurm

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/fluksio/provision/slurm/internal/queue"
)

// nodeShapes are the nodes' sizes by partition, as sinfo shows them to
// the login user: what the preflight measures a profile against, so that
// a profile larger than any node is refused at the figure that is too
// large, with the largest there is, and not with Slurm's "Requested node
// configuration is not available" at the profile's first line.
//
// Only what sinfo shows is known: a hidden partition, or a site whose
// PrivateData hides nodes, leaves a profile unmeasured, never refused.
type nodeShapes struct {
	// parts are the partitions in sinfo's order, each once.
	parts []partShape
	// def is the default partition's name ("" when sinfo marks none).
	def string
}

// partShape is the largest node of one partition, figure by figure.
type partShape struct {
	name            string
	cpus, gpus      int
	memMB           int64
	unmeasuredShape bool
}

// parseNodeShapes reads sinfo's lines (queue.ParseNodes) into the
// largest node of each partition, figure by figure.
func parseNodeShapes(out string) nodeShapes {
	return shapesOf(queue.ParseNodes(out))
}

// shapesOf is the largest node of each partition of groups, figure by
// figure, in sinfo's order.
func shapesOf(groups []queue.NodeGroup) nodeShapes {
	var s nodeShapes
	for _, g := range groups {
		if g.Default {
			s.def = g.Partition
		}
		i := slices.IndexFunc(s.parts, func(p partShape) bool { return p.name == g.Partition })
		if i < 0 {
			s.parts = append(s.parts, partShape{name: g.Partition})
			i = len(s.parts) - 1
		}
		p := &s.parts[i]
		if g.Unmeasured {
			p.unmeasuredShape = true
			continue
		}
		p.cpus = max(p.cpus, g.CPUs)
		p.memMB = max(p.memMB, g.MemMB)
		p.gpus = max(p.gpus, nodeGPUs(g.Gres))
	}
	return s
}

// nodeGPUs counts the GPUs of one sinfo %G field's items: "gpu:2",
// "gpu:a100:4", "gpu:a100:2" and "gpu:v100:2", "(null)".
func nodeGPUs(gres []string) int {
	n := 0
	for _, item := range gres {
		if c, ok := gresGPUs(item); ok {
			n += int(c)
		}
	}
	return n
}

// partition is the shape of the partition named, or of the default one
// for "".
func (s nodeShapes) partition(name string) (partShape, bool) {
	if name == "" {
		name = s.def
	}
	i := slices.IndexFunc(s.parts, func(p partShape) bool { return p.name == name })
	if i < 0 {
		return partShape{}, false
	}
	return s.parts[i], true
}

// names lists the partitions, the default one marked.
func (s nodeShapes) names() string {
	var out []string
	for _, p := range s.parts {
		if p.name == s.def {
			out = append(out, p.name+" (the default)")
		} else {
			out = append(out, p.name)
		}
	}
	return strings.Join(out, ", ")
}

// String is the fact the preflight shows.
func (p partShape) String() string {
	return fmt.Sprintf("largest node %d cpus, %d MB, %d gpus", p.cpus, p.memMB, p.gpus)
}

// profilePartitions are the partitions a profile's sbatch lines ask for
// (--partition takes a comma list; Slurm runs the job in the first that
// can), or nil for the default one.
func profilePartitions(prof Profile) []string { return prof.options().partitions }

// readShapes reads the nodes' shapes once per check; ok is false when
// sinfo did not answer or showed nothing, and the profiles then go
// unmeasured.
func (c *check) readShapes(ctx context.Context) (nodeShapes, bool) {
	groups, err := c.q.q.Nodes(ctx)
	if err != nil {
		return nodeShapes{}, false
	}
	s := shapesOf(groups)
	if len(s.parts) == 0 {
		return s, false
	}
	for _, p := range s.parts {
		name := "partition " + p.name
		if p.name == s.def {
			name += " (default)"
		}
		if p.unmeasuredShape {
			c.fact(name, "nodes of sizes sinfo did not give")
			continue
		}
		c.fact(name, p.String())
	}
	return s, true
}

// tooLarge refuses, at the attribute that is too large, a profile that
// asks a machine for more than the largest node of every partition it
// may run in has. It reports whether it refused.
func (c *check) tooLarge(shapes nodeShapes, prof Profile, path []string) bool {
	parts := profilePartitions(prof)
	if parts == nil {
		parts = []string{""}
	}
	// The largest figure of the partitions the profile may run in: a
	// node of any of them will do.
	var big partShape
	var names []string
	for _, name := range parts {
		p, ok := shapes.partition(name)
		if !ok || p.unmeasuredShape {
			// Hidden, or not a partition at all: sbatch --test-only
			// says which.
			return false
		}
		big.cpus, big.memMB, big.gpus = max(big.cpus, p.cpus), max(big.memMB, p.memMB), max(big.gpus, p.gpus)
		names = append(names, p.name)
	}
	where := "partition " + strings.Join(names, " or ")
	refused := false
	if prof.CPUs > big.cpus {
		c.fail(append(slices.Clone(path), "cpus"), "Profile larger than any node",
			"Profile %s asks for %d cpus a machine, but the largest node of %s has %d. Set cpus = %d or less, or a partition with larger nodes.",
			prof.Name, prof.CPUs, where, big.cpus, big.cpus)
		refused = true
	}
	if prof.RAMMB > big.memMB {
		c.fail(append(slices.Clone(path), "ram_mb"), "Profile larger than any node",
			"Profile %s asks for %d MB a machine, but the largest node of %s has %d MB (RealMemory). Set ram_mb = %d or less, or a partition with larger nodes.",
			prof.Name, prof.RAMMB, where, big.memMB, big.memMB)
		refused = true
	}
	if prof.GPUs > big.gpus {
		fix := fmt.Sprintf("Set gpus = %d or less, or a partition with more GPUs a node.", big.gpus)
		if big.gpus == 0 {
			fix = "Set a partition with GPU nodes in sbatch, or gpus = 0."
		}
		c.fail(append(slices.Clone(path), "gpus"), "Profile larger than any node",
			"Profile %s asks for %d gpus a machine, but the largest node of %s has %d. %s",
			prof.Name, prof.GPUs, where, big.gpus, fix)
		refused = true
	}
	return refused
}

// partitionHint is the partitions there are, for a refusal that names
// the partition.
func partitionHint(shapes nodeShapes, said string) string {
	if len(shapes.parts) == 0 || !strings.Contains(strings.ToLower(said), "partition") {
		return ""
	}
	return " The partitions the login user sees: " + shapes.names() + "."
}
