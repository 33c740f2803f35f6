package slurm

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/internal/queue"
	"github.com/fluksio/provision/slurm/sbatch"
)

// adopter keeps the books level-triggered: it takes over the machines of
// this engine that the books do not hold, and cancels the jobs nobody
// would use (adopt). Its fields are guarded by p.mu.
type adopter struct {
	// p is the provisioner whose books this reads and changes, under p.mu.
	p *Provisioner

	// adoptPending is set from Configure until this provisioner's jobs
	// left from an earlier run have been listed and dealt with; each poll
	// cycle tries again until then.
	adoptPending bool
	// mine holds the workers submitted while adoptPending is set, so that
	// a late adoption does not take this run's own jobs for strays.
	mine map[string]bool
}

// adopt keeps the books level-triggered: it takes over the machines of
// this engine that the books do not hold, so that they are polled,
// expired and cancelled at shutdown like this run's own. It runs at
// Configure, for the jobs an earlier run left, and then on every poll
// cycle, for a submission that landed after it was given up on: ssh was
// killed, or its answer was lost and the queue did not have it yet, but
// the sbatch on the login node went on. Each machine (a job, or one task
// of an array) is adopted on its own, its worker read from the tag and
// its task, its age counted from now, and the engine hears of it
// (worker_provisioned), so that its worker may attach. A request of this
// run that has not begun its submission yields to an adopted machine of
// its profile (superseded). Whether all of them are still wanted is the
// demand's business: Provision gives up what is pending beyond it.
//
// At Configure every machine is adopted; later only pending ones, since
// a running machine the books do not hold is one whose worker arrived.
// Jobs nobody would ever use are cancelled, with one scancel: a pending
// job whose tag names no worker of a configured profile, and any job of
// this engine from another credential epoch, running or not, because its
// worker cannot attach; and at Configure, in relay mode with the relay's
// own certificate, every job an earlier run left, since its workers pin
// that run's relay. Jobs without this engine's tag are never touched
// (tag.go).
func (ad *adopter) adopt(ctx context.Context, cfg *settings, host shared.Host, rows []queue.Job) {
	p := ad.p
	p.mu.Lock()
	if p.shut {
		p.mu.Unlock()
		return
	}
	first := ad.adoptPending
	// The workers the books already hold: in p.outstanding and ad.mine,
	// looked up where they are, and those of submissions in flight or
	// jobs being cancelled, which are few. (Copying the books into one
	// set every cycle cost a third of a poll cycle at 10,000.)
	held := map[string]bool{}
	for r := range p.sub.inflight {
		held[r.worker] = true
	}
	for _, j := range p.cancels.cancelling {
		for _, w := range j.workers() {
			held[w] = true
		}
	}
	// An attached worker's job is ours too: one pending again was
	// requeued under its worker and is endedUnder's to cancel.
	ours := func(w string) bool {
		if p.outstanding[w] != nil || ad.mine[w] || held[w] {
			return true
		}
		_, attached := p.ends.attachedJobs[w]
		_, reconciled := p.workers.reconciled[w]
		return attached || reconciled
	}
	relayPinned := p.relay != nil && p.relay.tls != nil
	var strays []jobRef
	var leftAlone []queue.Job
	var adopted []*request
	foreign := 0
	now := p.now()
	type commented struct {
		tag          sbatch.Tag
		mine         bool
		profile, why string
	}
	byComment := map[string]commented{}
	for _, row := range rows {
		if endedStates[row.State] || row.State == "COMPLETING" {
			continue
		}
		// An array's tasks share one comment: it is read once a cycle,
		// not once a task.
		c, known := byComment[row.Comment]
		if !known {
			c.tag, c.mine = cfg.ours(row.Comment)
			if c.mine {
				c.profile, c.why = cfg.profileOf(c.tag.Worker)
			}
			byComment[row.Comment] = c
		}
		tag, profile, why := c.tag, c.profile, c.why
		if !c.mine {
			foreign++
			continue
		}
		worker := machineWorker(tag.Worker, row.ID)
		_, task := sbatch.SplitTask(row.ID)
		machines := cfg.machinesOf(profile, worker)
		nodes := len(machines)
		switch {
		case ours(worker) || ours(machines[0]) || (first && ours(tag.Worker)):
			// This run's own: a machine in the books, or a task of an
			// array submitted while adoption was pending (mine holds
			// the array's tag).
			continue
		case p.ends.departed[worker] != (attachedJob{}) && row.State == "PENDING":
			// Its worker attached in this process and left; the job was
			// requeued, and the worker's name is spent (ends.go).
			strays = append(strays, jobRef{job: row.ID, profile: profile, worker: worker,
				why: "requeued after its worker attached and left; its worker can never attach again"})
			continue
		case tag.Epoch != cfg.epoch:
			strays = append(strays, jobRef{job: row.ID, profile: profile, worker: worker,
				why: "its worker holds a credential signed with an earlier secret of the engine (epoch " + tag.Epoch + ") and can never attach"})
			continue
		case first && relayPinned:
			// An earlier run's relay made its own certificate, which
			// died with it: this job's workers pin that one, and no
			// relay of this run can be it (relaytls.go).
			strays = append(strays, jobRef{job: row.ID, profile: profile, worker: worker,
				why: "its workers dial the relay of an earlier run of the plugin, whose certificate they pin went with it, and can never attach"})
			continue
		case !first && row.State != "PENDING":
			continue // Its worker arrived, or will leave by itself.
		case why != "" && row.State == "PENDING":
			strays = append(strays, jobRef{job: row.ID, profile: profile, worker: worker, why: "found in the queue: " + why})
			continue
		case why != "":
			leftAlone = append(leftAlone, row)
			continue
		}
		for j, m := range machines {
			r := &request{profile: profile, worker: m, tag: tag.Worker, task: task, node: -1, nodes: nodes, batch: len(machines),
				since: now, cancel: func() {}, done: closedDone, job: row.ID, slurmState: row.State, phase: phaseQueued}
			if nodes > 1 {
				r.node = j
			}
			if row.State == "RUNNING" {
				r.running = now
			}
			p.outstanding[m] = r
			adopted = append(adopted, r)
		}
	}
	ad.supersedeWaitingLocked(adopted)
	// The caps are the provisioner's, not only the profile's: adopted
	// machines of one profile beside this run's requests for another can
	// put it over max_workers or max_pending, so requests still waiting
	// to submit give way, newest first, until both hold; where they are
	// not enough, the pending machines just adopted go.
	ad.yieldToCapsLocked(cfg)
	adopted, beyond := ad.beyondCapsLocked(cfg, adopted)
	strays = append(strays, beyond...)
	ad.adoptPending, ad.mine = false, nil
	p.mu.Unlock()

	ad.tell(ctx, cfg, host, first, adopted, leftAlone, strays, foreign)
}

