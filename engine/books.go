package engine

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/loglimit"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

// defaultPollWait is how long GET /v1/work holds a request open. Long
// enough that an idle worker costs a request every twenty seconds; short
// enough that proxies and load balancers with a thirty-second idle timeout
// leave it alone.
const defaultPollWait = 20 * time.Second

// goneFactor: a worker running a task it was handed, and unseen for this
// many poll periods, counts as gone. Three, so that one slow round trip
// or one retried request is not mistaken for a dead machine.
const goneFactor = 3

// deadAfter: a worker that holds no task it was handed (idle, or with a
// task it never picked up) and has had no poll open for this long counts
// as gone. A live worker polls again within milliseconds of each answer,
// its long poll is its heartbeat, and a worker that dies mid-poll hangs
// up, which ends the poll at once; so a few seconds of silence is death,
// not a slow network.
const deadAfter = 5 * time.Second

// books keeps the workers' state: who may attach (admission), who is
// attached and in which session, what each was given, what came back,
// and who has gone silent. It speaks no HTTP: the worker protocol's
// handlers (workerAPI, workerapi.go) ask it, and it decides; what a
// long poll answers is decided here too (longPoll), however the poll
// waits. Deciding who gets what is the router's job, and the books
// never call a provisioner.
type books struct {
	// PollWait is the longest GET /v1/work holds a request before
	// answering 204. A worker may ask for less with ?wait=SECONDS. Set it
	// before serving; zero means defaultPollWait.
	PollWait time.Duration

	logger hclog.Logger
	signer *host.Signer
	now    func() time.Time
	hooks  booksHooks
	// ignoredEvents bounds how often an event about another
	// provisioner's worker is logged: a plugin can send them by the
	// thousand.
	ignoredEvents *loglimit.Limiter

	// changed holds at most one pending wake-up for the run loop: a
	// worker attached, finished or left, so a router pass now would find
	// something new.
	changed chan struct{}
	// arrived holds at most one pending wake-up for the run loop: a
	// worker attached, and its provisioner has not heard so (Run makes a
	// Reconcile soon after, so that the plugin knows the job arrived
	// before its poller can take the job's end for a failed start).
	arrived chan struct{}
	// done is closed by Close; long polls answer at once after it.
	done      chan struct{}
	closeOnce sync.Once
	// leave is closed by dismiss: polls answer CodeLeave from then on.
	leave       chan struct{}
	dismissOnce sync.Once

	// mu guards workers, results, admission, waiting and every field of
	// every workerState and longPoll. It is never held while writing a
	// response, logging, or calling a hook: a slow client must not stall
	// every other worker.
	mu      sync.Mutex
	workers map[string]*workerState
	// results are finished tasks by id, kept until the router takes them.
	results map[string]Result
	// reported names the tasks that ended since the router last asked
	// (Reported): by a result, or lost with a worker that left holding
	// them (goneOf), the one way a task ends without one; the router
	// asks about these alone.
	reported []string
	// verified are the tokens that verified, by token (verify).
	verified map[string]host.Credential
	// lost says why each task whose worker left the books holding it was
	// lost, by task id, kept until the router takes it (TaskOutcome).
	lost map[string]string
	// admission is the provisioners' word on which job each worker was
	// started as, from their events, and the names that may never attach
	// again: their worker detached or was given up on, or their request
	// was cancelled. A credential is worth one job.
	admission *admission
	// waiting are the long polls armed to be woken (longPoll.arm):
	// dismiss and Close wake them all.
	waiting map[*longPoll]struct{}
	// untold are workers, by provisioner, that attached and left before
	// any attachedBy named them: attachedBy names them once, so that
	// their plugin learns every job that arrived, however short its
	// worker's stay (a job killed a second after its worker attached
	// ended under a worker, not before one).
	untold map[string][]string
	// unwanted are the provisioners (profile "") and profiles a reload
	// removed (letGo): a worker of one that attaches later is leaving
	// from the start.
	unwanted map[ownedProfile]bool
}

// ownedProfile is a provisioner's profile; profile "" is the whole
// provisioner.
type ownedProfile struct{ provisioner, profile string }

// booksHooks hear what the books did, after the books are updated and
// without b.mu; each may be nil.
type booksHooks struct {
	// attach hears each first attach, result each accepted result.
	attach func(WorkerInfo)
	result func(Result)
	// activity hears what happens to workers and tasks (attached,
	// detached, gone, dropped, task assigned, task done), for the event
	// stream and the metrics.
	activity func(Activity)
	// gone hears each worker that left the books: detached, silent, or
	// dropped when its request was cancelled; why says which, in words.
	gone func(w WorkerInfo, why string)
}

// WorkerInfo is what a worker advertised when it attached.
type WorkerInfo struct {
	Name string `json:"name"`
	// Provisioner is the one whose credential the worker attached with:
	// its owner, whatever its name suggests.
	Provisioner string   `json:"provisioner"`
	Hostname    string   `json:"hostname"`
	JobID       string   `json:"job_id"`
	CPUs        int      `json:"cpus"`
	GPUs        int      `json:"gpus"`
	RAMMB       int64    `json:"ram_mb"`
	Labels      []string `json:"labels"`
	// Profile is what its provisioner said it was started as: a need
	// may name it as its label, as it may for the provisioner's shapes.
	Profile string `json:"profile,omitempty"`
	// Features are the kinds of task it runs (worker.FeatureCommand,
	// worker.FeaturePayload), as its attach named them; none means the
	// stand-in alone.
	Features []string `json:"features,omitempty"`
	// EndsAt is when the worker's job must end, as the worker said at
	// attach; zero if it did not say. The router gives it no task whose
	// timeout would run past EndsAt less worker.EndMargin.
	EndsAt time.Time `json:"ends_at,omitzero"`
	// took is set once the worker was given a task: a machine that has
	// served is no evidence of a mismatch when its time runs short
	// (mismatch.go).
	took bool
	// slots is set when the worker named worker.FeatureSlots: it runs
	// as many tasks at once as its CPUs, GPUs and memory hold (slots.go).
	slots bool
	// running is how many tasks the worker holds, in the books' idle
	// lists (roomLocked) and as a pass gives it more (take): a worker
	// with slots and a task is not idle evidence of a mismatch.
	running int
}

