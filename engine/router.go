package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/engine/internal/supervise"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

// defaultProvisionTimeout bounds one Provision call unless
// router.provisionTimeout says otherwise. The contract says Provision
// returns at once; this is for a plugin that does not. Each target is
// asked on its own goroutine, so a stuck one delays only itself.
const defaultProvisionTimeout = 10 * time.Second

// passWait is how long a pass waits for the targets it asked before it
// goes on: long enough for a plugin that answers at once, as the contract
// asks, so that its outcome is logged in this pass. A target still
// answering after that keeps its round (and is not asked again until it
// ends) while the router serves the rest.
const passWait = 100 * time.Millisecond

// pool is the workers as the router sees them: which are idle and what
// each fits (their shape), who is attached by provisioner, and a way to
// hand one a task and learn how it went. The books are the pool of the
// project's worker protocol; the router asks provisioners for machines
// for exactly the needs its idle workers do not cover.
type pool interface {
	// IdleAndAttached lists the idle workers, smallest first, and from
	// the same moment every attached worker's name by its provisioner,
	// less those whose job ends within worker.EndMargin twice over: they
	// are leaving, and a cap has room for their replacements.
	IdleAndAttached() ([]WorkerInfo, map[string][]string)
	// IdleWorkers is IdleAndAttached's first half.
	IdleWorkers() []WorkerInfo
	// Assign gives worker a task, or fails if it left or is busy.
	Assign(worker string, t Task) error
	// TaskOutcome says how task id given to worker stands; a result is
	// handed over once.
	TaskOutcome(worker, id string) (Result, assignState)
	// Reported names the tasks that ended since its last call, by a
	// result or with their worker.
	Reported() []string
	// CancelTask stops task id on worker, and reports whether the
	// worker held it.
	CancelTask(worker, id string) bool
}

var _ pool = (*books)(nil)

// target is a provisioner as the router sees it. Shapes are fetched once,
// when the target is set up, so that asking "could it fit this?" is a
// loop over a slice and never a call across the plugin boundary.
type target struct {
	Name   string
	P      shared.Provisioner
	Shapes []shared.Shape
}

// covers reports whether any shape the target can start fits n.
func (t target) covers(n shared.Need) bool {
	for _, s := range t.Shapes {
		if s.Fits(n) {
			return true
		}
	}
	return false
}

// router matches needs to workers. A need goes to an idle attached worker
// that fits it if there is one; if there is none, every provisioner that
// could start one is asked to. Nothing is ever taken away from a worker,
// and a worker has one task at a time.
//
// Pass does the work and is meant to be called by the run loop, every
// second or so and whenever the books change. The other methods are
// reports and may be called from anywhere.
type router struct {
	// provisionTimeout bounds one Provision call; set before the first
	// Pass. newRouter sets defaultProvisionTimeout.
	provisionTimeout time.Duration

	logger hclog.Logger
	engine pool

	// pass serialises Pass. It is held across provisioner calls, so
	// nothing but Pass may take it: the reports use mu alone.
	pass sync.Mutex

	// mu guards needs (and every field of every needState), targets,
	// nextTask and busy. It is never held while calling a provisioner or
	// the engine.
	mu    sync.Mutex
	needs []*needState
	// added counts every need ever added, for their ids; needs holds only
	// the last keepServed served ones beside those not served yet.
	added int
	// forgotten counts the served needs dropped from needs.
	forgotten int
	// withdrawn counts the needs Withdraw took back.
	withdrawn int
	targets   []*targetState
	nextTask  int
	// busy names the targets with a round of Provision calls under way.
	busy map[string]bool
	// rising says the demand may have risen since the provisioners were
	// last asked (a need added, a task back to waiting, a target up, a
	// need refused or held back, a profile's hold changed), and asked is
	// when they were last asked: Step asks them again at once when
	// rising, else once provisionEvery has passed.
	rising bool
	asked  time.Time
	// out are the needs given a task, in the order they were given it,
	// for settle to ask about without reading every need; a need whose
	// task came back stays until settle drops it (needState.listed).
	out []*needState
	// servedSince counts the needs served since the oldest were last
	// forgotten (forgetServedLocked).
	servedSince int
	// unsorted says needs is not in matchOwn's order (the most
	// demanding first): a need was added that is more demanding than
	// the one before it. Taking needs out keeps an order, so it is only
	// ever set; while it is clear, matchOwn reads needs as they are.
	unsorted bool

	// rounds counts the goroutines asking targets; Close waits for them.
	rounds sync.WaitGroup

	// onDeadline, if set, is told after each Provision call whether the
	// target answered within provisionTimeout (missed true if not), so
	// that a plugin that keeps missing deadlines can be restarted. Set it
	// before the first Pass.
	onDeadline func(target string, missed bool)
	// onBurst, if set, hears of each Provision call that asked for or
	// cancelled machines of a profile. Set it before the first Pass.
	onBurst func(target string, pd shared.ProfileDemand)

	// holds is the engine's own backoff of failing profiles (backoff.go).
	holds *holds
	// mismatches are the profiles whose machines attached and could not
	// take a kind of waiting need (mismatch.go); guarded by mu.
	mismatches mismatchBook
	// onMismatch, if set, hears each mismatch new or renewed, with no
	// lock held. Set before the first Pass.
	onMismatch func(Mismatch)

	// tasks is the task table of the needs that are tasks (Submit);
	// nil for a router of stand-in needs alone. Set before the first
	// Pass.
	tasks *taskTable
	// place, if set, places waiting needs on idle workers instead of
	// match's own rule (Config.Place). Set before the first Pass.
	place func([]WaitingTask, []WorkerInfo) []Placement
	// onTask, if set, hears what became of a task (an attempt lost, the
	// task ended), after Pass or Cancel released every lock. Set before
	// the first Pass.
	onTask func(taskNews)

	// walked is when settle last asked about every task out; settle's,
	// under pass.
	walked time.Time
}

type targetState struct {
	target
	// down is set by setDown: the plugin is restarting or has failed,
	// and asking it would only produce errors.
	down bool
}

type needState struct {
	id   string
	need shared.Need
	// work is how long its task takes; zero for the stand-in.
	work time.Duration
	// rec is the task a need submitted with Submit is (nil for the
	// stand-in's need); its id is the need's.
	rec *taskRec
	// task and worker are set while a task for the need is out; listed
	// while the need is in router.out.
	task, worker string
	listed       bool
	served       bool
	// result is the worker's report, once served; ended is how a
	// task's need's task ended.
	result *Result
	ended  TaskState
	// lost counts the attempts of a task's need whose machine was lost.
	lost int32
	// uncovered is set once "nothing covers this" has been logged.
	uncovered bool
	// at is what each target asked has said about the need, in the
	// order they were first asked. A list, not a map per kind of fact:
	// a need is asked of one target or a few, and six maps a need were a
	// third of the engine's heap with 10,000 needs waiting.
	at []*needAt
}

// needAt is what one target has said about one need.
type needAt struct {
	target string
	// asked is the target's last outcome, as the status page shows it
	// (hasAsked: there is one); logged is the last one logged, so a pass
	// logs only what changed and an idle engine's log stays quiet.
	asked    asked
	hasAsked bool
	logged   loggedOutcome
	// failover is the last route around a backing-off profile that was
	// logged ("small -> cpu"); route, when set, is the need asked for
	// instead of need at the target, and tried the profiles tried on the
	// way there.
	failover string
	route    *shared.Need
	tried    map[string]bool
	// refused: the target could not fit the need or failed, and it is
	// asked of the next covering target instead.
	refused bool
	// profile is the profile the target last said it asks (or holds)
	// machines of for the need, for a mismatch to be told by.
	profile string
}

