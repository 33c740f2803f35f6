package engine

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

// told records what an embedder's task and worker hooks heard.
type told struct {
	mu    sync.Mutex // guards lines
	lines []string
}

func (h *told) add(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.lines = append(h.lines, fmt.Sprintf(format, args...))
}

func (h *told) all() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.lines)
}

// hooks records every hook of Hooks (but the plugins').
func (h *told) hooks() Hooks {
	return Hooks{
		Attach:    func(w WorkerInfo) { h.add("attach %s", w.Name) },
		Result:    func(r Result) { h.add("result %s by %s", r.TaskID, r.Worker) },
		TaskEnded: func(r TaskResult) { h.add("ended %s %s (%d attempts)", r.ID, r.State, len(r.Attempts)) },
		TaskLost:  func(r TaskResult, again bool) { h.add("lost %s again=%v", r.ID, again) },
		WorkerGone: func(w WorkerInfo, why string) {
			h.add("gone %s: %s", w.Name, why)
		},
	}
}

// TestTaskLostRetried: a task whose worker is lost under it (it
// detaches without reporting) waits again, and runs on the next worker
// as attempt 2 (a new attempt id, the same name), its stream kept
// afresh; its result has both attempts, the first lost. TaskLost hears
// the loss with again.
func TestTaskLostRetried(t *testing.T) {
	t.Parallel()
	var h told
	e := taskEngine(t, Config{Hooks: h.hooks()})
	spec := commandTask("retry-1")
	spec.Retries = 1
	id, err := e.Submit(spec)
	if err != nil {
		t.Fatal(err)
	}
	a := joinWorker(t, e, "slurm-retry-a", worker.FeatureCommand)
	first := a.take()
	if status, _ := a.appendLog(first.ID, "stdout", 0, []byte("from a, lost\n")); status != http.StatusNoContent {
		t.Fatalf("a's stdout: %d", status)
	}
	a.detach()
	res := waitTask(t, e, id, "the task waiting again", func(r TaskResult) bool { return r.State == TaskWaiting && len(r.Attempts) == 1 })
	if at := res.Attempts[0]; at.State != TaskLostState || at.Worker != "slurm-retry-a" || at.Ended.IsZero() {
		t.Errorf("the lost attempt: %+v", at)
	}
	if _, err := os.Stat(filepath.Join(e.TaskDir(id), "stdout")); err != nil {
		t.Errorf("the lost attempt's stdout is not kept until the next begins: %v", err)
	}
	b := joinWorker(t, e, "slurm-retry-b", worker.FeatureCommand)
	second := b.take()
	if second.Name != id || second.Attempt != 2 || second.ID == first.ID {
		t.Fatalf("second attempt %+v after %+v; want the same name, attempt 2, a new id", second, first)
	}
	if _, err := os.Stat(filepath.Join(e.TaskDir(id), "stdout")); !os.IsNotExist(err) {
		t.Errorf("the first attempt's stdout is still there at the second's start: %v", err)
	}
	if status, _ := b.appendLog(second.ID, "stdout", 0, []byte("from b\n")); status != http.StatusNoContent {
		t.Fatalf("b's stdout: %d", status)
	}
	zero := 0
	b.report(worker.ResultRequest{TaskID: second.ID, State: worker.StateSucceeded, ExitCode: &zero, Stdout: 7})
	res = waitTask(t, e, id, "the task's end", ended)
	if res.State != worker.StateSucceeded || len(res.Attempts) != 2 || res.Attempts[0].State != TaskLostState ||
		res.Attempts[1].State != worker.StateSucceeded || res.Attempts[1].Worker != "slurm-retry-b" || res.Stdout != "from b\n" {
		t.Errorf("result: %+v; want succeeded, attempts [lost on a, succeeded on b], b's stdout", res)
	}
	waitFor(t, "the hooks", func() bool { return slices.Contains(h.all(), "ended retry-1 succeeded (2 attempts)") })
	if got := h.all(); !slices.Contains(got, "lost retry-1 again=true") || !slices.Contains(got, "gone slurm-retry-a: its job 77 was stopped under its task (cancelled, or at its time limit)") {
		t.Errorf("hooks heard %q; want the loss (again) and a's going", got)
	}
}

