package slurm

import (
	"strings"

	"github.com/fluksio/provision/slurm/internal/queue"
)

// The poll's fewest RPCs.
//
// The steady state of a fleet at work is its workers' jobs running,
// watched so that an end under a worker is heard within a poll (ends.go):
// the poll only needs to know that each is still running. Slurm 24.05
// and later answer that with squeue --only-job-state, one RPC against
// the full poll's two (sdiag, 24.11.5 and 26.05), for the ids asked (-j):
// ids and states, nothing else. So a cycle whose every watched job was
// running reads only their states; when one is not running any more, the
// same cycle polls in full (queue.Jobs: reasons, comments, every job of the
// provisioner's name), whose words the engine is told. A full poll also
// runs whenever a request is pending (its reason is shown and judged), a
// submission may land late or be found by its comment, adoption is due,
// a cancellation is under way, and at least every fullPollEvery cycles.
// A Slurm without the option (22.05 says "unrecognized option") is
// polled in full from then on.
//
// Rejected: squeue --me --only-job-state, which lists every job of the
// user at one RPC: it prints nothing on 24.11 (the user is not in what
// the controller returns), and another account's jobs of the same name
// would need their user anyway.

// fullPollEvery is how often, in poll cycles, a full poll runs when
// nothing else asks for one.
const fullPollEvery = 5

// lightPollMax is the most job ids a light poll asks for; beyond it the
// cycle polls in full, whose one squeue by name is shorter than the list.
const lightPollMax = 2000

// noStateOnly reports whether squeue refused --only-job-state as an
// option it does not know (Slurm before 24.05).
func noStateOnly(err error) bool {
	s := err.Error()
	return strings.Contains(s, "only-job-state") && (strings.Contains(s, "unrecognized option") || strings.Contains(s, "invalid option"))
}

// lightChanged reports whether a light poll's rows show a watched job no
// longer running, or not listed: the cycle then polls in full, for the
// words the engine is told.
func lightChanged(cfg *settings, rows []queue.Job, watched []watch, ends []endWatch) bool {
	byID := indexRows(rows)
	for _, w := range watched {
		if row, ok := rowOf(byID, w.job, cfg.comment(w.r.tag)); !ok || !runningStates[row.State] {
			return true
		}
	}
	for _, e := range ends {
		if row, ok := rowOf(byID, e.job, cfg.comment(e.tag)); !ok || !runningStates[row.State] {
			return true
		}
	}
	return false
}