// timeFor reports whether the worker has time, at now, for a task that
// may run for timeout (0: no timeout): worker.EndMargin before its job's
// end, after the timeout.
func (w WorkerInfo) timeFor(timeout time.Duration, now time.Time) bool {
	return w.EndsAt.IsZero() || !now.Add(timeout+worker.EndMargin).After(w.EndsAt)
}

// leavingSoon reports whether the worker's job ends within lead of now,
// less worker.EndMargin: it will leave before a machine asked for now
// could take its place.
func (w WorkerInfo) leavingSoon(lead time.Duration, now time.Time) bool {
	return !w.EndsAt.IsZero() && now.Add(lead+worker.EndMargin).After(w.EndsAt)
}

// has reports whether the worker has every feature of requires.
func (w WorkerInfo) has(requires []string) bool {
	for _, f := range requires {
		if !slices.Contains(w.Features, f) {
			return false
		}
	}
	return true
}

// shape is the worker as a machine, so that the router matches workers
// with the same rule (shared.Shape.Fits) that provisioners' shapes use.
func (w WorkerInfo) shape() shared.Shape {
	return shared.Shape{Profile: w.Profile, CPUs: w.CPUs, GPUs: w.GPUs, RAMMB: w.RAMMB, Labels: w.Labels}
}

// Task is one piece of work for one worker, as GET /v1/work sends it.
type Task = worker.Task

func toNeedJSON(n shared.Need) worker.Need {
	return worker.Need{CPUs: n.CPUs, GPUs: n.GPUs, RAMMB: n.RAMMB, Label: n.Label}
}

// Result is what a worker reported for a task.
type Result struct {
	TaskID   string    `json:"task_id"`
	Worker   string    `json:"worker"`
	Hostname string    `json:"hostname"`
	JobID    string    `json:"job_id"`
	CPUs     int       `json:"cpus"`
	Output   string    `json:"output"`
	At       time.Time `json:"at"`
	// run is what the worker said of a command or payload task's run
	// (nil for the stand-in): the router's task record reads it.
	run *worker.ResultRequest
	// lostWhy says why the worker left holding the task, for a task
	// TaskOutcome reports lost; "" if the books do not know.
	lostWhy string
}

// workerState is one attached worker. Every field is guarded by books.mu.
type workerState struct {
	info WorkerInfo
	// owner is the provisioner named in the worker's credential, and
	// expires is when that credential ends.
	owner    string
	expires  time.Time
	attached time.Time
	lastSeen time.Time
	// polling counts long polls in progress: a worker waiting on us is
	// alive however long ago its last request began.
	polling int
	// held are the tasks assigned and not yet reported, in the order
	// they were assigned; none when the worker is idle. A worker without
	// slots holds one at most, and it is handed out again on every poll
	// until its result arrives, so a response lost on the way costs a
	// repeat, not the task. A worker with slots (slots.go) polls while
	// it runs tasks, so its polls answer only the tasks not yet
	// delivered.
	held []*heldTask
	// reported are the tasks whose results arrived and which the router
	// has not collected yet (TaskOutcome): until it has, their room is
	// not free, so that the router never holds more tasks of one worker
	// out at once than it holds, and GET /status never shows a worker
	// without slots on two. A
	// worker freed at its report could be given the next need by a
	// pass that had settled before the report came, while its last
	// still read assigned on it. Rejected: settling in report itself
	// (the router's books would be written from a worker's request,
	// beside the pass that owns them), and a reconcile in /status alone
	// (it hid the double from the page, not from the router). The cost:
	// a result that comes while a pass settles waits for the next pass
	// for its worker's next task, and its report asks for that pass at
	// once (notify).
	reported []Task
	// poll is the worker's open GET /v1/work, which Assign wakes; nil
	// when none is open.
	poll *longPoll
	// session is the digest of the session secret its attach was
	// answered with (session.go): work, result and detach must carry
	// the secret.
	session [sha256.Size]byte
	// told is set once attachedBy named the worker: its plugin has heard
	// (or is hearing) that its job arrived.
	told bool
	// leaving is set when a reload removed its profile or provisioner
	// (books.letGo): it is given no task, and its next poll with none
	// answers CodeLeave, so a busy worker finishes its task first.
	leaving bool
}

// newBareBooks returns the books of workers whose credentials signer
// verifies, with no hooks. now is its clock (nil means time.Now); tests
// pass their own.
func newBareBooks(logger hclog.Logger, signer *host.Signer, now func() time.Time) *books {
	return newBooks(logger, signer, now, booksHooks{})
}