// atTarget is what target has said about ns, made when it has said
// nothing yet. p.mu must be held.
func (ns *needState) atTarget(target string) *needAt {
	if a := ns.seen(target); a != nil {
		return a
	}
	a := &needAt{target: target}
	ns.at = append(ns.at, a)
	return a
}

// seen is what target has said about ns, or nil. p.mu must be held.
func (ns *needState) seen(target string) *needAt {
	for _, a := range ns.at {
		if a.target == target {
			return a
		}
	}
	return nil
}

// newRouter returns a router that hands tasks out through engine and asks
// targets for machines.
func newRouter(logger hclog.Logger, engine pool, targets []target) *router {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	p := &router{provisionTimeout: defaultProvisionTimeout, logger: logger, engine: engine, busy: map[string]bool{}, holds: newHolds(nil), rising: true,
		mismatches: mismatchBook{m: map[mismatchKey]*mismatch{}}}
	for _, t := range targets {
		p.targets = append(p.targets, &targetState{target: t})
	}
	return p
}

// Add records a need to be served and returns its id.
func (p *router) Add(n shared.Need) string { return p.AddWork(n, 0) }

// AddWork records a need whose task takes work (zero: the worker's
// stand-in computation) and returns its id.
func (p *router) AddWork(n shared.Need, work time.Duration) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.added++
	id := "need-" + strconv.Itoa(p.added)
	n.Lifetime = lifetimeFor(work)
	p.appendLocked(&needState{id: id, need: n, work: work})
	return id
}

// addTask records the need of a task Submit made; its id is the
// task's.
func (p *router) addTask(rec *taskRec, n shared.Need) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n.Lifetime = lifetimeFor(rec.timeout)
	p.appendLocked(&needState{id: rec.id, need: n, rec: rec})
}

// appendLocked adds ns to the needs: the demand rises, and the needs
// may leave matchOwn's order. p.mu must be held.
func (p *router) appendLocked(ns *needState) {
	if n := len(p.needs); n > 0 && moreDemanding(ns.need, p.needs[n-1].need) < 0 {
		p.unsorted = true
	}
	p.needs = append(p.needs, ns)
	p.rising = true
}

// moreDemanding orders needs for matchOwn: negative when a is more
// demanding than b (more GPUs, then CPUs, then memory), so that it
// chooses a worker first.
func moreDemanding(a, b shared.Need) int {
	return cmp.Or(cmp.Compare(b.GPUs, a.GPUs), cmp.Compare(b.CPUs, a.CPUs), cmp.Compare(b.RAMMB, a.RAMMB))
}

// withdrawTask takes rec's need back if it waits: found says the router
// has it; withdrawn that it waited and is gone. A need of rec's whose
// task is reserved or out is not withdrawn (match, or the outcome, ends
// it as cancelled).
func (p *router) withdrawTask(rec *taskRec) (found, withdrawn bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, ns := range p.needs {
		if ns.rec != rec {
			continue
		}
		if ns.served || ns.task != "" {
			return true, false
		}
		p.needs = slices.Delete(p.needs, i, i+1)
		p.withdrawn++
		return true, true
	}
	return false, false
}

// Why Withdraw did not take a need back.
var (
	ErrNoSuchNeed = errors.New("no such need (or it was served long ago and forgotten)")
	ErrNeedServed = errors.New("the need is served already")
	// ErrNeedUnderWay: a worker runs its task. Nothing is taken from a
	// worker; the need will be served.
	ErrNeedUnderWay = errors.New("the need's task is under way on a worker")
)

// Withdraw takes back a need that still waits: it leaves the books, and
// the next pass tells its provisioner the smaller demand, which cancels
// what is still queued for it beyond the rest (demand is level-triggered:
// a need that is not counted is not wanted). A need whose task is out, or
// that is served, is not withdrawn, and the error says which.
func (p *router) Withdraw(id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, ns := range p.needs {
		if ns.id != id {
			continue
		}
		switch {
		case ns.served:
			return ErrNeedServed
		case ns.task != "":
			return ErrNeedUnderWay
		}
		p.needs = slices.Delete(p.needs, i, i+1)
		p.withdrawn++
		return nil
	}
	return ErrNoSuchNeed
}

// Withdrawn is how many needs Withdraw has taken back.
func (p *router) Withdrawn() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.withdrawn
}

// setTarget adds a target, or replaces the one of the same name: after a
// plugin restarts it has a new client and possibly new shapes. Replacing
// a target clears its down mark.
func (p *router) setTarget(t target) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rising = true
	p.mismatches.clear(t.Name)
	for i, ts := range p.targets {
		if ts.Name == t.Name {
			p.targets[i] = &targetState{target: t}
			return
		}
	}
	p.targets = append(p.targets, &targetState{target: t})
}

// shapesOf is the named target's shapes, nil if there is none.
func (p *router) shapesOf(name string) []shared.Shape {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ts := range p.targets {
		if ts.Name == name {
			return slices.Clone(ts.Shapes)
		}
	}
	return nil
}

// removeTarget takes the named target away: a reload removed its
// provisioner. Needs it covered fail over to the others, or wait.
func (p *router) removeTarget(name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rising = true
	p.targets = slices.DeleteFunc(p.targets, func(ts *targetState) bool { return ts.Name == name })
	p.mismatches.clear(name)
}

// setDown marks a target down (skipped by Pass) or up again.
func (p *router) setDown(name string, down bool) {
	p.mu.Lock()
	changed := false
	for _, ts := range p.targets {
		if ts.Name == name && ts.down != down {
			ts.down, changed = down, true
		}
	}
	if changed {
		p.rising = true
	}
	p.mu.Unlock()
	if changed {
		p.logger.Info("provisioner marked", "provisioner", name, "down", down)
	}
}

// Pass settles finished and lost tasks, gives waiting needs to idle
// workers, and asks for machines for the needs still waiting.
func (p *router) Pass(ctx context.Context) {
	for _, n := range p.passOnce(ctx, true) {
		p.tell(n)
	}
}

// provisionEvery is how often Step asks the provisioners for machines
// when nothing has raised the demand since it last did: the demand
// falls as waiting needs go to workers, and a provisioner hears of it
// (and gives up what it has pending beyond it) within this.
const provisionEvery = time.Second

// Step is the run loop's pass: it settles and matches as Pass does,
// and asks the provisioners as Pass does only when the demand may have
// risen since they were last asked (rising) or provisionEvery has
// passed. Asking costs a pass in proportion to the needs waiting (each
// is routed and told its outcome), and the run loop passes on every
// result: with 10,000 tasks queued, asking on each took a millisecond a
// task of the engine's CPU (bench, measurement 15), while settling and
// matching stop at the idle workers.
func (p *router) Step(ctx context.Context) {
	for _, n := range p.passOnce(ctx, false) {
		p.tell(n)
	}
}

// passOnce is Pass (ask true) or Step but for telling what became of
// tasks, which they do once every lock is released.
func (p *router) passOnce(ctx context.Context, ask bool) []taskNews {
	p.pass.Lock()
	defer p.pass.Unlock()
	now := time.Now()
	if !ask {
		p.mu.Lock()
		ask = p.rising || now.Sub(p.asked) >= provisionEvery
		p.mu.Unlock()
	}
	news := p.settle()
	waiting, more := p.match(ask)
	if ask {
		p.mu.Lock()
		p.rising, p.asked = false, now
		p.mu.Unlock()
		p.provision(ctx, waiting)
	}
	return append(news, more...)
}

// tell hands what became of a task to onTask; no lock may be held.
func (p *router) tell(n taskNews) {
	if p.onTask != nil {
		p.onTask(n)
	}
}

