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

// readFacts reads the start-up facts with scontrol show config and keeps
// them, or returns why it could not. Configure's adoption reads them
// before any submission may begin; each poll cycle reads them again
// until they are read.
func (p *Provisioner) readFacts(ctx context.Context) error {
	c, err := p.q.Facts(ctx)
	if err != nil {
		p.mu.Lock()
		p.factsErr = truncate(err.Error())
		p.mu.Unlock()
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cluster != c.Cluster {
		// The limits read so far were every cluster's; this one's are
		// read again.
		p.lim.limits.readAt = time.Time{}
	}
	p.cluster = c.Cluster
	p.maxJobs = c.MaxJobCount
	p.facts, p.factsErr = factsRead, ""
	if p.arrayNote == "" {
		p.maxArray = arrayCap(c.MaxArraySize)
		if p.maxArray <= 1 {
			p.arrayNote = "the cluster's MaxArraySize allows no job arrays; submitting one job per machine"
		}
	}
	return nil
}

// factsNoteLocked is Status's note while the facts are unread, "" once
// they are. p.mu must be held.
func (p *Provisioner) factsNoteLocked() string {
	if p.facts == factsRead {
		return ""
	}
	why := "not read yet"
	if p.factsErr != "" {
		why = strings.TrimSpace(p.factsErr)
	}
	return fmt.Sprintf("the cluster's MaxArraySize, MaxJobCount and name are not yet known (scontrol show config: %s): one submission asks for at most %d machines until they are read; trying again each poll",
		why, unknownFactsBurst)
}