func newBooks(logger hclog.Logger, signer *host.Signer, now func() time.Time, hooks booksHooks) *books {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	if now == nil {
		now = time.Now
	}
	return &books{
		logger:        logger,
		signer:        signer,
		now:           now,
		hooks:         hooks,
		ignoredEvents: loglimit.New(refusalLogBurst, refusalLogWindow),
		changed:       make(chan struct{}, 1),
		arrived:       make(chan struct{}, 1),
		done:          make(chan struct{}),
		leave:         make(chan struct{}),
		workers:       make(map[string]*workerState),
		results:       make(map[string]Result),
		lost:          make(map[string]string),
		admission:     newAdmission(now),
		waiting:       make(map[*longPoll]struct{}),
		untold:        make(map[string][]string),
		verified:      make(map[string]host.Credential),
	}
}

// changes delivers a value after a worker attaches, reports a result or
// detaches, so the run loop can pass at once instead of on its next tick.
// Wake-ups that arrive while one is pending are merged.
func (b *books) changes() <-chan struct{} { return b.changed }

// arrivals delivers a value after a worker attaches, so that the run loop
// tells its provisioner soon (Run). Wake-ups are merged as in changes.
func (b *books) arrivals() <-chan struct{} { return b.arrived }

// Close ends the long polls in progress and refuses new ones, so that an
// http.Server's Shutdown need not wait out PollWait. It is idempotent.
func (b *books) Close() {
	b.closeOnce.Do(func() { close(b.done) })
	b.wakeAll()
}

// wakeAll wakes every armed long poll, to answer from the books as they
// are now (leave, closing).
func (b *books) wakeAll() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for lp := range b.waiting {
		lp.fire()
	}
}

// attached lists the workers attached now, by name.
func (b *books) attached() []string {
	b.mu.Lock()
	names := make([]string, 0, len(b.workers))
	for name := range b.workers {
		names = append(names, name)
	}
	b.mu.Unlock()
	slices.Sort(names)
	return names
}

// attachedBy lists the workers attached now whose credential a given
// provisioner asked for, for that provisioner's Reconcile. Ownership comes
// from the credential, not from the name: a provisioner "bad" that minted
// "bad-gpu-x" does not make provisioner "bad-gpu" think its worker came.
// The list also names, once, the workers that attached and left since
// the last list (untold): to the plugin they are attached until the next
// call says they left.
func (b *books) attachedBy(provisioner string) []string {
	b.mu.Lock()
	var names []string
	for name, ws := range b.workers {
		if ws.owner == provisioner {
			names = append(names, name)
			ws.told = true
		}
	}
	names = append(names, b.untold[provisioner]...)
	delete(b.untold, provisioner)
	b.mu.Unlock()
	slices.Sort(names)
	return slices.Compact(names)
}

// retell puts back the workers of names, an attachedBy list of
// provisioner's whose Reconcile was not made, that have left since: the
// next list names them.
func (b *books) retell(provisioner string, names []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, name := range names {
		if ws := b.workers[name]; ws == nil || ws.owner != provisioner {
			b.tellLaterLocked(provisioner, name)
		}
	}
}

// forgetLocked takes the worker name, whose state is ws, off the books.
// b.mu must be held.
func (b *books) forgetLocked(name string, ws *workerState) {
	delete(b.workers, name)
	if !ws.told {
		b.tellLaterLocked(ws.owner, name)
	}
}

// tellLaterLocked keeps name for provisioner's next attachedBy, within
// maxUntold a provisioner: past it (no Reconcile is being made) the
// plugin learns of the job from its queue. b.mu must be held.
func (b *books) tellLaterLocked(provisioner, name string) {
	if len(b.untold[provisioner]) < maxUntold {
		b.untold[provisioner] = append(b.untold[provisioner], name)
	}
}

// maxUntold bounds books.untold per provisioner.
const maxUntold = 10000

// ObserveEvent records what a provisioner's event says about a worker's
// credential: worker_provisioned names the job the worker must attach as;
// worker_cancelled, worker_provision_failed and worker_job_ended revoke
// the name for good, and drop the worker if it is attached, so that its
// task is placed again at once. A provisioner speaks only for
// its own workers: an event naming a worker another provisioner recorded
// changes nothing. ev.Provisioner must be the host's stamp, never the
// plugin's claim. The error, which the caller counts, wraps
// errOverBudget when the provisioner's events hold their budget of
// records and this one's was not kept; nil otherwise.
func (b *books) ObserveEvent(ev shared.Event) error {
	b.mu.Lock()
	revoke, err := b.admission.observe(ev)
	var dropped *goneWorker
	if ws := b.workers[ev.Worker]; revoke && ws != nil && ws.owner == ev.Provisioner {
		why := "its request was cancelled (" + string(ev.Kind) + ")"
		switch {
		case ev.Kind == shared.EventWorkerJobEnded:
			why = "its job ended under it: " + ev.Detail
		case ev.Detail != "":
			// A plugin that had not heard the worker arrived speaks of
			// its job as of one that failed to start: its words say
			// what happened to the job.
			why += ": " + ev.Detail
		}
		dropped = b.goneOf(ws, why)
		b.forgetLocked(ev.Worker, ws)
	}
	b.mu.Unlock()
	overBudget := errors.Is(err, errOverBudget)
	if err != nil && !overBudget {
		if ok, leftOut := b.ignoredEvents.Allow(time.Now()); ok {
			b.logger.Warn("ignored an event about another provisioner's worker", "provisioner", ev.Provisioner,
				"worker", ev.Worker, "kind", ev.Kind, "error", err, "not_logged_before", leftOut)
		}
	}
	if dropped != nil {
		for _, a := range dropped.activities(EventWorkerDropped) {
			b.logger.Info("worker dropped", "worker", dropped.info.Name, "why", dropped.why, "task", a.Task, "attempt_id", a.AttemptID)
			b.activity(a)
		}
		b.tellGone(dropped)
		b.notify()
	}
	if overBudget {
		return err
	}
	return nil
}

