package engine

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/fluksio/provision/worker"
)

// TestResultCarriesNextTask: a result posted with wait (POST
// /v1/result?wait=SECONDS) is recorded and answered as a poll: 200 with
// the next waiting task, the pass woken by the result having assigned
// it; with none waiting, 204 within resultPollWait, whatever wait asked.
// Without wait the answer is 204 as ever, an older worker's.
func TestResultCarriesNextTask(t *testing.T) {
	t.Parallel()
	e, _ := hookEngine(t, Config{}, time.Hour)
	w := joinWorker(t, e, "slurm-carried", worker.FeatureCommand)
	for _, id := range []string{"one", "two", "three"} {
		if _, err := e.Submit(commandTask(id)); err != nil {
			t.Fatal(err)
		}
	}
	zero := 0
	post := func(id, query string) (int, []byte) {
		body, _ := json.Marshal(worker.ResultRequest{TaskID: id, State: worker.StateSucceeded, ExitCode: &zero, Hostname: "n-" + w.name, JobID: "77", CPUs: 4})
		resp, got := w.do("POST", "/v1/result"+query, bytes.NewReader(body), nil)
		return resp.StatusCode, got
	}
	task := w.take()
	// An older worker's result: 204, and it polls.
	if code, got := post(task.ID, ""); code != http.StatusNoContent {
		t.Fatalf("a result without wait answered %d %s; want 204", code, got)
	}
	task = w.take()
	if task.Name != "two" {
		t.Fatalf("second task %q", task.Name)
	}
	code, got := post(task.ID, "?wait=30")
	var next Task
	if code != http.StatusOK || json.Unmarshal(got, &next) != nil || next.Name != "three" {
		t.Fatalf("a result with wait answered %d %s; want 200 with task three", code, got)
	}
	waitTask(t, e, "two", "two's end", ended)
	// Nothing left: 204 within resultPollWait, though it asked for 30 s.
	start := time.Now()
	if code, got := post(next.ID, "?wait=30"); code != http.StatusNoContent {
		t.Fatalf("the last result with wait answered %d %s; want 204", code, got)
	}
	if took := time.Since(start); took > resultPollWait+5*time.Second {
		t.Errorf("the last result with wait took %s; want about %s", took, resultPollWait)
	}
	for _, id := range []string{"one", "two", "three"} {
		if res := waitTask(t, e, id, id+"'s end", ended); res.State != worker.StateSucceeded {
			t.Errorf("%s: %+v", id, res)
		}
	}
	// A bad wait is refused before the result is read.
	if code, _ := post(next.ID, "?wait=soon"); code != http.StatusBadRequest {
		t.Errorf("wait=soon answered %d; want 400", code)
	}
}
