package slurm

import (
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

// jobsFullDetail is the words for a submission sbatch could not place
// because the controller would not take a job, and until when
// submissions are held.
func jobsFullDetail(ceiling int, said string, until time.Time) string {
	return fmt.Sprintf("%s: slurmctld would not take a job (its MaxJobCount = %d, counting finished jobs until MinJobAge; or the controller is busy): sbatch said %q; not asking again until %s",
		limitReached, ceiling, truncateTo(strings.TrimSpace(said), 200), until.UTC().Format(time.RFC3339))
}
