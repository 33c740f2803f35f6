package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

// The worker's half of the task protocol, as plain HTTP calls over
// loopback to a real engine (Engine.Mux on its own listener): package
// worker's client is another's to change, and these tests pin the
// engine's side of the wire, byte for byte.

// taskEngine serves a real engine for task tests on 127.0.0.1:0 (its
// Mux, operator endpoints guarded as by default: this uid only), with
// the run loop on a goroutine the test owns. Cleanup stops the loop and
// the engine, after the workers' own cleanups have detached them.
// routes, if given, adds an embedder's routes to the mux.
func taskEngine(t *testing.T, cfg Config, routes ...func(*http.ServeMux)) *Engine {
	t.Helper()
	e, _ := runTaskEngine(t, cfg, 0, routes...)
	return e
}

// runTaskEngine is taskEngine, with the run loop's intervals set to
// every unless it is 0, and stop, which ends the loop and the engine
// once (cleanup calls it too).
func runTaskEngine(t *testing.T, cfg Config, every time.Duration, routes ...func(*http.ServeMux)) (e *Engine, stop func()) {
	t.Helper()
	cfg.Secret, cfg.ID, cfg.Listen = testSecret, "test", "127.0.0.1:0"
	if cfg.Logger == nil {
		cfg.Logger, _ = testLogger(t)
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if every > 0 {
		e.passEvery, e.reconcileEvery = every, every
	}
	e.books.PollWait = 10 * time.Second
	mux := e.Mux(nil, false)
	for _, r := range routes {
		r(mux)
	}
	if err := e.Serve(mux); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var run sync.WaitGroup
	run.Add(1)
	go func() {
		defer run.Done()
		e.Run(ctx, nil)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			run.Wait()
			e.Stop(context.Background())
		})
	}
	t.Cleanup(stop)
	return e, stop
}

// testWorker is one worker of a test, speaking the protocol by hand.
type testWorker struct {
	t *testing.T
	e *Engine
	// base is the engine's URL, without the trailing "/".
	base    string
	name    string
	token   string
	session string
	client  *http.Client
}

// joinWorker attaches a worker named name that runs features (none:
// the stand-in alone), as its provisioner's event and its credential
// allow; its cleanup detaches it.
func joinWorker(t *testing.T, e *Engine, name string, features ...string) *testWorker {
	t.Helper()
	return joinWorkerAt(t, e, strings.TrimSuffix(e.URL(), "/"), name, features...)
}

// joinWorkerAt is joinWorker for an engine served at base by a server
// of the test's own.
func joinWorkerAt(t *testing.T, e *Engine, base, name string, features ...string) *testWorker {
	t.Helper()
	return joinWorkerEnding(t, e, base, name, time.Time{}, features...)
}

// joinWorkerEnding is joinWorkerAt for a worker whose job ends at endsAt
// (zero: not said).
func joinWorkerEnding(t *testing.T, e *Engine, base, name string, endsAt time.Time, features ...string) *testWorker {
	t.Helper()
	w := &testWorker{t: t, e: e, base: base, name: name, token: sign(t, host.NewSigner(testSecret), name, time.Hour),
		client: &http.Client{Transport: &http.Transport{}}}
	provisioned(e.books, name, "77")
	req := worker.AttachRequest{Hostname: "n-" + name, JobID: "77", CPUs: 4, GPUs: 1, RAMMB: 8000, Labels: []string{"gpu"}, Features: features}
	if !endsAt.IsZero() {
		req.EndsAt = endsAt.Unix()
	}
	body, _ := json.Marshal(req)
	resp, got := w.do("POST", "/v1/attach", bytes.NewReader(body), nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: attach answered %d %s", name, resp.StatusCode, got)
	}
	var a worker.AttachResponse
	if err := json.Unmarshal(got, &a); err != nil {
		t.Fatal(err)
	}
	w.session = a.Session
	t.Cleanup(func() {
		w.do("POST", "/v1/detach", nil, nil)
		w.client.CloseIdleConnections()
	})
	return w
}

