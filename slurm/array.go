package slurm

import (
	"context"
	"regexp"
	"strconv"

	"github.com/fluksio/provision/slurm/sbatch"
)

// A burst of machines of one profile is one sbatch --array=0-(N-1): one
// submission, one RPC to slurmctld, however many machines. Each array task
// is one machine, with a worker name of its own (<base>-<task>) and a
// credential of its own, which the script picks by SLURM_ARRAY_TASK_ID.
//
// Why arrays and not one sbatch per machine: docs/design/slurm-arrays.md.
//
// A cluster that refuses arrays (MaxArraySize=0, or sbatch rejects
// --array) gets one sbatch per machine instead, and Status says so.

// maxArraySizeRE finds MaxArraySize in scontrol show config.
var maxArraySizeRE = regexp.MustCompile(`(?m)^MaxArraySize\s*=\s*([0-9]+)\s*$`)

// readArraySize reads the cluster's MaxArraySize with scontrol show
// config. Array indexes run from 0 to MaxArraySize-1, so that is the most
// machines one sbatch may ask for; 0 or 1 means no arrays. A cluster whose
// setting cannot be read is taken to allow Slurm's default, 1001: the
// first sbatch says if it does not. Configure's adoption reads it once,
// before any submission may begin.
func (p *Provisioner) readArraySize(ctx context.Context) int {
	stdout, _, err := p.call(ctx, nil, "scontrol", "show", "config")
	if err != nil {
		return defaultMaxArraySize
	}
	p.mu.Lock()
	if m := clusterNameRE.FindSubmatch(stdout); m != nil {
		p.cluster = string(m[1])
	}
	p.maxJobs = parseMaxJobCount(stdout)
	p.mu.Unlock()
	if m := maxArraySizeRE.FindSubmatch(stdout); m != nil {
		if n, err := strconv.Atoi(string(m[1])); err == nil {
			return max(1, min(n, sbatch.MaxTaskIndex))
		}
	}
	return defaultMaxArraySize
}

// defaultMaxArraySize is Slurm's own default.
const defaultMaxArraySize = 1001
