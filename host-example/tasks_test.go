package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/worker"
)

func TestReadTasks(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "in.bin"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "tasks.jsonl")
	good := `# a comment, then a blank line

{"id": "a1", "command": ["sha256sum", "in.bin"], "inputs": {"in.bin": "in.bin"}}
{"id": "b.2", "cpus": 2, "gpus": 1, "ram_mb": 512, "label": "x", "command": ["sh", "-c", "exit 3"], "env": {"K": "v"}, "outputs": ["out/", "r.txt"], "timeout": "90s", "attempts": 1}
{"id": "c", "command": ["true"], "timeout": 2.5}
`
	if err := os.WriteFile(file, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	specs, err := readTasks(file, testResults(t, filepath.Join(dir, "results")))
	if err != nil {
		t.Fatal(err)
	}
	if len(specs) != 3 {
		t.Fatalf("%d tasks", len(specs))
	}
	a, b, c := specs[0], specs[1], specs[2]
	if a.ID != "a1" || a.Need.CPUs != 1 || len(a.Inputs) != 1 || a.Inputs[0].Path != filepath.Join(dir, "in.bin") || a.Retries != defaultAttempts-1 {
		t.Errorf("a1 = %+v", a)
	}
	if b.Need.CPUs != 2 || b.Need.GPUs != 1 || b.Need.RAMMB != 512 || b.Need.Label != "x" || b.Timeout != 90*time.Second || b.Retries != 0 || b.Env["K"] != "v" || len(b.Outputs) != 2 {
		t.Errorf("b.2 = %+v", b)
	}
	if c.Timeout != 2500*time.Millisecond {
		t.Errorf("c's timeout = %s", c.Timeout)
	}
}

func TestReadTasksRefuses(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "in.bin"), []byte("data"), 0o644)
	os.Mkdir(filepath.Join(dir, "adir"), 0o755)
	results := filepath.Join(dir, "results")
	os.MkdirAll(filepath.Join(results, "old"), 0o755)
	os.WriteFile(filepath.Join(results, "old", "result.json"), []byte("{}"), 0o644)
	for _, tc := range []struct{ name, line, want string }{
		{"unknown field", `{"id": "a", "cmd": ["true"]}`, `:2: unknown field "cmd"`},
		{"unknown field near one", `{"id": "a", "command": ["true"], "input": {"x": "in.bin"}}`, `:2: unknown field "input"; did you mean "inputs"?`},
		{"misspelt field", `{"id": "a", "comand": ["true"]}`, `:2: unknown field "comand"; did you mean "command"?`},
		{"transposed field", `{"id": "a", "command": ["true"], "lable": "x"}`, `:2: unknown field "lable"; did you mean "label"?`},
		{"no id", `{"command": ["true"]}`, `:2: no "id"`},
		{"bad id", `{"id": "../x", "command": ["true"]}`, `:2: id "../x": use letters`},
		{"duplicate id", `{"id": "first", "command": ["true"]}`, `:2: task "first" again (first on line 1)`},
		{"empty command", `{"id": "a", "command": []}`, `:2: task "a": "command" is empty`},
		{"missing input", `{"id": "a", "command": ["true"], "inputs": {"x": "nope.bin"}}`, `:2: task "a": input "x": stat ` + filepath.Join(dir, "nope.bin") + `: no such file or directory`},
		{"input a directory", `{"id": "a", "command": ["true"], "inputs": {"x": "adir"}}`, `is not a regular file`},
		{"input dotdot", `{"id": "a", "command": ["true"], "inputs": {"../x": "in.bin"}}`, `:2: task "a": input "../x": a ".." element`},
		{"input absolute", `{"id": "a", "command": ["true"], "inputs": {"/x": "in.bin"}}`, `:2: task "a": input "/x": absolute`},
		{"output dotdot", `{"id": "a", "command": ["true"], "outputs": ["a/../../b"]}`, `:2: task "a": output "a/../../b": a ".." element`},
		{"output absolute", `{"id": "a", "command": ["true"], "outputs": ["/etc/passwd"]}`, `output "/etc/passwd": absolute`},
		{"credential in env", `{"id": "a", "command": ["true"], "env": {"FLUKSIO_WORKER_TOKEN": "x"}}`, `env may not set FLUKSIO_WORKER_TOKEN`},
		{"bad timeout", `{"id": "a", "command": ["true"], "timeout": "soon"}`, `timeout "soon" is not a duration`},
		{"zero attempts", `{"id": "a", "command": ["true"], "attempts": 0}`, `attempts must be at least 1`},
		{"zero cpus", `{"id": "a", "command": ["true"], "cpus": 0}`, `cpus must be at least 1`},
		{"not JSON", `id: a`, `:2: not a JSON object`},
		{"two values", `{"id": "a", "command": ["true"]} {}`, `:2: more than one JSON value`},
		{"earlier results", `{"id": "old", "command": ["true"]}`, `:2: task "old": ` + filepath.Join(results, "old") + ` holds an earlier run's results; give -resume to keep what succeeded`},
		{"after unknown", `{"id": "a", "command": ["true"], "after": ["nope"]}`, `:2: task "a": runs after "nope", which no line of the file names`},
		{"after bad id", `{"id": "a", "command": ["true"], "after": ["../x"]}`, `:2: task "a": after names "../x", which is no task id`},
		{"after itself", `{"id": "a", "command": ["true"], "after": ["a"]}`, `:2: task "a" runs after itself: a -> a`},
		{"input from unknown", `{"id": "a", "command": ["true"], "inputs": {"x": {"task": "nope", "path": "o"}}}`, `:2: task "a": input "x" is from task "nope", which no line of the file names`},
		{"input not an output", `{"id": "a", "command": ["true"], "inputs": {"x": {"task": "first", "path": "o"}}}`, `:2: task "a": input "x" is task "first"'s "o", which is none of its outputs ()`},
		{"input object unknown key", `{"id": "a", "command": ["true"], "inputs": {"x": {"task": "first", "file": "o"}}}`, `another task's output ({"task": "map-1", "path": "counts.txt"})`},
		{"input from dotdot", `{"id": "a", "command": ["true"], "inputs": {"x": {"task": "first", "path": "../o"}}}`, `:2: task "a": input "x" from task "first": path "../o": a ".." element`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(dir, "tasks.jsonl")
			os.WriteFile(file, []byte(`{"id": "first", "command": ["true"]}`+"\n"+tc.line+"\n"), 0o644)
			_, err := readTasks(file, testResults(t, results))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v\nwant it to contain %q", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), file+":") {
				t.Errorf("err = %v; want it to start with the file's name", err)
			}
		})
	}
}