// supersedeWaitingLocked has each request of this run that has not begun
// its submission yield to a machine of its profile adopted, one for one.
// The books are sorted once, not once an adopted machine: a restart that
// finds 10,000 would otherwise sort them 10,000 times. p.mu must be
// held.
func (ad *adopter) supersedeWaitingLocked(adopted []*request) {
	p := ad.p
	if len(adopted) == 0 {
		return
	}
	waiting := map[string][]*request{}
	for _, r := range p.sortedLocked() {
		if r.phase == phaseAwaitingAdoption {
			waiting[r.profile] = append(waiting[r.profile], r)
		}
	}
	for _, a := range adopted {
		if w := waiting[a.profile]; len(w) > 0 {
			w[0].phase = phaseSuperseded
			delete(p.outstanding, w[0].worker)
			waiting[a.profile] = w[1:]
		}
	}
}

// tell says what a look at the queue did: the engine hears of each
// machine adopted, the poller is woken for them, and the strays are
// cancelled; what was left alone is logged.
func (ad *adopter) tell(ctx context.Context, cfg *settings, host shared.Host, first bool, adopted []*request, leftAlone []queue.Job, strays []jobRef, foreign int) {
	p := ad.p
	if foreign > 0 {
		cfg.log.Debug("left alone jobs of the same name that are not this engine's", "count", foreign, "engine_id", cfg.engineID)
	}
	evs := make([]shared.Event, 0, len(adopted))
	for _, r := range adopted {
		msg := "adopted a machine left by an earlier run"
		if !first {
			msg = "adopted a machine that reached the queue after its submission was given up on"
		}
		cfg.log.Info(msg, "profile", r.profile, "job", r.job, "worker", r.worker, "state", r.slurmState)
		evs = append(evs, shared.Event{Kind: shared.EventWorkerProvisioned, Profile: r.profile, Job: r.job, Worker: r.worker,
			Detail: "found in the queue and adopted"})
	}
	// Back to back, then every acknowledgement: one round trip, not one
	// a machine.
	p.publishAll(p.life, cfg, host, evs)
	if first {
		for _, row := range leftAlone {
			cfg.log.Info("left alone a running job of an earlier run", "job", row.ID, "state", row.State, "comment", row.Comment)
		}
	}
	if len(adopted) > 0 {
		p.poll.wake()
	}
	if len(strays) > 0 {
		// What cannot be cancelled now is kept and tried again on each
		// poll cycle and at Shutdown (cancelJobs).
		p.cancels.cancelJobs(ctx, cfg, host, strays, "cancelled a job nobody will use")
	}
}

