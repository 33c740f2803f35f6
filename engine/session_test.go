package engine

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluksio/provision/worker"
)

// TestCopiedCredentialGetsNothing: the attack of issue 24, item 2. A
// burst's script holds every task's credential, so task 1 reads task 0's
// and tries it while task 0 is attached: before sessions it polled as
// worker 0 and got its task, its forged result was accepted, and its
// detach removed worker 0. Now, without task 0's session, it gets 401 or
// 403 on work, result and detach and 409 on attach: 0 tasks, 0 results
// accepted, and worker 0 stays attached and gets its task.
func TestCopiedCredentialGetsNothing(t *testing.T) {
	t.Parallel()
	e, _, signer, logs := serveEngine(t, 50*time.Millisecond)
	token0 := sign(t, signer, "slurm-cpu-b-0", time.Hour)
	provisioned(e, "slurm-cpu-b-0", "4242_0")
	body := func(job string) string {
		return `{"hostname":"n01","job_id":"` + job + `","cpus":4,"gpus":1,"ram_mb":8000,"labels":["gpu"]}`
	}
	if rec := do(t, e, "POST", "/v1/attach", token0, body("4242_0")); rec.Code != http.StatusOK {
		t.Fatalf("task 0's attach: %d %s", rec.Code, rec.Body)
	}
	session0 := sessionOf(token0)

	// Task 1 attaches with task 0's credential, as task 0 or as itself.
	for _, job := range []string{"4242_0", "4242_1"} {
		if rec := doSession(t, e, "POST", "/v1/attach", token0, "", body(job)); rec.Code != http.StatusConflict && rec.Code != http.StatusForbidden {
			t.Errorf("a sibling's attach as job %s: %d %s; want 409 or 403", job, rec.Code, rec.Body)
		}
	}
	if s := sessionOf(token0); s != session0 {
		t.Fatal("a refused attach changed the session")
	}

	if err := e.Assign("slurm-cpu-b-0", Task{ID: "task-1"}); err != nil {
		t.Fatal(err)
	}
	// With no session, with a guessed one, and with a session of its
	// own that the engine never gave for this worker.
	// The last is session0 with its last character changed (to "A",
	// unless that is what it was: then to "Q").
	last := "A"
	if strings.HasSuffix(session0, "A") {
		last = "Q"
	}
	forged := []string{"", "AAAA", strings.Repeat("x", 43), session0[:42] + last}
	tasks, results := 0, 0
	for _, s := range forged {
		rec := doSession(t, e, "GET", "/v1/work?wait=0", token0, s, "")
		switch rec.Code {
		case http.StatusOK:
			tasks++
		case http.StatusUnauthorized, http.StatusForbidden:
		default:
			t.Errorf("a sibling's poll with session %q: %d %s; want 401 or 403", s, rec.Code, rec.Body)
		}
		rec = doSession(t, e, "POST", "/v1/result", token0, s, `{"task_id":"task-1","output":"forged"}`)
		switch rec.Code {
		case http.StatusNoContent:
			results++
		case http.StatusUnauthorized, http.StatusForbidden:
		default:
			t.Errorf("a sibling's result with session %q: %d %s; want 401 or 403", s, rec.Code, rec.Body)
		}
		if rec := doSession(t, e, "POST", "/v1/detach", token0, s, ""); rec.Code != http.StatusUnauthorized && rec.Code != http.StatusForbidden {
			t.Errorf("a sibling's detach with session %q: %d; want 401 or 403", s, rec.Code)
		}
	}
	t.Logf("the sibling got %d tasks, %d results accepted; worker 0 attached: %v", tasks, results, e.attached())
	if tasks != 0 || results != 0 {
		t.Errorf("the sibling got %d tasks and %d results accepted; want 0 and 0", tasks, results)
	}
	if got := e.attached(); len(got) != 1 || got[0] != "slurm-cpu-b-0" {
		t.Fatalf("after the sibling's detach, attached = %q; want worker 0 still", got)
	}
	if _, st := e.TaskOutcome("slurm-cpu-b-0", "task-1"); st != assignPending {
		t.Errorf("task-1 is %v after the sibling's forged result; want still pending", st)
	}

	// Worker 0 itself carries on: it gets its task, its result counts,
	// and it detaches.
	rec := do(t, e, "GET", "/v1/work?wait=0", token0, "")
	var task Task
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &task) != nil || task.ID != "task-1" {
		t.Fatalf("worker 0's poll: %d %s; want task-1", rec.Code, rec.Body)
	}
	if rec := do(t, e, "POST", "/v1/result", token0, `{"task_id":"task-1","output":"real"}`); rec.Code != http.StatusNoContent {
		t.Fatalf("worker 0's result: %d %s", rec.Code, rec.Body)
	}
	if res, st := e.TaskOutcome("slurm-cpu-b-0", "task-1"); st != assignDone || res.Output != "real" {
		t.Errorf("outcome %v %q; want worker 0's", st, res.Output)
	}
	if rec := do(t, e, "POST", "/v1/detach", token0, ""); rec.Code != http.StatusNoContent || len(e.attached()) != 0 {
		t.Errorf("worker 0's detach: %d, attached %q", rec.Code, e.attached())
	}
	if strings.Contains(logs.String(), session0) || strings.Contains(logs.String(), token0) {
		t.Error("a session or a credential is in the log")
	}
}