// records is how many job records and revocations provisioner's events
// hold in the books' admission, each of recordBudget.
func (b *books) records(provisioner string) (jobs, revoked int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.admission.records(provisioner)
}

func (b *books) pollWait() time.Duration {
	if b.PollWait > 0 {
		return b.PollWait
	}
	return defaultPollWait
}

func (b *books) notify() {
	select {
	case b.changed <- struct{}{}:
	default:
	}
}

func (b *books) activity(a Activity) {
	if b.hooks.activity != nil {
		b.hooks.activity(a)
	}
}

// -- the router's side ---------------------------------------------------

var (
	errNotAttached = errors.New("worker is not attached")
	errWorkerBusy  = errors.New("worker already has a task, or no room for this one")
)

// IdleWorkers lists attached workers that may be given a task now,
// smallest first, so that a small need takes a small machine and leaves
// the big ones for the needs only they fit: those with no task, and
// those with slots with room, each with what is free of it as its
// CPUs, GPUs and memory (workerState.roomLocked), so that a task goes
// first to the fullest machine that holds it.
func (b *books) IdleWorkers() []WorkerInfo {
	b.mu.Lock()
	var idle []WorkerInfo
	for _, ws := range b.workers {
		if w, ok := ws.roomLocked(); ok {
			idle = append(idle, w)
		}
	}
	b.mu.Unlock()
	sortIdle(idle)
	return idle
}

// IdleAndAttached is IdleWorkers and, from the same moment, every
// attached worker's name by its provisioner: a demand built from the one
// and told with the other cannot count a worker that attached in between
// as both arrived and still wanted.
func (b *books) IdleAndAttached() ([]WorkerInfo, map[string][]string) {
	now := b.now()
	b.mu.Lock()
	var idle []WorkerInfo
	attached := map[string][]string{}
	for name, ws := range b.workers {
		if w, ok := ws.roomLocked(); ok {
			idle = append(idle, w)
		}
		// A worker whose job ends within the margin is leaving: its
		// provisioner may ask for its replacement under a cap now.
		if !ws.info.leavingSoon(worker.EndMargin, now) {
			attached[ws.owner] = append(attached[ws.owner], name)
		}
	}
	b.mu.Unlock()
	for _, names := range attached {
		slices.Sort(names)
	}
	sortIdle(idle)
	return idle, attached
}

