package engine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/engine/internal/park"
	"github.com/fluksio/provision/internal/clip"
	"github.com/fluksio/provision/internal/loglimit"
	"github.com/fluksio/provision/internal/termsafe"
	"github.com/fluksio/provision/worker"
)

// workerAPI is where workers meet the engine, over plain HTTP: they
// attach with a credential the engine signed, long-poll for a task,
// report its result and detach when they leave (docs/worker-protocol.md).
// It reads requests and writes answers; the books decide. Every worker's
// request carries "Authorization: Bearer <token>", and the worker's name
// is the one in the token, never one in the body.
type workerAPI struct {
	books  *books
	logger hclog.Logger
	// refusals bounds how often a refused request is logged: a flood of
	// bad credentials must not become a flood of log lines.
	refusals *loglimit.Limiter
	// parker parks long polls that wait (waiter.go); nil holds each on
	// its goroutine. Fixed before the server serves.
	parker *park.Parker
	// tasks are the tasks whose bytes the transfer routes move
	// (transfer.go); nil answers them 404. Fixed before the server
	// serves.
	tasks *taskTable
}

func newWorkerAPI(books *books, parker *park.Parker) *workerAPI {
	return &workerAPI{books: books, logger: books.logger, refusals: loglimit.New(refusalLogBurst, refusalLogWindow), parker: parker}
}

// handler routes the workers' endpoints.
func (a *workerAPI) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/attach", a.handleAttach)
	mux.HandleFunc("GET /v1/work", a.handleWork)
	mux.HandleFunc("GET /v1/watch", a.handleWatch)
	mux.HandleFunc("POST /v1/result", a.handleResult)
	mux.HandleFunc("POST /v1/detach", a.handleDetach)
	mux.HandleFunc("GET /v1/work/{id}/inputs/{name...}", a.handleInput)
	mux.HandleFunc("POST /v1/work/{id}/log/{stream}", a.handleLog)
	mux.HandleFunc("PUT /v1/work/{id}/outputs/{path...}", a.handleOutput)
	return mux
}

// status is the HTTP status a denial is answered with.
func (d denial) status() int {
	switch d {
	case noSession, nameRevoked, badCredential:
		return http.StatusUnauthorized
	case otherSession, jobMismatch:
		return http.StatusForbidden
	case jobNotYet:
		return http.StatusServiceUnavailable
	}
	return http.StatusConflict
}

// authenticate returns what a request's credential says: signed by the
// engine, not expired, and not revoked. On failure it has already
// answered 401, logged why, without the token, and closed the
// connection.
//
// A credential that checks out does not yet make the connection a
// worker's (connGate's share for workers): that takes an attach that
// succeeds, or a session that holds (credentialed). A detached worker's
// credential, or a failed job's, checks out for hours; were its
// connection a worker's, a few such connections polling would fill the
// workers' share and lock the real workers out.
func (a *workerAPI) authenticate(w http.ResponseWriter, r *http.Request) (host.Credential, bool) {
	token, ok := Bearer(r.Header.Get("Authorization"))
	if !ok {
		a.refuse(w, r, "missing credential")
		return host.Credential{}, false
	}
	cred, err := a.books.verify(token)
	if err != nil {
		a.refuse(w, r, err.Error())
		return host.Credential{}, false
	}
	return cred, true
}

// closeAfter has the server close r's connection after its answer: the
// request was refused for its credential or session, and its connection
// is not a worker's to keep.
func closeAfter(w http.ResponseWriter) { w.Header().Set("Connection", "close") }

// Bearer returns the token of an Authorization header. The scheme is
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
// nowhere. The body is never read (DontReadBody).
func (a *workerAPI) refuse(w http.ResponseWriter, r *http.Request, reason string) {
	if ok, leftOut := a.refusals.Allow(time.Now()); ok {
		kv := []any{"reason", reason, "path", r.URL.Path, "remote", r.RemoteAddr}
		if leftOut > 0 {
			kv = append(kv, "refusals_not_logged_before", leftOut)
		}
		a.logger.Warn("refused a worker", kv...)
	}
	DontReadBody(w)
	w.Header().Set("WWW-Authenticate", `Bearer realm="fluksio"`)
	WriteError(w, http.StatusUnauthorized, reason)
}

