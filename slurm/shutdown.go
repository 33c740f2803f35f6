package slurm

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fluksio/provision/shared"
)

// closing is Shutdown's work and outcome: waiting for submissions,
// emptying the queue of this provisioner's jobs, and what every caller
// of Shutdown gets. Its fields are guarded by p.mu.
type closing struct {
	// p is the provisioner whose books this reads and changes, under p.mu.
	p *Provisioner

	// suspect is set when a submission may have reached slurmctld without
	// this provisioner learning its job id (ssh killed, answer lost): its
	// job can land later, so Shutdown reads the queue for it even if the
	// books hold nothing.
	suspect bool
	// shutdownDone is closed when the one Shutdown has finished;
	// shutdownResp and shutdownErr are its outcome, which every caller
	// gets. Set under mu before shutdownDone is closed.
	shutdownDone chan struct{}
	shutdownResp *shared.ShutdownResponse
	shutdownErr  error
}

// shutdown is the one Shutdown's work.
func (cl *closing) shutdown(ctx context.Context, req *shared.ShutdownRequest) (*shared.ShutdownResponse, error) {
	p := cl.p
	p.mu.Lock()
	cfg, host, q := p.cfg, p.host, p.q
	var inflight []*request
	for r := range p.sub.inflight {
		inflight = append(inflight, r)
	}
	p.mu.Unlock()
	// The poller, and adoption if Configure is still at it, stop now: the
	// queue is about to be emptied of this provisioner's jobs.
	p.poll.stop()
	defer p.stop()
	if q != nil {
		defer q.Close(ctx) // last of all, after squeue and scancel
	}
	if cfg == nil {
		return &shared.ShutdownResponse{}, nil
	}

	deadline, hasDeadline := ctx.Deadline()
	if req != nil && !req.Deadline.IsZero() && (!hasDeadline || req.Deadline.Before(deadline)) {
		deadline, hasDeadline = req.Deadline, true
	}
	if hasDeadline {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}

	stragglers, left := cl.waitSubmissions(ctx, cfg, inflight, deadline, hasDeadline)

	p.mu.Lock()
	jobs, lost, arrived := cl.emptyBooksLocked(inflight, stragglers)
	neverLooked, suspect := p.adoption.adoptPending, cl.suspect
	sweep := suspect || neverLooked || len(lost) > 0
	p.mu.Unlock()

	if sweep {
		found, notFound := cl.sweep(ctx, cfg, lost, arrived, neverLooked, suspect)
		left = append(left, notFound...)
		for _, j := range found {
			if !slices.ContainsFunc(jobs, func(k jobRef) bool { return k.job == j.job }) {
				jobs = append(jobs, j)
			}
		}
	}
	slices.SortFunc(jobs, func(a, b jobRef) int {
		return cmp.Or(cmp.Compare(len(a.job), len(b.job)), strings.Compare(a.job, b.job))
	})

	resp := &shared.ShutdownResponse{}
	if len(jobs) > 0 {
		var notCancelled string
		resp.Cancelled, notCancelled = cl.cancelAll(ctx, cfg, host, jobs)
		if notCancelled != "" {
			left = append(left, notCancelled)
		}
	}
	if len(left) > 0 {
		return nil, fmt.Errorf("shutdown incomplete: may be left in the queue: %s; cancelled: %s",
			strings.Join(left, "; "), orNone(resp.Cancelled))
	}
	return resp, nil
}

// emptyBooksLocked empties the books for Shutdown and says what of them
// is in the queue: the jobs to cancel (queued, and those being
// cancelled), the requests whose job may be there unknown (an answer
// lost, a submission stopped), and the workers that attached while
// their submission was still going, whose jobs are never cancelled.
// p.mu must be held.
func (cl *closing) emptyBooksLocked(inflight, stragglers []*request) (jobs []jobRef, lost []*request, arrived map[string]bool) {
	p := cl.p
	for _, r := range p.sortedLocked() {
		switch {
		case r.phase == phaseQueued:
			jobs = append(jobs, jobRef{job: r.job, profile: r.profile, worker: r.worker})
		case r.phase == phaseAnswerLost:
			lost = append(lost, r)
		}
	}
	clear(p.outstanding)
	for _, r := range stragglers {
		if r.job == "" && r.phase != phaseArrived && !slices.Contains(lost, r) {
			lost = append(lost, r)
		}
	}
	for _, j := range p.cancels.cancelling {
		jobs = append(jobs, *j)
	}
	// Workers that attached while their submission was still going are
	// not to be cancelled, whatever state the queue shows their job in.
	arrived = map[string]bool{}
	for _, r := range inflight {
		if r.phase == phaseArrived {
			arrived[r.worker] = true
		}
	}
	return jobs, lost, arrived
}