// sortIdle sorts idle workers smallest first (IdleWorkers).
func sortIdle(idle []WorkerInfo) {
	slices.SortFunc(idle, func(a, b WorkerInfo) int {
		if c := a.GPUs - b.GPUs; c != 0 {
			return c
		}
		if c := a.CPUs - b.CPUs; c != 0 {
			return c
		}
		if a.RAMMB != b.RAMMB {
			if a.RAMMB < b.RAMMB {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
}

// Assign gives t to worker, which hands it out on its next poll (or the
// one in progress).
func (b *books) Assign(worker string, t Task) error {
	b.mu.Lock()
	ws := b.workers[worker]
	if ws == nil {
		b.mu.Unlock()
		return errNotAttached
	}
	if (!ws.info.slots && ws.busyLocked()) || (ws.info.slots && !ws.fitsFreeLocked(t.Need)) {
		b.mu.Unlock()
		return errWorkerBusy
	}
	ws.held = append(ws.held, &heldTask{t: t})
	ws.info.took = true
	if ws.poll != nil {
		ws.poll.fire()
	}
	a := Activity{Kind: EventTaskAssigned, Provisioner: ws.owner, Worker: worker, Job: ws.info.JobID, Task: t.Name, Attempt: t.Attempt, AttemptID: t.ID}
	b.mu.Unlock()
	b.activity(a)
	return nil
}

// CancelTask cancels task id on worker, and reports whether the worker
// held it. A task not yet handed out is taken back at once, as reported
// cancelled; one the worker has is marked, and the worker's watch
// answers the cancel (longPoll.decideLocked) until it reports the task.
func (b *books) CancelTask(worker, id string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	ws := b.workers[worker]
	if ws == nil {
		return false
	}
	h := ws.findLocked(id)
	if h == nil {
		return false
	}
	if !h.delivered {
		b.takeBackCancelledLocked(ws, h, "cancelled before its worker took it")
		return true
	}
	h.cancel = true
	// A worker has one watch open at a time, or none between two; the
	// waiting polls are few beside the workers, and a cancel is rare.
	for lp := range b.waiting {
		if lp.watch && lp.ws == ws {
			lp.fire()
		}
	}
	return true
}

// Reported returns the tasks that ended since the last call, by a
// result or with their worker (TaskOutcome says which).
func (b *books) Reported() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	ids := b.reported
	b.reported = nil
	return ids
}

// assignState is where an assigned task stands, as TaskOutcome sees it.
type assignState int

const (
	assignPending assignState = iota // assigned, no result yet
	assignDone                       // result arrived (and is now the caller's)
	assignLost                       // its worker left or was given up on first
)

// TaskOutcome reports on task id given to worker. A result is handed over
// once: the engine forgets it as it returns assignDone.
func (b *books) TaskOutcome(worker, id string) (Result, assignState) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if res, ok := b.results[id]; ok {
		delete(b.results, id)
		if ws := b.workers[worker]; ws != nil {
			ws.reported = slices.DeleteFunc(ws.reported, func(t Task) bool { return t.ID == id })
		}
		return res, assignDone
	}
	// Not swept here: goneness is decided by watch alone.
	if ws := b.workers[worker]; ws != nil && ws.findLocked(id) != nil {
		return Result{}, assignPending
	}
	why := b.lost[id]
	delete(b.lost, id)
	return Result{lostWhy: why}, assignLost
}

// goneWorker is a worker that left the books, kept to be told (log,
// activity, the gone hook) once the lock is released.
type goneWorker struct {
	info     WorkerInfo
	owner    string
	lastSeen time.Time
	// tasks are the tasks it held, none if it was idle; why says in
	// words why it left. Each is lost with it, and retried as the
	// task's Retries say.
	tasks []Task
	why   string
}

// goneOf is ws leaving the books for why. b.mu must be held.
func (b *books) goneOf(ws *workerState, why string) *goneWorker {
	g := &goneWorker{info: ws.info, owner: ws.owner, lastSeen: ws.lastSeen, why: why}
	for _, h := range ws.held {
		g.tasks = append(g.tasks, h.t)
		b.lost[h.t.ID] = why
		b.reported = append(b.reported, h.t.ID)
	}
	return g
}

// activities are g's leaving as kind: one a task it held, with the
// task, or one alone if it held none.
func (g *goneWorker) activities(kind EventKind) []Activity {
	a := Activity{Kind: kind, Provisioner: g.owner, Worker: g.info.Name, Job: g.info.JobID, Detail: g.why}
	if len(g.tasks) == 0 {
		return []Activity{a}
	}
	out := make([]Activity, 0, len(g.tasks))
	for _, t := range g.tasks {
		a.Task, a.Attempt, a.AttemptID = t.Name, t.Attempt, t.ID
		out = append(out, a)
	}
	return out
}

// tellGone calls the gone hook for g, without b.mu.
func (b *books) tellGone(g *goneWorker) {
	if b.hooks.gone != nil {
		b.hooks.gone(g.info, g.why)
	}
}

// Activity is something that happened to a worker or a task, as the
// event stream and the metrics hear it.
type Activity struct {
	// Kind is one of the worker and task kinds of EventKind.
	Kind        EventKind
	Provisioner string
	Worker      string
	// Job is the scheduler's id the worker reported (Slurm's job id).
	Job string
	// Task is the task's id (empty for the stand-in's work); Attempt its
	// attempt's number and AttemptID the attempt's id.
	Task      string
	Attempt   int
	AttemptID string
	Detail    string
}

// -- liveness ------------------------------------------------------------

// sweepLocked drops workers that are gone, and revokes their names: a
// worker with no poll open and no task in hand for deadAfter, or running
// a task it was handed and unseen for goneFactor poll periods. A task that
// was assigned to a dead worker and never picked up goes back to the
// router (TaskOutcome says assignLost). It also forgets revocations and job
// records older than any credential can live. b.mu must be held. A worker
// running a long task does not poll meanwhile; ours are short, and one
// that needs longer should poll in between (a poll while holding a task
// just hands the task back).
func (b *books) sweepLocked() []*goneWorker {
	now := b.now()
	busyLimit := goneFactor * b.pollWait()
	var gone []*goneWorker
	for name, ws := range b.workers {
		if ws.polling > 0 {
			continue
		}
		limit := deadAfter
		if slices.ContainsFunc(ws.held, func(h *heldTask) bool { return h.delivered }) {
			limit = busyLimit
		}
		if now.Sub(ws.lastSeen) > limit {
			gone = append(gone, b.goneOf(ws, "silent since "+ws.lastSeen.UTC().Format(time.RFC3339)))
			b.forgetLocked(name, ws)
			b.admission.revoke(name, "gone silent", ws.expires)
		}
	}
	b.admission.sweep()
	return gone
}

// watchEvery is how often watch looks for workers gone silent: a fifth
// of deadAfter, so a dead worker is noticed at most a fifth late.
const watchEvery = deadAfter / 5

// watch decides liveness until ctx ends: every watchEvery it drops the
// workers gone silent and revokes their names (sweep). It is the one
// place that does: reading the books (GET /status, a metrics scrape,
// attached) never changes them. Engine runs it on a goroutine it owns.
func (b *books) watch(ctx context.Context) {
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			b.sweep()
		}
	}
}

// sweep drops the workers gone silent now, revokes their names, and
// tells of each (log, activity). watch calls it; a test with its own
// clock calls it itself.
func (b *books) sweep() {
	b.mu.Lock()
	gone := b.sweepLocked()
	b.mu.Unlock()
	b.logGone(gone)
}

// dismiss lets the workers go, for a clean stop: every poll open now or
// made from now on answers 410 with CodeLeave, on which a worker
// detaches and exits 0, so its job ends completed instead of failing
// when the engine is gone. A worker busy with a task hears it on its
// watch (GET /v1/watch) and drops the task; one too old to watch hears
// it at its next poll, after its result. dismiss waits up to wait (or
// ctx) for every worker to detach and returns how many had not.
// Attaches are still taken: a worker that comes now is told to leave at
// its first poll.
func (b *books) dismiss(ctx context.Context, wait time.Duration) int {
	b.dismissOnce.Do(func() { close(b.leave) })
	b.wakeAll()
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	// A poll with a deadline, not an event: detaches are rare here and
	// the wait is seconds long at most.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		b.mu.Lock()
		n := len(b.workers)
		b.mu.Unlock()
		if n == 0 {
			return 0
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			return n
		case <-ctx.Done():
			return n
		}
	}
}