// do sends one request with the worker's credential and session, and
// reads the whole answer.
func (w *testWorker) do(method, path string, body io.Reader, header http.Header) (*http.Response, []byte) {
	w.t.Helper()
	req, err := http.NewRequest(method, w.base+path, body)
	if err != nil {
		w.t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if w.token != "" {
		req.Header.Set("Authorization", "Bearer "+w.token)
	}
	if w.session != "" {
		req.Header.Set(worker.SessionHeader, w.session)
	}
	resp, err := w.client.Do(req)
	if err != nil {
		w.t.Fatalf("%s: %s %s: %v", w.name, method, path, err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		w.t.Fatalf("%s: %s %s: reading the answer: %v", w.name, method, path, err)
	}
	return resp, got
}

// take polls until the worker is handed a task, within 10 s.
func (w *testWorker) take() Task {
	w.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		resp, got := w.do("GET", "/v1/work?wait=1", nil, nil)
		switch resp.StatusCode {
		case http.StatusOK:
			var task Task
			if err := json.Unmarshal(got, &task); err != nil {
				w.t.Fatal(err)
			}
			return task
		case http.StatusNoContent:
		default:
			w.t.Fatalf("%s: poll answered %d %s", w.name, resp.StatusCode, got)
		}
	}
	w.t.Fatalf("%s: no task within 10 s", w.name)
	return Task{}
}

// pollNone polls once for wait seconds and fails the test if a task
// comes.
func (w *testWorker) pollNone(wait float64) {
	w.t.Helper()
	resp, got := w.do("GET", "/v1/work?wait="+strconv.FormatFloat(wait, 'f', -1, 64), nil, nil)
	if resp.StatusCode != http.StatusNoContent {
		w.t.Fatalf("%s: poll answered %d %s; want 204, no task", w.name, resp.StatusCode, got)
	}
}

// input fetches input name of attempt; NAME is path-escaped as the
// protocol says, "/" and all.
func (w *testWorker) input(attempt, name string) (int, []byte) {
	w.t.Helper()
	resp, got := w.do("GET", "/v1/work/"+attempt+"/inputs/"+url.PathEscape(name), nil, nil)
	return resp.StatusCode, got
}

// appendLog sends data as stream's bytes from offset; it returns the
// status and the engine's Fluksio-Offset.
func (w *testWorker) appendLog(attempt, stream string, offset int64, data []byte) (int, string) {
	w.t.Helper()
	resp, _ := w.do("POST", fmt.Sprintf("/v1/work/%s/log/%s?offset=%d", attempt, stream, offset), bytes.NewReader(data), nil)
	return resp.StatusCode, resp.Header.Get("Fluksio-Offset")
}

// putOutput uploads an output at escapedPath (already path-escaped).
func (w *testWorker) putOutput(attempt, escapedPath string, data []byte) (int, string) {
	w.t.Helper()
	resp, got := w.do("PUT", "/v1/work/"+attempt+"/outputs/"+escapedPath, bytes.NewReader(data), nil)
	return resp.StatusCode, string(got)
}

// report posts a result.
func (w *testWorker) report(r worker.ResultRequest) int {
	w.t.Helper()
	r.Hostname, r.JobID, r.CPUs = "n-"+w.name, "77", 4
	body, _ := json.Marshal(r)
	resp, got := w.do("POST", "/v1/result", bytes.NewReader(body), nil)
	if resp.StatusCode != http.StatusNoContent {
		w.t.Logf("%s: result answered %d %s", w.name, resp.StatusCode, got)
	}
	return resp.StatusCode
}

// detach ends the worker as it leaves.
func (w *testWorker) detach() {
	w.t.Helper()
	if resp, got := w.do("POST", "/v1/detach", nil, nil); resp.StatusCode != http.StatusNoContent {
		w.t.Fatalf("%s: detach answered %d %s", w.name, resp.StatusCode, got)
	}
}

// waitTask waits, within 10 s, for task id to stand as cond says.
func waitTask(t *testing.T, e *Engine, id, what string, cond func(TaskResult) bool) TaskResult {
	t.Helper()
	var res TaskResult
	waitFor(t, what, func() bool {
		var ok bool
		res, ok = e.Task(id)
		return ok && cond(res)
	})
	return res
}

// ended is waitTask's cond for a task that ended.
func ended(r TaskResult) bool {
	return r.State != TaskWaiting && r.State != TaskRunning
}

// commandTask is a small command task on the tests' need.
func commandTask(id string) TaskSpec {
	return TaskSpec{ID: id, Need: shared.Need{CPUs: 1}, Command: []string{"sh", "-c", "true"}}
}
