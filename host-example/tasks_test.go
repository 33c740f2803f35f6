package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
	specs, err := readTasks(file, filepath.Join(dir, "results"))
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
		{"earlier results", `{"id": "old", "command": ["true"]}`, `:2: task "old": ` + filepath.Join(results, "old") + ` holds an earlier run's results`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(dir, "tasks.jsonl")
			os.WriteFile(file, []byte(`{"id": "first", "command": ["true"]}`+"\n"+tc.line+"\n"), 0o644)
			_, err := readTasks(file, results)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v\nwant it to contain %q", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), file+":") {
				t.Errorf("err = %v; want it to start with the file's name", err)
			}
		})
	}
}

func TestRunTasksFlagsGoTogether(t *testing.T) {
	var out, errOut strings.Builder
	if code := runMain([]string{"-config", "x.hcl", "-tasks", "t.jsonl"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "-tasks FILE and -results DIR go together") {
		t.Errorf("exit %d, stderr %q", code, errOut.String())
	}
}
