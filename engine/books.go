package engine

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
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

// Books is where workers meet the engine, over plain HTTP: they attach
// with a credential the engine signed, long-poll for a task, report its
// result and detach when they leave. It keeps the books on who is
// attached, what each was given and what came back; deciding who gets what
// is the Router's job, and the Books never calls a provisioner.
//
// Every worker's request carries "Authorization: Bearer <token>", and
// the worker's name is the one in the token, never one in the body. GET
// /status is the operator's: the daemon serves it behind operatorAuth
// (host-example/operator.go).
type Books struct {
	// PollWait is the longest GET /v1/work holds a request before
	// answering 204. A worker may ask for less with ?wait=SECONDS. Set it
	// before serving; zero means defaultPollWait.
	PollWait time.Duration

	// StatusFunc supplies the provisioners in GET /status. It is called
	// with the request's context and without e.mu, so it may cross the
	// plugin boundary. Nil lists none. Set before serving.
	StatusFunc func(context.Context) []host.ProvisionerStatus

	// NeedsFunc supplies the needs in GET /status, normally Router.Needs.
	// Nil lists none. Set before serving.
	NeedsFunc func() []NeedStatus
	// HeldFunc supplies the profiles the engine holds back in GET
	// /status, normally Router.Held.
	HeldFunc func() []HeldProfile

	// ID is the engine's identity (Config.ID), shown in GET /status.
	// Set before serving.
	ID string

	// OnAttach and OnResult, when set, hear of each first attach and each
	// accepted result, after the books are updated and without e.mu; the
	// run command tells its story with them. Set before serving.
	OnAttach func(WorkerInfo)
	OnResult func(Result)
	// OnActivity, when set, hears of what happens to workers and tasks
	// (attached, detached, gone, dropped, task assigned, task done), for
	// the event stream and the metrics; without e.mu. Set before serving.
	OnActivity func(Activity)

	logger hclog.Logger
	signer *host.Signer
	now    func() time.Time
	// refusals bounds how often a refused request is logged: a flood of
	// bad credentials must not become a flood of log lines.
	refusals *loglimit.Limiter
	// ignoredEvents bounds how often an event about another
	// provisioner's worker is logged: a plugin can send them by the
	// thousand.
	ignoredEvents *loglimit.Limiter
	// status serves GET /status from a short-lived cache.
	status host.StatusCache

	// changed holds at most one pending wake-up for the run loop: a
	// worker attached, finished or left, so a router pass now would find
	// something new.
	changed chan struct{}
	// done is closed by Close; long polls return at once after it.
	done      chan struct{}
	closeOnce sync.Once
	// leave is closed by Dismiss: polls answer CodeLeave from then on.
	leave       chan struct{}
	dismissOnce sync.Once
	// parker parks long polls (park.go); nil holds each on its
	// goroutine. Engine.Serve sets it before serving.
	parker *parker

	// mu guards workers, results, admission and every field of every
	// workerState. It is never held while writing a response, logging, or
	// calling StatusFunc or NeedsFunc: a slow client or a slow plugin
	// must not stall every other worker.
	mu      sync.Mutex
	workers map[string]*workerState
	// results are finished tasks by id, kept until the router takes them.
	results map[string]Result
	// admission is the provisioners' word on which job each worker was
	// started as, from their events, and the names that may never attach
	// again: their worker detached or was given up on, or their request
	// was cancelled. A credential is worth one job.
	admission *host.Admission
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
}

// workerState is one attached worker. Every field is guarded by Books.mu.
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
	// task is assigned and not yet reported; nil when the worker is idle.
	// It is handed out again on every poll until its result arrives, so a
	// response lost on the way costs a repeat, not the task.
	task *Task
	// delivered is set once task went out in a poll's answer: from then
	// the worker is busy with it and not expected to poll.
	delivered bool
	// wake holds at most one pending signal that task was set, for a
	// poll held on its goroutine; parked is the poll parked now, fired
	// instead.
	wake   chan struct{}
	parked *parkedPoll
	// session is the digest of the session secret its attach was
	// answered with (session.go): work, result and detach must carry
	// the secret.
	session [sha256.Size]byte
}

// NewBooks returns an Books that trusts credentials signer verifies.
// now is its clock (nil means time.Now); tests pass their own.
func NewBooks(logger hclog.Logger, signer *host.Signer, now func() time.Time) *Books {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	if now == nil {
		now = time.Now
	}
	return &Books{
		logger:        logger,
		signer:        signer,
		now:           now,
		refusals:      loglimit.New(refusalLogBurst, refusalLogWindow),
		ignoredEvents: loglimit.New(refusalLogBurst, refusalLogWindow),
		changed:       make(chan struct{}, 1),
		done:          make(chan struct{}),
		leave:         make(chan struct{}),
		workers:       make(map[string]*workerState),
		results:       make(map[string]Result),
		admission:     host.NewAdmission(now),
	}
}

// Handler routes the engine's endpoints.
func (e *Books) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/attach", e.handleAttach)
	mux.HandleFunc("GET /v1/work", e.handleWork)
	mux.HandleFunc("GET /v1/watch", e.handleWatch)
	mux.HandleFunc("POST /v1/result", e.handleResult)
	mux.HandleFunc("POST /v1/detach", e.handleDetach)
	mux.HandleFunc("GET /status", e.handleStatus)
	return mux
}

// Changed delivers a value after a worker attaches, reports a result or
// detaches, so the run loop can pass at once instead of on its next tick.
// Wake-ups that arrive while one is pending are merged.
func (e *Books) Changed() <-chan struct{} { return e.changed }