func (b *books) logGone(gone []*goneWorker) {
	for _, g := range gone {
		for _, a := range g.activities(EventWorkerGone) {
			b.logger.Warn("worker gone", "worker", g.info.Name, "last_seen", g.lastSeen, "task", a.Task, "attempt_id", a.AttemptID)
			b.activity(a)
		}
		b.tellGone(g)
	}
	if len(gone) > 0 {
		b.notify()
	}
}

// -- the workers' requests -----------------------------------------------

// A denial is why the books turn a worker's request down. The worker API
// answers each with a status of its own (denial.status).
type denial int

const (
	allowed         denial = iota
	notAttached            // the credential's worker is not attached: attach (again)
	noSession              // no session secret
	otherSession           // the session secret of another attach
	nameRevoked            // the name may never attach again
	jobNotYet              // its provisioner has not said which job it is yet
	jobMismatch            // not the job its provisioner started
	attachedAlready        // attached: a credential attaches once
	noSuchTask             // a result or a transfer for a task the worker does not hold
	badCredential          // no credential, or one the engine did not sign, expired or revoked
)

// caller is who sent a worker's request, as workerOf checked it.
type caller struct {
	cred host.Credential
	info WorkerInfo
	// task is the name (the engine's id) of the task whose attempt the
	// request is about, which the worker holds; empty when none was
	// asked about.
	task string
}

