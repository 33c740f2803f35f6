package slurm

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// The controller's own ceiling, MaxJobCount: sbatch does not refuse an
// array that would pass it, but sleeps and retries. So a submission the
// books bring within half of it first counts the controller's jobs and
// asks for no more than fits; the rest waits jobsFullWait, answered
// "capped". Where the count misses, submit_timeout bounds sbatch, and its
// words hold submissions for jobsFullWait (docs/design/slurm-job-count.md).

const (
	// jobsFullWait is how long submissions are held after sbatch said the
	// controller would not take a job: long enough not to wait out
	// submit_timeout again at once, short enough that MinJobAge's purge
	// is soon noticed.
	jobsFullWait = 30 * time.Second
)

// jobsFullWords are sbatch's words when slurmctld will not take a job
// for now (EAGAIN: MaxJobCount reached, or the controller busy), lower
// case.
var jobsFullWords = []string{
	"temporarily unable to accept job",
	"job queue full",
}

// jobsFull reports whether sbatch said the controller would not take a
// job for now.
func jobsFull(said string) bool {
	s := strings.ToLower(said)
	for _, w := range jobsFullWords {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}

// trimToJobCount fits a submission under the cluster's MaxJobCount: when
// the books bring it within half of the ceiling, it counts the
// controller's jobs and takes the allocations that do not fit out of the
// books, unsubmitted and unannounced, so that the demand asks for them
// again as jobs leave.
func (p *Provisioner) trimToJobCount(ctx context.Context, cfg *settings, live []*request) []*request {
	p.mu.Lock()
	ceiling := p.maxJobs
	ours := p.oursLocked(cfg, false)
	p.mu.Unlock()
	allocs := groupAllocations(live)
	if ceiling <= 0 || 2*ours < ceiling {
		return live
	}
	n, err := p.q.CountAll(ctx)
	if err != nil {
		// Without a count, sbatch says, within submit_timeout.
		cfg.log.Debug("could not count the controller's jobs before a submission", "error", err)
		return live
	}
	// slurmctld refuses when its jobs and the new ones would reach the
	// ceiling.
	fit := max(0, ceiling-1-n)
	if fit >= len(allocs) {
		return live
	}
	p.mu.Lock()
	kept := p.keepAllocationsLocked(allocs, fit)
	detail := fmt.Sprintf("%s: the cluster's MaxJobCount = %d; slurmctld holds %d jobs and array tasks (every user's, finished ones until MinJobAge), so %d of %d machines were asked for; the rest are asked for as jobs leave",
		limitReached, ceiling, n, len(kept), len(live))
	p.holds.binding = hold{kind: holdClusterFull, reason: detail}
	// The rest would be asked for at once, counted again and trimmed
	// again: held for jobsFullWait instead, as after sbatch's own words.
	p.holds.clusterFull = hold{kind: holdClusterFull, until: p.now().Add(jobsFullWait), reason: detail}
	p.mu.Unlock()
	cfg.log.Info("trimmed a burst to the room the cluster's MaxJobCount leaves; the rest is asked for as jobs leave",
		"profile", live[0].profile, "machines", len(live), "submitting", len(kept), "jobs", n, "max_job_count", ceiling)
	return kept
}

// jobsFullDetail is the words for a submission sbatch could not place
// because the controller would not take a job, and until when
// submissions are held.
func jobsFullDetail(ceiling int, said string, until time.Time) string {
	return fmt.Sprintf("%s: slurmctld would not take a job (its MaxJobCount = %d, counting finished jobs until MinJobAge; or the controller is busy): sbatch said %q; not asking again until %s",
		limitReached, ceiling, truncateTo(strings.TrimSpace(said), 200), until.UTC().Format(time.RFC3339))
}
