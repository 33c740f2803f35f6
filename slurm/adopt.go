package slurm

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

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
	lk := ad.lookLocked(cfg)
	for _, row := range rows {
		lk.rowLocked(row)
	}
	ad.supersedeWaitingLocked(lk.adopted)
	// The caps are the provisioner's, not only the profile's: adopted
	// machines of one profile beside this run's requests for another can
	// put it over max_workers or max_pending, so requests still waiting
	// to submit give way, newest first, until both hold; where they are
	// not enough, the pending machines just adopted go.
	ad.yieldToCapsLocked(cfg)
	adopted, beyond := ad.beyondCapsLocked(cfg, lk.adopted)
	lk.adopted, lk.strays = adopted, append(lk.strays, beyond...)
	ad.adoptPending, ad.mine = false, nil
	p.mu.Unlock()

	lk.tell(ctx, host)
}

// queueLook is one adopt's pass over the queue's rows, made under p.mu:
// what the books already hold, and what becomes of each machine of this
// engine that they do not. Its methods run with p.mu held.
type queueLook struct {
	ad  *adopter
	cfg *settings
	// first is set for Configure's look, which adopts running machines
	// too.
	first bool
	// relayPinned is set when workers pin the relay's own certificate,
	// which dies with the run that made it (relaytls.go).
	relayPinned bool
	now         time.Time
	// held is the workers of submissions in flight and of jobs being
	// cancelled; the rest of the books are looked up where they are
	// (oursLocked).
	held map[string]bool
	// byComment is what each comment says: an array's tasks share one,
	// and it is read once a cycle, not once a task.
	byComment map[string]commented

	adopted   []*request
	strays    []jobRef
	leftAlone []queue.Job
	// foreign counts the jobs of the same name that are not this
	// engine's.
	foreign int
}

// commented is what a job's comment says: its tag, whether the job is
// this engine's, and for one that is, the profile its worker is of or
// why it names none.
type commented struct {
	tag          sbatch.Tag
	mine         bool
	profile, why string
}

// lookLocked begins a look at the queue. p.mu must be held.
func (ad *adopter) lookLocked(cfg *settings) *queueLook {
	p := ad.p
	lk := &queueLook{ad: ad, cfg: cfg, first: ad.adoptPending, relayPinned: p.relay != nil && p.relay.tls != nil,
		now: p.now(), held: map[string]bool{}, byComment: map[string]commented{}}
	// The workers the books already hold: in p.outstanding and ad.mine,
	// looked up where they are, and those of submissions in flight or
	// jobs being cancelled, which are few. (Copying the books into one
	// set every cycle cost a third of a poll cycle at 10,000.)
	for r := range p.sub.inflight {
		lk.held[r.worker] = true
	}
	for _, j := range p.cancels.cancelling {
		for _, w := range j.workers() {
			lk.held[w] = true
		}
	}
	return lk
}

// submittedLocked reports whether worker w is of a submission of this
// run: in the books, in mine, or in flight. p.mu must be held.
func (lk *queueLook) submittedLocked(w string) bool {
	p := lk.ad.p
	return p.outstanding[w] != nil || lk.ad.mine[w] || lk.held[w]
}

// oursLocked reports whether worker w is in the books already. An
// attached worker's job is ours too: one pending again was requeued under
// its worker and is endedUnder's to cancel. p.mu must be held.
func (lk *queueLook) oursLocked(w string) bool {
	p := lk.ad.p
	if p.outstanding[w] != nil || lk.ad.mine[w] || lk.held[w] {
		return true
	}
	_, attached := p.ends.attachedJobs[w]
	_, reconciled := p.workers.reconciled[w]
	return attached || reconciled
}

// comment is what a job's comment says, read once a look.
func (lk *queueLook) comment(comment string) commented {
	c, known := lk.byComment[comment]
	if !known {
		c.tag, c.mine = lk.cfg.ours(comment)
		if c.mine {
			c.profile, c.why = lk.cfg.profileOf(c.tag.Worker)
		}
		lk.byComment[comment] = c
	}
	return c
}

