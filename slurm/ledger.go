package slurm

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/sbatch"
)

// ledger is the books of machines asked for and not yet arrived: a
// request per worker name, from the reservation that precedes its sbatch
// until its worker attaches, its job fails or ends, or it is given up.
// Its methods read and change only the requests; what to ask the cluster
// for, and when, is the Provisioner's. It is guarded by the Provisioner's
// mu: every method named Locked is called with it held.
//
// It has no lock of its own because none of the Provisioner's decisions
// about it reads or changes it alone:
//   - Provision counts the books with the attached workers, the backoffs
//     and the holds, and reserves what is short (reserveLocked) in the
//     same step: two passes that counted apart would both take the same
//     room under max_workers;
//   - a reservation is recorded in the books, in inflight and, until
//     adoption, in mine at once, and adoption tells this run's jobs from
//     strays by all three in one look (adopt's ours): with the books
//     under a lock of their own, that look is both locks at once, or a
//     window in which a job just reserved is taken for a stray and
//     cancelled;
//   - an arrival leaves the books and ends its profile's backoff together
//     (arrivedLocked), and a failure leaves them with lastErr set and its
//     profile's backoff counted (submissionFailed, judge): a Provision in
//     between would see the machine gone and its profile not backing
//     off, and ask for it again at once;
//   - a request's phase, job and state, which the poller and the
//     submissions change, are read by those same steps.
//
// A lock of its own would be taken under mu at every one of them, an
// order to keep for no concurrency gained. The ssh transport, which is
// slow, has its own (slurm/sshrun), and mu is never held across it.
type ledger struct {
	// outstanding holds the machines asked for and not yet arrived, by
	// worker name.
	outstanding map[string]*request
}

// sortedLocked is the books in a stable order, oldest first, so that what
// a pass over them does and logs does not change from run to run.
func (l *ledger) sortedLocked() []*request {
	out := make([]*request, 0, len(l.outstanding))
	for _, r := range l.outstanding {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b *request) int { return cmpNewest(b, a) })
	return out
}

// countsLocked is the machines on their way, by profile.
func (l *ledger) countsLocked() map[string]profileCounts {
	counts := map[string]profileCounts{}
	for _, r := range l.outstanding {
		c := counts[r.profile]
		switch {
		case r.phase == phaseQueued && r.slurmState == "RUNNING":
			c.starting++
		default:
			c.pending++
		}
		if r.phase == phaseAwaitingAdoption || r.phase == phaseSubmitting {
			c.inFlight++
		}
		counts[r.profile] = c
	}
	return counts
}

// onTheWayDetailLocked says what the oldest machine of profile on its way
// is waiting for, for an answer that asks for nothing new.
func (l *ledger) onTheWayDetailLocked(profile string, now time.Time) string {
	for _, r := range l.sortedLocked() {
		if r.profile != profile {
			continue
		}
		switch r.phase {
		case phaseQueued:
			// The same words for as long as nothing changes: the engine
			// logs an answer when it differs from the last, so an age
			// in here would make a log line a second per waiting need.
			state := strings.ToLower(r.slurmState)
			switch {
			case state == "":
				state = "queued"
			case r.pendingReason != "":
				// Slurm's reason in its own word: the first thing an
				// operator asks of a job that waits.
				state += ", held by Slurm for " + r.pendingReason
			}
			return fmt.Sprintf("job %s (worker %s), asked for at %s, is %s and its worker has not attached", r.job, r.worker, r.since.UTC().Format(time.TimeOnly), state)
		case phaseAnswerLost:
			return fmt.Sprintf("the answer to worker %s's sbatch was lost; its job is being looked for in the queue", r.worker)
		default:
			return fmt.Sprintf("worker %s is still being submitted", r.worker)
		}
	}
	return ""
}

