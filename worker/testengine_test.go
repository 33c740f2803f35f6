package worker

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// testEngine is a test double of the engine's side of the worker
// protocol (docs/worker-protocol.md), over real HTTP on loopback: attach,
// work, watch, result and detach, and a command task's transfers (inputs,
// log, outputs), each with the engine's checks: the credential and the
// session, the holder of the task, the log's offsets, the limits. It
// serves one worker credential, and hands out the tasks a test adds, in
// order. It is not the engine kit (engine/), which a worker's tests may
// not link.
type testEngine struct {
	srv      *httptest.Server
	token    string
	pollWait time.Duration

	mu sync.Mutex // guards what follows; never held while a body is read or an answer written
	// session is the attach's; empty before one.
	session  string
	features []string
	// attached is the last attach's request: what the worker offered.
	attached AttachRequest
	attaches int
	detaches int
	polls    int // GET /v1/work requests
	leaving  bool
	seq      int
	queue    []*testTask          // added, not yet handed out
	tasks    map[string]*testTask // by ID
	// refused lists the transfers refused, as "STATUS METHOD PATH".
	refused []string
	// changed is closed, and replaced, at every change.
	changed chan struct{}
	// holdResult, if set, holds the answer to the first result (which
	// is recorded at once) until it is closed: a result's answer on its
	// way back while the engine goes on.
	holdResult chan struct{}
	held       bool
}

// testTask is a task as the test engine holds it.
type testTask struct {
	Task
	// content is what GET inputs/NAME serves, which may differ from what
	// Task.Inputs says of it.
	content map[string][]byte
	handed  bool // to the worker; until its result comes, the worker holds it
	result  *ResultRequest
	// cancel is the reason the engine cancelled the task with; sent says
	// a watch has carried it.
	cancel     string
	cancelled  bool
	cancelSent bool
	logs       map[string][]byte
	chunks     map[string][]int // the size of each append, per stream
	outputs    map[string][]byte
	// late counts transfers that came after the cancel was sent.
	late int
	// pollsAtResult is testEngine.polls when the result came.
	pollsAtResult int
}

const testToken = "test-credential-0123456789"

// startTestEngine starts a test engine on 127.0.0.1; Close stops it.
func startTestEngine() *testEngine {
	e := &testEngine{token: testToken, pollWait: 200 * time.Millisecond,
		tasks: map[string]*testTask{}, changed: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/attach", e.attach)
	mux.HandleFunc("GET /v1/work", e.work)
	mux.HandleFunc("GET /v1/watch", e.watch)
	mux.HandleFunc("POST /v1/result", e.result)
	mux.HandleFunc("POST /v1/detach", e.detach)
	mux.HandleFunc("GET /v1/work/{id}/inputs/{name...}", e.input)
	mux.HandleFunc("POST /v1/work/{id}/log/{stream}", e.log)
	mux.HandleFunc("PUT /v1/work/{id}/outputs/{path...}", e.output)
	e.srv = httptest.NewServer(mux)
	return e
}

// newTestEngine is startTestEngine for a test, stopped at its end.
func newTestEngine(t *testing.T) *testEngine {
	e := startTestEngine()
	t.Cleanup(e.Close)
	return e
}

// Close stops the server, and with it every request still open.
func (e *testEngine) Close() {
	e.srv.CloseClientConnections()
	e.srv.Close()
}

// URL is where workers reach the engine.
func (e *testEngine) URL() string { return e.srv.URL }

// changedLocked wakes whoever waits for a change. e.mu is held.
func (e *testEngine) changedLocked() {
	close(e.changed)
	e.changed = make(chan struct{})
}

// Add queues t for the worker, with the bytes its inputs are served
// with (by name), and returns its ID.
func (e *testEngine) Add(t Task, content map[string][]byte) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seq++
	t.ID = fmt.Sprintf("task-%d", e.seq)
	if t.Name == "" {
		t.Name = fmt.Sprintf("job-%d", e.seq)
	}
	tt := &testTask{Task: t, content: content, logs: map[string][]byte{}, chunks: map[string][]int{}, outputs: map[string][]byte{}}
	e.tasks[t.ID] = tt
	e.queue = append(e.queue, tt)
	e.changedLocked()
	return t.ID
}

