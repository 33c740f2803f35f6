package slurm

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/fluksio/provision/slurm/sbatch"
)

// The cluster's start-up facts: MaxArraySize (how many machines one
// sbatch may ask for), MaxJobCount (the controller's ceiling, jobcount.go)
// and ClusterName (which of the user's associations are this cluster's,
// limits.go), all from one scontrol show config.
//
// They are read, never guessed. A read that fails (the controller
// rationing RPCs, an outage, a slow login node) used to be taken for
// Slurm's defaults, so a cluster of MaxArraySize 10001 was asked for
// 1001 at a time for the whole run, and one that had lowered it got
// arrays it refuses, which turned arrays off. Now the facts stay unknown
// until a read succeeds: each poll cycle tries again, bursts are at most
// unknownFactsBurst machines meanwhile, and Status says why.

// factsState is whether the start-up facts have been read.
type factsState int

const (
	// factsUnread: no scontrol show config has answered yet.
	factsUnread factsState = iota
	// factsRead: maxArray, maxJobs and cluster hold the cluster's own.
	factsRead
)

// unknownFactsBurst is the most machines one submission asks for while
// the facts are unread: a tenth of Slurm's default MaxArraySize (1001)
// and a hundredth of its default MaxJobCount (10000), so that a guess
// costs little on a site that lowered them, and the rest of a burst is
// asked for once the facts are read, as demand is level-triggered.
const unknownFactsBurst = 100

// arrayCap is the most machines one sbatch asks for on a cluster of
// MaxArraySize n: array indexes run from 0 to n-1, and 0 or 1 means no
// arrays (1). An unset MaxArraySize is Slurm's default.
func arrayCap(n int) int {
	if n < 0 {
		return defaultMaxArraySize
	}
	return max(1, min(n, sbatch.MaxTaskIndex))
}

// clusterFacts is what the provisioner knows of the cluster from its
// configuration (readFacts): how many machines one sbatch may ask for,
// the job count's ceiling and the cluster's name. Its fields are guarded
// by p.mu.
type clusterFacts struct {
	// p is the provisioner whose books this reads and changes, under p.mu.
	p *Provisioner

	// maxArray is the most machines one sbatch asks for: the cluster's
	// MaxArraySize, once facts is factsRead (facts.go); 1 where arrays
	// are refused, which arrayNote then explains for Status.
	maxArray  int
	arrayNote string
	// facts is whether maxArray, maxJobs and cluster have been read, and
	// factsErr why the last read failed while they have not.
	facts    factsState
	factsErr string
	// cluster is the cluster's name (ClusterName), read with the facts;
	// the user's associations of other clusters are not its limits.
	cluster string
	// maxJobs is the cluster's MaxJobCount, read with the facts; 0
	// until read (jobcount.go).
	maxJobs int
}

// readFacts reads the start-up facts with scontrol show config and keeps
// them, or returns why it could not. Configure's adoption reads them
// before any submission may begin; each poll cycle reads them again
// until they are read.
func (cf *clusterFacts) readFacts(ctx context.Context) error {
	p := cf.p
	c, err := p.q.Facts(ctx)
	if err != nil {
		p.mu.Lock()
		cf.factsErr = truncate(err.Error())
		p.mu.Unlock()
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if cf.cluster != c.Cluster {
		// The limits read so far were every cluster's; this one's are
		// read again.
		p.lim.limits.readAt = time.Time{}
	}
	cf.cluster = c.Cluster
	cf.maxJobs = c.MaxJobCount
	cf.facts, cf.factsErr = factsRead, ""
	if cf.arrayNote == "" {
		cf.maxArray = arrayCap(c.MaxArraySize)
		if cf.maxArray <= 1 {
			cf.arrayNote = "the cluster's MaxArraySize allows no job arrays; submitting one job per machine"
		}
	}
	return nil
}

// factsNoteLocked is Status's note while the facts are unread, "" once
// they are. p.mu must be held.
func (cf *clusterFacts) factsNoteLocked() string {
	if cf.facts == factsRead {
		return ""
	}
	why := "not read yet"
	if cf.factsErr != "" {
		why = strings.TrimSpace(cf.factsErr)
	}
	return fmt.Sprintf("the cluster's MaxArraySize, MaxJobCount and name are not yet known (scontrol show config: %s): one submission asks for at most %d machines until they are read; trying again each poll",
		why, unknownFactsBurst)
}
