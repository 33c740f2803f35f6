package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/worker"
)

// TestRunTasksAfter runs a map-reduce through host-example run -tasks
// on real workers (a memory run: no Slurm): 8 maps each write a count,
// one reduce takes the 8 counts as inputs ({"task", "path"}) and sums
// them, a report runs after the reduce; a task that fails, and one
// after it. The reduce's output is the sum of the maps' counts, every
// task that succeeded ran once, the task after the failure never ran
// and its result.json names the failure, and run exits 1 (not every
// task succeeded).
func TestRunTasksAfter(t *testing.T) {
	var lines []string
	inputs := map[string]any{}
	want := 0
	for i := range 8 {
		id := fmt.Sprintf("map-%d", i)
		lines = append(lines, fmt.Sprintf(`{"id": %q, "command": ["sh", "-c", "mkdir -p out && echo %d > out/count"], "outputs": ["out/"]}`, id, 10+i))
		inputs[fmt.Sprintf("c%d", i)] = map[string]string{"task": id, "path": "out/count"}
		want += 10 + i
	}
	in, _ := json.Marshal(inputs)
	// The reduce comes first in the file: run submits it after the maps.
	lines = append([]string{fmt.Sprintf(`{"id": "reduce", "command": ["sh", "-c", "cat c* | awk '{s+=$1} END {print s}' > sum"], "inputs": %s, "outputs": ["sum"]}`, in)}, lines...)
	lines = append(lines,
		`{"id": "report", "command": ["true"], "after": ["reduce"]}`,
		`{"id": "bad", "command": ["sh", "-c", "exit 3"]}`,
		`{"id": "after-bad", "command": ["true"], "after": ["bad"]}`)
	tasks := writeTaskFile(t, len(lines), func(i int) string { return lines[i] })
	r := startMemRun(t, 4, tasks, "-timeout", "5m")
	r.startWorkers(t)
	code := r.p.wait(t, 5*time.Minute)
	t.Logf("exit %d\n%s", code, r.p.stdout)
	if code != 1 {
		t.Errorf("exit %d; want 1 (bad failed, after-bad not run)", code)
	}
	sum, err := os.ReadFile(filepath.Join(r.results, "reduce", "outputs", "sum"))
	if err != nil || strings.TrimSpace(string(sum)) != fmt.Sprint(want) {
		t.Errorf("the reduce's sum: %q, %v; want %d", sum, err, want)
	}
	read := func(id string) engine.TaskResult {
		var res engine.TaskResult
		b, err := os.ReadFile(filepath.Join(r.results, id, "result.json"))
		if err == nil {
			err = json.Unmarshal(b, &res)
		}
		if err != nil {
			t.Fatalf("%s's result.json: %v", id, err)
		}
		return res
	}
	for _, id := range []string{"map-0", "map-7", "reduce", "report"} {
		if res := read(id); res.State != worker.StateSucceeded || len(res.Attempts) != 1 {
			t.Errorf("%s: %s after %d attempts; want succeeded, once", id, res.State, len(res.Attempts))
		}
	}
	if res := read("after-bad"); res.State != worker.StateCancelled || len(res.Attempts) != 0 || !strings.Contains(res.Error, "not run: it runs after task bad, which ended failed") {
		t.Errorf("after-bad: %s %q, %d attempts; want cancelled, never run, naming bad", res.State, res.Error, len(res.Attempts))
	}
	rep, red := read("report"), read("reduce")
	if rep.Attempts[0].Started.Before(red.Ended) {
		t.Errorf("report started at %s, before the reduce ended at %s", rep.Attempts[0].Started, red.Ended)
	}
}