// Cancel cancels task id: the worker's open watch, or its next one,
// answers 200 with its ID.
func (e *testEngine) Cancel(id, reason string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.tasks[id].cancelled, e.tasks[id].cancel = true, reason
	e.changedLocked()
}

// Leave lets the workers go: polls and watches answer 410 leave.
func (e *testEngine) Leave() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.leaving = true
	e.changedLocked()
}

// waitFor waits until cond, which reads the engine under its lock,
// holds, failing the test after 30 s.
func (e *testEngine) waitFor(t *testing.T, what string, cond func(e *testEngine) bool) {
	t.Helper()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for {
		e.mu.Lock()
		ok, changed := cond(e), e.changed
		e.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("no %s within 30 s", what)
		}
	}
}

// Result waits for task id's result.
func (e *testEngine) Result(t *testing.T, id string) ResultRequest {
	t.Helper()
	e.waitFor(t, "result of "+id, func(e *testEngine) bool { return e.tasks[id].result != nil })
	e.mu.Lock()
	defer e.mu.Unlock()
	return *e.tasks[id].result
}

// PolledAfter waits for the worker's first poll after task id's result:
// by then it has done with the task, its directory included.
func (e *testEngine) PolledAfter(t *testing.T, id string) {
	t.Helper()
	e.Result(t, id)
	e.waitFor(t, "poll after the result of "+id, func(e *testEngine) bool { return e.polls > e.tasks[id].pollsAtResult })
}

// task returns a copy of what the engine holds of task id.
func (e *testEngine) task(id string) testTask {
	e.mu.Lock()
	defer e.mu.Unlock()
	tt := *e.tasks[id]
	tt.logs, tt.outputs, tt.chunks = map[string][]byte{}, map[string][]byte{}, map[string][]int{}
	for k, v := range e.tasks[id].logs {
		tt.logs[k] = slices.Clone(v)
	}
	for k, v := range e.tasks[id].outputs {
		tt.outputs[k] = slices.Clone(v)
	}
	for k, v := range e.tasks[id].chunks {
		tt.chunks[k] = slices.Clone(v)
	}
	return tt
}

// -- the routes ------------------------------------------------------------

func writeTestError(w http.ResponseWriter, status int, msg, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(ErrorResponse{Error: msg, Code: code})
}

// authorized checks the credential and, but for the attach, the session.
func (e *testEngine) authorized(w http.ResponseWriter, r *http.Request) bool {
	if r.Header.Get("Authorization") != "Bearer "+e.token {
		writeTestError(w, http.StatusUnauthorized, "bad credential", "")
		return false
	}
	if r.URL.Path == "/v1/attach" {
		return true
	}
	e.mu.Lock()
	session := e.session
	e.mu.Unlock()
	switch got := r.Header.Get(SessionHeader); {
	case got == "":
		writeTestError(w, http.StatusUnauthorized, "no session", "")
		return false
	case got != session:
		writeTestError(w, http.StatusForbidden, "another's session", "")
		return false
	}
	return true
}

func (e *testEngine) attach(w http.ResponseWriter, r *http.Request) {
	if !e.authorized(w, r) {
		return
	}
	var req AttachRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeTestError(w, http.StatusBadRequest, err.Error(), "")
		return
	}
	e.mu.Lock()
	e.attaches++
	e.session = fmt.Sprintf("session-%d", e.attaches)
	e.features = req.Features
	e.attached = req
	ans := AttachResponse{Worker: "test-worker", Session: e.session}
	e.changedLocked()
	e.mu.Unlock()
	json.NewEncoder(w).Encode(ans)
}

// longPoll waits for answer to say something, for the poll wait at
// most; answer runs under e.mu.
func (e *testEngine) longPoll(r *http.Request, wait time.Duration, answer func() (int, any, bool)) (int, any) {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		e.mu.Lock()
		status, body, ok := answer()
		changed := e.changed
		e.mu.Unlock()
		if ok {
			return status, body
		}
		select {
		case <-changed:
		case <-timer.C:
			return http.StatusNoContent, nil
		case <-r.Context().Done():
			return http.StatusNoContent, nil
		}
	}
}

