package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/worker"
)

// operatorGet sends an operator's request to e and reads the answer.
func operatorGet(t *testing.T, e *Engine, method, path string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, e.URL()+strings.TrimPrefix(path, "/"), nil)
	if method != http.MethodGet {
		req.Header.Set("Fluksio-Operator", "1")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

// statusAnswer is the part of GET /status these tests read.
type statusAnswer struct {
	Workers      []workerStatus `json:"workers"`
	Needs        []NeedStatus   `json:"needs"`
	Summary      statusSummary  `json:"summary"`
	WorkersTotal int            `json:"workers_total"`
	NeedsMatched int            `json:"needs_matched"`
}

func getStatus(t *testing.T, e *Engine, query string) statusAnswer {
	t.Helper()
	code, body := operatorGet(t, e, "GET", "/status"+query)
	if code != http.StatusOK {
		t.Fatalf("GET /status%s: %d %s", query, code, body)
	}
	var st statusAnswer
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("GET /status%s: %v\n%s", query, err, body)
	}
	return st
}

// TestStatusSummaryAndLimit: GET /status counts every task by state and
// every need by state and reason whatever it lists; ?limit caps the
// lists (needs_matched and workers_total say how many there are),
// ?state lists only the needs of a state (a need's, its task's or its
// reason); a task is named by its id, its attempt by a number beside it
// and its attempt id; the ends are counted over time.
func TestStatusSummaryAndLimit(t *testing.T) {
	t.Parallel()
	e := taskEngine(t, Config{})
	const n = 250
	for i := range n {
		if _, err := e.Submit(commandTask(fmt.Sprintf("s%03d", i))); err != nil {
			t.Fatal(err)
		}
	}
	st := getStatus(t, e, "?limit=100")
	if len(st.Needs) != 100 || st.NeedsMatched != n || st.Summary.Tasks.Waiting != n || st.Summary.Tasks.Submitted != n ||
		st.Summary.Needs.Waiting != n || st.WorkersTotal != 0 {
		t.Errorf("?limit=100 of %d waiting: %d needs listed, %d matched, summary %+v, %d workers", n, len(st.Needs), st.NeedsMatched, st.Summary, st.WorkersTotal)
	}
	if st := getStatus(t, e, "?state=failed&limit=100"); len(st.Needs) != 0 || st.NeedsMatched != 0 {
		t.Errorf("?state=failed with none failed: %d listed, %d matched", len(st.Needs), st.NeedsMatched)
	}
	if code, body := operatorGet(t, e, "GET", "/status?limit=x"); code != http.StatusBadRequest || !strings.Contains(string(body), "whole number") {
		t.Errorf("?limit=x: %d %s; want 400 saying what to give", code, body)
	}

	w := joinWorker(t, e, "slurm-sum-a", worker.FeatureCommand)
	task := w.take()
	if task.Name != "s000" || task.Attempt != 1 {
		t.Fatalf("took %+v; want s000, attempt 1", task)
	}
	running := getStatus(t, e, "?state=running")
	if running.NeedsMatched != 1 || len(running.Needs) != 1 {
		t.Fatalf("?state=running: %+v", running.Needs)
	}
	if n := running.Needs[0]; n.ID != "s000" || n.Task != "s000" || n.Attempt != 1 || n.AttemptID != task.ID || n.Worker != "slurm-sum-a" || n.TaskState != TaskRunning {
		t.Errorf("the running task's need: %+v; want s000 on slurm-sum-a, task s000, attempt 1, attempt_id %s", n, task.ID)
	}
	if ws := running.Workers; len(ws) != 1 || ws[0].Task != "s000" || ws[0].Attempt != 1 || ws[0].AttemptID != task.ID {
		t.Errorf("the worker: %+v; want holding task s000, attempt 1 (%s)", ws, task.ID)
	}
	one := 1
	w.report(worker.ResultRequest{TaskID: task.ID, State: worker.StateFailed, ExitCode: &one})
	waitTask(t, e, "s000", "the task's end", ended)
	var failed statusAnswer
	waitFor(t, "the failed task counted", func() bool {
		failed = getStatus(t, e, "?state=failed&limit=100")
		return failed.Summary.Tasks.Failed == 1
	})
	if len(failed.Needs) != 1 || failed.Needs[0].Task != "s000" || failed.Needs[0].AttemptID != task.ID || failed.Needs[0].TaskState != worker.StateFailed {
		t.Errorf("?state=failed: %+v", failed.Needs)
	}
	ends := 0
	for _, c := range failed.Summary.Tasks.Ended.Counts {
		ends += c
	}
	if ends != 1 || failed.Summary.Tasks.Ended.StepSeconds != 1 || failed.Summary.Tasks.Ended.Start.IsZero() {
		t.Errorf("the ends over time: %+v; want one end in steps of 1 s", failed.Summary.Tasks.Ended)
	}
	if s := failed.Summary.Tasks; s.Submitted != n || s.Failed+s.Waiting+s.Running != n {
		t.Errorf("the tasks' counts %+v do not add up to %d", s, n)
	}

	// The attempt's id, asked for as a task's, names the task.
	for _, req := range [][2]string{{"GET", "/v1/tasks/" + task.ID}, {"POST", "/v1/tasks/" + task.ID + "/cancel"}} {
		code, body := operatorGet(t, e, req[0], req[1])
		var a attemptNotTask
		json.Unmarshal(body, &a)
		if code != http.StatusNotFound || a.TaskID != "s000" || a.Attempt != 1 || !strings.Contains(a.Error, "attempt 1 of task s000") {
			t.Errorf("%s %s: %d %s; want 404 naming task s000, attempt 1", req[0], req[1], code, body)
		}
	}
	if res, _ := e.Task("s000"); len(res.Attempts) != 1 || res.Attempts[0].Number != 1 || res.Attempts[0].AttemptID != task.ID {
		t.Errorf("the task's attempts: %+v; want attempt 1, %s", res.Attempts, task.ID)
	}
	// Events name the task by its id, the attempt beside it.
	evs := e.Events(context.Background(), 0)
	assigned := false
	for ev := range evs {
		if ev.Kind == EventTaskAssigned && ev.Task == "s000" && ev.Attempt == 1 && ev.AttemptID == task.ID {
			assigned = true
		}
		if ev.Kind == EventTaskEnded && ev.Task == "s000" {
			if ev.AttemptID != task.ID || ev.Attempt != 1 || ev.Job != "77" {
				t.Errorf("task_ended: %+v; want attempt 1 (%s), job 77", ev, task.ID)
			}
			break
		}
	}
	if !assigned {
		t.Errorf("no task_assigned event for s000 naming attempt 1 (%s)", task.ID)
	}
}

