package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

// fakeClock is a clock a test moves by hand.
type fakeClock struct {
	mu sync.Mutex // guards t
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// sessions remembers the session each credential's last attach was
// answered with, so that do sends it as the worker would.
var sessions sync.Map // token -> session

// do sends one request straight to the engine's handler, as the worker
// holding token would: with the session its last attach was given.
func do(t *testing.T, e *books, method, path, token, body string) *httptest.ResponseRecorder {
	t.Helper()
	rec := doSession(t, e, method, path, token, sessionOf(token), body)
	if path == "/v1/attach" && rec.Code == http.StatusOK {
		var resp worker.AttachResponse
		if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil || resp.Session == "" {
			t.Fatalf("attach answered %s: no session", rec.Body)
		}
		sessions.Store(token, resp.Session)
	}
	return rec
}

// doSession sends one request with the session given ("" for none).
func doSession(t *testing.T, e *books, method, path, token, session, body string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if session != "" && path != "/v1/attach" {
		req.Header.Set(sessionHeader, session)
	}
	rec := httptest.NewRecorder()
	booksHandler(e).ServeHTTP(rec, req)
	return rec
}

// sessionOf is the session do remembers for token.
func sessionOf(token string) string {
	s, _ := sessions.Load(token)
	session, _ := s.(string)
	return session
}

func sign(t *testing.T, s *host.Signer, worker string, ttl time.Duration) string {
	t.Helper()
	token, _, err := s.Sign(claims(worker), ttl)
	if err != nil {
		t.Fatal(err)
	}
	return token
}

const attachBody = `{"hostname":"n01","job_id":"77","cpus":4,"gpus":1,"ram_mb":8000,"labels":["gpu"]}`

func TestAttach(t *testing.T) {
	t.Parallel()
	signer := host.NewSigner(testSecret)
	good := sign(t, signer, "slurm-gpu-1", time.Hour)
	forged := sign(t, host.NewSigner([]byte(strings.Repeat("z", 32))), "slurm-gpu-1", time.Hour)
	// Signed by the right secret, but already expired by the engine's
	// clock: signed with the real clock, verified two hours later.
	expired := sign(t, signer, "slurm-gpu-1", time.Hour)
	later := func() time.Time { return time.Now().Add(2 * time.Hour) }

	tests := []struct {
		name   string
		now    func() time.Time
		header string
		want   int
		reason string
	}{
		{"good", nil, "Bearer " + good, http.StatusOK, ""},
		{"lower-case scheme", nil, "bearer " + good, http.StatusOK, ""},
		{"forged", nil, "Bearer " + forged, http.StatusUnauthorized, "signature"},
		{"expired", later, "Bearer " + expired, http.StatusUnauthorized, "expired"},
		{"missing", nil, "", http.StatusUnauthorized, "missing"},
		{"basic", nil, "Basic " + good, http.StatusUnauthorized, "missing"},
		{"garbage", nil, "Bearer " + good[:10], http.StatusUnauthorized, "malformed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			logger, logs := testLogger(t)
			e := newBareBooks(logger, signer, tc.now)
			provisioned(e, "slurm-gpu-1", "77")
			req := httptest.NewRequest("POST", "/v1/attach", strings.NewReader(attachBody))
			req.RemoteAddr = "10.1.2.3:4567"
			if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			rec := httptest.NewRecorder()
			booksHandler(e).ServeHTTP(rec, req)

			if rec.Code != tc.want {
				t.Fatalf("status %d; want %d (body %s)", rec.Code, tc.want, rec.Body)
			}
			for _, tok := range []string{good, forged, expired} {
				if strings.Contains(logs.String(), tok) || strings.Contains(rec.Body.String(), tok) {
					t.Errorf("a token appears in the log or the response:\n%s\n%s", logs, rec.Body)
				}
			}
			if tc.want == http.StatusOK {
				var resp worker.AttachResponse
				if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil || resp.Worker != "slurm-gpu-1" {
					t.Errorf("response %s; want worker slurm-gpu-1", rec.Body)
				}
				if got := e.attached(); len(got) != 1 || got[0] != "slurm-gpu-1" {
					t.Errorf("Attached() = %q", got)
				}
				return
			}
			var resp worker.ErrorResponse
			if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil || !strings.Contains(resp.Error, tc.reason) {
				t.Errorf("response %s; want a JSON error mentioning %q", rec.Body, tc.reason)
			}
			if l := logs.String(); !strings.Contains(l, "refused a worker") || !strings.Contains(l, "10.1.2.3:4567") {
				t.Errorf("log does not record the refusal and its source:\n%s", l)
			}
			if len(e.attached()) != 0 {
				t.Errorf("refused worker is attached: %q", e.attached())
			}
		})
	}
}