func writeAnswer(w http.ResponseWriter, status int, body any) {
	if body == nil {
		w.WriteHeader(status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(body)
}

var leaveAnswer = ErrorResponse{Error: "the engine is stopping", Code: CodeLeave}

func (e *testEngine) work(w http.ResponseWriter, r *http.Request) {
	if !e.authorized(w, r) {
		return
	}
	e.mu.Lock()
	e.polls++
	e.changedLocked()
	e.mu.Unlock()
	wait := e.pollWait
	if s, err := strconv.ParseFloat(r.URL.Query().Get("wait"), 64); err == nil {
		wait = min(wait, time.Duration(s*float64(time.Second)))
	}
	status, body := e.longPoll(r, wait, func() (int, any, bool) {
		switch {
		case e.leaving:
			return http.StatusGone, leaveAnswer, true
		case len(e.queue) > 0:
			tt := e.queue[0]
			e.queue = e.queue[1:]
			tt.handed = true
			e.changedLocked()
			return http.StatusOK, tt.Task, true
		}
		return 0, nil, false
	})
	writeAnswer(w, status, body)
}

func (e *testEngine) watch(w http.ResponseWriter, r *http.Request) {
	if !e.authorized(w, r) {
		return
	}
	status, body := e.longPoll(r, e.pollWait, func() (int, any, bool) {
		if e.leaving {
			return http.StatusGone, leaveAnswer, true
		}
		for _, tt := range e.tasks {
			if tt.handed && tt.result == nil && tt.cancelled && !tt.cancelSent {
				tt.cancelSent = true
				e.changedLocked()
				return http.StatusOK, WatchAnswer{Cancel: tt.ID, Reason: tt.cancel}, true
			}
		}
		return 0, nil, false
	})
	writeAnswer(w, status, body)
}

func (e *testEngine) result(w http.ResponseWriter, r *http.Request) {
	if !e.authorized(w, r) {
		return
	}
	var res ResultRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, MaxResultBody)).Decode(&res); err != nil {
		writeTestError(w, http.StatusBadRequest, err.Error(), "")
		return
	}
	e.mu.Lock()
	tt := e.tasks[res.TaskID]
	ok := tt != nil && tt.handed && tt.result == nil
	var hold chan struct{}
	if ok {
		tt.result, tt.pollsAtResult = &res, e.polls
		e.changedLocked()
		if e.holdResult != nil && !e.held {
			e.held, hold = true, e.holdResult
		}
	}
	e.mu.Unlock()
	if !ok {
		writeTestError(w, http.StatusConflict, "no such task for this worker", "")
		return
	}
	if hold != nil {
		select {
		case <-hold:
		case <-r.Context().Done():
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

func (e *testEngine) detach(w http.ResponseWriter, r *http.Request) {
	if !e.authorized(w, r) {
		return
	}
	e.mu.Lock()
	e.detaches++
	e.changedLocked()
	e.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// heldLocked returns the task r's {id} names if the worker holds it now;
// nil (to be answered 409) is recorded as a refusal. A transfer after
// the cancel went out is counted: the worker should send nothing
// further. e.mu is held.
func (e *testEngine) heldLocked(r *http.Request) *testTask {
	tt := e.tasks[r.PathValue("id")]
	if tt == nil || !tt.handed || tt.result != nil {
		e.refused = append(e.refused, fmt.Sprintf("409 %s %s", r.Method, r.URL.Path))
		e.changedLocked()
		return nil
	}
	if tt.cancelSent {
		tt.late++
		e.changedLocked()
	}
	return tt
}

func (e *testEngine) refuseLocked(r *http.Request, status int) {
	e.refused = append(e.refused, fmt.Sprintf("%d %s %s", status, r.Method, r.URL.Path))
	e.changedLocked()
}

func (e *testEngine) input(w http.ResponseWriter, r *http.Request) {
	if !e.authorized(w, r) {
		return
	}
	e.mu.Lock()
	tt := e.heldLocked(r)
	var data []byte
	found := false
	if tt != nil {
		data, found = tt.content[r.PathValue("name")]
		if !found {
			e.refuseLocked(r, http.StatusNotFound)
		}
	}
	e.mu.Unlock()
	switch {
	case tt == nil:
		writeTestError(w, http.StatusConflict, "this worker does not hold "+r.PathValue("id"), "")
	case !found:
		writeTestError(w, http.StatusNotFound, "no such input", "")
	default:
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		w.Write(data)
	}
}

func (e *testEngine) log(w http.ResponseWriter, r *http.Request) {
	if !e.authorized(w, r) {
		return
	}
	stream := r.PathValue("stream")
	offset, err := strconv.ParseInt(r.URL.Query().Get("offset"), 10, 64)
	if (stream != StreamStdout && stream != StreamStderr) || err != nil || offset < 0 {
		writeTestError(w, http.StatusBadRequest, "a stream is stdout or stderr, at an offset", "")
		return
	}
	chunk, err := io.ReadAll(io.LimitReader(r.Body, 2<<20))
	if err != nil {
		writeTestError(w, http.StatusBadRequest, err.Error(), "")
		return
	}
	e.mu.Lock()
	tt := e.heldLocked(r)
	status, size := http.StatusNoContent, int64(0)
	if tt != nil {
		size = int64(len(tt.logs[stream]))
		end := offset + int64(len(chunk))
		switch {
		case len(chunk) > 1<<20:
			status = http.StatusRequestEntityTooLarge
		case end <= size:
			// A repeat: answered as if appended.
		case offset != size:
			status = http.StatusConflict
		case tt.Limits.Log > 0 && end > tt.Limits.Log:
			status = http.StatusRequestEntityTooLarge
		default:
			tt.logs[stream] = append(tt.logs[stream], chunk...)
			tt.chunks[stream] = append(tt.chunks[stream], len(chunk))
			size = end
		}
		if status != http.StatusNoContent {
			e.refuseLocked(r, status)
		}
		e.changedLocked()
	}
	e.mu.Unlock()
	switch {
	case tt == nil:
		writeTestError(w, http.StatusConflict, "this worker does not hold "+r.PathValue("id"), "")
	case status != http.StatusNoContent:
		writeTestError(w, status, fmt.Sprintf("%s at %d refused: the engine has %d", stream, offset, size), "")
	default:
		w.Header().Set(OffsetHeader, strconv.FormatInt(size, 10))
		w.WriteHeader(http.StatusNoContent)
	}
}

func (e *testEngine) output(w http.ResponseWriter, r *http.Request) {
	if !e.authorized(w, r) {
		return
	}
	name := r.PathValue("path")
	data, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		writeTestError(w, http.StatusBadRequest, err.Error(), "")
		return
	}
	e.mu.Lock()
	tt := e.heldLocked(r)
	status := http.StatusNoContent
	if tt != nil {
		var total int64
		for _, o := range tt.outputs {
			total += int64(len(o))
		}
		declared := slices.ContainsFunc(tt.Outputs, func(o string) bool { return name == o || strings.HasPrefix(name, o+"/") })
		switch {
		case name == "" || path.Clean(name) != name || strings.HasPrefix(name, "/") ||
			slices.Contains(strings.Split(name, "/"), "..") || !declared:
			status = http.StatusBadRequest
		case tt.Limits.Outputs > 0 && total+int64(len(data)) > tt.Limits.Outputs:
			status = http.StatusRequestEntityTooLarge
		default:
			tt.outputs[name] = data
			e.changedLocked()
		}
		if status != http.StatusNoContent {
			e.refuseLocked(r, status)
		}
	}
	e.mu.Unlock()
	switch {
	case tt == nil:
		writeTestError(w, http.StatusConflict, "this worker does not hold "+r.PathValue("id"), "")
	case status != http.StatusNoContent:
		writeTestError(w, status, "output "+name+" refused", "")
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

// refusedSnapshot is what the engine has refused so far.
func (e *testEngine) refusedSnapshot() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.refused)
}