// TestTaskLostExhausted: a task lost on more attempts than its Retries
// ends lost; its worker dropped by its provisioner's event counts as
// lost as a detach does. TaskLost hears the last loss without again,
// and TaskEnded the end.
func TestTaskLostExhausted(t *testing.T) {
	t.Parallel()
	var h told
	e := taskEngine(t, Config{Hooks: h.hooks()})
	spec := commandTask("exhaust-1")
	spec.Retries = 1
	id, err := e.Submit(spec)
	if err != nil {
		t.Fatal(err)
	}
	a := joinWorker(t, e, "slurm-exhaust-a", worker.FeatureCommand)
	a.take()
	a.detach()
	waitTask(t, e, id, "the task waiting again", func(r TaskResult) bool { return r.State == TaskWaiting })
	b := joinWorker(t, e, "slurm-exhaust-b", worker.FeatureCommand)
	b.take()
	e.books.ObserveEvent(shared.Event{Kind: shared.EventWorkerCancelled, Provisioner: testProvisioner, Worker: "slurm-exhaust-b"})
	res := waitTask(t, e, id, "the task's end", ended)
	if res.State != TaskLostState || len(res.Attempts) != 2 || res.Attempts[1].State != TaskLostState || !strings.Contains(res.Error, "lost under it on every attempt (2)") {
		t.Errorf("result: %+v; want lost after 2 attempts", res)
	}
	waitFor(t, "the hooks", func() bool { return slices.Contains(h.all(), "ended exhaust-1 lost (2 attempts)") })
	got := h.all()
	want := []string{"lost exhaust-1 again=true", "lost exhaust-1 again=false", "ended exhaust-1 lost (2 attempts)"}
	var tasks []string
	for _, l := range got {
		if strings.Contains(l, "exhaust-1") && !strings.HasPrefix(l, "gone ") {
			tasks = append(tasks, l)
		}
	}
	if !slices.Equal(tasks, want) || !slices.Contains(got, "gone slurm-exhaust-b: its request was cancelled (worker_cancelled)") {
		t.Errorf("hooks heard %q; want %q and b dropped", got, want)
	}
}

// TestTaskCancelWaiting: a waiting task cancelled is withdrawn and ends
// cancelled at once; cancelling it again is ErrTaskEnded, an unknown id
// ErrNoSuchTask.
func TestTaskCancelWaiting(t *testing.T) {
	t.Parallel()
	var h told
	e := taskEngine(t, Config{Hooks: h.hooks()})
	id, err := e.Submit(commandTask("cancel-w"))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Cancel(id); err != nil {
		t.Fatal(err)
	}
	res, ok := e.Task(id)
	if !ok || res.State != worker.StateCancelled || res.Error != "cancelled while it waited" || len(res.Attempts) != 0 {
		t.Errorf("after Cancel: %+v; want cancelled while it waited, no attempts", res)
	}
	for _, n := range e.Needs() {
		if n.ID == id && n.State != NeedServed {
			t.Errorf("the cancelled task's need still %s", n.State)
		}
	}
	if err := e.Cancel(id); !errors.Is(err, ErrTaskEnded) {
		t.Errorf("Cancel again: %v; want ErrTaskEnded", err)
	}
	if err := e.Cancel("nope"); !errors.Is(err, ErrNoSuchTask) {
		t.Errorf("Cancel(nope): %v; want ErrNoSuchTask", err)
	}
	// The hooks run on the engine's own goroutine, soon after.
	want := []string{"ended cancel-w cancelled (0 attempts)"}
	waitFor(t, "the TaskEnded hook", func() bool { return len(h.all()) >= len(want) })
	if got := h.all(); !slices.Equal(got, want) {
		t.Errorf("hooks heard %q", got)
	}
	// A worker that comes later is not handed it.
	w := joinWorker(t, e, "slurm-cancel-w", worker.FeatureCommand)
	w.pollNone(0.5)
}