// TestReportedWorkerHoldsItsTask: a worker whose result is in holds its
// task until the router has collected it: it is not idle, takes no
// other task, and GET /status shows it with that task (reported). A
// worker freed at the report was given the next task while the router
// still listed the last one on it: one worker on two rows.
func TestReportedWorkerHoldsItsTask(t *testing.T) {
	t.Parallel()
	signer := host.NewSigner(testSecret)
	e := newBareBooks(nil, signer, nil)
	token := sign(t, signer, "w1", time.Hour)
	provisioned(e, "w1", "77")
	if rec := do(t, e, "POST", "/v1/attach", token, attachBody); rec.Code != http.StatusOK {
		t.Fatalf("attach: %d %s", rec.Code, rec.Body)
	}
	if err := e.Assign("w1", Task{ID: "task-9", Name: "t9", Attempt: 1}); err != nil {
		t.Fatal(err)
	}
	if rec := do(t, e, "POST", "/v1/result", token, `{"task_id":"task-9","hostname":"n01","job_id":"77","cpus":4,"output":"done"}`); rec.Code != http.StatusNoContent {
		t.Fatalf("result: %d %s", rec.Code, rec.Body)
	}
	if idle := e.IdleWorkers(); len(idle) != 0 {
		t.Errorf("a worker whose result is not collected counted idle: %+v", idle)
	}
	if err := e.Assign("w1", Task{ID: "task-10", Name: "t10", Attempt: 1}); err != errWorkerBusy {
		t.Errorf("assigning it another task: %v; want errWorkerBusy", err)
	}
	if st := e.statuses(); len(st) != 1 || st[0].Task != "t9" || st[0].AttemptID != "task-9" || !st[0].Reported {
		t.Errorf("status: %+v; want w1 holding t9 (task-9), reported", st)
	}
	if _, state := e.TaskOutcome("w1", "task-9"); state != assignDone {
		t.Fatalf("outcome %v; want done", state)
	}
	if idle := e.IdleWorkers(); len(idle) != 1 {
		t.Errorf("once collected, idle workers: %+v; want w1", idle)
	}
	if st := e.statuses(); st[0].Task != "" || st[0].AttemptID != "" || st[0].Reported {
		t.Errorf("status once collected: %+v; want idle", st[0])
	}
}

// TestEndSeriesStaysBounded: ends counted over a run longer than
// maxEndBuckets steps double the step instead of growing the series:
// 300 ends, one a second, are 75 bars of 4 s (1 s up to 120 s, 2 s up
// to 240 s, then 4 s), every end counted.
func TestEndSeriesStaysBounded(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	s := endSeries{start: start}
	for i := range 300 {
		s.add(start.Add(time.Duration(i)*time.Second + 500*time.Millisecond))
	}
	got := s.export()
	total := 0
	for _, n := range got.Counts {
		total += n
	}
	if got.StepSeconds != 4 || len(got.Counts) != 75 || total != 300 || got.Counts[0] != 4 || got.Counts[74] != 4 {
		t.Errorf("300 ends a second apart: %d bars of %gs holding %d (first %d, last %d); want 75 of 4s holding 300, 4 each",
			len(got.Counts), got.StepSeconds, total, got.Counts[0], got.Counts[len(got.Counts)-1])
	}
}

// TestJobStoppedSaysWhich: a worker that detaches with a task in hand
// was stopped; the time limit it reported says whether its job was
// cancelled (well before the limit), reached it, or either (no limit).
func TestJobStoppedSaysWhich(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		ends time.Time
		want string
	}{
		{now.Add(41 * time.Minute), "its job 9_0 was cancelled under its task, 41m0s before its time limit"},
		{now.Add(5 * time.Second), "its job 9_0 reached its time limit under its task"},
		{time.Time{}, "its job 9_0 was stopped under its task (cancelled, or at its time limit)"},
	} {
		if got := jobStopped(WorkerInfo{JobID: "9_0", EndsAt: c.ends}, now); got != c.want {
			t.Errorf("ends at %v: %q; want %q", c.ends, got, c.want)
		}
	}
}