// Close ends the long polls in progress and refuses new ones, so that an
// http.Server's Shutdown need not wait out PollWait. It is idempotent.
func (e *Books) Close() {
	e.closeOnce.Do(func() { close(e.done) })
	e.parker.end(wakeDone)
}

// Attached lists the workers attached now, by name, for Reconcile.
// Workers not seen for goneFactor poll periods are dropped first.
func (e *Books) Attached() []string {
	e.mu.Lock()
	names := make([]string, 0, len(e.workers))
	for name := range e.workers {
		names = append(names, name)
	}
	e.mu.Unlock()
	slices.Sort(names)
	return names
}

// AttachedBy lists the workers attached now whose credential a given
// provisioner asked for, for that provisioner's Reconcile. Ownership comes
// from the credential, not from the name: a provisioner "bad" that minted
// "bad-gpu-x" does not make provisioner "bad-gpu" think its worker came.
func (e *Books) AttachedBy(provisioner string) []string {
	e.mu.Lock()
	var names []string
	for name, ws := range e.workers {
		if ws.owner == provisioner {
			names = append(names, name)
		}
	}
	e.mu.Unlock()
	slices.Sort(names)
	return names
}

// ObserveEvent records what a provisioner's event says about a worker's
// credential: worker_provisioned names the job the worker must attach as;
// worker_cancelled and worker_provision_failed revoke the name for good,
// and drop the worker if it is attached. A provisioner speaks only for
// its own workers: an event naming a worker another provisioner recorded
// changes nothing. ev.Provisioner must be the host's stamp, never the
// plugin's claim. The error, which the caller counts, wraps
// host.ErrOverBudget when the provisioner's events hold their budget of
// records and this one's was not kept; nil otherwise.
func (e *Books) ObserveEvent(ev shared.Event) error {
	e.mu.Lock()
	revoke, err := e.admission.Observe(ev)
	var dropped *goneWorker
	if ws := e.workers[ev.Worker]; revoke && ws != nil && ws.owner == ev.Provisioner {
		dropped = &goneWorker{name: ev.Worker, owner: ws.owner, job: ws.info.JobID, lastSeen: ws.lastSeen}
		if ws.task != nil {
			dropped.task = ws.task.ID
		}
		delete(e.workers, ev.Worker)
	}
	e.mu.Unlock()
	overBudget := errors.Is(err, host.ErrOverBudget)
	if err != nil && !overBudget {
		if ok, leftOut := e.ignoredEvents.Allow(time.Now()); ok {
			e.logger.Warn("ignored an event about another provisioner's worker", "provisioner", ev.Provisioner,
				"worker", ev.Worker, "kind", ev.Kind, "error", err, "not_logged_before", leftOut)
		}
	}
	if dropped != nil {
		e.logger.Info("worker dropped: its request was cancelled", "worker", dropped.name, "task_left", dropped.task)
		e.activity(Activity{Kind: EventWorkerDropped, Provisioner: dropped.owner, Worker: dropped.name, Job: dropped.job, Task: dropped.task,
			Detail: "its request was cancelled (" + string(ev.Kind) + ")"})
		e.notify()
	}
	if overBudget {
		return err
	}
	return nil
}

// records is how many job records and revocations provisioner's events
// hold in the books' admission, each of host.RecordBudget.
func (e *Books) records(provisioner string) (jobs, revoked int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.admission.Records(provisioner)
}

func (e *Books) pollWait() time.Duration {
	if e.PollWait > 0 {
		return e.PollWait
	}
	return defaultPollWait
}

func (e *Books) notify() {
	select {
	case e.changed <- struct{}{}:
	default:
	}
}

// -- the router's side ---------------------------------------------------

var (
	errNotAttached = errors.New("worker is not attached")
	errWorkerBusy  = errors.New("worker already has a task")
)

// IdleWorkers lists attached workers with no task, smallest first, so
// that a small need takes a small machine and leaves the big ones for the
// needs only they fit.
func (e *Books) IdleWorkers() []WorkerInfo {
	idle, _ := e.IdleAndAttached()
	return idle
}

// IdleAndAttached is IdleWorkers and, from the same moment, every
// attached worker's name by its provisioner: a demand built from the one
// and told with the other cannot count a worker that attached in between
// as both arrived and still wanted.
func (e *Books) IdleAndAttached() ([]WorkerInfo, map[string][]string) {
	e.mu.Lock()
	var idle []WorkerInfo
	attached := map[string][]string{}
	for name, ws := range e.workers {
		if ws.task == nil {
			idle = append(idle, ws.info)
		}
		attached[ws.owner] = append(attached[ws.owner], name)
	}
	e.mu.Unlock()
	for _, names := range attached {
		slices.Sort(names)
	}
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
	return idle, attached
}

// Assign gives t to worker, which hands it out on its next poll (or the
// one in progress).
func (e *Books) Assign(worker string, t Task) error {
	e.mu.Lock()
	ws := e.workers[worker]
	if ws == nil {
		e.mu.Unlock()
		return errNotAttached
	}
	if ws.task != nil {
		e.mu.Unlock()
		return errWorkerBusy
	}
	ws.task = &t
	select {
	case ws.wake <- struct{}{}:
	default:
	}
	if ws.parked != nil {
		ws.parked.fire(wakeTask)
	}
	a := Activity{Kind: EventTaskAssigned, Provisioner: ws.owner, Worker: worker, Job: ws.info.JobID, Task: t.ID}
	e.mu.Unlock()
	e.activity(a)
	return nil
}