// TestTaskCancelRunning: cancelling a task on a worker answers the
// worker's open watch 200 with WatchAnswer{Cancel: attempt} at once,
// parked or held alike, and every watch after it until the worker reports; the
// task ends cancelled when the report comes, and the worker stays and
// takes the next task.
func TestTaskCancelRunning(t *testing.T) {
	t.Parallel()
	for _, hold := range []bool{false, true} {
		t.Run(fmt.Sprintf("HoldPolls=%v", hold), func(t *testing.T) {
			t.Parallel()
			e := taskEngine(t, Config{HoldPolls: hold})
			id, err := e.Submit(commandTask("cancel-r"))
			if err != nil {
				t.Fatal(err)
			}
			w := joinWorker(t, e, "slurm-cancel-r", worker.FeatureCommand)
			task := w.take()
			type answer struct {
				status int
				body   []byte
			}
			watched := make(chan answer, 1)
			go func() {
				resp, body := w.do("GET", "/v1/watch", nil, nil)
				watched <- answer{resp.StatusCode, body}
			}()
			waitFor(t, "the watch open", func() bool {
				e.books.mu.Lock()
				defer e.books.mu.Unlock()
				for lp := range e.books.waiting {
					if lp.watch && lp.name == w.name {
						return true
					}
				}
				return false
			})
			if !hold && e.api.parker.Parked() != 1 {
				t.Errorf("%d polls parked; want the watch", e.api.parker.Parked())
			}
			if err := e.Cancel(id); err != nil {
				t.Fatal(err)
			}
			// At once: well before the watch's period (PollWait) ends,
			// when it would answer anyway.
			var got answer
			select {
			case got = <-watched:
			case <-time.After(e.books.PollWait / 2):
				t.Fatalf("the watch did not answer the cancel within %s; its period is %s", e.books.PollWait/2, e.books.PollWait)
			}
			var wa worker.WatchAnswer
			if err := json.Unmarshal(got.body, &wa); got.status != http.StatusOK || err != nil || wa.Cancel != task.ID {
				t.Fatalf("watch: %d %s; want 200 {cancel: %s}", got.status, got.body, task.ID)
			}
			if res, _ := e.Task(id); res.State != TaskRunning {
				t.Errorf("before the worker's report: %s; want running", res.State)
			}
			if resp, body := w.do("GET", "/v1/watch", nil, nil); resp.StatusCode != http.StatusOK || !strings.Contains(string(body), task.ID) {
				t.Errorf("the next watch: %d %s; want the cancel again", resp.StatusCode, body)
			}
			w.report(worker.ResultRequest{TaskID: task.ID, State: worker.StateCancelled, Signal: "SIGTERM", Error: "cancelled by the engine"})
			res := waitTask(t, e, id, "the task's end", ended)
			if res.State != worker.StateCancelled || len(res.Attempts) != 1 || res.Attempts[0].State != worker.StateCancelled {
				t.Errorf("result: %+v; want cancelled", res)
			}
			next, err := e.Submit(commandTask("after-cancel"))
			if err != nil {
				t.Fatal(err)
			}
			if task := w.take(); task.Name != next {
				t.Errorf("the worker's next task: %+v; want %s", task, next)
			}
		})
	}
}

// TestWithdrawTask: Withdraw given a task's id cancels it while it
// waits, and says ErrNeedUnderWay of one on a worker and ErrNeedServed
// of one ended, as of a need.
func TestWithdrawTask(t *testing.T) {
	t.Parallel()
	e := taskEngine(t, Config{})
	waiting, err := e.Submit(commandTask("withdraw-w"))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Withdraw(waiting); err != nil {
		t.Fatalf("Withdraw of a waiting task: %v", err)
	}
	if res, _ := e.Task(waiting); res.State != worker.StateCancelled {
		t.Errorf("withdrawn: %s; want cancelled", res.State)
	}
	if err := e.Withdraw(waiting); !errors.Is(err, ErrNeedServed) {
		t.Errorf("Withdraw of an ended task: %v; want ErrNeedServed", err)
	}
	running, err := e.Submit(commandTask("withdraw-r"))
	if err != nil {
		t.Fatal(err)
	}
	w := joinWorker(t, e, "slurm-withdraw", worker.FeatureCommand)
	w.take()
	if err := e.Withdraw(running); !errors.Is(err, ErrNeedUnderWay) {
		t.Errorf("Withdraw of a running task: %v; want ErrNeedUnderWay", err)
	}
	if res, _ := e.Task(running); res.State != TaskRunning {
		t.Errorf("after a refused Withdraw: %s; want running still", res.State)
	}
}