// refuseSession answers a request whose session does not hold, logs it
// at the rate refusals are logged (a sibling trying a copied credential
// in a loop must not flood the log), and closes the connection.
func (a *workerAPI) refuseSession(w http.ResponseWriter, r *http.Request, d denial, worker, reason string) {
	if ok, leftOut := a.refusals.Allow(time.Now()); ok {
		kv := []any{"worker", worker, "reason", reason, "path", r.URL.Path, "remote", r.RemoteAddr}
		if leftOut > 0 {
			kv = append(kv, "refusals_not_logged_before", leftOut)
		}
		a.logger.Warn("refused a worker's request", kv...)
	}
	closeAfter(w)
	WriteError(w, d.status(), reason)
}

// sessionHolds reports whether a request's session held (d is allowed);
// if it did, the request's connection is a worker's now
// (markCredentialed), and nothing short of it makes it one.
func sessionHolds(r *http.Request, d denial) bool {
	if d != allowed {
		return false
	}
	markCredentialed(r.Context())
	return true
}

func (a *workerAPI) handleAttach(w http.ResponseWriter, r *http.Request) {
	cred, ok := a.authenticate(w, r)
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
		Name: name, Provisioner: cred.Provisioner, Hostname: termsafe.EscapeLine(req.Hostname), JobID: termsafe.EscapeLine(req.JobID),
		CPUs: req.CPUs, GPUs: req.GPUs, RAMMB: req.RAMMB, Labels: slices.Clone(req.Labels), Features: slices.Clone(req.Features),
	}
	if req.EndsAt > 0 {
		info.EndsAt = time.Unix(req.EndsAt, 0)
	}
	if err := allows(cred.CredentialClaims, info.CPUs, info.GPUs, info.RAMMB, info.Labels); err != nil {
		a.refuseAttach(w, r, http.StatusForbidden, name, err.Error())
		return
	}
	session, d, refusal := a.books.attach(cred, info)
	if d != allowed {
		a.refuseAttach(w, r, d.status(), name, refusal)
		return
	}
	// The connection is the attached worker's now: it leaves the share
	// of connections that are no worker's.
	markCredentialed(r.Context())
	writeJSON(w, http.StatusOK, worker.AttachResponse{Worker: name, Session: session})
}

// refuseAttach answers an attach with a valid credential that may not
// attach, logs why, and closes the connection.
func (a *workerAPI) refuseAttach(w http.ResponseWriter, r *http.Request, status int, worker, reason string) {
	a.logger.Warn("refused an attach", "worker", worker, "reason", reason, "remote", r.RemoteAddr)
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
	if req.EndsAt < 0 || req.EndsAt > 1<<40 {
		return fmt.Errorf("ends_at %d is not a time in Unix seconds", req.EndsAt)
	}
	if len(req.Features) > 16 {
		return fmt.Errorf("%d features; at most 16", len(req.Features))
	}
	for _, f := range req.Features {
		if f == "" || len(f) > 64 || termsafe.EscapeLine(f) != f {
			return errors.New("a feature is empty, longer than 64 bytes, or not printable")
		}
	}
	return nil
}