// TaskState is where a task stands, as TaskOutcome sees it.
type TaskState int

const (
	TaskPending TaskState = iota // assigned, no result yet
	TaskDone                     // result arrived (and is now the caller's)
	TaskLost                     // its worker left or was given up on first
)

// TaskOutcome reports on task id given to worker. A result is handed over
// once: the engine forgets it as it returns TaskDone.
func (e *Books) TaskOutcome(worker, id string) (Result, TaskState) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if res, ok := e.results[id]; ok {
		delete(e.results, id)
		return res, TaskDone
	}
	// Not swept here: goneness is decided where it is logged. A worker
	// past its time is dropped by the IdleWorkers call in the same pass.
	if ws := e.workers[worker]; ws != nil && ws.task != nil && ws.task.ID == id {
		return Result{}, TaskPending
	}
	return Result{}, TaskLost
}

// goneWorker is a worker dropped for silence, kept to be logged once the
// lock is released.
type goneWorker struct {
	name     string
	owner    string
	job      string
	lastSeen time.Time
	task     string
}

// Activity is something that happened to a worker or a task, as
// Books.OnActivity hears it.
type Activity struct {
	// Kind is one of the worker and task kinds of EventKind.
	Kind        EventKind
	Provisioner string
	Worker      string
	// Job is the scheduler's id the worker reported (Slurm's job id).
	Job    string
	Task   string
	Detail string
}

func (e *Books) activity(a Activity) {
	if e.OnActivity != nil {
		e.OnActivity(a)
	}
}

// sweepLocked drops workers that are gone, and revokes their names: a
// worker with no poll open and no task in hand for deadAfter, or running
// a task it was handed and unseen for goneFactor poll periods. A task that
// was assigned to a dead worker and never picked up goes back to the
// router (TaskOutcome says TaskLost). It also forgets revocations and job
// records older than any credential can live. e.mu must be held. A worker
// running a long task does not poll meanwhile; ours are short, and one
// that needs longer should poll in between (a poll while holding a task
// just hands the task back).
func (e *Books) sweepLocked() []goneWorker {
	now := e.now()
	busyLimit := goneFactor * e.pollWait()
	var gone []goneWorker
	for name, ws := range e.workers {
		if ws.polling > 0 {
			continue
		}
		limit := deadAfter
		if ws.task != nil && ws.delivered {
			limit = busyLimit
		}
		if now.Sub(ws.lastSeen) > limit {
			g := goneWorker{name: name, owner: ws.owner, job: ws.info.JobID, lastSeen: ws.lastSeen}
			if ws.task != nil {
				g.task = ws.task.ID
			}
			gone = append(gone, g)
			delete(e.workers, name)
			e.admission.Revoke(name, "gone silent", ws.expires)
		}
	}
	e.admission.Sweep()
	return gone
}

// watchEvery is how often Watch looks for workers gone silent: a fifth
// of deadAfter, so a dead worker is noticed at most a fifth late.
const watchEvery = deadAfter / 5

// Watch decides liveness until ctx ends: every watchEvery it drops the
// workers gone silent and revokes their names (Sweep). It is the one
// place that does: reading the books (GET /status, a metrics scrape,
// Attached) never changes them. Engine runs it on a goroutine it owns.
func (e *Books) Watch(ctx context.Context) {
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			e.Sweep()
		}
	}
}

// Sweep drops the workers gone silent now, revokes their names, and
// tells of each (log, OnActivity). Watch calls it; an engine that runs
// no Watch, or a test with its own clock, calls it itself.
func (e *Books) Sweep() {
	e.mu.Lock()
	gone := e.sweepLocked()
	e.mu.Unlock()
	e.logGone(gone)
}