// settle asks the engine about every task out and records what it says.
// What became of tasks is returned, to be told without the locks.
//
// It asks about the tasks that ended since the last pass alone (a
// result, or a worker gone with its task), and about every task out
// once provisionEvery has passed since it last did: a pass for each
// result, or a storm of attaches, then costs in proportion to what
// ended, not to the tasks out.
func (p *router) settle() []taskNews {
	var news []taskNews
	ids := p.engine.Reported()
	all := false
	if now := time.Now(); now.Sub(p.walked) >= provisionEvery {
		all, p.walked = true, now
	}
	reported := make(map[string]bool, len(ids))
	for _, id := range ids {
		reported[id] = true
	}
	p.mu.Lock()
	var out []*needState
	type ref struct{ worker, task string }
	var refs []ref
	listed := p.out[:0]
	for _, ns := range p.out {
		if ns.task == "" {
			ns.listed = false
			continue
		}
		listed = append(listed, ns)
		if !all && !reported[ns.task] {
			continue
		}
		out = append(out, ns)
		refs = append(refs, ref{ns.worker, ns.task})
	}
	clear(p.out[len(listed):])
	p.out = listed
	p.mu.Unlock()

	for i, ns := range out {
		res, state := p.engine.TaskOutcome(refs[i].worker, refs[i].task)
		// What the worker said of a task's run goes to the task table;
		// the need keeps the report's header alone.
		kept := res
		kept.run = nil
		switch {
		case state == assignDone && ns.rec != nil:
			n, ok := p.tasks.finish(ns.rec, refs[i].task, res)
			p.mu.Lock()
			ns.served, ns.result, ns.task = true, &kept, ""
			ns.ended = n.res.State
			p.mu.Unlock()
			if ok {
				news = append(news, n)
			}
			p.logger.Debug("task ended", "task", ns.id, "attempt_id", res.TaskID, "worker", res.Worker, "host", res.Hostname,
				"state", n.res.State, "error", n.res.Error)
		case state == assignDone:
			p.mu.Lock()
			ns.served, ns.result, ns.task = true, &kept, ""
			p.mu.Unlock()
			p.logger.Debug("need served", "need", ns.id, "attempt_id", res.TaskID, "worker", res.Worker, "host", res.Hostname)
		case state == assignLost && ns.rec != nil:
			why := "its worker " + refs[i].worker + " left, or was given up on, without reporting it"
			if res.lostWhy != "" {
				why = "its worker " + refs[i].worker + " is gone: " + res.lostWhy
			}
			n, ok := p.tasks.lost(ns.rec, refs[i].task, why)
			ended := n.ended || (!ok && p.tasks.hasEnded(ns.rec))
			p.mu.Lock()
			ns.task, ns.worker = "", ""
			ns.lost++
			if ended {
				ns.served, ns.ended = true, n.res.State
			} else {
				p.rising = true
			}
			p.mu.Unlock()
			if ok {
				news = append(news, n)
			}
			p.logger.Warn("task lost with its worker", "task", ns.id, "attempt_id", refs[i].task, "worker", refs[i].worker,
				"again", n.again, "state", n.res.State)
		case state == assignLost:
			p.mu.Lock()
			ns.task, ns.worker = "", ""
			p.rising = true
			p.mu.Unlock()
			// Its worker left without reporting. The need is as unserved
			// as it ever was, and this pass places it again.
			p.logger.Warn("work lost with its worker", "need", ns.id, "attempt_id", refs[i].task, "worker", refs[i].worker)
		}
	}
	p.mu.Lock()
	for _, ns := range out {
		if ns.served {
			p.servedSince++
		}
	}
	if p.servedSince >= forgetEvery {
		p.forgetServedLocked(keepServed)
		p.servedSince = 0
	}
	p.mu.Unlock()
	return news
}

// keepServed is how many served needs the router remembers, for /status
// and the page. An engine that runs for weeks adds needs without end;
// keeping every one served made its memory and every /status answer grow
// with its age, without bound.
const keepServed = 1000

// forgetEvery is how many needs are served between two forgettings of
// the oldest: forgetting reads every need, and a pass that did it for
// each result cost in proportion to the queue.
const forgetEvery = 100

// forgetServedLocked drops the oldest served needs beyond keep; those not
// yet served are never dropped. p.mu must be held.
func (p *router) forgetServedLocked(keep int) {
	served := 0
	for _, ns := range p.needs {
		if ns.served {
			served++
		}
	}
	drop := served - keep
	if drop <= 0 {
		return
	}
	kept := p.needs[:0]
	for _, ns := range p.needs {
		if ns.served && drop > 0 {
			drop--
			p.forgotten++
			continue
		}
		kept = append(kept, ns)
	}
	clear(p.needs[len(kept):])
	p.needs = kept
}

// plan is a waiting need placed on an idle worker, with the task it
// is assigned.
type plan struct {
	ns     *needState
	worker WorkerInfo
	task   Task
}

// match gives each waiting need an idle worker that fits it (its need,
// and the features its task requires): the router's own rule
// (matchOwn), or the embedder's (Config.Place). It returns the needs
// left waiting (with the embedder's rule, or when wantWaiting), and
// what became of tasks that ended before they could start (cancelled).
func (p *router) match(wantWaiting bool) ([]*needState, []taskNews) {
	if p.place == nil && !p.anyWaiting() {
		// Nothing to place: the idle workers are not listed, so that a
		// pass for each of ten thousand attaches costs no more than the
		// needs it reads.
		return nil, nil
	}
	idle := p.engine.IdleWorkers()
	var plans []plan
	var waiting []*needState
	if p.place != nil {
		plans, waiting = p.matchPlaced(idle)
	} else {
		var told []Mismatch
		plans, waiting, told = p.matchOwn(idle, wantWaiting)
		for _, m := range told {
			p.logger.Warn("a machine asked for waiting tasks cannot take them; its profile is not asked for such tasks for a while",
				"provisioner", m.Provisioner, "profile", m.Profile, "worker", m.Worker, "task", m.Task, "cause", m.Cause,
				"detail", m.Detail, "until", m.Until, "machines", m.Count)
			if p.onMismatch != nil {
				p.onMismatch(m)
			}
		}
	}

	var news []taskNews
	for _, pl := range plans {
		t := pl.task
		if rec := pl.ns.rec; rec != nil {
			var outcome beginOutcome
			t, outcome = p.tasks.begin(rec, pl.task, pl.worker)
			if outcome != begun {
				// Cancelled (or ended) before it began: it ends here.
				p.mu.Lock()
				pl.ns.task, pl.ns.worker, pl.ns.served = "", "", true
				p.mu.Unlock()
				if outcome == beginCancelled {
					if n, ok := p.tasks.end(rec, worker.StateCancelled, "cancelled while it waited"); ok {
						news = append(news, n)
					}
				}
				state := p.tasks.stateOf(rec)
				p.mu.Lock()
				pl.ns.ended = state
				p.mu.Unlock()
				continue
			}
		}
		if err := p.engine.Assign(pl.worker.Name, t); err != nil {
			// It left (or was given up on) since IdleWorkers; try
			// elsewhere this very pass.
			if pl.ns.rec != nil {
				p.tasks.unbegin(pl.ns.rec, t.ID)
			}
			p.mu.Lock()
			pl.ns.task, pl.ns.worker = "", ""
			p.mu.Unlock()
			waiting = append(waiting, pl.ns)
			continue
		}
		// Cancel marks the task before it asks the books to stop it: a
		// cancel that came between begin and Assign found nothing to
		// stop, and is seen here.
		if pl.ns.rec != nil && p.tasks.cancelled(pl.ns.rec) {
			p.engine.CancelTask(pl.worker.Name, t.ID)
		}
		p.logger.Debug("task assigned", "task", pl.ns.id, "attempt", t.Attempt, "attempt_id", t.ID, "worker", pl.worker.Name)
	}
	return waiting, news
}

// anyWaiting reports whether a need waits for a worker.
func (p *router) anyWaiting() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.ContainsFunc(p.needs, (*needState).waitsLocked)
}