// TestTaskCancelledWorkerLost: a cancelled task whose worker is then
// lost ends cancelled, and is not run again.
func TestTaskCancelledWorkerLost(t *testing.T) {
	t.Parallel()
	e := taskEngine(t, Config{})
	spec := commandTask("cancel-lost")
	spec.Retries = 3
	id, err := e.Submit(spec)
	if err != nil {
		t.Fatal(err)
	}
	w := joinWorker(t, e, "slurm-cancel-lost", worker.FeatureCommand)
	w.take()
	if err := e.Cancel(id); err != nil {
		t.Fatal(err)
	}
	w.detach()
	res := waitTask(t, e, id, "the task's end", ended)
	if res.State != worker.StateCancelled || len(res.Attempts) != 1 {
		t.Errorf("result: %+v; want cancelled after its one attempt", res)
	}
}

// TestTaskCancelBeforeTaken: a task cancelled after it was assigned but
// before its worker's poll took it is taken back at once and ends
// cancelled; the worker's poll then has nothing for it. A worker that
// took a cancelled task and polls again instead of reporting it does
// not run it: the task ends cancelled all the same.
func TestTaskCancelBeforeTaken(t *testing.T) {
	t.Parallel()
	e := taskEngine(t, Config{})
	w := joinWorker(t, e, "slurm-cancel-early", worker.FeatureCommand)
	id, err := e.Submit(commandTask("cancel-early"))
	if err != nil {
		t.Fatal(err)
	}
	waitTask(t, e, id, "the task assigned", func(r TaskResult) bool { return r.State == TaskRunning })
	if err := e.Cancel(id); err != nil {
		t.Fatal(err)
	}
	res := waitTask(t, e, id, "the task's end", ended)
	if res.State != worker.StateCancelled || res.Error != "cancelled before its worker took it" {
		t.Errorf("result: %s %q; want cancelled before its worker took it", res.State, res.Error)
	}
	w.pollNone(0.2)

	id, err = e.Submit(commandTask("cancel-repoll"))
	if err != nil {
		t.Fatal(err)
	}
	task := w.take()
	if err := e.Cancel(id); err != nil {
		t.Fatal(err)
	}
	w.pollNone(0.2)
	res = waitTask(t, e, id, "the task's end", ended)
	if res.State != worker.StateCancelled || !strings.Contains(res.Error, "polled for work again without reporting it") {
		t.Errorf("result: %s %q; want cancelled, the worker polled again", res.State, res.Error)
	}
	if status := w.report(worker.ResultRequest{TaskID: task.ID, State: worker.StateCancelled}); status != http.StatusConflict {
		t.Errorf("a report after that: %d; want 409", status)
	}
}

// TestAuthenticate: an embedder's route checks a worker's request as
// the workers' routes do: an attached worker in its session passes; a
// detached worker's credential, no session, another session, a forged
// token and none are refused.
func TestAuthenticate(t *testing.T) {
	t.Parallel()
	var e *Engine
	e = taskEngine(t, Config{}, func(mux *http.ServeMux) {
		mux.HandleFunc("GET /mine", func(w http.ResponseWriter, r *http.Request) {
			info, err := e.Authenticate(r)
			if err != nil {
				WriteError(w, http.StatusUnauthorized, err.Error())
				return
			}
			fmt.Fprintf(w, "%s on %s with %v", info.Name, info.Hostname, info.Features)
		})
	})
	live := joinWorker(t, e, "slurm-auth-live", worker.FeatureCommand)
	left := joinWorker(t, e, "slurm-auth-left", worker.FeatureCommand)
	left.detach()
	noSession, otherSession, forged, none := *live, *live, *live, *live
	noSession.session, otherSession.session = "", "another"
	forged.token = live.token[:len(live.token)-4] + "AAAA"
	none.token = ""
	if resp, body := live.do("GET", "/mine", nil, nil); resp.StatusCode != http.StatusOK || string(body) != "slurm-auth-live on n-slurm-auth-live with [command]" {
		t.Errorf("the attached worker: %d %s", resp.StatusCode, body)
	}
	for _, tc := range []struct {
		what string
		w    *testWorker
		want string
	}{
		{"a detached worker's credential", left, "revoked"},
		{"no session", &noSession, "no session"},
		{"another session", &otherSession, "another session"},
		{"a forged credential", &forged, "signature"},
		{"no credential", &none, "missing credential"},
	} {
		if resp, body := tc.w.do("GET", "/mine", nil, nil); resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), tc.want) {
			t.Errorf("%s: %d %s; want refused, saying %q", tc.what, resp.StatusCode, body, tc.want)
		}
	}
}

