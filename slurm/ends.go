package slurm

// Hearing a job end under its worker. A worker's liveness is the engine's
// to judge from its requests, and a busy worker may be silent for a
// while, so the engine's rule waits three poll periods before it gives a
// worker up; a job killed whole (a node crash, the OOM killer, scancel by
// a person) would cost its task that long. The queue knows at once: the
// provisioner keeps the job of every worker the engine reports attached
// (Reconcile) and reads it in the squeue each poll cycle already makes
// for its other jobs. A job no longer running under its worker is told
// to the engine as worker_job_ended (contract 2.6), which drops the
// worker and places its task again.
//
// Rejected: asking the worker. A worker whose processes were killed
// cannot say so, and a node that went down takes its connections with
// it without a word; only the scheduler's record is there in both cases.
// The cost is a poll cycle, one squeue, every poll_interval while any
// worker is attached, where before the poller rested once every machine
// had arrived.
//
// A worker that left (Reconcile) is kept among the departed while the
// queue lists its job: if the job is requeued after the worker left
// (its node failed as it went), adoption cancels it instead of taking
// it for a machine on its way.
//
// What it will not do: judge a worker that is running. A job RUNNING
// whose worker is silent is the engine's liveness rule's to judge, which
// stays as the net under this; and a job requeued after its node failed
// (PENDING again under the same id, as Slurm does with JobRequeue=1) is
// cancelled here, since its worker's name is revoked and could never
// attach again.

import (
	"context"
	"fmt"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/internal/queue"
)

// attachedJob is the job of a worker the engine reports attached.
type attachedJob struct {
	job, tag, profile string
}

// endWatch is an attached worker's job as a poll cycle found it before
// reading the queue.
type endWatch struct {
	worker string
	attachedJob
}

// runningStates are the states of a job whose processes still run, or are
// only stopped: its worker is alive as far as the scheduler knows.
var runningStates = map[string]bool{
	"RUNNING": true, "CONFIGURING": true, "SUSPENDED": true, "STOPPED": true,
	"SIGNALING": true, "RESIZING": true, "STAGE_OUT": true,
}

// orBlank is sep and s, or "" when s is.
func orBlank(sep, s string) string {
	if s == "" {
		return ""
	}
	return sep + s
}

// jobEnds hears jobs end under their workers: the jobs of the workers the
// engine reports attached, and of those that left while the queue still
// lists them. Its fields are guarded by p.mu.
type jobEnds struct {
	// p is the provisioner whose books this reads and changes, under p.mu.
	p *Provisioner

	// attachedJobs holds the job of each attached worker whose request
	// arrived in this process, until Reconcile says it left or a poll
	// cycle finds its job ended under it (ends.go).
	attachedJobs map[string]attachedJob
	// departed holds the jobs of workers that attached in this process
	// and left (Reconcile) or whose job ended under them, while the queue
	// still lists the job: one pending again was requeued, and its
	// worker's name is spent, so it is cancelled, never adopted (ends.go).
	departed map[string]attachedJob
}

// keepAttachedLocked starts watching the jobs of the workers whose
// requests arrived. p.mu must be held.
func (je *jobEnds) keepAttachedLocked(arrived []*request) {
	if len(arrived) == 0 {
		return
	}
	if je.attachedJobs == nil {
		je.attachedJobs = map[string]attachedJob{}
	}
	for _, r := range arrived {
		if r.job != "" {
			je.attachedJobs[r.worker] = attachedJob{job: r.job, tag: r.tag, profile: r.profile}
		}
	}
}

// departLocked stops watching worker's job, which left with it, and
// keeps it among the departed while the queue lists it. p.mu must be
// held.
func (je *jobEnds) departLocked(worker string) {
	j, ok := je.attachedJobs[worker]
	if !ok {
		return
	}
	delete(je.attachedJobs, worker)
	if je.departed == nil {
		je.departed = map[string]attachedJob{}
	}
	je.departed[worker] = j
}

// forgetDepartedLocked drops the departed whose job the queue no longer
// lists as queued or running: ended, or gone. p.mu must be held.
func (je *jobEnds) forgetDepartedLocked(cfg *settings, byID rowIndex) {
	for w, j := range je.departed {
		if row, ok := rowOf(byID, j.job, cfg.comment(j.tag)); !ok || endedStates[row.State] {
			delete(je.departed, w)
		}
	}
}

// endWatchesLocked lists the attached workers' jobs for a poll cycle.
// p.mu must be held.
func (je *jobEnds) endWatchesLocked() []endWatch {
	out := make([]endWatch, 0, len(je.attachedJobs))
	for w, j := range je.attachedJobs {
		out = append(out, endWatch{worker: w, attachedJob: j})
	}
	return out
}

// endedUnder tells the engine of each watched job that has ended or left
// its machine under its attached worker (worker_job_ended), and stops
// watching it. A job requeued (pending again) is cancelled too.
func (je *jobEnds) endedUnder(ctx context.Context, cfg *settings, host shared.Host, watched []endWatch, rows []queue.Job) {
	p := je.p
	byID := indexRows(rows)
	var evs []shared.Event
	var requeued []jobRef
	p.mu.Lock()
	je.forgetDepartedLocked(cfg, byID)
	for _, w := range watched {
		row, listed := rowOf(byID, w.job, cfg.comment(w.tag))
		if listed && runningStates[row.State] {
			continue
		}
		if cur, ok := je.attachedJobs[w.worker]; !ok || cur != w.attachedJob {
			continue // the worker left, or came back, while the queue was read
		}
		je.departLocked(w.worker)
		state, detail := row.State, ""
		switch {
		case !listed:
			state = "GONE"
			detail = fmt.Sprintf("job %s has left the queue", w.job)
		case row.State == "PENDING":
			detail = fmt.Sprintf("job %s is pending again (requeued%s): its worker's processes are gone", w.job, orBlank(", ", row.Reason))
			requeued = append(requeued, jobRef{job: w.job, profile: w.profile, worker: w.worker,
				why: "requeued under its attached worker, whose name is revoked"})
		case row.Reason != "" && row.Reason != "None":
			detail = fmt.Sprintf("job %s is %s (%s)", w.job, row.State, row.Reason)
		default:
			detail = fmt.Sprintf("job %s is %s", w.job, row.State)
		}
		evs = append(evs, shared.Event{Kind: shared.EventWorkerJobEnded, Profile: w.profile, Job: w.job, Worker: w.worker,
			JobState: state, Detail: detail})
	}
	p.mu.Unlock()
	for _, ev := range evs {
		// A worker that leaves ends its job COMPLETED, and the queue may
		// say so before the engine's next Reconcile says it left: that
		// end is no news.
		if ev.JobState == "COMPLETED" || ev.JobState == "COMPLETING" {
			cfg.log.Debug("the job of an attached worker ended", "worker", ev.Worker, "job", ev.Job, "state", ev.JobState)
		} else {
			cfg.log.Warn("a job ended under its attached worker", "worker", ev.Worker, "job", ev.Job, "state", ev.JobState, "detail", ev.Detail)
		}
	}
	p.publishAll(ctx, cfg, host, evs)
	if len(requeued) > 0 {
		p.cancels.cancelJobs(ctx, cfg, host, requeued, "cancelled a job requeued under its attached worker")
	}
}