// fits reports whether w can take ns's task: its shape fits the need,
// it has every feature the task requires, and its job has time left for
// the task's timeout.
func (ns *needState) fits(w WorkerInfo) bool { return ns.fitsAt(w, time.Now()) }

// fitsAt is fits at now.
func (ns *needState) fitsAt(w WorkerInfo, now time.Time) bool {
	return w.shape().Fits(ns.need) && (ns.rec == nil || w.has(ns.rec.requires)) && ns.timeFits(w, now)
}

// timeFits reports whether w's job has time for ns's task at now.
func (ns *needState) timeFits(w WorkerInfo, now time.Time) bool {
	return w.timeFor(ns.runFor(), now)
}

// runFor is how long ns's task may run: a task's timeout (zero: none),
// the stand-in's work.
func (ns *needState) runFor() time.Duration {
	if ns.rec != nil {
		return ns.rec.timeout
	}
	return ns.work
}

// waitsLocked reports whether ns waits for a worker. p.mu must be held.
func (ns *needState) waitsLocked() bool { return !ns.served && ns.task == "" }

// reserveLocked gives ns a task on w, reserved now, under p.mu, so that
// Withdraw cannot take the need back between here and Assign: a task
// would then run for a need nobody tracks. p.mu must be held.
func (p *router) reserveLocked(ns *needState, w WorkerInfo) plan {
	p.nextTask++
	t := Task{ID: "task-" + strconv.Itoa(p.nextTask), Need: toNeedJSON(ns.need), WorkSeconds: ns.work.Seconds()}
	ns.task, ns.worker = t.ID, w.Name
	if !ns.listed {
		ns.listed = true
		p.out = append(p.out, ns)
	}
	return plan{ns, w, t}
}

// requiresKey is a task's features as one string, without building one
// for the one feature every task requires today.
func requiresKey(requires []string) string {
	if len(requires) == 1 {
		return requires[0]
	}
	return strings.Join(requires, ",")
}

// matchOwn is the router's own rule: the most demanding needs choose
// first, each taking the smallest idle worker that fits it. It returns
// the needs left waiting only when wantWaiting; without, it stops once
// every idle worker is taken, so that a pass that only hands out tasks
// costs in proportion to the workers, not to the needs waiting. An idle
// worker left with nothing while a kind of need asked of its profile
// waits that it cannot take is a mismatch (mismatch.go): told, the
// third result.
func (p *router) matchOwn(idle []WorkerInfo, wantWaiting bool) ([]plan, []*needState, []Mismatch) {
	var plans []plan
	var waiting []*needState
	if len(idle) == 0 && !wantWaiting {
		return nil, nil, nil
	}
	taken := make([]bool, len(idle))
	free := len(idle)

	p.mu.Lock()
	defer p.mu.Unlock()
	// The most demanding needs choose first, each taking the smallest
	// idle worker that fits it: a GPU worker that attaches while a GPU
	// need and a CPU need both wait goes to the GPU need. An idle worker
	// that fits a waiting need always gets it, even if another worker
	// asked for that need is on its way: capacity in hand beats capacity
	// in a queue. Needs added in that order (a burst's, all alike) are
	// read as they are.
	order := p.needs
	if p.unsorted {
		order = slices.Clone(p.needs)
		slices.SortStableFunc(order, func(a, b *needState) int { return moreDemanding(a.need, b.need) })
	}
	// unfit holds the kinds of need no idle worker left fits. Workers
	// are only taken as the pass goes on, so such a need stays unfit to
	// its end, and the needs like it (a burst's are all alike) skip the
	// scan: with 10,000 needs waiting and workers attaching, scanning
	// the idle list for each made a pass cost needs × idle workers. The
	// last kind (need, features, timeout) is kept beside: alike needs
	// come in a row.
	type kind struct {
		need     shared.Need
		requires string
		timeout  time.Duration
	}
	unfit := map[kind]bool{}
	// unfitOnes has one need of each kind in unfit, for the mismatches.
	var unfitOnes []*needState
	var last kind
	lastUnfit, haveLast := false, false
	for _, ns := range order {
		if !ns.waitsLocked() {
			continue
		}
		if free == 0 {
			if !wantWaiting {
				break
			}
			waiting = append(waiting, ns)
			continue
		}
		k := kind{need: ns.need}
		if ns.rec != nil {
			k.requires, k.timeout = requiresKey(ns.rec.requires), ns.rec.timeout
		}
		if !haveLast || k != last {
			last, lastUnfit, haveLast = k, unfit[k], true
		}
		if lastUnfit {
			if wantWaiting {
				waiting = append(waiting, ns)
			}
			continue
		}
		found := false
		for i, w := range idle {
			if !taken[i] && ns.fits(w) {
				taken[i], found = true, true
				free--
				plans = append(plans, p.reserveLocked(ns, w))
				p.mismatches.served(w, ns)
				break
			}
		}
		if !found {
			unfit[k], lastUnfit = true, true
			unfitOnes = append(unfitOnes, ns)
			if wantWaiting {
				waiting = append(waiting, ns)
			}
		}
	}
	if free == 0 || len(unfitOnes) == 0 {
		return plans, waiting, nil
	}
	left := make([]WorkerInfo, 0, free)
	for i, w := range idle {
		if !taken[i] {
			left = append(left, w)
		}
	}
	told := p.mismatches.note(left, unfitOnes, time.Now())
	if len(told) > 0 {
		p.rising = true
	}
	return plans, waiting, told
}