// workerOf is the one check of a worker's request beyond its attach and
// long polls, for the transfer routes and Engine.Authenticate alike: a
// credential the engine signed, not expired and not revoked, of a worker
// attached now, in the session its attach was answered with; and, when
// attempt is not empty, the worker holds that attempt of a task now. It
// returns the caller, or the denial and why.
func (b *books) workerOf(r *http.Request, attempt string) (caller, denial, string) {
	token, ok := Bearer(r.Header.Get("Authorization"))
	if !ok {
		return caller{}, badCredential, "missing credential"
	}
	cred, err := b.verify(token)
	if err != nil {
		return caller{}, badCredential, err.Error()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	ws, d, refusal := b.sessionLocked(cred, r.Header.Get(sessionHeader))
	if ws == nil {
		return caller{cred: cred}, d, refusal
	}
	// A worker moving a task's bytes is alive, however long the
	// transfer keeps it from polling.
	ws.lastSeen = b.now()
	c := caller{cred: cred, info: ws.info}
	c.info.Labels, c.info.Features = slices.Clone(c.info.Labels), slices.Clone(c.info.Features)
	if attempt == "" {
		return c, allowed, ""
	}
	h := ws.findLocked(attempt)
	if h == nil || h.t.Name == "" {
		return c, noSuchTask, "worker " + cred.Worker + " does not hold task " + attempt
	}
	c.task = h.t.Name
	return c, allowed, ""
}

// verify returns what a worker's token says: signed by the engine, not
// expired, and not revoked.
//
// A token that verified is kept (verified), so that a worker's every
// request is not a MAC, two base64 decodings and a parse again: a
// kept one is taken while it has not expired; revocation is asked each
// time.
func (b *books) verify(token string) (host.Credential, error) {
	now := b.now()
	b.mu.Lock()
	cred, kept := b.verified[token]
	b.mu.Unlock()
	if !kept || !now.Before(cred.Expires) {
		var err error
		if cred, err = b.signer.Verify(token, now); err != nil {
			return cred, err
		}
		kept = false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !kept {
		if len(b.verified) >= maxVerified {
			clear(b.verified)
		}
		b.verified[token] = cred
	}
	// The caller's own labels: the kept ones stay as they verified.
	cred.Labels = slices.Clone(cred.Labels)
	return cred, b.admission.isRevoked(cred.Worker)
}

// maxVerified bounds the tokens verify keeps: a few hundred bytes each,
// one per worker, and when full they are all dropped and verified
// again as they come.
const maxVerified = 1 << 15

// ownedLocked returns the attached worker a credential names, or nil if
// there is none or it was attached under another provisioner's
// credential for the same name. b.mu must be held.
func (b *books) ownedLocked(cred host.Credential) *workerState {
	ws := b.workers[cred.Worker]
	if ws == nil || ws.owner != cred.Provisioner {
		return nil
	}
	return ws
}

// attach attaches the worker cred names as info (checked against cred's
// claims by the caller), and returns the secret of its new session; or
// the denial and why.
func (b *books) attach(cred host.Credential, info WorkerInfo) (string, denial, string) {
	name := cred.Worker
	now := b.now()
	b.mu.Lock()
	d, refusal := b.admitLocked(cred, info)
	var session string
	if d == allowed {
		info.Profile = b.admission.profileOf(name)
		info.slots = info.has([]string{worker.FeatureSlots})
		ws := &workerState{owner: cred.Provisioner, expires: cred.Expires, attached: now, lastSeen: now, info: info}
		ws.leaving = b.unwantedLocked(ws)
		session, ws.session = newSession()
		b.workers[name] = ws
	}
	b.mu.Unlock()
	if d != allowed {
		return "", d, refusal
	}

	b.logger.Info("worker attached", "worker", name, "provisioner", cred.Provisioner, "host", info.Hostname,
		"job_id", info.JobID, "cpus", info.CPUs, "gpus", info.GPUs, "ram_mb", info.RAMMB, "labels", info.Labels)
	if b.hooks.attach != nil {
		b.hooks.attach(info)
	}
	b.activity(Activity{Kind: EventWorkerAttached, Provisioner: info.Provisioner, Worker: name, Job: info.JobID,
		Detail: fmt.Sprintf("from %s, %d cpus, %d gpus", info.Hostname, info.CPUs, info.GPUs)})
	b.notify()
	select {
	case b.arrived <- struct{}{}:
	default:
	}
	return session, allowed, ""
}

// admitLocked decides whether a worker with a valid credential may attach
// as info, and if not, why. b.mu must be held.
func (b *books) admitLocked(cred host.Credential, info WorkerInfo) (denial, string) {
	if d, why := b.admission.admit(cred, info.JobID); d != allowed {
		return d, why
	}
	if ws := b.workers[cred.Worker]; ws != nil {
		return attachedAlready, fmt.Sprintf("worker %s is already attached (from host %s); a credential attaches once", cred.Worker, ws.info.Hostname)
	}
	return allowed, ""
}

// report records res for the worker cred names, in the session whose
// secret is session; or says why not. The worker, host and job recorded
// are the attach's, never the body's. seal (nil: none) hears a task's
// attempt as its result is accepted, under b.mu, so that nothing the
// worker sends after the acceptance changes what it recorded.
func (b *books) report(cred host.Credential, session string, res Result, seal func(task, attempt string)) (denial, string) {
	name := cred.Worker
	var task Task
	b.mu.Lock()
	ws, d, refusal := b.sessionLocked(cred, session)
	var h *heldTask
	if ws != nil {
		h = ws.findLocked(res.TaskID)
	}
	switch {
	case ws == nil:
	case h == nil:
		// Most likely a retry of a result already recorded.
		d, refusal = noSuchTask, "no such task for this worker"
	default:
		if h.t.Name == "" {
			// The stand-in's result is its output alone.
			res.run = nil
		} else if seal != nil {
			seal(h.t.Name, h.t.ID)
		}
		// Who ran it is what the attach established, whatever the
		// body says.
		res.Worker, res.Hostname, res.JobID = ws.info.Name, ws.info.Hostname, ws.info.JobID
		b.results[res.TaskID] = res
		task = h.t
		ws.reported = append(ws.reported, h.t)
		b.reported = append(b.reported, res.TaskID)
		ws.dropLocked(h)
		// A worker let go leaves at its first poll once it holds no
		// task; one with slots may have that poll open already (its
		// room freed before its result went): it is answered now, not
		// at the end of its wait.
		if ws.leaving && len(ws.held) == 0 && ws.poll != nil {
			ws.poll.fire()
		}
		ws.lastSeen = res.At
	}
	b.mu.Unlock()
	if d != allowed {
		return d, refusal
	}
	if res.run == nil {
		// A task's result is logged as the router settles it ("task
		// ended", with its state): once a task, not twice.
		b.logger.Info("work done", "attempt_id", res.TaskID, "worker", name, "host", res.Hostname,
			"job_id", res.JobID, "cpus", res.CPUs, "output", res.Output)
	}
	if b.hooks.result != nil {
		b.hooks.result(res)
	}
	detail := res.Output
	if res.run != nil {
		detail = string(res.run.State)
	}
	b.activity(Activity{Kind: EventTaskDone, Provisioner: cred.Provisioner, Worker: name, Job: res.JobID, Task: task.Name,
		Attempt: task.Attempt, AttemptID: res.TaskID, Detail: detail})
	b.notify()
	return allowed, ""
}

// detach ends the worker cred names, in the session whose secret is
// session: it leaves the books, and its name may not attach again,
// whether or not it got as far as attaching. Only a session that does
// not hold is denied (not being attached is not: the credential's job
// is over either way).
func (b *books) detach(cred host.Credential, session string) (denial, string) {
	name := cred.Worker
	b.mu.Lock()
	ws, d, refusal := b.sessionLocked(cred, session)
	if ws == nil && d != notAttached {
		// Attached, in a session this request does not hold: a copied
		// credential does not end its owner's.
		b.mu.Unlock()
		return d, refusal
	}
	var left *goneWorker
	if ws != nil {
		why := "detached"
		if len(ws.held) > 0 {
			why = jobStopped(ws.info, b.now())
		}
		left = b.goneOf(ws, why)
		b.forgetLocked(name, ws)
	}
	// A credential of another provisioner for the same name revokes
	// nothing of the owner's.
	if ws != nil || (b.workers[name] == nil && b.admission.ownedBy(name, cred.Provisioner)) {
		b.admission.revoke(name, "detached", cred.Expires)
	}
	b.mu.Unlock()
	if left != nil {
		// A task left behind is noticed by the router, which places it
		// again; nothing to do here but say so.
		for _, t := range left.tasks {
			b.logger.Info("worker detached with a task in hand", "worker", name, "job_id", left.info.JobID, "task", t.Name,
				"attempt", t.Attempt, "attempt_id", t.ID, "why", left.why)
		}
		if len(left.tasks) == 0 {
			b.logger.Info("worker detached", "worker", name)
		}
		for _, a := range left.activities(EventWorkerDetached) {
			a.Provisioner = cred.Provisioner
			b.activity(a)
		}
		b.tellGone(left)
		b.notify()
	}
	return allowed, ""
}

// jobStopped says why a worker left with task in hand: a worker
// detaches mid-task only when it is stopped (its job cancelled, by hand,
// by a nemesis or by the scheduler, or at its time limit), and the time
// limit it reported tells which.
func jobStopped(info WorkerInfo, now time.Time) string {
	job := "its job"
	if info.JobID != "" {
		job += " " + info.JobID
	}
	switch {
	case info.EndsAt.IsZero():
		return job + " was stopped under its task (cancelled, or at its time limit)"
	case now.Before(info.EndsAt.Add(-worker.EndMargin)):
		return fmt.Sprintf("%s was cancelled under its task, %s before its time limit", job, info.EndsAt.Sub(now).Truncate(time.Second))
	}
	return job + " reached its time limit under its task"
}

// workerCounts is the attached workers by the provisioner that asked for
// them, idle or busy (a worker whose result is not yet collected is
// busy, as GET /status counts it).
func (b *books) workerCounts() map[string]workerCounts {
	b.mu.Lock()
	out := map[string]workerCounts{}
	for _, ws := range b.workers {
		n := out[ws.owner]
		if ws.busyLocked() {
			n.busy++
		} else {
			n.idle++
		}
		cpus, _ := ws.busyShareLocked()
		n.cpus += ws.info.CPUs
		n.cpusBusy += cpus
		out[ws.owner] = n
	}
	b.mu.Unlock()
	return out
}

// workerStatus is one attached worker as GET /status lists it.
type workerStatus struct {
	WorkerInfo
	AttachedAt time.Time `json:"attached_at"`
	LastSeen   time.Time `json:"last_seen"`
	Polling    bool      `json:"polling"`
	// Task is the id of the task the worker holds (empty for the
	// stand-in's work, and when idle); Attempt is its attempt's number
	// and AttemptID the attempt's id, set whenever the worker holds
	// work. Reported: its result is in, and the engine's next pass
	// records it; the worker takes no other task until then.
	Task      string `json:"task,omitempty"`
	Attempt   int    `json:"attempt,omitempty"`
	AttemptID string `json:"attempt_id,omitempty"`
	Reported  bool   `json:"reported,omitempty"`
	// TimeLeft is how long until the worker's job must end, in whole
	// seconds ("41s"); empty when its end is not known.
	TimeLeft string `json:"time_left,omitempty"`
	// Running counts the tasks the worker holds, reported ones not yet
	// recorded among them; a worker with slots may hold several, and
	// Task names the first, AttemptIDs every one.
	Running    int      `json:"running,omitempty"`
	AttemptIDs []string `json:"attempt_ids,omitempty"`
	// CPUsBusy and GPUsBusy are what of its CPUs and GPUs the tasks it
	// holds take (a task one CPU at least); a worker without slots is
	// wholly busy with its one task.
	CPUsBusy int `json:"cpus_busy"`
	GPUsBusy int `json:"gpus_busy"`
}

// statuses lists the attached workers in order of name. They are copied
// under the lock into a slice made to size, and ordered outside it by
// moving each once: a workerStatus is a few hundred bytes, and sorting
// the slice in place moves them many times over.
func (b *books) statuses() []workerStatus {
	now := b.now()
	b.mu.Lock()
	all := make([]workerStatus, 0, len(b.workers))
	for _, ws := range b.workers {
		st := workerStatus{WorkerInfo: ws.info, AttachedAt: ws.attached, LastSeen: ws.lastSeen, Polling: ws.polling > 0}
		if !ws.info.EndsAt.IsZero() {
			st.TimeLeft = max(0, ws.info.EndsAt.Sub(now)).Truncate(time.Second).String()
		}
		st.Labels = slices.Clone(st.Labels)
		var held *Task
		switch {
		case len(ws.held) > 0:
			held = &ws.held[0].t
		case len(ws.reported) > 0:
			held, st.Reported = &ws.reported[0], true
		}
		if held != nil {
			st.Task, st.Attempt, st.AttemptID = held.Name, held.Attempt, held.ID
		}
		st.Running = len(ws.held) + len(ws.reported)
		for _, h := range ws.held {
			st.AttemptIDs = append(st.AttemptIDs, h.t.ID)
		}
		for _, r := range ws.reported {
			st.AttemptIDs = append(st.AttemptIDs, r.ID)
		}
		st.CPUsBusy, st.GPUsBusy = ws.busyShareLocked()
		all = append(all, st)
	}
	b.mu.Unlock()
	order := make([]int, len(all))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(x, y int) int { return strings.Compare(all[x].Name, all[y].Name) })
	sorted := make([]workerStatus, len(all))
	for k, i := range order {
		sorted[k] = all[i]
	}
	return sorted
}

// letGo has the workers of the provisioners and profiles in gone (a
// profile "" is the whole provisioner) leave: from now on, and for one
// that attaches later, each is given no task and its next poll without
// one answers CodeLeave; a busy one finishes its task first. It returns
// how many attached workers it let go.
func (b *books) letGo(gone []ownedProfile) int {
	if len(gone) == 0 {
		return 0
	}
	b.mu.Lock()
	if b.unwanted == nil {
		b.unwanted = map[ownedProfile]bool{}
	}
	for _, g := range gone {
		b.unwanted[g] = true
	}
	n := 0
	for _, ws := range b.workers {
		if !ws.leaving && b.unwantedLocked(ws) {
			ws.leaving = true
			n++
		}
	}
	b.mu.Unlock()
	b.wakeAll()
	return n
}

// unwantedLocked reports whether ws's provisioner or profile was
// removed. b.mu must be held.
func (b *books) unwantedLocked(ws *workerState) bool {
	return b.unwanted[ownedProfile{ws.owner, ""}] || (ws.info.Profile != "" && b.unwanted[ownedProfile{ws.owner, ws.info.Profile}])
}

// wanted takes back letGo's word for the provisioners and profiles in
// back, which a later reload added again; the workers already leaving
// still leave.
func (b *books) wanted(back []ownedProfile) {
	b.mu.Lock()
	for _, g := range back {
		delete(b.unwanted, g)
	}
	b.mu.Unlock()
}

// countOf is how many workers of provisioner are attached.
func (b *books) countOf(provisioner string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, ws := range b.workers {
		if ws.owner == provisioner {
			n++
		}
	}
	return n
}