// yieldToCapsLocked supersedes requests that have not begun their
// submission, newest first, while the provisioner is over its max_workers
// or max_pending; it returns how many gave way. Adoption calls it: a
// request made before the first look at the queue was counted without the
// earlier run's jobs. An adopted job whose worker is attached counts
// twice here (in the books and among the attached) until the next call
// sees it arrive, which errs toward giving way: the next Provision asks
// again for what is then missing. p.mu must be held.
func (ad *adopter) yieldToCapsLocked(cfg *settings) int {
	p := ad.p
	over := ad.overCapsLocked(cfg)
	if over <= 0 {
		return 0
	}
	// Only the requests still waiting to submit can give way, and they
	// are few: they alone are sorted, not the books (which, at 10,000
	// outstanding, cost a tenth of a poll cycle).
	var waiting []*request
	for _, r := range p.outstanding {
		if r.phase == phaseAwaitingAdoption {
			waiting = append(waiting, r)
		}
	}
	slices.SortFunc(waiting, cmpNewest)
	yielded := 0
	for _, r := range waiting {
		if yielded >= over {
			break
		}
		r.phase = phaseSuperseded
		delete(p.outstanding, r.worker)
		yielded++
	}
	return yielded
}

// overCapsLocked is how many machines the provisioner holds beyond
// max_workers (those on their way and those attached) or max_pending,
// whichever is more; 0 or less when both hold. p.mu must be held.
func (ad *adopter) overCapsLocked(cfg *settings) int {
	p := ad.p
	counts := p.countsLocked()
	var alive, pending int
	for _, prof := range cfg.Profiles {
		c := counts[prof.Name]
		alive += c.pending + c.starting + p.workers.attached[prof.Name]
		pending += c.pending
	}
	return max(alive-*cfg.MaxWorkers, pending-*cfg.MaxPending)
}

// beyondCapsLocked takes out of the books the pending machines just
// adopted, newest job first, while the provisioner is still over
// max_workers or max_pending once the requests waiting to submit have
// given way, and returns the machines kept and the jobs to cancel. Such
// a job is a submission that reached the queue after this run filled
// its caps: one whose sbatch was given up on and went on, or one a
// killed predecessor left in flight. Adopted as it is, the cluster would
// run more machines than the operator allowed. A running job is never
// taken: its worker may be at work. A job goes whole, every machine of a
// multi-node allocation with it. p.mu must be held.
func (ad *adopter) beyondCapsLocked(cfg *settings, adopted []*request) (kept []*request, beyond []jobRef) {
	p := ad.p
	over := ad.overCapsLocked(cfg)
	if over <= 0 {
		return adopted, nil
	}
	byJob := map[string][]*request{}
	var jobs []string
	for _, r := range adopted {
		if r.slurmState != "PENDING" {
			continue
		}
		if byJob[r.job] == nil {
			jobs = append(jobs, r.job)
		}
		byJob[r.job] = append(byJob[r.job], r)
	}
	// Newest first: a later job id is a later submission.
	slices.SortFunc(jobs, func(a, b string) int { return cmpJobRef(b, a) })
	gone := map[*request]bool{}
	for _, job := range jobs {
		if over <= 0 {
			break
		}
		ms := byJob[job]
		ref := jobRef{job: job, profile: ms[0].profile, worker: ms[0].worker,
			why: fmt.Sprintf("found in the queue after its submission was given up on, with max_workers %d and max_pending %d already reached", *cfg.MaxWorkers, *cfg.MaxPending)}
		for _, m := range ms {
			delete(p.outstanding, m.worker)
			gone[m] = true
			if m != ms[0] {
				ref.others = append(ref.others, m.worker)
			}
		}
		beyond = append(beyond, ref)
		over -= len(ms)
	}
	for _, r := range adopted {
		if !gone[r] {
			kept = append(kept, r)
		}
	}
	return kept, beyond
}

// cmpJobRef orders job ids ("123") and array tasks ("123_4") as Slurm
// numbers them: by job, then by task, a plain job before its tasks.
func cmpJobRef(a, b string) int {
	ja, ta := sbatch.SplitTask(a)
	jb, tb := sbatch.SplitTask(b)
	if c := cmp.Compare(len(ja), len(jb)); c != 0 {
		return c
	}
	if c := strings.Compare(ja, jb); c != 0 {
		return c
	}
	return cmp.Compare(ta, tb)
}