// TestNearest: a suggestion is made within an edit distance of 2 (1 for a
// short name) or for a prefix, and not otherwise: "cmd" is not "id".
func TestNearest(t *testing.T) {
	known := jsonFields(&taskLine{})
	for name, want := range map[string]string{"input": "inputs", "comand": "command", "lable": "label", "output": "outputs", "timout": "timeout", "cmd": "", "ID": "id", "xyz": "", "attempt": "attempts"} {
		if got := nearest(name, known); got != want {
			t.Errorf("nearest(%q) = %q, want %q", name, got, want)
		}
	}
}

// TestRunTasksMistakeExits2: a tasks file with a typo in a field is a
// mistake in what was given: run exits 2, before anything is read or
// asked for, naming the file's line and the field meant.
func TestRunTasksMistakeExits2(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "tasks.jsonl")
	os.WriteFile(file, []byte(`{"id": "a", "command": ["true"], "input": {"x": "in.bin"}}`+"\n"), 0o644)
	var out, errOut strings.Builder
	code := runMain([]string{"-config", filepath.Join(dir, "absent.hcl"), "-tasks", file, "-results", filepath.Join(dir, "results")}, &out, &errOut)
	if want := file + `:1: unknown field "input"; did you mean "inputs"?`; code != 2 || !strings.Contains(errOut.String(), want) {
		t.Errorf("exit %d, stderr %q; want 2 and %q", code, errOut.String(), want)
	}
}