// Dismiss lets the workers go, for a clean stop: every poll open now or
// made from now on answers 410 with CodeLeave, on which a worker
// detaches and exits 0, so its job ends completed instead of failing
// when the engine is gone. A worker busy with a task hears it on its
// watch (GET /v1/watch) and drops the task; one too old to watch hears
// it at its next poll, after its result. Dismiss waits up to wait (or ctx) for
// every worker to detach and returns how many had not. Attaches are
// still taken: a worker that comes now is told to leave at its first
// poll.
func (e *Books) Dismiss(ctx context.Context, wait time.Duration) int {
	e.dismissOnce.Do(func() { close(e.leave) })
	e.parker.end(wakeLeave)
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	// A poll with a deadline, not an event: detaches are rare here and
	// the wait is seconds long at most.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		e.mu.Lock()
		n := len(e.workers)
		e.mu.Unlock()
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

func (e *Books) logGone(gone []goneWorker) {
	for _, g := range gone {
		e.logger.Warn("worker gone", "worker", g.name, "last_seen", g.lastSeen, "task", g.task)
		e.activity(Activity{Kind: EventWorkerGone, Provisioner: g.owner, Worker: g.name, Job: g.job, Task: g.task,
			Detail: "silent since " + g.lastSeen.UTC().Format(time.RFC3339)})
	}
	if len(gone) > 0 {
		e.notify()
	}
}

// -- the workers' side ---------------------------------------------------

// authenticate returns what a request's credential says: signed by the
// engine, not expired, and not revoked. On failure it has already
// answered 401, logged why, without the token, and closed the
// connection.
//
// A credential that checks out does not yet make the connection a
// worker's (connGate's share for workers): that takes an attach that
// succeeds, or a session that holds (sessionLocked). A detached worker's
// credential, or a failed job's, checks out for hours; had it made its
// connection a worker's, 40 connections polling with one filled
// max_connections = 40 and the real workers' attaches were reset.
func (e *Books) authenticate(w http.ResponseWriter, r *http.Request) (host.Credential, bool) {
	token, ok := Bearer(r.Header.Get("Authorization"))
	if !ok {
		e.refuse(w, r, "missing credential")
		return host.Credential{}, false
	}
	cred, err := e.signer.Verify(token, e.now())
	if err == nil {
		e.mu.Lock()
		err = e.admission.Revoked(cred.Worker)
		e.mu.Unlock()
	}
	if err != nil {
		e.refuse(w, r, err.Error())
		return host.Credential{}, false
	}
	return cred, true
}

// closeAfter has the server close r's connection after its answer: the
// request was refused for its credential or session, and its connection
// is not a worker's to keep.
func closeAfter(w http.ResponseWriter) { w.Header().Set("Connection", "close") }

// ownedLocked returns the attached worker a credential names, or nil if
// there is none or it was attached under another provisioner's
// credential for the same name. e.mu must be held.
func (e *Books) ownedLocked(cred host.Credential) *workerState {
	ws := e.workers[cred.Worker]
	if ws == nil || ws.owner != cred.Provisioner {
		return nil
	}
	return ws
}

// Bearer extracts the token from an Authorization header. The scheme is
// case-insensitive, as RFC 9110 says.
func Bearer(header string) (string, bool) {
	scheme, token, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// Refused requests are logged at most refusalLogBurst per
// refusalLogWindow; the next line logged says how many were left out.
const (
	refusalLogBurst  = 10
	refusalLogWindow = 10 * time.Second
)

// refuse answers 401 and closes the connection. reason comes from
// Verify's errors, which never contain the token; the header itself goes
// nowhere.
//
// The body is never read (see dontReadBody).
func (e *Books) refuse(w http.ResponseWriter, r *http.Request, reason string) {
	if ok, leftOut := e.refusals.Allow(time.Now()); ok {
		kv := []any{"reason", reason, "path", r.URL.Path, "remote", r.RemoteAddr}
		if leftOut > 0 {
			kv = append(kv, "refusals_not_logged_before", leftOut)
		}
		e.logger.Warn("refused a worker", kv...)
	}
	DontReadBody(w)
	w.Header().Set("WWW-Authenticate", `Bearer realm="fluksio"`)
	WriteError(w, http.StatusUnauthorized, reason)
}

func (e *Books) handleAttach(w http.ResponseWriter, r *http.Request) {
	cred, ok := e.authenticate(w, r)
	if !ok {
		return
	}
	name := cred.Worker
	var req worker.AttachRequest
	if err := decodeBody(w, r, worker.MaxRequestBody, &req); err != nil {
		WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := checkAttach(req); err != nil {
		WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	// What a worker says about itself is printed in the story and the
	// log: no control character of its survives.
	info := WorkerInfo{
		Name: name, Provisioner: cred.Provisioner, Hostname: host.Printable(req.Hostname), JobID: host.Printable(req.JobID),
		CPUs: req.CPUs, GPUs: req.GPUs, RAMMB: req.RAMMB, Labels: slices.Clone(req.Labels),
	}
	if err := host.Allows(cred.CredentialClaims, info.CPUs, info.GPUs, info.RAMMB, info.Labels); err != nil {
		e.refuseAttach(w, r, http.StatusForbidden, name, err.Error())
		return
	}

	now := e.now()
	e.mu.Lock()
	status, refusal := e.admitLocked(cred, info)
	var session string
	if refusal == "" {
		info.Profile = e.admission.ProfileOf(name)
		ws := &workerState{owner: cred.Provisioner, expires: cred.Expires, attached: now, lastSeen: now,
			info: info, wake: make(chan struct{}, 1)}
		session, ws.session = newSession()
		e.workers[name] = ws
	}
	e.mu.Unlock()
	if refusal != "" {
		e.refuseAttach(w, r, status, name, refusal)
		return
	}

	e.logger.Info("worker attached", "worker", name, "provisioner", cred.Provisioner, "host", info.Hostname,
		"job_id", info.JobID, "cpus", info.CPUs, "gpus", info.GPUs, "ram_mb", info.RAMMB, "labels", info.Labels)
	if e.OnAttach != nil {
		e.OnAttach(info)
	}
	e.activity(Activity{Kind: EventWorkerAttached, Provisioner: info.Provisioner, Worker: name, Job: info.JobID,
		Detail: fmt.Sprintf("from %s, %d cpus, %d gpus", info.Hostname, info.CPUs, info.GPUs)})
	e.notify()
	// The connection is the attached worker's now: it leaves the share
	// of connections that are no worker's.
	markCredentialed(r.Context())
	writeJSON(w, http.StatusOK, worker.AttachResponse{Worker: name, Session: session})
}

// admitLocked decides whether a worker with a valid credential may attach
// as info, and if not, with which status and why. e.mu must be held.
func (e *Books) admitLocked(cred host.Credential, info WorkerInfo) (int, string) {
	var refusal *host.AdmitError
	if err := e.admission.Admit(cred, info.JobID); errors.As(err, &refusal) {
		status := map[host.Refusal]int{
			host.RefusedRevoked:  http.StatusUnauthorized,
			host.RefusedNotYet:   http.StatusServiceUnavailable,
			host.RefusedMismatch: http.StatusForbidden,
		}[refusal.Refusal]
		return status, refusal.Error()
	}
	if ws := e.workers[cred.Worker]; ws != nil {
		return http.StatusConflict, fmt.Sprintf("worker %s is already attached (from host %s); a credential attaches once", cred.Worker, ws.info.Hostname)
	}
	return 0, ""
}

// refuseAttach answers an attach with a valid credential that may not
// attach, logs why, and closes the connection.
func (e *Books) refuseAttach(w http.ResponseWriter, r *http.Request, status int, worker, reason string) {
	e.logger.Warn("refused an attach", "worker", worker, "reason", reason, "remote", r.RemoteAddr)
	closeAfter(w)
	WriteError(w, status, reason)
}

func checkAttach(req worker.AttachRequest) error {
	switch {
	case req.CPUs < 1:
		return fmt.Errorf("cpus is %d; a worker has at least 1", req.CPUs)
	case req.GPUs < 0 || req.RAMMB < 0:
		return errors.New("gpus and ram_mb may not be negative")
	case len(req.Hostname) > 255 || len(req.JobID) > 64:
		return errors.New("hostname or job_id is too long")
	case len(req.Labels) > 64:
		return fmt.Errorf("%d labels; at most 64", len(req.Labels))
	}
	for _, l := range req.Labels {
		if l == "" || len(l) > 128 {
			return errors.New("a label is empty or longer than 128 bytes")
		}
	}
	return nil
}

func (e *Books) handleWork(w http.ResponseWriter, r *http.Request) {
	cred, ok := e.authenticate(w, r)
	if !ok {
		return
	}
	wait := e.pollWait()
	if s := r.URL.Query().Get("wait"); s != "" {
		// A worker about to reach its idle limit asks for less, so it
		// can leave on time rather than a poll period late.
		secs, err := strconv.ParseFloat(s, 64)
		if err != nil || secs < 0 {
			WriteError(w, http.StatusBadRequest, "wait must be a number of seconds")
			return
		}
		if d := time.Duration(secs * float64(time.Second)); d < wait {
			wait = d
		}
	}

	if e.parker.canPark(r) && e.parkWork(w, r, cred, wait) {
		return
	}
	task, status, reason := e.nextTask(r, cred, wait)
	switch status {
	case http.StatusUnauthorized, http.StatusForbidden:
		e.refuseSession(w, r, status, cred.Worker, reason)
		return
	}
	if status == http.StatusConflict && reason != pollOpen {
		closeAfter(w)
	}
	status, body := workAnswer(status, reason, cred.Worker, task)
	if body == nil {
		w.WriteHeader(status)
		return
	}
	writeJSON(w, status, body)
}

// workAnswer is the answer to GET /v1/work for what nextTask said (not
// 401 or 403), as a status and a value to encode (nil: none), for the
// poll held on its goroutine and the parked one alike.
func workAnswer(status int, reason, name string, task Task) (int, any) {
	switch status {
	case http.StatusOK:
		return status, task
	case http.StatusNoContent:
		return status, nil
	case http.StatusGone:
		return status, worker.ErrorResponse{Error: "the engine is stopping and lets its workers go: detach and exit", Code: worker.CodeLeave}
	case http.StatusConflict:
		if reason == pollOpen {
			return status, worker.ErrorResponse{Error: "a poll is already open for worker " + name + "; poll again when it ends", Code: worker.CodePollOpen}
		}
		return status, worker.ErrorResponse{Error: reason}
	}
	return http.StatusServiceUnavailable, worker.ErrorResponse{Error: "engine is shutting down"}
}

// parkWork parks a poll that would wait (park.go) and reports whether it
// did; on false nothing was written and the caller holds the poll as
// before. The books may change between the look before the hijack and
// the one after; the second decides, and a poll with its answer ready
// then is answered at once.
func (e *Books) parkWork(w http.ResponseWriter, r *http.Request, cred host.Credential, wait time.Duration) bool {
	name := cred.Worker
	e.mu.Lock()
	ws, _, _ := e.sessionLocked(r, cred)
	waits := ws != nil && ws.polling == 0 && ws.task == nil && !isClosed(e.leave) && !isClosed(e.done)
	e.mu.Unlock()
	if !waits {
		return false
	}
	pp, ok := e.parker.hijack(w, r)
	if !ok {
		return false
	}
	if pp == nil {
		return true
	}
	e.mu.Lock()
	counted := e.workers[name] == ws && ws.polling == 0
	if counted {
		ws.polling++
		ws.lastSeen = e.now()
		ws.parked = pp
	}
	now := !counted || ws.task != nil
	pp.answer = func(why wakeReason) parkedAnswer {
		e.mu.Lock()
		status, reason, task := e.parkedWorkLocked(ws, name, counted, why)
		e.mu.Unlock()
		if why == wakeHangup {
			return parkedAnswer{none: true}
		}
		status, body := workAnswer(status, reason, name, task)
		return parkedAnswer{status: status, body: body}
	}
	e.mu.Unlock()
	e.parker.hold(pp, wait, now)
	return true
}

// parkedWorkLocked decides a parked poll's answer, as nextTask's loop
// decides a held one's: counted says the poll was counted in ws.polling.
// e.mu must be held.
func (e *Books) parkedWorkLocked(ws *workerState, name string, counted bool, why wakeReason) (int, string, Task) {
	if counted {
		ws.polling--
		ws.lastSeen = e.now()
		ws.parked = nil
	}
	switch {
	case why == wakeLeave:
		return http.StatusGone, worker.CodeLeave, Task{}
	case e.workers[name] != ws:
		return http.StatusConflict, errNotAttached.Error(), Task{}
	case !counted && ws.polling > 0:
		return http.StatusConflict, pollOpen, Task{}
	case ws.task != nil:
		// A worker that hung up never reads the task: it stays
		// undelivered, as in nextTask.
		ws.delivered = why != wakeHangup
		return http.StatusOK, "", *ws.task
	case why == wakeDone:
		return http.StatusServiceUnavailable, "", Task{}
	}
	return http.StatusNoContent, "", Task{}
}

// isClosed reports whether ch, closed once and never sent on, is closed.
func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// handleWatch holds GET /v1/watch, which a worker keeps open while it runs
// a task (it has no poll open then). It answers 410 with CodeLeave as soon
// as Dismiss lets the workers go, and the worker drops its task and
// leaves: without it, a worker busy when the engine stopped cleanly heard
// nothing until its task ended and its report had failed for its give-up
// time, and its job outlived the stop by both (the soak found jobs running
// 20 s after the engine had exited). Else it answers 204 after the poll
// period, and the worker opens another. The task is not taken back: a
// stopping engine has no use for its result. Each watch counts as the
// worker being seen.
func (e *Books) handleWatch(w http.ResponseWriter, r *http.Request) {
	cred, ok := e.authenticate(w, r)
	if !ok {
		return
	}
	e.mu.Lock()
	ws, status, reason := e.sessionLocked(r, cred)
	if ws != nil {
		ws.lastSeen = e.now()
	}
	e.mu.Unlock()
	switch status {
	case 0:
	case http.StatusUnauthorized, http.StatusForbidden:
		e.refuseSession(w, r, status, cred.Worker, reason)
		return
	default:
		closeAfter(w)
		WriteError(w, status, reason)
		return
	}
	if e.parker.canPark(r) {
		if pp, ok := e.parker.hijack(w, r); ok {
			if pp != nil {
				pp.answer = func(why wakeReason) parkedAnswer {
					e.mu.Lock()
					if e.workers[cred.Worker] == ws {
						ws.lastSeen = e.now()
					}
					e.mu.Unlock()
					status, body := watchAnswer(why)
					return parkedAnswer{status: status, body: body, none: status == 0}
				}
				e.parker.hold(pp, e.pollWait(), false)
			}
			return
		}
	}
	timer := time.NewTimer(e.pollWait())
	defer timer.Stop()
	var why wakeReason
	select {
	case <-e.leave:
		why = wakeLeave
	case <-timer.C:
		why = wakeTimer
	case <-e.done:
		why = wakeDone
	case <-r.Context().Done():
		why = wakeHangup
	}
	e.mu.Lock()
	if e.workers[cred.Worker] == ws {
		ws.lastSeen = e.now()
	}
	e.mu.Unlock()
	switch status, body := watchAnswer(why); {
	case status == 0:
	case body == nil:
		w.WriteHeader(status)
	default:
		writeJSON(w, status, body)
	}
}

// watchAnswer is the answer to GET /v1/watch when why ended it: a status
// and a value to encode (nil: none), or 0 when the worker hung up.
func watchAnswer(why wakeReason) (int, any) {
	switch why {
	case wakeLeave:
		return http.StatusGone, worker.ErrorResponse{Error: "the engine is stopping and lets its workers go: drop the task, detach and exit", Code: worker.CodeLeave}
	case wakeDone:
		return http.StatusServiceUnavailable, worker.ErrorResponse{Error: "engine is shutting down"}
	case wakeHangup:
		return 0, nil
	}
	return http.StatusNoContent, nil
}

// nextTask waits up to wait for a task for the worker r's credential and
// session speak for, and says how to answer: 200 with the task, 204 for
// none yet, 409 if the worker is not attached (it should attach again)
// or, with reason pollOpen, has a poll open already, 401 or 403 when the
// session is missing or another's (sessionLocked), 503 if the engine is
// closing.
func (e *Books) nextTask(r *http.Request, cred host.Credential, wait time.Duration) (Task, int, string) {
	ctx := r.Context()
	timer := time.NewTimer(wait)
	defer timer.Stop()

	name := cred.Worker
	e.mu.Lock()
	defer e.mu.Unlock()
	ws, status, reason := e.sessionLocked(r, cred)
	if ws == nil {
		return Task{}, status, reason
	}
	if ws.polling > 0 {
		// The first keeps its place: a task goes out in one answer.
		return Task{}, http.StatusConflict, pollOpen
	}
	select {
	case <-e.leave:
		// Dismissed: a task in hand was reported or is lost with the
		// engine anyway.
		ws.lastSeen = e.now()
		return Task{}, http.StatusGone, worker.CodeLeave
	default:
	}
	ws.polling++
	ws.lastSeen = e.now()
	defer func() {
		ws.polling--
		ws.lastSeen = e.now()
	}()
	for {
		if ws.task != nil {
			// A worker that hung up (it died mid-poll) never reads the
			// task: it stays undelivered, so the worker's silence is
			// noticed in deadAfter rather than goneFactor poll periods.
			ws.delivered = ctx.Err() == nil
			return *ws.task, http.StatusOK, ""
		}
		if e.workers[name] != ws {
			// Detached (or attached afresh) while we waited.
			return Task{}, http.StatusConflict, errNotAttached.Error()
		}
		e.mu.Unlock()
		var status int
		select {
		case <-ws.wake:
		case <-timer.C:
			status = http.StatusNoContent
		case <-ctx.Done():
			// The worker hung up; nobody reads the answer.
			status = http.StatusNoContent
		case <-e.leave:
			status = http.StatusGone
		case <-e.done:
			status = http.StatusServiceUnavailable
		}
		e.mu.Lock()
		if status == http.StatusGone {
			return Task{}, status, worker.CodeLeave
		}
		if status != 0 && ws.task == nil {
			return Task{}, status, ""
		}
	}
}

func (e *Books) handleResult(w http.ResponseWriter, r *http.Request) {
	cred, ok := e.authenticate(w, r)
	if !ok {
		return
	}
	name := cred.Worker
	var req worker.ResultRequest
	if err := decodeBody(w, r, worker.MaxResultBody, &req); err != nil {
		WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	// Escaped here, once, so that the story, the log and the router's
	// books all see the same harmless text.
	res := Result{
		TaskID: host.Printable(req.TaskID), Worker: name, Hostname: host.Printable(req.Hostname),
		JobID: host.Printable(req.JobID), CPUs: req.CPUs, Output: host.Printable(req.Output), At: e.now(),
	}

	e.mu.Lock()
	ws, status, refusal := e.sessionLocked(r, cred)
	switch {
	case ws == nil && status != http.StatusConflict:
		// A copied credential: the result is not this process's to give.
		e.mu.Unlock()
		e.refuseSession(w, r, status, name, refusal)
		return
	case ws == nil:
		closeAfter(w)
	case ws.task == nil || ws.task.ID != req.TaskID:
		// Most likely a retry of a result already recorded.
		refusal = "no such task for this worker"
	default:
		e.results[req.TaskID] = res
		ws.task, ws.delivered = nil, false
		ws.lastSeen = res.At
	}
	e.mu.Unlock()

	if refusal != "" {
		e.logger.Warn("refused a result", "worker", name, "task", res.TaskID, "reason", refusal)
		WriteError(w, http.StatusConflict, refusal)
		return
	}
	e.logger.Info("work done", "task", res.TaskID, "worker", name, "host", res.Hostname,
		"job_id", res.JobID, "cpus", res.CPUs, "output", res.Output)
	if e.OnResult != nil {
		e.OnResult(res)
	}
	e.activity(Activity{Kind: EventTaskDone, Provisioner: cred.Provisioner, Worker: name, Job: res.JobID, Task: res.TaskID, Detail: res.Output})
	e.notify()
	w.WriteHeader(http.StatusNoContent)
}

func (e *Books) handleDetach(w http.ResponseWriter, r *http.Request) {
	cred, ok := e.authenticate(w, r)
	if !ok {
		return
	}
	name := cred.Worker
	e.mu.Lock()
	ws, status, refusal := e.sessionLocked(r, cred)
	if ws == nil && status != http.StatusConflict {
		// Attached, in a session this request does not hold: a copied
		// credential does not end its owner's.
		e.mu.Unlock()
		e.refuseSession(w, r, status, name, refusal)
		return
	}
	var task, job string
	if ws != nil {
		if ws.task != nil {
			task = ws.task.ID
		}
		job = ws.info.JobID
		delete(e.workers, name)
	}
	// Whether or not it got as far as attaching, this credential's job
	// is over: it may not attach again. A credential of another
	// provisioner for the same name revokes nothing of the owner's.
	if ws != nil || (e.workers[name] == nil && e.admission.OwnedBy(name, cred.Provisioner)) {
		e.admission.Revoke(name, "detached", cred.Expires)
	}
	e.mu.Unlock()

	// Whoever asked, the connection is no attached worker's any more.
	closeAfter(w)
	if ws != nil {
		// A task left behind is noticed by the router, which places it
		// again; nothing to do here but say so.
		e.logger.Info("worker detached", "worker", name, "task_left", task)
		e.activity(Activity{Kind: EventWorkerDetached, Provisioner: cred.Provisioner, Worker: name, Job: job, Task: task})
		e.notify()
	}
	w.WriteHeader(http.StatusNoContent)
}

// -- status --------------------------------------------------------------

type workerStatus struct {
	WorkerInfo
	AttachedAt time.Time `json:"attached_at"`
	LastSeen   time.Time `json:"last_seen"`
	Polling    bool      `json:"polling"`
	Task       string    `json:"task,omitempty"`
}

type statusReport struct {
	EngineID     string                   `json:"engine_id"`
	Provisioners []host.ProvisionerStatus `json:"provisioners"`
	Workers      []workerStatus           `json:"workers"`
	Needs        []NeedStatus             `json:"needs"`
	// HeldBack is the engine's own backoff (backoff.go): profiles whose
	// machines failed in a row, whatever their plugin does about it.
	HeldBack []HeldProfile `json:"held_back"`
}

func (e *Books) handleStatus(w http.ResponseWriter, r *http.Request) {
	// Empty lists, not null: a status page reads .length without asking.
	report := statusReport{EngineID: e.ID, Provisioners: []host.ProvisionerStatus{}, Workers: []workerStatus{}, Needs: []NeedStatus{}, HeldBack: []HeldProfile{}}
	if e.HeldFunc != nil {
		report.HeldBack = e.HeldFunc()
	}
	if e.StatusFunc != nil {
		report.Provisioners = e.status.Get(r.Context(), e.StatusFunc)
	}
	if e.NeedsFunc != nil {
		if needs := e.NeedsFunc(); needs != nil {
			report.Needs = needs
		}
	}

	// The workers are copied under the lock into a slice made to size,
	// and put in order of name outside it by moving each once: a
	// workerStatus is some 200 bytes, and with 10,000 workers growing
	// the slice by appends and sorting it in place moved them enough to
	// take half of GET /status's time.
	e.mu.Lock()
	all := make([]workerStatus, 0, len(e.workers))
	for _, ws := range e.workers {
		st := workerStatus{WorkerInfo: ws.info, AttachedAt: ws.attached, LastSeen: ws.lastSeen, Polling: ws.polling > 0}
		st.Labels = slices.Clone(st.Labels)
		if ws.task != nil {
			st.Task = ws.task.ID
		}
		all = append(all, st)
	}
	e.mu.Unlock()
	order := make([]int, len(all))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(all[a].Name, all[b].Name) })
	report.Workers = make([]workerStatus, len(all))
	for k, i := range order {
		report.Workers[k] = all[i]
	}
	report.stream(w)
}

// stream writes the report as statusReport's JSON, its two long lists
// (a worker and a need each of 10,000 machines) one element at a time,
// each on a line of its own, so that the answer is never whole in
// memory. Encoded whole, a 5 MB answer at 10,000 workers left two 8 MB
// buffers behind it (encoding/json keeps its own in a pool, and
// writeJSON kept the other): a third of the engine's heap. The cost: no
// Content-Length (the body is chunked), and an encoding error found part
// way through cannot become a 500; the connection is then cut, so that a
// reader sees a broken answer rather than a short one.
func (report statusReport) stream(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	js := newJSONStream(w)
	js.raw(`{"engine_id":`)
	js.value(report.EngineID)
	js.raw(",\n\"provisioners\":")
	js.value(report.Provisioners)
	js.raw(",\n\"workers\":[")
	for i := range report.Workers {
		js.element(i, &report.Workers[i])
	}
	js.raw("\n],\n\"needs\":[")
	for i := range report.Needs {
		js.element(i, &report.Needs[i])
	}
	js.raw("\n],\n\"held_back\":")
	js.value(report.HeldBack)
	js.raw("}\n")
	if js.err == nil {
		js.err = js.w.Flush()
	}
	if js.err != nil {
		panic(http.ErrAbortHandler)
	}
}

// jsonStream writes a JSON document in parts, each value encoded into a
// buffer of its own size; the first error stops it.
type jsonStream struct {
	w   *bufio.Writer
	buf bytes.Buffer
	enc *json.Encoder
	err error
}

func newJSONStream(w io.Writer) *jsonStream {
	js := &jsonStream{w: bufio.NewWriterSize(w, 32<<10)}
	js.enc = json.NewEncoder(&js.buf)
	return js
}

func (js *jsonStream) raw(s string) {
	if js.err == nil {
		_, js.err = js.w.WriteString(s)
	}
}

// value writes v without the newline json.Encoder ends it with.
func (js *jsonStream) value(v any) {
	if js.err != nil {
		return
	}
	js.buf.Reset()
	if js.err = js.enc.Encode(v); js.err == nil {
		_, js.err = js.w.Write(bytes.TrimSuffix(js.buf.Bytes(), []byte("\n")))
	}
}

// element writes v as the i-th element of a list, on a line of its own.
func (js *jsonStream) element(i int, v any) {
	if i > 0 {
		js.raw(",")
	}
	js.raw("\n")
	js.value(v)
}

// -- plumbing ------------------------------------------------------------

func WriteError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, worker.ErrorResponse{Error: msg})
}

// writeJSON encodes v before writing anything, so that an encoding failure
// can still become a 500 rather than half a body. The encoding goes into
// a pooled buffer, to spare a small answer json.Marshal's copy; a long
// answer is streamed instead (statusReport.stream).
func writeJSON(w http.ResponseWriter, status int, v any) {
	buf := jsonBuffers.Get().(*bytes.Buffer)
	defer func() {
		// A buffer grown by a rare large answer is left to the
		// collector rather than kept for every small one.
		if buf.Cap() <= 64<<10 {
			buf.Reset()
			jsonBuffers.Put(buf)
		}
	}()
	if err := json.NewEncoder(buf).Encode(v); err != nil {
		http.Error(w, `{"error":"could not encode response"}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}

// jsonBuffers are writeJSON's encoding buffers.
var jsonBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// decodeBody reads one JSON object of at most limit bytes into v.
// Unknown fields are ignored, so that a newer worker can talk to an older
// engine: fields are added, never repurposed.
func decodeBody(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	if r.ContentLength > limit {
		// Said up front: refuse without reading a byte of it.
		DontReadBody(w)
		return fmt.Errorf("bad request body: %d bytes; at most %d", r.ContentLength, limit)
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("bad request body: %w", err)
	}
	return nil
}

// DontReadBody makes sure the request body is never read and the
// connection is closed after the answer. Go's server reads up to 256 KiB
// of a body the handler left unread, to keep the connection for the next
// request, and it does so even when the answer says "Connection: close";
// a client that announces a body and never sends it would hold the
// connection until ReadTimeout. A read deadline in the past ends that
// read at once.
func DontReadBody(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	// Fails only where there is no connection to close (a recorder in a
	// test), which is fine.
	_ = http.NewResponseController(w).SetReadDeadline(time.Unix(1, 0))
}

// provisionerStatus is the provisioners' status through the engine's
// cache (at most one Status call per plugin a second), for GET /status
// and the metrics alike.
func (e *Books) provisionerStatus(ctx context.Context) []host.ProvisionerStatus {
	if e.StatusFunc == nil {
		return nil
	}
	return e.status.Get(ctx, e.StatusFunc)
}

// workerCounts is the attached workers by the provisioner that asked for
// them, idle or busy.
func (e *Books) workerCounts() map[string]workerCounts {
	e.mu.Lock()
	out := map[string]workerCounts{}
	for _, ws := range e.workers {
		n := out[ws.owner]
		if ws.task != nil {
			n.busy++
		} else {
			n.idle++
		}
		out[ws.owner] = n
	}
	e.mu.Unlock()
	return out
}