// provision tells every target that is up its whole demand: the waiting
// needs routed to it, grouped by need. A need goes to the first target
// that covers it and has not refused it (no fit, an error); a profile
// backing off is routed around inside its target by asking for the next
// fitting shape instead. Targets with no demand are told so too, because
// demand is level-triggered: a provisioner cancels what it has pending
// beyond what it is told, and keeps its warm minimum. Each target is asked
// on a goroutine of its own, and the pass waits at most passWait for them:
// a target that hangs delays only itself, and is not asked again while its
// round lasts.
func (p *router) provision(ctx context.Context, waiting []*needState) {
	p.mu.Lock()
	targets := make([]targetState, 0, len(p.targets))
	for _, ts := range p.targets {
		targets = append(targets, *ts)
	}
	p.mu.Unlock()

	rounds := map[string]*round{}
	for _, t := range targets {
		if !t.down {
			rounds[t.Name] = &round{}
		}
	}
	// A worker may have attached since match looked: it is idle and will
	// take a waiting need on the next pass. That need is covered, not
	// wanted; counting it would ask for a machine now and give one up the
	// pass after, when the demand falls back.
	idle, attached := p.engine.IdleAndAttached()
	now := time.Now()
	taken := make([]bool, len(idle))
	// Needs whose profile the engine holds back (backoff.go): each held
	// profile is asked for at most its allowance this pass, and the rest
	// are answered BACKING_OFF here, without asking the plugin.
	type heldNeed struct {
		t      target
		ns     *needState
		need   shared.Need
		o      shared.DemandOutcome
		reason WaitReason
	}
	var held []heldNeed
	routed := map[holdKey]int{}
	// Needs a mismatch holds back (mismatch.go), told so without asking;
	// retried marks the mismatches a need was asked for once their
	// hold passed: one at a time.
	type mismatchedNeed struct {
		target string
		ns     *needState
		words  string
	}
	var mismatched []mismatchedNeed
	retried := map[*mismatch]bool{}
	// What a pass works out for a need depends on the need alone (the
	// targets covering it; a target's profile for it and that profile's
	// hold), and a queue's needs come alike in a row: each is worked out
	// once for the need before, not once for every need waiting.
	var (
		coverNeed  shared.Need
		covering   []targetState
		haveCover  bool
		profTarget string
		profNeed   shared.Need
		profile    string
		profOK     bool
		keep       int
		hold       holdState
	)
	var uncovered []*needState
	p.mu.Lock()
	for _, ns := range waiting {
		covered := false
		for i, w := range idle {
			if !taken[i] && ns.fitsAt(w, now) {
				taken[i], covered = true, true
				break
			}
		}
		if covered {
			continue
		}
		if !haveCover || ns.need != coverNeed {
			coverNeed, covering, haveCover = ns.need, nil, true
			for _, t := range targets {
				if t.covers(ns.need) {
					covering = append(covering, t)
				}
			}
		}
		t, ok := p.routeLocked(ns, covering)
		if !ok {
			if len(covering) == 0 && !ns.uncovered {
				ns.uncovered = true
				uncovered = append(uncovered, ns)
			}
			continue
		}
		need := ns.need
		if a := ns.seen(t.Name); a != nil && a.route != nil {
			need = *a.route
		}
		var words string
		if need, words = p.mismatches.route(t.target, ns, need, now, retried); words != "" {
			mismatched = append(mismatched, mismatchedNeed{t.Name, ns, words})
			continue
		}
		if profTarget != t.Name || need != profNeed {
			profTarget, profNeed = t.Name, need
			profile, profOK = profileFor(t.Shapes, need)
			keep = -1
			if profOK {
				keep, hold = p.holds.allowance(t.Name, profile)
			}
		}
		if profOK {
			k := holdKey{t.Name, profile}
			if keep >= 0 && routed[k] >= keep {
				held = append(held, heldNeed{t.target, ns, need, shared.DemandOutcome{Outcome: shared.OutcomeBackingOff, Profile: profile, Detail: holdDetail(hold)}, holdReason(hold)})
				continue
			}
			routed[k]++
		}
		rounds[t.Name].add(need, ns)
	}
	p.mu.Unlock()
	// Logged once p.mu is released: the log may be slow.
	for _, ns := range uncovered {
		p.logger.Warn("no provisioner can start a machine for this need", "need", ns.id, "spec", FormatNeed(ns.need))
	}
	for _, h := range held {
		p.noteDemand(h.t, h.ns, h.need, h.o, wordsOf(h.o), h.reason)
	}
	for _, m := range mismatched {
		p.noteOutcome(m.ns, m.target, ReasonMismatch, m.words, []any{"outcome", "mismatch"})
	}
	p.ask(ctx, targets, rounds, attached)
}

// ask tells each target that is not still answering the last pass its
// round, each on a goroutine of the router's (rounds), and waits for
// them at most passWait: a slow plugin's answer lands in a later pass.
func (p *router) ask(ctx context.Context, targets []targetState, rounds map[string]*round, attached map[string][]string) {
	var started sync.WaitGroup
	for _, t := range targets {
		rd := rounds[t.Name]
		if rd == nil {
			continue
		}
		p.mu.Lock()
		if p.busy[t.Name] {
			p.mu.Unlock()
			continue
		}
		p.busy[t.Name] = true
		p.mu.Unlock()
		started.Add(1)
		p.rounds.Add(1)
		go func() {
			defer p.rounds.Done()
			defer started.Done()
			p.askTarget(ctx, t.target, rd, attached[t.Name])
			p.mu.Lock()
			delete(p.busy, t.Name)
			p.mu.Unlock()
		}()
	}
	done := make(chan struct{})
	go func() {
		started.Wait()
		close(done)
	}()
	timer := time.NewTimer(passWait)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
	case <-ctx.Done():
	}
}

// round is one target's demand in a pass: an entry per distinct need, and
// the waiting needs each entry stands for.
type round struct {
	demand []shared.Demand
	needs  [][]*needState
}

func (r *round) add(n shared.Need, ns *needState) {
	for i, d := range r.demand {
		if d.Need == n {
			r.demand[i].Count++
			r.needs[i] = append(r.needs[i], ns)
			return
		}
	}
	r.demand = append(r.demand, shared.Demand{Need: n, Count: 1})
	r.needs = append(r.needs, []*needState{ns})
}

// routeLocked picks the target a waiting need is asked of this pass
// among covering, the targets that cover it: the first that is up and
// has not refused it. When every covering target has refused it, the
// refusals are forgotten and the first is asked again: what refused may
// have changed (a restart, a backoff over). p.mu must be held.
func (p *router) routeLocked(ns *needState, covering []targetState) (targetState, bool) {
	for pass := 0; pass < 2; pass++ {
		for _, t := range covering {
			if t.down {
				a := ns.atTarget(t.Name)
				a.asked, a.hasAsked = asked{reason: ReasonProvisionerDown, desc: "down"}, true
				a.logged = loggedOutcome{kind: "down", desc: "down"}
				continue
			}
			if a := ns.seen(t.Name); a == nil || !a.refused {
				return t, true
			}
		}
		for _, a := range ns.at {
			a.refused = false
		}
	}
	return targetState{}, false
}

// askTarget tells one target its demand and records, need by need, what
// it did. A profile backing off makes its needs ask for the next fitting
// shape from the next pass on, so that a larger profile that works serves
// them instead of their waiting on the broken one; a need the target
// cannot fit, or a call that fails, is routed to the next covering target.
func (p *router) askTarget(ctx context.Context, t target, rd *round, attached []string) {
	callCtx, cancel := context.WithTimeout(ctx, p.provisionTimeout)
	resp, err := t.P.Provision(callCtx, &shared.ProvisionRequest{Demand: rd.demand, Attached: attached})
	// The pass's own end cuts the call short (supervise.Ended).
	cutShort := supervise.Ended(ctx)
	missed := !cutShort && supervise.MissedDeadline(callCtx, err)
	cancel()
	if p.onDeadline != nil {
		p.onDeadline(t.Name, missed)
	}
	if missed {
		err = fmt.Errorf("no answer within %s", p.provisionTimeout)
	}
	if err != nil && cutShort {
		// The pass itself was cut short (the run is over, the engine
		// stops): the provisioner said nothing, and each need keeps its
		// last answer, such as "login needed", not the cut's words.
		return
	}
	if err == nil && len(resp.Outcomes) != len(rd.demand) {
		err = fmt.Errorf("%d outcomes for %d demand entries", len(resp.Outcomes), len(rd.demand))
	}
	if err != nil {
		for _, needs := range rd.needs {
			for _, ns := range needs {
				p.refuse(ns, t.Name)
				p.noteOutcome(ns, t.Name, ReasonError, "error: "+err.Error(), []any{"error", err})
			}
		}
		return
	}
	p.holds.reported(t.Name, resp.Profiles)
	p.noteProfiles(t.Name, resp.Profiles)
	for i, o := range resp.Outcomes {
		// One description an outcome, shared by its needs: a burst of
		// 10,000 is one outcome.
		words := wordsOf(o)
		switch o.Outcome {
		case shared.OutcomeNoFit, shared.OutcomeBackingOff:
			// Each need is routed anew.
			for _, ns := range rd.needs[i] {
				p.noteDemand(t, ns, rd.demand[i].Need, o, words, reasonOf(o))
			}
		default:
			if o.Profile != "" {
				p.mu.Lock()
				for _, ns := range rd.needs[i] {
					ns.atTarget(t.Name).profile = o.Profile
				}
				p.mu.Unlock()
			}
			p.noteOutcomes(rd.needs[i], t.Name, reasonOf(o), words.desc, words.kv, true)
		}
	}
}

// outcomeWords is an outcome as the status page says it (desc) and as
// the log records it (kv).
type outcomeWords struct {
	desc string
	kv   []any
}

func wordsOf(o shared.DemandOutcome) outcomeWords {
	desc := o.Outcome.String()
	if o.Profile != "" {
		desc += " " + o.Profile
	}
	if o.Detail != "" {
		desc += ": " + o.Detail
	}
	return outcomeWords{desc, []any{"outcome", o.Outcome.String(), "profile", o.Profile, "detail", o.Detail}}
}

