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
	// Packs says the target's workers run as many tasks at once as
	// their machine holds (the plugin offers
	// shared.CapabilityWorkerSlots): its demand is machines by what
	// they hold (round.pack), not one a need.
	Packs bool
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
// and a worker has one task at a time, or, with slots (slots.go), as
// many as fit what is free of it.
//
// Pass does the work and is meant to be called by the run loop, every
// second or so and whenever the books change. The other methods are
// reports and may be called from anywhere.
type router struct {
	logger hclog.Logger
	engine pool
	// asks is the side that asks the provisioners for machines (ask.go).
	asks asker

	// pass serialises Pass. It is held across provisioner calls, so
	// nothing but Pass may take it: the reports use mu alone.
	pass sync.Mutex

	// mu guards needs (and every field of every needState), targets,
	// nextTask and asks.busy. It is never held while calling a provisioner or
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
	// logged (small -> cpu); route, when set, is the need asked for
	// instead of need at the target, and tried the profiles tried on the
	// way there.
	failover failover
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
	p := &router{logger: logger, engine: engine, holds: newHolds(nil), rising: true,
		mismatches: mismatchBook{m: map[mismatchKey]*mismatch{}}}
	p.asks = asker{p: p, provisionTimeout: defaultProvisionTimeout, busy: map[string]bool{}}
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
// passed, and no Engine.Together is under way. Asking costs a pass in proportion to the needs waiting (each
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
		ask = p.asks.holding.Load() == 0 && (p.rising || now.Sub(p.asked) >= provisionEvery)
		p.mu.Unlock()
	}
	news := p.settle()
	waiting, more := p.match(ask)
	if ask {
		p.mu.Lock()
		p.rising, p.asked = false, now
		p.mu.Unlock()
		p.asks.provision(ctx, waiting)
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
		for i := range idle {
			if w := idle[i]; !taken[i] && ns.fits(w) {
				found = true
				plans = append(plans, p.reserveLocked(ns, w))
				p.mismatches.served(w, ns)
				// A worker with slots stays on offer while a CPU of its
				// is free: the next need may fit what is left.
				if idle[i].take(ns.need) {
					taken[i] = true
					free--
				}
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
		// A worker with slots that runs a task is no evidence of a
		// mismatch: its room is what its tasks left.
		if !taken[i] && w.running == 0 {
			left = append(left, w)
		}
	}
	told := p.mismatches.note(left, unfitOnes, time.Now())
	if len(told) > 0 {
		p.rising = true
	}
	return plans, waiting, told
}

// Close waits for the rounds of Provision calls still under way, each
// bounded by provisionTimeout.
func (p *router) Close() {
	p.asks.rounds.Wait()
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