// TestOnePollAtATime: three polls at once for one worker, as the attack
// ran them. One waits and gets the task; the two others are refused 409
// poll_open at once, and the first keeps its place.
func TestOnePollAtATime(t *testing.T) {
	t.Parallel()
	e, srv, signer, _ := serveEngine(t, 10*time.Second)
	token := sign(t, signer, "slurm-cpu-1", time.Hour)
	provisioned(e, "slurm-cpu-1", "77")
	if rec := do(t, e, "POST", "/v1/attach", token, attachBody); rec.Code != http.StatusOK {
		t.Fatalf("attach: %d %s", rec.Code, rec.Body)
	}
	poll := func() (int, worker.ErrorResponse, Task) {
		req, _ := http.NewRequest("GET", srv.URL+"/v1/work", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set(sessionHeader, sessionOf(token))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return 0, worker.ErrorResponse{}, Task{}
		}
		defer resp.Body.Close()
		var er worker.ErrorResponse
		var task Task
		if resp.StatusCode == http.StatusOK {
			json.NewDecoder(resp.Body).Decode(&task)
		} else {
			json.NewDecoder(resp.Body).Decode(&er)
		}
		return resp.StatusCode, er, task
	}
	polling := func() int {
		e.mu.Lock()
		defer e.mu.Unlock()
		if ws := e.workers["slurm-cpu-1"]; ws != nil {
			return ws.polling
		}
		return -1
	}

	type answer struct {
		code int
		er   worker.ErrorResponse
		task Task
	}
	first := make(chan answer, 1)
	go func() {
		c, er, task := poll()
		first <- answer{c, er, task}
	}()
	waitFor(t, "the first poll to be open", func() bool { return polling() == 1 })

	var wg sync.WaitGroup
	others := make([]answer, 2)
	for i := range others {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, er, task := poll()
			others[i] = answer{c, er, task}
		}()
	}
	wg.Wait()
	refused := 0
	for _, a := range others {
		if a.code == http.StatusConflict && a.er.Code == pollOpen {
			refused++
		} else {
			t.Errorf("a second poll at once: %d %+v; want 409 %s", a.code, a.er, pollOpen)
		}
	}
	if n := polling(); n != 1 {
		t.Errorf("%d polls open after the two refusals; want the first, still waiting", n)
	}
	if err := e.Assign("slurm-cpu-1", Task{ID: "task-7"}); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-first:
		t.Logf("three polls at once: the first got %d %s, %d refused with 409 %s", a.code, a.task.ID, refused, pollOpen)
		if a.code != http.StatusOK || a.task.ID != "task-7" {
			t.Errorf("the first poll: %d %+v; want task-7", a.code, a.task)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the first poll never got the task")
	}
}

// TestWorkerWaitsOutAnOpenPoll: the worker's side of one poll at a time.
// A poll of its session still open on the engine's side (its answer was
// lost, or the worker gave up on it first) makes the next one 409
// poll_open; the worker waits for it to end and polls again, rather than
// attaching again (which would be refused: it is attached) and exiting.
func TestWorkerWaitsOutAnOpenPoll(t *testing.T) {
	t.Parallel()
	e, srv, signer, _ := serveEngine(t, 400*time.Millisecond)
	token := sign(t, signer, "w", time.Hour)
	provisioned(e, "w", "")
	w, _ := newTestWorker(t, srv.URL, token, func(c *worker.Config) { c.RetryFirst = 20 * time.Millisecond })
	ctx := context.Background()
	if err := w.Attach(ctx); err != nil || w.Session() == "" {
		t.Fatalf("attach: %v, session %q", err, w.Session())
	}

	// The poll left open: the engine holds it for its PollWait.
	left := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("GET", srv.URL+"/v1/work", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set(sessionHeader, w.Session())
		resp, err := srv.Client().Do(req)
		if err != nil {
			left <- 0
			return
		}
		resp.Body.Close()
		left <- resp.StatusCode
	}()
	waitFor(t, "the earlier poll to be open", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.workers["w"] != nil && e.workers["w"].polling == 1
	})
	task, err := w.Poll(ctx, time.Second)
	if err != nil || task != nil {
		t.Errorf("the worker's poll behind an open one: %v, %v; want none and no error", task, err)
	}
	if code := <-left; code != http.StatusNoContent {
		t.Errorf("the earlier poll: %d; want 204 when its wait ran out", code)
	}
	if got := e.attached(); len(got) != 1 {
		t.Errorf("attached = %q; want the worker still", got)
	}
}