// noteDemand records what a target did about one need: o, in words.
func (p *router) noteDemand(t target, ns *needState, asked shared.Need, o shared.DemandOutcome, words outcomeWords, reason WaitReason) {
	desc := words.desc
	switch o.Outcome {
	case shared.OutcomeNoFit:
		p.refuse(ns, t.Name)
	case shared.OutcomeBackingOff:
		// Ask for the next fitting shape from the next pass on. The
		// smallest profile that fits it is its own, unless one that fits
		// it is tried already; then a later pass tries the one after.
		p.mu.Lock()
		at := ns.atTarget(t.Name)
		if at.tried == nil {
			at.tried = map[string]bool{}
		}
		at.tried[o.Profile] = true
		next, ok := nextShape(t.Shapes, ns.need, at.tried)
		var route string
		if ok {
			at.tried[next.Profile] = true
			at.route = &shared.Need{CPUs: max(asked.CPUs, next.CPUs), GPUs: max(asked.GPUs, next.GPUs),
				RAMMB: max(asked.RAMMB, next.RAMMB), Label: ns.need.Label, Lifetime: max(asked.Lifetime, next.Lifetime)}
			route = o.Profile + " -> " + next.Profile
		} else {
			// Every shape backs off: back to the smallest, and let the
			// other targets have a go.
			at.route, at.tried, at.refused = nil, nil, true
		}
		changed := route != "" && at.failover != route
		if route != "" {
			at.failover = route
		}
		// Asked elsewhere from the next pass on.
		p.rising = true
		p.mu.Unlock()
		if changed {
			p.logger.Warn("profile backing off; asking for the next fitting profile instead", "need", ns.id, "provisioner", t.Name,
				"failed_over_from", o.Profile, "profile", next.Profile)
		}
	}
	p.noteOutcomes([]*needState{ns}, t.Name, reason, desc, words.kv, o.Outcome != shared.OutcomeBackingOff)
}

// refuse routes ns away from target until every covering target has
// refused it.
func (p *router) refuse(ns *needState, target string) {
	p.mu.Lock()
	ns.atTarget(target).refused = true
	p.rising = true
	p.mu.Unlock()
}

// noteProfiles keeps what a target said about its profiles, for the
// story and GET /status, and logs a burst when one was asked for.
func (p *router) noteProfiles(target string, profiles []shared.ProfileDemand) {
	for _, pd := range profiles {
		if pd.Requested > 0 || pd.Cancelled > 0 {
			p.logger.Info("provisioner asked for machines", "provisioner", target, "profile", pd.Profile, "wanted", pd.Wanted,
				"requested", pd.Requested, "submissions", pd.Submissions, "cancelled", pd.Cancelled, "on_the_way", pd.OnTheWay, "attached", pd.Attached)
			if p.onBurst != nil {
				p.onBurst(target, pd)
			}
		}
	}
}

// nextShape is the first of shapes, in the provisioner's match order,
// that fits n and whose profile has not been tried.
func nextShape(shapes []shared.Shape, n shared.Need, tried map[string]bool) (shared.Shape, bool) {
	for _, s := range shapes {
		if !tried[s.Profile] && s.Fits(n) {
			return s, true
		}
	}
	return shared.Shape{}, false
}

// busyWith reports whether a round of Provision calls to target is under
// way.
func (p *router) busyWith(target string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.busy[target]
}

// Close waits for the rounds of Provision calls still under way, each
// bounded by provisionTimeout.
func (p *router) Close() {
	p.rounds.Wait()
}

// relogDetail is how often a need is logged again when only a
// provisioner's free-text detail changed, not its outcome or profile. A
// detail is the plugin's to word, and one that carries an age or a count
// changes every pass; the outcome is what an operator follows.
const relogDetail = time.Minute

// loggedOutcome is what was last logged of a need at a target: its kind
// (the outcome and profile, desc up to the detail), desc, and when.
type loggedOutcome struct {
	kind, desc string
	at         time.Time
}

// noteOutcome records what a target said about a need and logs it when
// it says something new: another outcome or profile at once, an error at
// once, a new detail of the same outcome at most every relogDetail.
func (p *router) noteOutcome(ns *needState, target string, reason WaitReason, desc string, kv []any) {
	p.noteOutcomes([]*needState{ns}, target, reason, desc, kv, false)
}

// noteOutcomes is noteOutcome for needs told the same outcome, under
// one hold of p.mu; with failedOver, a need that was failed over to
// another profile says so before desc. The needs it logs are one line:
// the first need's, with how many and the last when there are more (a
// queue of 100,000 alike tasks was 100,000 lines on its first pass).
func (p *router) noteOutcomes(needs []*needState, target string, reason WaitReason, desc string, kv []any, failedOver bool) {
	kind, _, _ := strings.Cut(desc, ": ")
	now := time.Now()
	var firstID, lastID string
	logged := 0
	p.mu.Lock()
	for _, ns := range needs {
		at := ns.atTarget(target)
		d, k := desc, kind
		if failedOver && at.failover != "" {
			d = "failed over (" + at.failover + "): " + desc
			k, _, _ = strings.Cut(d, ": ")
		}
		at.asked, at.hasAsked = asked{reason: reason, desc: d}, true
		last := at.logged
		changed := d != last.desc &&
			(k != last.kind || reason == ReasonError || now.Sub(last.at) >= relogDetail)
		if changed {
			at.logged = loggedOutcome{kind: k, desc: d, at: now}
			if logged == 0 {
				firstID = ns.id
			}
			lastID = ns.id
			logged++
		}
	}
	p.mu.Unlock()
	if logged == 0 {
		return
	}
	args := []any{"need", firstID}
	if logged > 1 {
		args = append(args, "needs", logged, "last_need", lastID)
	}
	args = append(append(args, "provisioner", target), kv...)
	if reason == ReasonError {
		p.logger.Error("could not ask for a machine", args...)
		return
	}
	p.logger.Debug("asked for a machine", args...)
}

// Served reports whether every need has been served. With no needs, it
// is trivially true.
func (p *router) Served() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ns := range p.needs {
		if !ns.served {
			return false
		}
	}
	return true
}

// Unserved describes each need not yet served, one line each, for a
// person wondering why the engine is still waiting.
func (p *router) Unserved() []string {
	var lines []string
	for _, st := range p.Needs() {
		if st.State != NeedServed {
			lines = append(lines, fmt.Sprintf("%s (%s): %s", st.ID, st.Spec, st.Detail))
		}
	}
	return lines
}

// NeedPhase is where a need stands.
type NeedPhase string

const (
	NeedWaiting  NeedPhase = "waiting"
	NeedAssigned NeedPhase = "assigned"
	NeedServed   NeedPhase = "served"
)

// WaitReason is why a waiting need waits, as the page, GET /status and
// a metric show it; Detail says it in words.
type WaitReason string

