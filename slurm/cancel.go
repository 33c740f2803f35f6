package slurm

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/internal/queue"
)

// canceller cancels the jobs the provisioner decided to cancel, and keeps
// each until Slurm confirms it gone: a scancel that failed (controller
// down, a timeout) loses nothing. Each poll cycle and Shutdown try
// again. Its field is guarded by p.mu.
type canceller struct {
	// p is the provisioner whose books this reads and changes, under p.mu.
	p *Provisioner

	// cancelling holds, by job id, the jobs this provisioner has decided
	// to cancel and Slurm has not yet confirmed gone: a scancel that
	// failed (controller down, a timeout) loses nothing. Each poll cycle
	// and Shutdown try again (cancelJobs, retryCancels).
	cancelling map[string]*jobRef
}

// cancelJobs cancels jobs already forgotten, with one scancel, and tells
// the engine about each: worker_cancelled with its why once Slurm has
// agreed. What scancel could not cancel stays in p.cancelling and is
// tried again on every poll cycle and at Shutdown; the engine hears of
// the first failure as worker_provision_failed, so that it stops trusting
// the worker's credential at once. msg is the log line for a cancelled
// job. It returns the ids cancelled now.
func (cn *canceller) cancelJobs(ctx context.Context, cfg *settings, host shared.Host, refs []jobRef, msg string) []string {
	p := cn.p
	if len(refs) == 0 {
		return nil
	}
	p.mu.Lock()
	for i := range refs {
		j := refs[i]
		j.msg = msg
		if old := cn.cancelling[j.job]; old != nil {
			j.failures = old.failures
			// The machines of one multi-node allocation share its job:
			// the engine hears of each.
			for _, w := range append([]string{old.worker}, old.others...) {
				if w != j.worker && !slices.Contains(j.others, w) {
					j.others = append(j.others, w)
				}
			}
		}
		cn.cancelling[j.job] = &j
	}
	p.mu.Unlock()
	return cn.retryCancels(ctx, cfg, host, jobIDs(refs), nil)
}

// retryCancels runs one scancel for the given ids of p.cancelling (all
// of them when ids is nil) and settles the outcome.
func (cn *canceller) retryCancels(ctx context.Context, cfg *settings, host shared.Host, ids []string, rows []queue.Job) []string {
	p := cn.p
	p.mu.Lock()
	if ids == nil {
		for id := range cn.cancelling {
			ids = append(ids, id)
		}
		slices.Sort(ids)
	}
	p.mu.Unlock()
	if len(ids) == 0 {
		return nil
	}
	// Jobs given up for falling demand are cancelled only if the queue
	// says they still pend (see pendingOnly).
	var any, pendingOnly []string
	p.mu.Lock()
	for _, id := range ids {
		if j := cn.cancelling[id]; j != nil && j.pendingOnly {
			pendingOnly = append(pendingOnly, id)
		} else {
			any = append(any, id)
		}
	}
	p.mu.Unlock()
	var done []string
	if len(any) > 0 {
		done = cn.settleCancels(ctx, cfg, host, any, p.q.Cancel(ctx, any))
	}
	if len(pendingOnly) > 0 {
		done = append(done, cn.cancelPending(ctx, cfg, host, pendingOnly, rows)...)
	}
	return done
}

// cancelPending cancels those of ids (jobs given up for falling demand)
// that the queue, read now unless rows are this moment's, shows still
// pending. One that started since the books last looked is kept
// (goneFromQueue), since its worker is about to attach.
//
// It cancels by id, not with scancel --state=PENDING: Slurm filters job
// records, and an array's pending tasks share one, so that would cancel
// them all. A task that starts between the squeue and the scancel is
// cancelled anyway (docs/design/slurm-cancel-pending.md).
func (cn *canceller) cancelPending(ctx context.Context, cfg *settings, host shared.Host, ids []string, rows []queue.Job) []string {
	p := cn.p
	if rows == nil {
		var err error
		if rows, err = p.q.Jobs(ctx, true); err != nil {
			// Nothing was cancelled; the next poll tries again.
			cn.settleCancels(ctx, cfg, host, ids, err)
			return nil
		}
		cn.goneFromQueue(ctx, cfg, host, rows)
	}
	pending := map[string]bool{}
	for _, row := range rows {
		if row.State == "PENDING" {
			pending[row.ID] = true
		}
	}
	var still []string
	p.mu.Lock()
	for _, id := range ids {
		if j := cn.cancelling[id]; j != nil && pending[id] {
			still = append(still, id)
		}
	}
	p.mu.Unlock()
	if len(still) == 0 {
		return nil
	}
	return cn.settleCancels(ctx, cfg, host, still, p.q.Cancel(ctx, still))
}