func TestRunTasksFlagsGoTogether(t *testing.T) {
	var out, errOut strings.Builder
	if code := runMain([]string{"-config", "x.hcl", "-tasks", "t.jsonl"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "-tasks FILE and -results DIR go together") {
		t.Errorf("exit %d, stderr %q", code, errOut.String())
	}
	errOut.Reset()
	if code := runMain([]string{"-config", "x.hcl", "-resume"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "-resume goes with -tasks FILE -results DIR") {
		t.Errorf("-resume alone: exit %d, stderr %q", code, errOut.String())
	}
}

// TestWriteResult: writeResult writes result.json where the task's
// directory is missing, and where the engine made it already for the
// task's streams, which stay as they were; and nothing but result.json
// is left beside them. A file where the directory goes is an error.
func TestWriteResult(t *testing.T) {
	root := t.TempDir()
	results := testResults(t, filepath.Join(root, "results"))
	code := 0
	r := engine.TaskResult{ID: "a", State: worker.StateSucceeded, ExitCode: &code, Attempts: []engine.Attempt{{Worker: "mem-1"}}}
	made := filepath.Join(results.Name(), "b")
	if err := os.Mkdir(made, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(made, "stdout"), []byte("hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		if err := writeResult(results, id, r, ""); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		b, err := os.ReadFile(filepath.Join(results.Name(), id, "result.json"))
		if err != nil {
			t.Fatal(err)
		}
		var got engine.TaskResult
		if err := json.Unmarshal(b, &got); err != nil || got.ID != "a" || got.State != worker.StateSucceeded || len(got.Attempts) != 1 {
			t.Errorf("%s: result.json %s (%v)", id, b, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(made, "stdout")); err != nil || string(b) != "hi\n" {
		t.Errorf("the engine's stdout became %q (%v)", b, err)
	}
	for _, id := range []string{"a", "b"} {
		entries, _ := os.ReadDir(filepath.Join(results.Name(), id))
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		if want := map[string]string{"a": "result.json", "b": "result.json stdout"}[id]; strings.Join(names, " ") != want {
			t.Errorf("%s holds %v; want %s", id, names, want)
		}
	}
	if err := os.WriteFile(filepath.Join(results.Name(), "c"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeResult(results, "c", r, ""); err == nil {
		t.Error("writeResult into a file: no error")
	}
}

// testResults is a -results directory at dir, opened as run opens it.
func testResults(tb testing.TB, dir string) *os.Root {
	tb.Helper()
	root, err := openResults(dir)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { root.Close() })
	return root
}

// BenchmarkWriteResult is what host-example spends on each task's
// result.json as the task ends (taskRun.taskEnded): its directory made
// and the file written whole.
func BenchmarkWriteResult(b *testing.B) {
	root := testResults(b, filepath.Join(b.TempDir(), "results"))
	code := 0
	now := time.Now()
	r := engine.TaskResult{ID: "d00001", State: worker.StateSucceeded, ExitCode: &code, Started: now, Ended: now,
		Attempts: []engine.Attempt{{Worker: "mem-1", Provisioner: "mem", JobID: "1001", Hostname: "node", State: worker.StateSucceeded, Started: now, Ended: now}}}
	b.ReportAllocs()
	cpu0 := processCPU(b)
	for i := range b.N {
		r.ID = fmt.Sprintf("d%06d", i)
		if err := writeResult(root, r.ID, r, ""); err != nil {
			b.Fatal(err)
		}
	}
	// The machine is shared: its CPU time says more than the clock.
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
}

// processCPU is this process's user and system time so far.
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestReadTasksAfter: "after" and inputs from other tasks' outputs come
// back in an order each task follows those it runs after (the file's
// order otherwise), as Submit takes them, each with its line; a cycle
// through other tasks is refused at the line where it closes, naming it.
func TestReadTasksAfter(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "tasks.jsonl")
	lines := `{"id": "reduce", "command": ["cat", "c1", "c2"], "inputs": {"c1": {"task": "map-1", "path": "out/counts.txt"}, "c2": {"task": "map-2", "path": "counts.txt"}}}
{"id": "map-1", "command": ["true"], "outputs": ["out/"]}
{"id": "report", "command": ["true"], "after": ["reduce"]}
{"id": "map-2", "command": ["true"], "outputs": ["counts.txt"], "after": ["map-1"]}
`
	os.WriteFile(file, []byte(lines), 0o644)
	specs, at, err := readTaskLines(file, testResults(t, filepath.Join(dir, "results")))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for i, s := range specs {
		got = append(got, fmt.Sprintf("%s:%d", s.ID, at[i]))
	}
	if want := []string{"map-1:2", "map-2:4", "reduce:1", "report:3"}; !slices.Equal(got, want) {
		t.Errorf("order %v; want %v", got, want)
	}
	r := specs[2]
	if len(r.Inputs) != 2 || (r.Inputs[0].Name != "c1" || r.Inputs[0].FromTask != "map-1" || r.Inputs[0].Path != "out/counts.txt") || r.Inputs[1].FromTask != "map-2" {
		t.Errorf("reduce's inputs %+v", r.Inputs)
	}

	cycle := `{"id": "a", "command": ["true"], "after": ["c"]}
{"id": "b", "command": ["true"], "after": ["a"]}
{"id": "c", "command": ["true"], "inputs": {"x": {"task": "b", "path": "o"}}, "outputs": ["o"]}
`
	cycle = strings.Replace(cycle, `"after": ["a"]}`, `"after": ["a"], "outputs": ["o"]}`, 1)
	os.WriteFile(file, []byte(cycle), 0o644)
	if _, _, err := readTaskLines(file, testResults(t, filepath.Join(dir, "results2"))); err == nil || !strings.Contains(err.Error(), file+`:1: task "a" runs after itself: a -> c -> b -> a`) {
		t.Errorf("a cycle: %v; want it named at line 1", err)
	}
}