const (
	// ReasonNotAsked: a provisioner covers it, but none was asked yet.
	ReasonNotAsked WaitReason = "not_asked"
	// ReasonNoFit: no provisioner can start a machine this big.
	ReasonNoFit WaitReason = "no_fit"
	// ReasonTooLong: machines large enough exist, but none lasts the
	// task's timeout plus the worker's end margin.
	ReasonTooLong WaitReason = "too_long"
	// ReasonMismatch: a machine of the profile it was asked of attached
	// and could not take it (a feature it lacks, too little time left,
	// less than its profile says); no other of that profile is asked for
	// it until the mismatch's hold passes, and then one at a time.
	ReasonMismatch WaitReason = "mismatch"
	// ReasonQueued: asked for; its machine is on its way (queued in the
	// scheduler, or starting).
	ReasonQueued WaitReason = "queued"
	// ReasonCapped: a cap of the provisioner's configuration
	// (max_workers, max_pending) holds it below the demand; also a
	// provisioner's CAPPED that names no condition (before contract 2.5).
	ReasonCapped WaitReason = "capped"
	// ReasonSiteLimit: an accounting limit of the site's holds it;
	// weather that clears as jobs end.
	ReasonSiteLimit WaitReason = "site_limit"
	// ReasonThrottled: the site's submit throttle gives submissions back
	// in its own time; weather.
	ReasonThrottled WaitReason = "throttled"
	// ReasonClusterFull: the cluster takes no new job; weather.
	ReasonClusterFull WaitReason = "cluster_full"
	// ReasonLoginNeeded: a person must log in before the provisioner
	// asks for anything.
	ReasonLoginNeeded WaitReason = "login_needed"
	// ReasonBackingOff: the profile's machines failed in a row.
	ReasonBackingOff WaitReason = "backing_off"
	// ReasonMisconfigured: the profile's machines failed for its
	// configuration; the operator must fix it.
	ReasonMisconfigured WaitReason = "misconfigured"
	// ReasonProvisionerDown: the provisioners that cover it are
	// restarting or failed.
	ReasonProvisionerDown WaitReason = "provisioner_down"
	// ReasonError: asking failed (the plugin answered an error).
	ReasonError WaitReason = "error"
)

// asked is what a target last said about a need.
type asked struct {
	reason WaitReason
	desc   string
}

// conditionReasons are the reasons a CAPPED or BACKING_OFF outcome's
// condition makes a need wait for.
var conditionReasons = map[shared.Condition]WaitReason{
	shared.ConditionCap:           ReasonCapped,
	shared.ConditionSiteLimit:     ReasonSiteLimit,
	shared.ConditionThrottled:     ReasonThrottled,
	shared.ConditionClusterFull:   ReasonClusterFull,
	shared.ConditionLoginNeeded:   ReasonLoginNeeded,
	shared.ConditionBackingOff:    ReasonBackingOff,
	shared.ConditionMisconfigured: ReasonMisconfigured,
}

// reasonOf is what a Provision outcome makes a need wait for: its
// condition, where a held-back outcome names one, else the outcome alone
// (a plugin before contract 2.5 names none).
func reasonOf(o shared.DemandOutcome) WaitReason {
	switch o.Outcome {
	case shared.OutcomeNoFit:
		return ReasonNoFit
	case shared.OutcomeBackingOff, shared.OutcomeCapped:
		if r, ok := conditionReasons[o.Condition]; ok {
			return r
		}
		if o.Outcome == shared.OutcomeBackingOff {
			return ReasonBackingOff
		}
		return ReasonCapped
	}
	return ReasonQueued
}

// NeedStatus is one need as GET /status shows it. A need of a task
// Submit made is the task: its ID is the task's id, the one every
// surface names it by; the attempt under way or that served it is a
// number beside it (Attempt), with its AttemptID for the workers'
// routes.
type NeedStatus struct {
	ID string `json:"id"`
	// Spec is the need as -need takes it.
	Spec  string      `json:"spec"`
	Need  worker.Need `json:"need"`
	State NeedPhase   `json:"state"`
	// TaskState is where a task's need's task stands: waiting, running,
	// or how it ended; empty for a need without a task (the stand-in's).
	TaskState TaskState `json:"task_state,omitempty"`
	// Reason is why it waits, while it does.
	Reason WaitReason `json:"reason,omitempty"`
	// Worker, Task, Attempt and AttemptID are set while assigned and
	// once served. Task is the task's id (the need's own, for a task
	// Submit made; empty for the stand-in's work, which is no task).
	Worker    string `json:"worker,omitempty"`
	Task      string `json:"task,omitempty"`
	Attempt   int    `json:"attempt,omitempty"`
	AttemptID string `json:"attempt_id,omitempty"`
	// Detail says what the need is waiting for, or what served it.
	Detail string  `json:"detail"`
	Result *Result `json:"result,omitempty"`
}

// Needs reports every need, in the order they were added.
func (p *router) Needs() []NeedStatus {
	return p.needsWhere(needQuery{limit: -1}).list
}

// needQuery is which needs GET /status lists: those whose state or task
// state is among states (every need when states is empty), the first
// limit of them (all when limit < 0).
type needQuery struct {
	states map[string]bool
	limit  int
}

// needsAnswer is the needs a needQuery lists, how many matched it, the
// count of every need by state and reason, and the need of every
// attempt out, by attempt id.
type needsAnswer struct {
	list    []NeedStatus
	matched int
	summary NeedCounts
	out     map[string]string
}

// NeedCounts is the needs by state, as GET /status's summary has them;
// Waiting's reasons are in ByReason. Forgotten are served needs the
// engine no longer lists (keepServed).
type NeedCounts struct {
	Waiting   int                `json:"waiting"`
	Assigned  int                `json:"assigned"`
	Served    int                `json:"served"`
	Forgotten int                `json:"forgotten"`
	ByReason  map[WaitReason]int `json:"by_reason"`
}

// needCounts is the needs by state and reason, as needsWhere counts
// them, listing none.
func (p *router) needCounts() NeedCounts { return p.needsWhere(needQuery{limit: 0}).summary }

// needsWhere answers q. A need is made a NeedStatus only when it is
// listed: with 100,000 needs waiting a page asks for a hundred, and the
// rest cost their count alone.
func (p *router) needsWhere(q needQuery) needsAnswer {
	p.mu.Lock()
	defer p.mu.Unlock()
	ans := needsAnswer{summary: NeedCounts{Forgotten: p.forgotten, ByReason: map[WaitReason]int{}}, out: map[string]string{}}
	if q.limit < 0 {
		ans.list = make([]NeedStatus, 0, len(p.needs))
	}
	for _, ns := range p.needs {
		phase, taskState := ns.phaseLocked()
		var reason WaitReason
		switch phase {
		case NeedWaiting:
			ans.summary.Waiting++
			reason = ns.waitReason(p.targets)
			ans.summary.ByReason[reason]++
		case NeedAssigned:
			ans.summary.Assigned++
			ans.out[ns.task] = ns.id
		case NeedServed:
			ans.summary.Served++
		}
		if len(q.states) > 0 && !q.states[string(phase)] && !q.states[string(taskState)] && !q.states[string(reason)] {
			continue
		}
		ans.matched++
		if q.limit >= 0 && len(ans.list) >= q.limit {
			continue
		}
		ans.list = append(ans.list, ns.status(p.targets))
	}
	return ans
}

// phaseLocked is where ns stands, and its task's state (empty for the
// stand-in's). p.mu must be held.
func (ns *needState) phaseLocked() (NeedPhase, TaskState) {
	var phase NeedPhase
	var state TaskState
	switch {
	case ns.served:
		phase, state = NeedServed, ns.ended
	case ns.task != "":
		phase, state = NeedAssigned, TaskRunning
	default:
		phase, state = NeedWaiting, TaskWaiting
	}
	if ns.rec == nil {
		state = ""
	}
	return phase, state
}