// handleWork answers GET /v1/work: 200 with the worker's task, 204 for
// none in its period, 409 if the worker is not attached (it should
// attach again) or, with code poll_open, has a poll open already, 401
// or 403 when the session is missing or another's, 410 leave once the
// engine lets its workers go, 503 if the engine is closing.
func (a *workerAPI) handleWork(w http.ResponseWriter, r *http.Request) {
	cred, ok := a.authenticate(w, r)
	if !ok {
		return
	}
	wait, _, err := a.pollWaitOf(r)
	if err != nil {
		WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	a.longPoll(w, r, cred, false, wait)
}

// resultPollWait bounds the poll a result carries (POST /v1/result with
// wait): a waiting task is assigned within a pass, milliseconds, and an
// idle worker's poll is better parked (GET /v1/work) than held.
const resultPollWait = time.Second

// pollWaitOf is how long a poll of r's may wait: the engine's poll wait,
// or less when r's wait (seconds) asks for less; asked says r named one.
// A worker about to reach its idle limit asks for less, so it can leave
// on time rather than a poll period late.
func (a *workerAPI) pollWaitOf(r *http.Request) (wait time.Duration, asked bool, err error) {
	wait = a.books.pollWait()
	s := r.URL.Query().Get("wait")
	if s == "" {
		return wait, false, nil
	}
	secs, err := strconv.ParseFloat(s, 64)
	if err != nil || secs < 0 {
		return 0, true, errors.New("wait must be a number of seconds")
	}
	if d := time.Duration(secs * float64(time.Second)); d < wait {
		wait = d
	}
	return wait, true, nil
}

// handleWatch answers GET /v1/watch, which a worker keeps open while it
// runs a task (it has no poll open then): 410 with CodeLeave as soon as
// the engine lets its workers go, on which the worker drops its task and
// leaves, so that its job does not outlive a clean stop of the engine;
// 200 with worker.WatchAnswer once the engine cancels the worker's task
// (Engine.Cancel), on which the worker stops it, reports it cancelled
// and stays; else 204 after the poll period, and the worker opens
// another. On leave the task is not taken back: a stopping engine has
// no use for its result. Each watch counts as the worker being seen.
func (a *workerAPI) handleWatch(w http.ResponseWriter, r *http.Request) {
	cred, ok := a.authenticate(w, r)
	if !ok {
		return
	}
	a.longPoll(w, r, cred, true, a.books.pollWait())
}

// maxRunningSaid bounds the attempt ids a poll's running= may name: a
// worker runs no more tasks than its CPUs, and a list past this is not
// read (the poll is answered as one that said nothing).
const maxRunningSaid = 4096

// runningOf is the attempt ids a worker with slots says it runs, from
// its poll's or watch's running= (worker.RunningParam): nil when it
// says nothing (a worker without slots), empty when it runs none.
func runningOf(r *http.Request) map[string]bool {
	q := r.URL.Query()
	if !q.Has(worker.RunningParam) {
		return nil
	}
	ids := strings.Split(q.Get(worker.RunningParam), ",")
	if len(ids) > maxRunningSaid {
		return nil
	}
	running := make(map[string]bool, len(ids))
	for _, id := range ids {
		if id != "" {
			running[id] = true
		}
	}
	return running
}

// longPoll opens a poll or a watch, answers it at once if the books
// have its answer, and otherwise has a waiter wait it out.
func (a *workerAPI) longPoll(w http.ResponseWriter, r *http.Request, cred host.Credential, watch bool, wait time.Duration) {
	lp, ans, task, d, refusal := a.books.openPoll(cred, r.Header.Get(sessionHeader), watch, wait, runningOf(r))
	if !sessionHolds(r, d) {
		if d == notAttached {
			closeAfter(w)
			WriteError(w, d.status(), refusal)
			return
		}
		a.refuseSession(w, r, d, cred.Worker, refusal)
		return
	}
	if ans != answerWait {
		writePollAnswer(w, lp, ans, task)
		return
	}
	a.waiterFor(r).wait(w, r, lp)
}

// pollAnswerHTTP is the status and the value to encode (nil: none) of a
// long poll's answer.
func pollAnswerHTTP(lp *longPoll, ans pollAnswer, task Task) (int, any) {
	switch ans {
	case answerTask:
		return http.StatusOK, task
	case answerCancel:
		return http.StatusOK, worker.WatchAnswer{Cancel: task.ID, Reason: "the engine cancelled task " + task.Name}
	case answerNone, answerWait:
		return http.StatusNoContent, nil
	case answerNotAttached:
		return http.StatusConflict, worker.ErrorResponse{Error: errNotAttached.Error()}
	case answerPollOpen:
		return http.StatusConflict, worker.ErrorResponse{Error: "a poll is already open for worker " + lp.name + "; poll again when it ends", Code: worker.CodePollOpen}
	case answerLeave:
		if lp.watch {
			return http.StatusGone, worker.ErrorResponse{Error: "the engine is stopping and lets its workers go: drop the task, detach and exit", Code: worker.CodeLeave}
		}
		return http.StatusGone, worker.ErrorResponse{Error: "the engine is stopping and lets its workers go: detach and exit", Code: worker.CodeLeave}
	}
	return http.StatusServiceUnavailable, worker.ErrorResponse{Error: "engine is shutting down"}
}

// writePollAnswer writes a long poll's answer through net/http.
func writePollAnswer(w http.ResponseWriter, lp *longPoll, ans pollAnswer, task Task) {
	if ans == answerNotAttached {
		// Detached while it waited: the connection is no attached
		// worker's any more.
		closeAfter(w)
	}
	status, body := pollAnswerHTTP(lp, ans, task)
	if body == nil {
		w.WriteHeader(status)
		return
	}
	writeJSON(w, status, body)
}

func (a *workerAPI) handleResult(w http.ResponseWriter, r *http.Request) {
	cred, ok := a.authenticate(w, r)
	if !ok {
		return
	}
	name := cred.Worker
	// With wait, the result is the worker's next poll too (one round
	// trip a task, not two): recorded, it is answered as GET /v1/work
	// answers.
	wait, poll, err := a.pollWaitOf(r)
	if err != nil {
		DontReadBody(w)
		WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	var req worker.ResultRequest
	if err := decodeBody(w, r, worker.MaxResultBody, &req); err != nil {
		WriteError(w, http.StatusBadRequest, err.Error())
		return
	}
	// Escaped here, once, so that the story, the log and the router's
	// books all see the same harmless text. Who ran it (worker, host,
	// job) is not the body's to say: books.report takes it from the
	// attach; the CPUs are what the worker counted on its node.
	res := Result{TaskID: termsafe.EscapeLine(req.TaskID), CPUs: req.CPUs, Output: termsafe.EscapeLine(req.Output), At: a.books.now()}
	// What a command or payload task's run came to (the books keep it
	// for those alone); its words are the worker's, escaped as above.
	run := req
	run.Hostname, run.JobID = "", ""
	run.Output, run.Error, run.Signal = "", clip.Bytes(termsafe.EscapeLine(req.Error), maxErrorText), clip.Bytes(termsafe.EscapeLine(req.Signal), maxErrorText)
	res.run = &run
	var seal func(task, attempt string)
	if a.tasks != nil {
		seal = a.tasks.seal
	}
	d, refusal := a.books.report(cred, r.Header.Get(sessionHeader), res, seal)
	switch d {
	case allowed:
		markCredentialed(r.Context())
		if poll {
			// Held on this goroutine (a request with a body is not
			// parked), so for resultPollWait at most: the next task
			// comes within a pass when one waits, and a worker with
			// none polls again, parked.
			a.longPoll(w, r, cred, false, min(wait, resultPollWait))
			return
		}
		w.WriteHeader(http.StatusNoContent)
		return
	case noSession, otherSession:
		// A copied credential: the result is not this process's to give.
		a.refuseSession(w, r, d, name, refusal)
		return
	case notAttached:
		closeAfter(w)
	case noSuchTask:
		markCredentialed(r.Context())
	}
	a.logger.Warn("refused a result", "worker", name, "task", res.TaskID, "reason", refusal)
	WriteError(w, http.StatusConflict, refusal)
}

func (a *workerAPI) handleDetach(w http.ResponseWriter, r *http.Request) {
	cred, ok := a.authenticate(w, r)
	if !ok {
		return
	}
	if d, refusal := a.books.detach(cred, r.Header.Get(sessionHeader)); d != allowed {
		a.refuseSession(w, r, d, cred.Worker, refusal)
		return
	}
	// Whoever asked, the connection is no attached worker's any more.
	closeAfter(w)
	w.WriteHeader(http.StatusNoContent)
}

// -- plumbing ------------------------------------------------------------

// WriteError answers status with msg as the worker protocol's error
// body, {"error": msg}.
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