// rowLocked decides what becomes of the machine a row of the queue
// stands for: left to this run, which holds it; a stray, cancelled; left
// alone; or adopted. p.mu must be held.
func (lk *queueLook) rowLocked(row queue.Job) {
	p, cfg, first := lk.ad.p, lk.cfg, lk.first
	if endedStates[row.State] || row.State == "COMPLETING" {
		return
	}
	c := lk.comment(row.Comment)
	tag, profile, why := c.tag, c.profile, c.why
	if !c.mine {
		lk.foreign++
		return
	}
	worker := machineWorker(tag.Worker, row.ID)
	machines := cfg.machinesOf(profile, worker)
	stray := func(reason string) {
		lk.strays = append(lk.strays, jobRef{job: row.ID, profile: profile, worker: worker, why: reason})
	}
	switch {
	case first && lk.relayPinned && !lk.submittedLocked(worker) && !lk.submittedLocked(machines[0]) && !lk.submittedLocked(tag.Worker):
		// An earlier run's relay made its own certificate, which
		// died with it: this job's workers pin that one, and no
		// relay of this run can be it (relaytls.go). So too for a
		// worker the engine still counts attached: it was attached
		// through the dead relay, and its job would hold a machine
		// of max_workers that nobody can use.
		stray("its workers dial the relay of an earlier run of the plugin, whose certificate they pin went with it, and can never attach")
	case lk.oursLocked(worker) || lk.oursLocked(machines[0]) || (first && lk.oursLocked(tag.Worker)):
		// This run's own: a machine in the books, or a task of an
		// array submitted while adoption was pending (mine holds
		// the array's tag).
	case p.ends.departed[worker] != (attachedJob{}) && row.State == "PENDING":
		// Its worker attached in this process and left; the job was
		// requeued, and the worker's name is spent (ends.go).
		stray("requeued after its worker attached and left; its worker can never attach again")
	case tag.Epoch != cfg.epoch:
		stray("its worker holds a credential signed with an earlier secret of the engine (epoch " + tag.Epoch + ") and can never attach")
	case !first && row.State != "PENDING":
		// Its worker arrived, or will leave by itself.
	case why != "" && row.State == "PENDING":
		stray("found in the queue: " + why)
	case why != "":
		lk.leftAlone = append(lk.leftAlone, row)
	default:
		lk.adoptLocked(row, c, machines)
	}
}

// adoptLocked puts the machines of row, a job or an array task of this
// engine's whose comment says c, in the books, its worker read from the
// tag and its task and its age counted from now. p.mu must be held.
func (lk *queueLook) adoptLocked(row queue.Job, c commented, machines []string) {
	p := lk.ad.p
	_, task := sbatch.SplitTask(row.ID)
	nodes := len(machines)
	for j, m := range machines {
		r := &request{profile: c.profile, worker: m, tag: c.tag.Worker, task: task, node: -1, nodes: nodes, batch: len(machines),
			since: lk.now, cancel: func() {}, done: closedDone, job: row.ID, slurmState: row.State, phase: phaseQueued}
		if nodes > 1 {
			r.node = j
		}
		if row.State == "RUNNING" {
			r.running = lk.now
		}
		p.outstanding[m] = r
		lk.adopted = append(lk.adopted, r)
	}
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

// tell says what the look did, after it: the engine hears of each
// machine adopted, the poller is woken for them, and the strays are
// cancelled; what was left alone is logged.
func (lk *queueLook) tell(ctx context.Context, host shared.Host) {
	p, cfg := lk.ad.p, lk.cfg
	if lk.foreign > 0 {
		cfg.log.Debug("left alone jobs of the same name that are not this engine's", "count", lk.foreign, "engine_id", cfg.engineID)
	}
	evs := make([]shared.Event, 0, len(lk.adopted))
	for _, r := range lk.adopted {
		msg := "adopted a machine left by an earlier run"
		if !lk.first {
			msg = "adopted a machine that reached the queue after its submission was given up on"
		}
		cfg.log.Info(msg, "profile", r.profile, "job", r.job, "worker", r.worker, "state", r.slurmState)
		evs = append(evs, shared.Event{Kind: shared.EventWorkerProvisioned, Profile: r.profile, Job: r.job, Worker: r.worker,
			Detail: "found in the queue and adopted"})
	}
	// Back to back, then every acknowledgement: one round trip, not one
	// a machine.
	p.publishAll(p.life, cfg, host, evs)
	if lk.first {
		for _, row := range lk.leftAlone {
			cfg.log.Info("left alone a running job of an earlier run", "job", row.ID, "state", row.State, "comment", row.Comment)
		}
	}
	if len(lk.adopted) > 0 {
		p.poll.wake()
	}
	if len(lk.strays) > 0 {
		// What cannot be cancelled now is kept and tried again on each
		// poll cycle and at Shutdown (cancelJobs).
		p.cancels.cancelJobs(ctx, cfg, host, lk.strays, "cancelled a job nobody will use")
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