// status is ns as GET /status shows it, among targets. router.mu must
// be held.
func (ns *needState) status(targets []*targetState) NeedStatus {
	st := NeedStatus{ID: ns.id, Spec: FormatNeed(ns.need), Need: toNeedJSON(ns.need), Worker: ns.worker, AttemptID: ns.task}
	st.State, st.TaskState = ns.phaseLocked()
	if ns.rec != nil && (ns.task != "" || ns.served) {
		st.Task = ns.id
	}
	switch {
	case ns.served && ns.result != nil:
		res := *ns.result
		st.Result = &res
		st.Worker, st.AttemptID = res.Worker, res.TaskID
		st.Detail = fmt.Sprintf("served by %s on %s", res.Worker, res.Hostname)
		if ns.rec != nil {
			st.Detail = fmt.Sprintf("task %s on %s (%s)", ns.ended, res.Worker, res.Hostname)
		}
	case ns.served:
		st.Detail = fmt.Sprintf("task %s", ns.ended)
	case ns.task != "":
		st.Detail = fmt.Sprintf("running on %s", ns.worker)
		if ns.lost > 0 {
			st.Detail += fmt.Sprintf(" (attempt %d: its machine was lost under %d before)", ns.lost+1, ns.lost)
		}
	default:
		st.Reason, st.Detail = ns.waitWords(targets)
	}
	if st.AttemptID != "" {
		st.Attempt = int(ns.lost) + 1
	}
	return st
}

// waitReason is why a waiting need waits: the first covering target's
// answer, not asked yet, or, where no target covers it, too long (a
// shape holds its resources, none lasts its time) or no fit. It is the
// one rule: waitWords, /status's summary and filter and the metrics all
// take their reason from it. router.mu must be held.
func (ns *needState) waitReason(targets []*targetState) WaitReason {
	covered, holds := false, false
	for _, ts := range targets {
		if !ts.covers(ns.need) {
			holds = holds || slices.ContainsFunc(ts.Shapes, func(s shared.Shape) bool { return s.HoldsResources(ns.need) })
			continue
		}
		covered = true
		if a := ns.seen(ts.Name); a != nil && a.hasAsked {
			return a.asked.reason
		}
	}
	switch {
	case covered:
		return ReasonNotAsked
	case holds:
		return ReasonTooLong
	}
	return ReasonNoFit
}

// waitWords says why a waiting need waits, and in words: its
// waitReason, and every covering target's answer. router.mu must be
// held.
func (ns *needState) waitWords(targets []*targetState) (WaitReason, string) {
	reason := ns.waitReason(targets)
	var said []string
	for _, ts := range targets {
		if a := ns.seen(ts.Name); a != nil && a.hasAsked && ts.covers(ns.need) {
			said = append(said, ts.Name+" "+a.asked.desc)
		}
	}
	switch {
	case len(said) > 0:
		return reason, "waiting for a worker; " + strings.Join(said, "; ")
	case reason == ReasonNotAsked:
		return reason, "waiting for a worker; no provisioner asked yet"
	}
	var shapes []namedShape
	for _, ts := range targets {
		for _, s := range ts.Shapes {
			shapes = append(shapes, namedShape{ts.Name, s})
		}
	}
	what := "timeout"
	if ns.rec == nil {
		what = "work"
	}
	var fe *FitError
	if err := fitError(shapes, ns.need, what, ns.runFor()); errors.As(err, &fe) {
		if reason == ReasonTooLong {
			return reason, "waiting; nothing is asked for it: " + fe.Error()
		}
		return reason, "waiting; no provisioner can start a machine this big: " + fe.Error()
	}
	return reason, "waiting; no provisioner can start a machine this big"
}

// parseNeed reads a need as -need takes it:
//
//	cpus=N[,gpus=N][,ram_mb=N][,label=L]
//
// in any order. cpus defaults to 1 and may not be less; the others default
// to zero (no constraint) and empty (any machine).
func parseNeed(s string) (shared.Need, error) {
	const form = "cpus=N[,gpus=N][,ram_mb=N][,label=L]"
	n := shared.Need{CPUs: 1}
	if strings.TrimSpace(s) == "" {
		return shared.Need{}, fmt.Errorf("empty need; write %s", form)
	}
	seen := map[string]bool{}
	for _, item := range strings.Split(s, ",") {
		key, value, ok := strings.Cut(strings.TrimSpace(item), "=")
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		if !ok || key == "" {
			return shared.Need{}, fmt.Errorf("need %q: %q is not key=value; write %s", s, item, form)
		}
		if seen[key] {
			return shared.Need{}, fmt.Errorf("need %q: %s is given twice", s, key)
		}
		seen[key] = true
		switch key {
		case "label":
			if value == "" {
				return shared.Need{}, fmt.Errorf("need %q: label is empty; leave it out to take any machine", s)
			}
			n.Label = value
		case "cpus", "gpus", "ram_mb":
			v, err := strconv.ParseInt(value, 10, 32)
			if err != nil || v < 0 {
				return shared.Need{}, fmt.Errorf("need %q: %s=%q is not a whole number of at least 0", s, key, value)
			}
			switch key {
			case "cpus":
				if v < 1 {
					return shared.Need{}, fmt.Errorf("need %q: cpus must be at least 1", s)
				}
				n.CPUs = int(v)
			case "gpus":
				n.GPUs = int(v)
			case "ram_mb":
				n.RAMMB = v
			}
		default:
			return shared.Need{}, fmt.Errorf("need %q: unknown key %q; write %s", s, key, form)
		}
	}
	return n, nil
}

// FormatNeed writes a need the way parseNeed reads it, leaving out what
// is at its default.
func FormatNeed(n shared.Need) string {
	parts := []string{"cpus=" + strconv.Itoa(n.CPUs)}
	if n.GPUs != 0 {
		parts = append(parts, "gpus="+strconv.Itoa(n.GPUs))
	}
	if n.RAMMB != 0 {
		parts = append(parts, "ram_mb="+strconv.FormatInt(n.RAMMB, 10))
	}
	if n.Label != "" {
		parts = append(parts, "label="+n.Label)
	}
	return strings.Join(parts, ",")
}

// maxNeedCount bounds count= in one -need, far above any burst a demo
// or a test makes.
const maxNeedCount = 100000

// NeedSpec is one -need flag: Count needs of one shape, each a task that
// takes Work (zero: the worker's stand-in computation).
type NeedSpec struct {
	Need  shared.Need
	Count int
	Work  time.Duration
}

// ParseNeedSpec reads a -need flag: a need as parseNeed takes it, with
// count=N (how many such needs, default 1) and work=DURATION (how long
// each task takes, such as 5s) anywhere among its keys.
func ParseNeedSpec(s string) (NeedSpec, error) {
	spec := NeedSpec{Count: 1}
	var rest []string
	for _, item := range strings.Split(s, ",") {
		key, value, _ := strings.Cut(strings.TrimSpace(item), "=")
		switch strings.TrimSpace(key) {
		case "count":
			n, err := strconv.Atoi(strings.TrimSpace(value))
			if err != nil || n < 1 || n > maxNeedCount {
				return NeedSpec{}, fmt.Errorf("need %q: count=%q is not a whole number from 1 to %d", s, value, maxNeedCount)
			}
			spec.Count = n
		case "work":
			d, err := time.ParseDuration(strings.TrimSpace(value))
			if err != nil || d <= 0 || d > 24*time.Hour {
				return NeedSpec{}, fmt.Errorf("need %q: work=%q is not a duration such as 5s (more than 0, at most 24h)", s, value)
			}
			spec.Work = d
		default:
			rest = append(rest, item)
		}
	}
	n, err := parseNeed(strings.Join(rest, ","))
	if err != nil {
		return NeedSpec{}, err
	}
	spec.Need = n
	return spec, nil
}

// NeedList collects repeated -need flags: fs.Var(&needs, "need", ...).
type NeedList []NeedSpec

func (l *NeedList) String() string {
	parts := make([]string, len(*l))
	for i, n := range *l {
		parts[i] = FormatNeed(n.Need)
		if n.Count != 1 {
			parts[i] += ",count=" + strconv.Itoa(n.Count)
		}
		if n.Work > 0 {
			parts[i] += ",work=" + n.Work.String()
		}
	}
	return strings.Join(parts, " ")
}

func (l *NeedList) Set(s string) error {
	n, err := ParseNeedSpec(s)
	if err != nil {
		return err
	}
	*l = append(*l, n)
	return nil
}