// settleCancels records the outcome of a scancel of ids: err nil means
// Slurm agreed, so they leave p.cancelling and the engine hears
// worker_cancelled. Otherwise they stay, and a first failure is reported.
func (cn *canceller) settleCancels(ctx context.Context, cfg *settings, host shared.Host, ids []string, err error) []string {
	p := cn.p
	var done, firstFail []jobRef
	p.mu.Lock()
	for _, id := range ids {
		j := cn.cancelling[id]
		if j == nil {
			continue
		}
		if err == nil {
			delete(cn.cancelling, id)
			done = append(done, *j)
			continue
		}
		j.failures++
		if j.failures == 1 {
			firstFail = append(firstFail, *j)
		}
	}
	if err != nil {
		p.lastErr = truncate("cancelling jobs " + strings.Join(ids, " ") + ": " + err.Error())
	}
	p.mu.Unlock()
	if err != nil {
		cfg.log.Error("could not cancel jobs; will try again on the next poll and at shutdown", "jobs", ids, "error", err)
	}
	for _, j := range firstFail {
		for _, w := range j.workers() {
			p.publish(ctx, cfg, host, shared.Event{Kind: shared.EventWorkerProvisionFailed, Profile: j.profile, Job: j.job, Worker: w,
				Detail: truncate(fmt.Sprintf("%s, and could not be cancelled yet (will keep trying): %v", j.why, err))})
		}
	}
	for _, j := range done {
		msg := j.msg
		if msg == "" {
			msg = "cancelled a job"
		}
		cfg.log.Warn(msg, "profile", j.profile, "job", j.job, "worker", j.worker, "waited", j.age.Round(time.Second), "why", j.why, "failed_tries", j.failures)
		for _, w := range j.workers() {
			p.publish(ctx, cfg, host, shared.Event{Kind: shared.EventWorkerCancelled, Profile: j.profile, Job: j.job, Worker: w, Detail: j.why})
		}
	}
	return jobIDs(done)
}

// goneFromQueue settles the jobs of p.cancelling that a poll found ended
// or no longer listed: Slurm has let them go, whether or not a scancel
// said so (scancel fails on an id it has already forgotten). It returns
// the ids still to cancel.
func (cn *canceller) goneFromQueue(ctx context.Context, cfg *settings, host shared.Host, rows []queue.Job) []string {
	p := cn.p
	p.mu.Lock()
	none := len(cn.cancelling) == 0
	p.mu.Unlock()
	if none {
		return nil // Nothing being cancelled: no index of the queue to make.
	}
	active := map[string]string{}
	for _, row := range rows {
		if !endedStates[row.State] {
			active[row.ID] = row.State
		}
	}
	var gone, left []string
	var kept []jobRef
	now := p.now()
	p.mu.Lock()
	for id, j := range cn.cancelling {
		state, listed := active[id]
		switch {
		case !listed:
			gone = append(gone, id)
		case j.pendingOnly && state != "PENDING":
			// It started before scancel --state=PENDING reached it: a
			// machine about to attach, which falling demand never
			// cancels. Back into the books it goes.
			delete(cn.cancelling, id)
			p.keepStartedLocked(*j, state, now)
			kept = append(kept, *j)
		default:
			left = append(left, id)
		}
	}
	p.mu.Unlock()
	for _, j := range kept {
		cfg.log.Info("a machine given up for falling demand started first; kept", "profile", j.profile, "job", j.job, "workers", j.workers())
	}
	slices.Sort(gone)
	slices.Sort(left)
	cn.settleCancels(ctx, cfg, host, gone, nil)
	return left
}