// TestTaskOperatorEndpoints: GET /v1/tasks/ID answers the task as it
// stands, POST /v1/tasks/ID/cancel cancels it (204), an unknown id is
// 404 and an ended task's cancel 409; both sit behind the operator's
// guard, as /status does.
func TestTaskOperatorEndpoints(t *testing.T) {
	t.Parallel()
	e := taskEngine(t, Config{})
	id, err := e.Submit(commandTask("op-1"))
	if err != nil {
		t.Fatal(err)
	}
	get := func(method, path string) (int, []byte) {
		req, _ := http.NewRequest(method, e.URL()+strings.TrimPrefix(path, "/"), nil)
		req.Header.Set(OperatorHeader, "1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, body
	}
	status, body := get("GET", "/v1/tasks/"+id)
	var res TaskResult
	if err := json.Unmarshal(body, &res); status != http.StatusOK || err != nil || res.ID != id || res.State != TaskWaiting ||
		!strings.Contains(string(body), `"attempts":[]`) {
		t.Errorf("GET /v1/tasks/%s: %d %s; want 200, waiting, no attempts", id, status, body)
	}
	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/v1/tasks/nope", http.StatusNotFound},
		{"POST", "/v1/tasks/nope/cancel", http.StatusNotFound},
		{"POST", "/v1/tasks/" + id + "/cancel", http.StatusNoContent},
		{"POST", "/v1/tasks/" + id + "/cancel", http.StatusConflict},
	} {
		if status, body := get(tc.method, tc.path); status != tc.want {
			t.Errorf("%s %s: %d %s; want %d", tc.method, tc.path, status, body, tc.want)
		}
	}
	if status, body := get("GET", "/v1/tasks/"+id); status != http.StatusOK || !strings.Contains(string(body), `"state":"cancelled"`) {
		t.Errorf("after the cancel: %d %s", status, body)
	}

	// The guard: an embedder's that refuses everyone refuses these too.
	guarded, err := New(Config{Secret: testSecret, ID: "test", Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	refuse := func(http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { WriteError(w, http.StatusForbidden, "operators only") })
	}
	if err := guarded.Serve(guarded.Mux(refuse, false)); err != nil {
		t.Fatal(err)
	}
	defer guarded.Stop(context.Background())
	if _, err := guarded.Submit(commandTask("op-2")); err != nil {
		t.Fatal(err)
	}
	for _, method := range []string{"GET", "POST"} {
		path := "v1/tasks/op-2"
		if method == "POST" {
			path += "/cancel"
		}
		req, _ := http.NewRequest(method, guarded.URL()+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s /%s behind a guard that refuses: %d; want 403", method, path, resp.StatusCode)
		}
	}
	if res, _ := guarded.Task("op-2"); res.State != TaskWaiting {
		t.Errorf("a refused cancel changed the task: %s", res.State)
	}
}

// TestSubmitRefusals: each bad spec is refused with words that say what
// and what to do, and nothing is added.
func TestSubmitRefusals(t *testing.T) {
	t.Parallel()
	e, err := New(Config{Secret: testSecret, ID: "test", Listen: "127.0.0.1:0", TaskLimits: TaskLimits{Input: 100}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Submit(commandTask("taken")); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	big := filepath.Join(dir, "big")
	os.WriteFile(big, make([]byte, 101), 0o600)
	ok := filepath.Join(dir, "ok")
	os.WriteFile(ok, []byte("fine"), 0o600)
	with := func(f func(*TaskSpec)) TaskSpec {
		s := commandTask("")
		f(&s)
		return s
	}
	for _, tc := range []struct {
		what string
		spec TaskSpec
		want string
	}{
		{"no command, no payload", with(func(s *TaskSpec) { s.Command = nil }), "no command and no payload: give Command"},
		{"the credential in Env", with(func(s *TaskSpec) { s.Env = map[string]string{shared.WorkerTokenEnv: "x"} }), "Env names FLUKSIO_WORKER_TOKEN, the worker's credential"},
		{"a node's credential in Env", with(func(s *TaskSpec) { s.Env = map[string]string{shared.WorkerTokenEnv + "_3": "x"} }), "Env names FLUKSIO_WORKER_TOKEN_3"},
		{"an empty input name", with(func(s *TaskSpec) { s.Inputs = []Input{{Data: []byte("x")}} }), "an input's name is empty"},
		{"an absolute input", with(func(s *TaskSpec) { s.Inputs = []Input{{Name: "/etc/passwd", Data: []byte("x")}} }), `input "/etc/passwd" is absolute`},
		{"an input with ..", with(func(s *TaskSpec) { s.Inputs = []Input{{Name: "a/../../b", Data: []byte("x")}} }), `input "a/../../b" has a ".." element`},
		{"an input not plainly written", with(func(s *TaskSpec) { s.Inputs = []Input{{Name: "a//b", Data: []byte("x")}} }), `write "a/b"`},
		{"a duplicate input", with(func(s *TaskSpec) { s.Inputs = []Input{{Name: "a", Data: []byte("x")}, {Name: "a", Path: ok}} }), `input "a" is given twice`},
		{"an input under an input", with(func(s *TaskSpec) { s.Inputs = []Input{{Name: "a", Data: []byte("x")}, {Name: "a/b", Path: ok}} }), `input "a/b" is under input "a"`},
		{"an empty output", with(func(s *TaskSpec) { s.Outputs = []string{""} }), "an output's name is empty"},
		{"an absolute output", with(func(s *TaskSpec) { s.Outputs = []string{"/tmp/x"} }), `output "/tmp/x" is absolute`},
		{"an output with ..", with(func(s *TaskSpec) { s.Outputs = []string{"../x"} }), `output "../x" has a ".." element`},
		{"a duplicate output", with(func(s *TaskSpec) { s.Outputs = []string{"x", "x"} }), `output "x" is given twice`},
		{"a duplicate id", with(func(s *TaskSpec) { s.ID = "taken" }), "task taken: the engine holds a task of that id already"},
		{"an id that is a path", with(func(s *TaskSpec) { s.ID = "../x" }), `task id "../x": use 1 to 128 letters`},
		{"an unreadable input", with(func(s *TaskSpec) { s.Inputs = []Input{{Name: "in", Path: filepath.Join(dir, "missing")}} }), `input "in": cannot read it`},
		{"a directory as input", with(func(s *TaskSpec) { s.Inputs = []Input{{Name: "in", Path: dir}} }), "is not a regular file"},
		{"an input past the limit", with(func(s *TaskSpec) { s.Inputs = []Input{{Name: "in", Path: big}} }), `input "in": ` + big + " is 101 bytes; the engine takes at most 100 bytes an input"},
		{"Data past the limit", with(func(s *TaskSpec) { s.Inputs = []Input{{Name: "in", Data: make([]byte, 101)}} }), "101 bytes of Data; the engine takes at most 100"},
		{"both Path and Data", with(func(s *TaskSpec) { s.Inputs = []Input{{Name: "in", Path: ok, Data: []byte("x")}} }), "both a Path and Data"},
		{"a negative timeout", with(func(s *TaskSpec) { s.Timeout = -time.Second }), "Timeout is -1s"},
		{"negative retries", with(func(s *TaskSpec) { s.Retries = -1 }), "Retries is -1"},
	} {
		id, err := e.Submit(tc.spec)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Submit = %q, %v; want an error saying %q", tc.what, id, err, tc.want)
		}
	}
	if n := len(e.Needs()); n != 1 {
		t.Errorf("%d needs after the refusals; want the one task accepted", n)
	}
	if _, ok := e.Task("t-1"); ok {
		t.Error("a refused task is held as t-1")
	}
	id, err := e.Submit(with(func(s *TaskSpec) { s.Inputs = []Input{{Name: "a/b", Path: ok}, {Name: "c", Data: []byte("x")}} }))
	if err != nil || id != "t-1" {
		t.Errorf("a good spec after the refusals: %q %v; want t-1", id, err)
	}
}

// TestOldWorkerNeverGetsCommandTask: a worker that names no features
// (one that predates tasks) is handed the stand-in, never a command or
// a payload task, however long they wait; a worker with the feature
// takes each.
func TestOldWorkerNeverGetsCommandTask(t *testing.T) {
	t.Parallel()
	e := taskEngine(t, Config{})
	cmd, err := e.Submit(commandTask("cmd-1"))
	if err != nil {
		t.Fatal(err)
	}
	pay, err := e.Submit(TaskSpec{ID: "pay-1", Need: shared.Need{CPUs: 1}, Payload: []byte(`{"step":1}`)})
	if err != nil {
		t.Fatal(err)
	}
	need := e.Add(shared.Need{CPUs: 1}, 0)
	old := joinWorker(t, e, "slurm-old")
	standIn := old.take()
	if standIn.Name != "" || len(standIn.Requires) != 0 || len(standIn.Command) != 0 {
		t.Fatalf("the old worker was handed %+v; want the stand-in", standIn)
	}
	old.report(worker.ResultRequest{TaskID: standIn.ID, Output: "done"})
	waitFor(t, "the stand-in served", func() bool {
		for _, n := range e.Needs() {
			if n.ID == need {
				return n.State == NeedServed
			}
		}
		return false
	})
	old.pollNone(1)
	for _, id := range []string{cmd, pay} {
		if res, _ := e.Task(id); res.State != TaskWaiting {
			t.Errorf("task %s: %s; want waiting for a worker that runs it", id, res.State)
		}
	}
	payer := joinWorker(t, e, "slurm-payer", worker.FeaturePayload)
	if task := payer.take(); task.Name != pay || string(task.Payload) != `{"step":1}` || !slices.Equal(task.Requires, []string{worker.FeaturePayload}) {
		t.Errorf("the payload worker was handed %+v; want %s", task, pay)
	}
	runner := joinWorker(t, e, "slurm-runner", worker.FeatureCommand)
	if task := runner.take(); task.Name != cmd || !slices.Equal(task.Command, []string{"sh", "-c", "true"}) {
		t.Errorf("the command worker was handed %+v; want %s", task, cmd)
	}
	old.pollNone(0.5)
}

// TestTaskHooksBesideEvents: with every hook of the embedder's set, the
// event stream (GET /v1/events) still has the attaches, the tasks and
// the leaving workers, and the metrics (GET /metrics) the task's end,
// and the hooks hear them too: neither replaces the other.
func TestTaskHooksBesideEvents(t *testing.T) {
	t.Parallel()
	var h told
	e := taskEngine(t, Config{Hooks: h.hooks()})
	id, err := e.Submit(commandTask("hooked"))
	if err != nil {
		t.Fatal(err)
	}
	w := joinWorker(t, e, "slurm-hooked", worker.FeatureCommand)
	task := w.take()
	zero := 0
	w.report(worker.ResultRequest{TaskID: task.ID, State: worker.StateSucceeded, ExitCode: &zero})
	waitTask(t, e, id, "the task's end", ended)
	w.detach()

	// The stream sends its history first, then waits for more.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", e.URL()+"v1/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var kinds []EventKind
	lines := bufio.NewScanner(resp.Body)
	for !slices.Contains(kinds, EventWorkerDetached) && lines.Scan() {
		if data, ok := strings.CutPrefix(lines.Text(), "data: "); ok {
			var ev Event
			if err := json.Unmarshal([]byte(data), &ev); err != nil {
				t.Fatalf("an event: %q: %v", data, err)
			}
			kinds = append(kinds, ev.Kind)
		}
	}
	for _, k := range []EventKind{EventWorkerAttached, EventTaskAssigned, EventTaskDone, EventTaskEnded, EventWorkerDetached} {
		if !slices.Contains(kinds, k) {
			t.Errorf("GET /v1/events: %v lacks %s", kinds, k)
		}
	}
	mresp, err := http.Get(e.URL() + "metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	if !strings.Contains(string(metrics), `fluksio_tasks_ended_total{state="succeeded"} 1`) {
		t.Errorf("GET /metrics has no task ended:\n%s", metrics)
	}
	waitFor(t, "the hooks", func() bool { return len(h.all()) == 4 })
	want := []string{"attach slurm-hooked", "result " + task.ID + " by slurm-hooked", "ended hooked succeeded (1 attempts)", "gone slurm-hooked: detached"}
	if got := h.all(); !slices.Equal(got, want) {
		t.Errorf("hooks heard %q; want %q", got, want)
	}
}

// TestTaskDirOwn: New makes no directory; the engine's own is made when
// it listens, under os.TempDir, and removed at Stop with what it holds;
// a Config.TaskDir is the embedder's and stays.
func TestTaskDirOwn(t *testing.T) {
	t.Parallel()
	e, err := New(Config{Secret: testSecret, ID: "test", Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if d := e.TaskDir("x"); d != "" {
		t.Errorf("TaskDir before Serve: %q; New makes nothing", d)
	}
	if err := e.Serve(e.Mux(nil, false)); err != nil {
		t.Fatal(err)
	}
	d := e.TaskDir("x")
	root := filepath.Dir(d)
	if fi, err := os.Stat(root); err != nil || !fi.IsDir() || !strings.HasPrefix(root, os.TempDir()) || fi.Mode().Perm() != 0o700 {
		t.Fatalf("the engine's task directory %s: %v %v; want a 0700 directory under %s", root, fi, err, os.TempDir())
	}
	os.MkdirAll(filepath.Join(d, "outputs"), 0o700)
	os.WriteFile(filepath.Join(d, "stdout"), []byte("x"), 0o600)
	e.Stop(context.Background())
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Errorf("the engine's task directory after Stop: %v; want it removed", err)
	}

	mine := filepath.Join(t.TempDir(), "tasks")
	e, err = New(Config{Secret: testSecret, ID: "test", Listen: "127.0.0.1:0", TaskDir: mine})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Serve(e.Mux(nil, false)); err != nil {
		t.Fatal(err)
	}
	if got := e.TaskDir("t-1"); got != filepath.Join(mine, "t-1") {
		t.Errorf("TaskDir(t-1) = %q; want under Config.TaskDir", got)
	}
	e.Stop(context.Background())
	if _, err := os.Stat(mine); err != nil {
		t.Errorf("Config.TaskDir after Stop: %v; it is the embedder's", err)
	}
}

// TestTaskWaitsForAWorkerWithTime: a worker whose job ends in 40 s gets
// no task of a 60 s timeout (40 < 60 + worker.EndMargin) but takes one of
// 10 s; the longer task waits for a worker with the time, and is demand
// meanwhile. /status shows the worker's time left.
func TestTaskWaitsForAWorkerWithTime(t *testing.T) {
	t.Parallel()
	e := taskEngine(t, Config{})
	long := commandTask("long-1")
	long.Timeout = 60 * time.Second
	longID, err := e.Submit(long)
	if err != nil {
		t.Fatal(err)
	}
	short := joinWorkerEnding(t, e, strings.TrimSuffix(e.URL(), "/"), "slurm-short-a", time.Now().Add(40*time.Second), worker.FeatureCommand)
	short.pollNone(0.5)
	quick := commandTask("quick-1")
	quick.Timeout = 10 * time.Second
	quickID, err := e.Submit(quick)
	if err != nil {
		t.Fatal(err)
	}
	if got := short.take(); got.Name != quickID {
		t.Fatalf("the worker with 40 s left took %q; want %q", got.Name, quickID)
	}
	if r, _ := e.Task(longID); r.State != TaskWaiting {
		t.Errorf("the 60 s task is %s; want waiting for a worker with the time", r.State)
	}
	var st statusReport
	resp, err := http.Get(strings.TrimSuffix(e.URL(), "/") + "/status")
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Workers) != 1 || !strings.HasSuffix(st.Workers[0].TimeLeft, "s") || st.Workers[0].EndsAt.IsZero() {
		t.Errorf("/status workers = %+v; want the time left", st.Workers)
	}
	roomy := joinWorkerEnding(t, e, strings.TrimSuffix(e.URL(), "/"), "slurm-roomy-b", time.Now().Add(2*time.Minute), worker.FeatureCommand)
	if got := roomy.take(); got.Name != longID {
		t.Errorf("the worker with 2 min left took %q; want %q", got.Name, longID)
	}
}