// waitSubmissions waits for the submissions and the poller, keeping back
// some time before the deadline for squeue and scancel, then stops the
// submissions still in flight: it returns those stragglers, and what may
// be left in the queue of those that did not stop in time.
func (cl *closing) waitSubmissions(ctx context.Context, cfg *settings, inflight []*request, deadline time.Time, hasDeadline bool) (stragglers []*request, left []string) {
	p := cl.p
	// Without a deadline, each submission is bounded by submit_timeout
	// anyway.
	allDone := make(chan struct{})
	go func() {
		p.wg.Wait()
		close(allDone)
	}()
	var cutoff <-chan time.Time
	if hasDeadline {
		reserve := max(0, min(time.Until(deadline)/2, shutdownReserve))
		t := time.NewTimer(time.Until(deadline.Add(-reserve)))
		defer t.Stop()
		cutoff = t.C
	}
	select {
	case <-allDone:
	case <-cutoff:
	case <-ctx.Done():
	}
	for _, r := range inflight {
		if !r.finished() {
			stragglers = append(stragglers, r)
			r.cancel()
		}
	}
	if len(stragglers) > 0 {
		cfg.log.Warn("submissions still in flight at shutdown; stopping them", "count", len(stragglers))
		p.mu.Lock()
		cl.suspect = true
		p.mu.Unlock()
		// Killing ssh returns within sshrun.WaitDelay; then each goroutine
		// publishes its failure and finishes.
		select {
		case <-allDone:
		case <-ctx.Done():
			for _, r := range stragglers {
				if !r.finished() {
					left = append(left, "the job of worker "+r.worker+" (its submission did not stop in time)")
				}
			}
		}
	}
	return stragglers, left
}

// sweep reads the queue once for what the books cannot say (sweepQueue):
// the jobs found, and what may be left in the queue when it could not be
// read for jobs whose submission was cut short (lost, or suspect).
func (cl *closing) sweep(ctx context.Context, cfg *settings, lost []*request, arrived map[string]bool, neverLooked, suspect bool) (found []jobRef, left []string) {
	p := cl.p
	found, err := cl.sweepQueue(ctx, cfg, lost, arrived, neverLooked)
	switch {
	case err != nil && !suspect && len(lost) == 0:
		// Only a look for what an earlier run may have left, and the
		// queue could never be read: this run put nothing there
		// that is not in the books, and changed nothing of what it
		// found, so the next run adopts it as this one would have.
		// Not this shutdown's failure.
		p.setLastErr(err.Error())
		cfg.log.Warn("could not read the queue at shutdown, as at every look before; this run left nothing there that it knows of, and jobs an earlier run may have left are the next run's to adopt",
			"error", err, "check", "squeue --me --name="+jobName(cfg.name))
	case err != nil:
		p.setLastErr(err.Error())
		cfg.log.Error("could not read the queue for jobs whose submission was cut short", "error", err)
		what := "any job of this engine that reached the queue after its submission was cut short"
		if len(lost) > 0 {
			var ws []string
			for _, r := range lost {
				ws = append(ws, r.worker)
			}
			what = "the jobs of workers " + strings.Join(ws, ", ") + ", if they reached the queue"
		}
		left = append(left, what+" (reading the queue: "+err.Error()+")")
	}
	return found, left
}

// cancelAll cancels jobs with one scancel and tells the engine of each:
// the ids cancelled, or what is left in the queue when scancel failed.
func (cl *closing) cancelAll(ctx context.Context, cfg *settings, host shared.Host, jobs []jobRef) (cancelled []string, left string) {
	p := cl.p
	if err := p.q.Cancel(ctx, jobIDs(jobs)); err != nil {
		p.setLastErr(err.Error())
		cfg.log.Error("could not cancel jobs at shutdown", "jobs", jobIDs(jobs), "error", err)
		return nil, "jobs " + strings.Join(jobIDs(jobs), " ") + " (scancel: " + err.Error() + ")"
	}
	for _, j := range jobs {
		cfg.log.Info("cancelled a job at shutdown", "profile", j.profile, "job", j.job, "worker", j.worker)
		for _, w := range j.workers() {
			p.publish(ctx, cfg, host, shared.Event{Kind: shared.EventWorkerCancelled, Profile: j.profile, Job: j.job, Worker: w, Detail: "provisioner shut down"})
		}
	}
	return jobIDs(jobs), ""
}

// sweepQueue reads the queue once for Shutdown: it returns every pending
// job of this engine and provisioner, any epoch, and the job of each lost
// request, pending or running (its worker has not attached, or it would
// not be lost). Other running jobs are left alone, since their worker may
// be attached and busy, unless running is set: a plugin that never got
// to look at the queue (restarted to shut down, say) cannot tell, and
// would have adopted and cancelled them like its own.
func (cl *closing) sweepQueue(ctx context.Context, cfg *settings, lost []*request, arrived map[string]bool, running bool) ([]jobRef, error) {
	p := cl.p
	rows, err := p.q.Jobs(ctx, false)
	if err != nil {
		return nil, err
	}
	lostBy := map[string]*request{}
	for _, r := range lost {
		lostBy[r.worker] = r
	}
	var found []jobRef
	for _, row := range rows {
		tag, mine := cfg.ours(row.Comment)
		if !mine {
			continue
		}
		worker := machineWorker(tag.Worker, row.ID)
		profile, _ := cfg.profileOf(tag.Worker)
		machines := cfg.machinesOf(profile, worker)
		if endedStates[row.State] || slices.ContainsFunc(machines, func(m string) bool { return arrived[m] }) {
			continue
		}
		if i := slices.IndexFunc(machines, func(m string) bool { return lostBy[m] != nil }); i >= 0 && tag.Epoch == cfg.epoch {
			r := lostBy[machines[i]]
			found = append(found, jobRef{job: row.ID, profile: r.profile, worker: r.worker})
			continue
		}
		if row.State == "PENDING" || running {
			found = append(found, jobRef{job: row.ID, profile: profile, worker: worker})
		}
	}
	return found, nil
}