// submissionsLocked groups a profile's machines on their way by the
// submission that made them (a job, or an array), oldest first.
func (l *ledger) submissionsLocked(profile string, now time.Time) []shared.Submission {
	byTag := map[string]*shared.Submission{}
	var order []string
	for _, r := range l.sortedLocked() {
		if r.profile != profile {
			continue
		}
		sub := byTag[r.tag]
		if sub == nil {
			job, _ := sbatch.SplitTask(r.job)
			sub = &shared.Submission{Job: job, Age: now.Sub(r.since)}
			byTag[r.tag] = sub
			order = append(order, r.tag)
		}
		sub.OnTheWay++
		sub.Machines = max(sub.Machines, r.batch, sub.OnTheWay)
	}
	out := make([]shared.Submission, 0, len(order))
	for _, t := range order {
		out = append(out, *byTag[t])
	}
	return out
}

// giveUpPendingLocked takes up to n machines of profile that are queued and
// not running out of the books, newest first, and returns them to be
// cancelled. Machines still being submitted are left: the next call sees
// them queued.
func (l *ledger) giveUpPendingLocked(profile string, n int, now time.Time) []jobRef {
	// An allocation (a job, or one array task) is given up whole or not
	// at all: its machines share the job, and one scancel ends them all.
	allocs := map[string][]*request{}
	for _, r := range l.outstanding {
		if r.profile == profile && r.phase == phaseQueued && r.slurmState != "RUNNING" && r.finished() {
			allocs[r.job] = append(allocs[r.job], r)
		}
	}
	var cands [][]*request
	for _, rs := range allocs {
		slices.SortFunc(rs, func(a, b *request) int { return a.node - b.node })
		if len(rs) == max(1, rs[0].nodes) {
			cands = append(cands, rs)
		}
	}
	slices.SortFunc(cands, func(a, b []*request) int {
		return cmpNewest(a[0], b[0])
	})
	var out []jobRef
	for _, rs := range cands {
		if len(rs) > n {
			continue
		}
		n -= len(rs)
		for _, r := range rs {
			delete(l.outstanding, r.worker)
			r.phase = phaseFailed
			out = append(out, jobRef{job: r.job, profile: r.profile, worker: r.worker, age: now.Sub(r.since), pendingOnly: true,
				why: "the engine no longer wants it: the demand fell while it was pending"})
		}
	}
	return out
}

// keepStartedLocked puts back into the books the machines of j, a job
// given up for falling demand that a poll found started (state) instead
// of cancelled: they are on their way again, their attach_timeout
// counting from now.
func (l *ledger) keepStartedLocked(j jobRef, state string, now time.Time) {
	_, task := sbatch.SplitTask(j.job)
	workers := j.workers()
	slices.Sort(workers)
	for _, w := range workers {
		alloc, node := cutNode(w)
		nodes := 1
		if node >= 0 {
			nodes = len(workers)
		} else {
			alloc = w
		}
		l.outstanding[w] = &request{profile: j.profile, worker: w, tag: alloc, task: task, node: node, nodes: nodes, batch: len(workers),
			since: now.Add(-j.age), cancel: func() {}, done: closedDone, job: j.job, slurmState: state, phase: phaseQueued}
		if state == "RUNNING" {
			l.outstanding[w].running = now
		}
	}
}

// keepAllocationsLocked keeps the first fit allocations of a submission
// and takes the others out of the books (superseded: they were never
// asked for, and the next Provision asks again for what is missing); the
// kept machines are the submission's batch. A limit that trims a burst
// (the user's accounting limit, the cluster's MaxJobCount) calls it.
// The Provisioner's mu must be held.
func (l *ledger) keepAllocationsLocked(allocs [][]*request, fit int) []*request {
	var kept []*request
	for i, a := range allocs {
		if i < fit {
			kept = append(kept, a...)
			continue
		}
		for _, r := range a {
			if r.phase == phaseSubmitting {
				r.phase = phaseSuperseded
			}
			if l.outstanding[r.worker] == r {
				delete(l.outstanding, r.worker)
			}
		}
	}
	for _, r := range kept {
		r.batch = len(kept)
	}
	return kept
}

// dropLocked takes worker's request out of the books, failed, if it is
// there and its worker has not arrived.
func (l *ledger) dropLocked(worker string) {
	if rq := l.outstanding[worker]; rq != nil {
		delete(l.outstanding, worker)
		if rq.phase != phaseArrived {
			rq.phase = phaseFailed
		}
	}
}