func TestAttachRefusesBadResources(t *testing.T) {
	t.Parallel()
	signer := host.NewSigner(testSecret)
	e := newBareBooks(nil, signer, nil)
	token := sign(t, signer, "w", time.Hour)
	for _, body := range []string{`{"cpus":0}`, `{"cpus":1,"gpus":-1}`, `not json`, `{"cpus":1,"labels":[""]}`} {
		if rec := do(t, e, "POST", "/v1/attach", token, body); rec.Code != http.StatusBadRequest {
			t.Errorf("attach %s: status %d; want 400", body, rec.Code)
		}
	}
}

func TestWorkResultDetach(t *testing.T) {
	t.Parallel()
	e, srv, signer, logs := serveEngine(t, 50*time.Millisecond)
	token := sign(t, signer, "w1", time.Hour)
	provisioned(e, "w1", "77")

	if rec := do(t, e, "GET", "/v1/work", token, ""); rec.Code != http.StatusConflict {
		t.Errorf("poll before attach: %d; want 409", rec.Code)
	}
	if rec := do(t, e, "POST", "/v1/attach", token, attachBody); rec.Code != http.StatusOK {
		t.Fatalf("attach: %d %s", rec.Code, rec.Body)
	}
	if rec := do(t, e, "GET", "/v1/work", token, ""); rec.Code != http.StatusNoContent {
		t.Errorf("poll with no work: %d; want 204", rec.Code)
	}

	// A poll in progress is answered by an assignment made while it
	// waits. PollWait is short, so the client polls again after each 204
	// until the task comes, as a worker does.
	got := make(chan Task, 1)
	go func() {
		defer close(got)
		for {
			req, _ := http.NewRequest("GET", srv.URL+"/v1/work", nil)
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set(sessionHeader, sessionOf(token))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return
			}
			var task Task
			if resp.StatusCode == http.StatusOK {
				json.NewDecoder(resp.Body).Decode(&task)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNoContent {
				got <- task
				return
			}
		}
	}()
	want := Task{ID: "task-9", Need: worker.Need{CPUs: 2, GPUs: 1, Label: "gpu"}}
	if err := e.Assign("w1", want); err != nil {
		t.Fatal(err)
	}
	if err := e.Assign("w1", Task{ID: "task-10"}); err != errWorkerBusy {
		t.Errorf("second assign: %v; want errWorkerBusy", err)
	}
	select {
	case task := <-got:
		if !reflect.DeepEqual(task, want) {
			t.Errorf("polled %+v; want %+v", task, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("poll never returned the task")
	}
	if idle := e.IdleWorkers(); len(idle) != 0 {
		t.Errorf("busy worker counted idle: %+v", idle)
	}

	if rec := do(t, e, "POST", "/v1/result", token, `{"task_id":"task-8","output":"x"}`); rec.Code != http.StatusConflict {
		t.Errorf("result for another task: %d; want 409", rec.Code)
	}
	if _, st := e.TaskOutcome("w1", "task-9"); st != assignPending {
		t.Errorf("task state %v; want pending", st)
	}
	body := `{"task_id":"task-9","hostname":"n01","job_id":"77","cpus":4,"output":"done"}`
	if rec := do(t, e, "POST", "/v1/result", token, body); rec.Code != http.StatusNoContent {
		t.Errorf("result: %d %s", rec.Code, rec.Body)
	}
	res, st := e.TaskOutcome("w1", "task-9")
	if st != assignDone || res.Worker != "w1" || res.Output != "done" || res.JobID != "77" {
		t.Errorf("outcome %v %+v", st, res)
	}
	if l := logs.String(); !strings.Contains(l, "work done") || !strings.Contains(l, "job_id=77") {
		t.Errorf("result not logged:\n%s", l)
	}

	if rec := do(t, e, "POST", "/v1/detach", token, ""); rec.Code != http.StatusNoContent {
		t.Errorf("detach: %d", rec.Code)
	}
	if len(e.attached()) != 0 {
		t.Errorf("still attached after detach: %q", e.attached())
	}
	if strings.Contains(logs.String(), token) {
		t.Error("token in the log")
	}
}

func TestSilentWorkerIsGone(t *testing.T) {
	t.Parallel()
	logger, logs := testLogger(t)
	clock := &fakeClock{t: time.Now()}
	signer := host.NewSigner(testSecret)
	e := newBareBooks(logger, signer, clock.now)
	e.PollWait = 20 * time.Second
	token := sign(t, signer, "quiet", 24*time.Hour)
	busyToken := sign(t, signer, "busy", 24*time.Hour)
	provisioned(e, "quiet", "77")
	provisioned(e, "busy", "77")
	for _, tok := range []string{token, busyToken} {
		if rec := do(t, e, "POST", "/v1/attach", tok, attachBody); rec.Code != http.StatusOK {
			t.Fatalf("attach: %d %s", rec.Code, rec.Body)
		}
	}
	// "quiet" is handed a task it never picks up; "busy" picks its up,
	// and is then running it, not polling.
	if err := e.Assign("quiet", Task{ID: "t1"}); err != nil {
		t.Fatal(err)
	}
	if err := e.Assign("busy", Task{ID: "t2"}); err != nil {
		t.Fatal(err)
	}
	if rec := do(t, e, "GET", "/v1/work?wait=0", busyToken, ""); rec.Code != http.StatusOK {
		t.Fatalf("busy's poll: %d", rec.Code)
	}
	clock.advance(deadAfter)
	e.sweep()
	if len(e.attached()) != 2 {
		t.Fatal("gone at exactly the limit; want still attached")
	}
	clock.advance(time.Millisecond)
	// Liveness is decided by books.sweep (its watch) alone: reading the books,
	// as GET /status and a metrics scrape do, changes nothing.
	if len(e.attached()) != 2 || len(e.attachedBy(testProvisioner)) != 2 {
		t.Fatal("a read dropped a silent worker; only Sweep may")
	}
	if rec := do(t, e, "GET", "/status", "", ""); rec.Code != http.StatusOK || len(e.attached()) != 2 {
		t.Fatalf("GET /status (%d) dropped a silent worker; only Sweep may", rec.Code)
	}
	e.sweep()
	if got := e.attached(); len(got) != 1 || got[0] != "busy" {
		t.Fatalf("Attached() = %q after %s of silence; want only the busy worker", got, deadAfter)
	}
	if _, st := e.TaskOutcome("quiet", "t1"); st != assignLost {
		t.Errorf("task of a gone worker: %v; want lost", st)
	}
	if !strings.Contains(logs.String(), "worker gone") {
		t.Errorf("no log of the worker going:\n%s", logs)
	}
	// A worker running a task it was handed has goneFactor poll periods.
	clock.advance(goneFactor*e.PollWait - deadAfter - time.Millisecond)
	e.sweep()
	if len(e.attached()) != 1 {
		t.Fatal("busy worker gone before goneFactor poll periods")
	}
	clock.advance(time.Millisecond)
	e.sweep()
	if len(e.attached()) != 0 {
		t.Fatal("busy worker still attached after goneFactor poll periods")
	}
	// It comes back: its credential is spent, and refused before
	// anything else: a worker given up on may not poll or attach again.
	if rec := do(t, e, "GET", "/v1/work", token, ""); rec.Code != http.StatusUnauthorized || !strings.Contains(rec.Body.String(), "revoked") {
		t.Errorf("poll from a forgotten worker: %d %s; want 401 revoked", rec.Code, rec.Body)
	}
	if rec := do(t, e, "POST", "/v1/attach", token, attachBody); rec.Code != http.StatusUnauthorized || !strings.Contains(rec.Body.String(), "revoked") {
		t.Errorf("attach after being given up on: %d %s; want 401 revoked", rec.Code, rec.Body)
	}
}

// A worker that attached and left between two Reconciles is named in the
// next one, once: its plugin must learn that its job arrived, or it
// takes the job's end for a start that failed. A list whose call was not
// made puts those back for the next.
func TestAShortStayIsToldOnce(t *testing.T) {
	t.Parallel()
	signer := host.NewSigner(testSecret)
	e := newBareBooks(nil, signer, nil)
	tokens := map[string]string{}
	for _, w := range []string{"brief", "killed", "stays", "listed"} {
		tokens[w] = sign(t, signer, w, time.Hour)
		provisioned(e, w, "77")
	}
	attach := func(w string) {
		t.Helper()
		if rec := do(t, e, "POST", "/v1/attach", tokens[w], attachBody); rec.Code != http.StatusOK {
			t.Fatalf("attach %s: %d %s", w, rec.Code, rec.Body)
		}
	}
	attach("listed")
	if got := e.attachedBy(testProvisioner); !slices.Equal(got, []string{"listed"}) {
		t.Fatalf("first list %q; want [listed]", got)
	}
	for _, w := range []string{"brief", "killed", "stays"} {
		attach(w)
	}
	select {
	case <-e.arrivals():
	default:
		t.Error("an attach did not ask the run loop for a Reconcile")
	}
	if rec := do(t, e, "POST", "/v1/detach", tokens["brief"], ""); rec.Code != http.StatusNoContent {
		t.Fatalf("detach: %d", rec.Code)
	}
	e.ObserveEvent(shared.Event{Kind: shared.EventWorkerJobEnded, Provisioner: testProvisioner, Worker: "killed", Job: "77"})
	if rec := do(t, e, "POST", "/v1/detach", tokens["listed"], ""); rec.Code != http.StatusNoContent {
		t.Fatalf("detach: %d", rec.Code)
	}
	got := e.attachedBy(testProvisioner)
	if want := []string{"brief", "killed", "stays"}; !slices.Equal(got, want) {
		t.Fatalf("list after two short stays %q; want %q (listed was told, and has left)", got, want)
	}
	e.retell(testProvisioner, got)
	if got := e.attachedBy(testProvisioner); !slices.Equal(got, []string{"brief", "killed", "stays"}) {
		t.Fatalf("list after a call not made %q; want the short stays again", got)
	}
	if got := e.attachedBy(testProvisioner); !slices.Equal(got, []string{"stays"}) {
		t.Fatalf("third list %q; want [stays]: a short stay is told once", got)
	}
}

func TestCloseEndsPolls(t *testing.T) {
	t.Parallel()
	signer := host.NewSigner(testSecret)
	e := newBareBooks(nil, signer, nil)
	e.PollWait = time.Hour
	token := sign(t, signer, "w", time.Hour)
	provisioned(e, "w", "77")
	if rec := do(t, e, "POST", "/v1/attach", token, attachBody); rec.Code != http.StatusOK {
		t.Fatalf("attach: %d %s", rec.Code, rec.Body)
	}
	done := make(chan int)
	go func() { done <- do(t, e, "GET", "/v1/work", token, "").Code }()
	waitFor(t, "the poll to start", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.workers["w"].polling == 1
	})
	e.Close()
	select {
	case code := <-done:
		if code != http.StatusServiceUnavailable {
			t.Errorf("poll ended with %d; want 503", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the poll")
	}
}

func TestStatus(t *testing.T) {
	t.Parallel()
	signer := host.NewSigner(testSecret)
	e := newBareBooks(nil, signer, nil)
	statusOf(e).provisioners = func(context.Context) []host.ProvisionerStatus {
		return []host.ProvisionerStatus{
			{Name: "hpc", Kind: "slurm", Process: "running", Status: &shared.StatusResponse{
				Name: "hpc", Kind: "slurm", Profiles: []string{"cpu"},
				Outstanding: []shared.Outstanding{{Profile: "cpu", Job: "123", Worker: "hpc-cpu-1", Age: 1500 * time.Millisecond, State: "PENDING"}},
			}},
			{Name: "old", Kind: "slurm", Process: "exited: signal: killed", Error: "plugin is gone"},
		}
	}
	p := newRouter(nil, e, nil)
	p.Add(shared.Need{CPUs: 2})
	statusOf(e).needs = p.needsWhere
	provisioned(e, "hpc-cpu-1", "77")
	if rec := do(t, e, "POST", "/v1/attach", sign(t, signer, "hpc-cpu-1", time.Hour), attachBody); rec.Code != http.StatusOK {
		t.Fatalf("attach: %d %s", rec.Code, rec.Body)
	}

	rec := do(t, e, "GET", "/status", "", "")
	if rec.Code != http.StatusOK {
		t.Fatalf("status: %d", rec.Code)
	}
	var got struct {
		Provisioners []map[string]any `json:"provisioners"`
		Workers      []map[string]any `json:"workers"`
		Needs        []map[string]any `json:"needs"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Provisioners) != 2 || len(got.Workers) != 1 || len(got.Needs) != 1 {
		t.Fatalf("status %s", rec.Body)
	}
	out := got.Provisioners[0]["status"].(map[string]any)["outstanding"].([]any)[0].(map[string]any)
	if out["job"] != "123" || out["age_seconds"] != 1.5 || out["state"] != "PENDING" {
		t.Errorf("outstanding rendered as %v", out)
	}
	if got.Provisioners[1]["process"] != "exited: signal: killed" || got.Provisioners[1]["status"] != nil {
		t.Errorf("exited provisioner rendered as %v", got.Provisioners[1])
	}
	if got.Workers[0]["name"] != "hpc-cpu-1" || got.Workers[0]["job_id"] != "77" || got.Workers[0]["provisioner"] != testProvisioner {
		t.Errorf("worker rendered as %v", got.Workers[0])
	}
	if got.Needs[0]["spec"] != "cpus=2" || got.Needs[0]["state"] != "waiting" {
		t.Errorf("need rendered as %v", got.Needs[0])
	}
}

// GET /status lists every attached worker once, in order of name (the
// map they are kept in has none), and says its length.
func TestStatusListsWorkersByName(t *testing.T) {
	t.Parallel()
	signer := host.NewSigner(testSecret)
	e := newBareBooks(nil, signer, nil)
	var want []string
	for _, i := range rand.Perm(40) {
		name := fmt.Sprintf("hpc-cpu-%02d", i)
		want = append(want, name)
		attachWorker(t, e, signer, name, fmt.Sprintf(`{"hostname":"n%d","job_id":"%d","cpus":1}`, i, 100+i))
	}
	slices.Sort(want)
	rec := do(t, e, "GET", "/status", "", "")
	var got struct {
		Workers []struct{ Name string } `json:"workers"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, w := range got.Workers {
		names = append(names, w.Name)
	}
	if !slices.Equal(names, want) {
		t.Errorf("GET /status lists the workers %v; want %v", names, want)
	}
	// Streamed, one worker a line: an operator's grep finds a worker's
	// whole entry.
	lines := strings.Split(rec.Body.String(), "\n")
	for _, name := range want {
		if !slices.ContainsFunc(lines, func(line string) bool {
			return strings.HasPrefix(line, `{"name":"`+name+`"`)
		}) {
			t.Errorf("no line of GET /status starts with worker %s:\n%s", name, rec.Body)
		}
	}
}

// TestStatusCutWhenEncodingFails: GET /status is streamed, so an
// encoding error part way through cannot become a 500; the connection
// is cut instead, and the reader sees a broken answer, never a short
// one that parses.
func TestStatusCutWhenEncodingFails(t *testing.T) {
	t.Parallel()
	s := host.NewSigner(testSecret)
	e := newBareBooks(nil, s, nil)
	for i := range 300 {
		attachWorker(t, e, s, fmt.Sprintf("hpc-cut-%03d", i), fmt.Sprintf(`{"hostname":"n%d","job_id":"%d","cpus":1}`, i, 100+i))
	}
	e.mu.Lock()
	// encoding/json refuses a time past the year 9999.
	e.workers["hpc-cut-299"].lastSeen = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	e.mu.Unlock()
	addr, _ := startListener(t, e, 0, nil)
	resp, err := http.Get("http://" + addr + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil {
		t.Errorf("GET /status with a worker it cannot encode read to its end (%d bytes, status %d); want the connection cut", len(body), resp.StatusCode)
	}
	if json.Valid(body) {
		t.Errorf("the cut answer parses as JSON")
	}
}

// TestStatusStreamIsTheReport: the streamed GET /status is, but for
// whitespace, statusReport encoded whole: the same keys in the same
// order, so that its struct tags stay the answer's schema.
func TestStatusStreamIsTheReport(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 6, 1, 2, 3, 0, time.UTC)
	report := statusReport{
		EngineID:     "eng-1",
		Provisioners: []host.ProvisionerStatus{{Name: "slurm"}},
		Workers: []workerStatus{
			{WorkerInfo: WorkerInfo{Name: "a", JobID: "1"}, AttachedAt: now, LastSeen: now, Polling: true},
			{WorkerInfo: WorkerInfo{Name: "b", JobID: "2"}, AttachedAt: now, LastSeen: now, Task: "t-1"},
		},
		Needs:    []NeedStatus{{ID: "need-1", Spec: "cpus=1", State: NeedWaiting, Detail: "waiting"}},
		HeldBack: []HeldProfile{},
	}
	rec := httptest.NewRecorder()
	report.stream(rec)
	var got bytes.Buffer
	if err := json.Compact(&got, rec.Body.Bytes()); err != nil {
		t.Fatalf("the stream is not JSON: %v\n%s", err, rec.Body)
	}
	want, err := json.Marshal(report)
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != string(want) {
		t.Errorf("streamed:\n%s\nwhole:\n%s", got.String(), want)
	}
}

// TestVerifyKeepsTokensWhileValid: a token that verified is kept and
// taken again without verifying, but only while it has not expired by
// the books' clock, and never past a revocation; a token that did not
// verify is not kept.
func TestVerifyKeepsTokensWhileValid(t *testing.T) {
	t.Parallel()
	signer := host.NewSigner(testSecret)
	clock := &fakeClock{t: time.Now()}
	b := newBareBooks(nil, signer, clock.now)
	token := sign(t, signer, "slurm-kept-1", time.Hour)
	forged := sign(t, host.NewSigner([]byte(strings.Repeat("z", 32))), "slurm-kept-1", time.Hour)
	for range 2 {
		if cred, err := b.verify(token); err != nil || cred.Worker != "slurm-kept-1" {
			t.Fatalf("verify: %+v, %v", cred, err)
		}
	}
	if _, err := b.verify(forged); !errors.Is(err, host.ErrCredentialForged) {
		t.Errorf("a forged token: %v; want ErrCredentialForged", err)
	}
	b.mu.Lock()
	kept := len(b.verified)
	b.mu.Unlock()
	if kept != 1 {
		t.Errorf("%d tokens kept; want the one that verified", kept)
	}
	clock.advance(2 * time.Hour)
	if _, err := b.verify(token); !errors.Is(err, host.ErrCredentialExpired) {
		t.Errorf("a kept token past its expiry: %v; want ErrCredentialExpired", err)
	}
	other := sign(t, signer, "slurm-kept-2", 4*time.Hour)
	if _, err := b.verify(other); err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	b.admission.revoke("slurm-kept-2", "detached", clock.now().Add(4*time.Hour))
	b.mu.Unlock()
	if _, err := b.verify(other); err == nil {
		t.Error("a kept token of a revoked worker verified")
	}
}
