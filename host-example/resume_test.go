package main

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

// TestSpecDigest: a task's digest changes with what it does (its id,
// command, env, need, timeout, outputs, an input's name, an input
// file's content, an input's task or path) and not with what it does
// not (its attempts, its after, where an input file with the same bytes
// lies, the order its inputs and env are given in, how the file spells
// its timeout).
func TestSpecDigest(t *testing.T) {
	dir := t.TempDir()
	in1, in2, same := filepath.Join(dir, "in1"), filepath.Join(dir, "in2"), filepath.Join(dir, "same-as-in1")
	os.WriteFile(in1, []byte("one"), 0o644)
	os.WriteFile(in2, []byte("two"), 0o644)
	os.WriteFile(same, []byte("one"), 0o644)
	base := func() engine.TaskSpec {
		return engine.TaskSpec{
			ID:      "t",
			Need:    shared.Need{CPUs: 1, GPUs: 0, RAMMB: 100, Label: "x"},
			Command: []string{"sh", "-c", "cat a b > out/c"},
			Env:     map[string]string{"K": "v", "L": "w"},
			Inputs:  []engine.Input{{Name: "a", Path: in1}, {Name: "b", FromTask: "m", Path: "out/c"}},
			Outputs: []string{"out"},
			Timeout: time.Minute,
			Retries: 2,
		}
	}
	digest := func(s engine.TaskSpec) [32]byte {
		t.Helper()
		d, err := specDigest(s, fileSums{})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	want := digest(base())
	for name, change := range map[string]func(*engine.TaskSpec){
		"id":           func(s *engine.TaskSpec) { s.ID = "u" },
		"command":      func(s *engine.TaskSpec) { s.Command = []string{"sh", "-c", "cat a b >out/c"} },
		"an argument":  func(s *engine.TaskSpec) { s.Command = []string{"sh", "-c cat a b > out/c"} },
		"env value":    func(s *engine.TaskSpec) { s.Env = map[string]string{"K": "v", "L": "W"} },
		"env added":    func(s *engine.TaskSpec) { s.Env = map[string]string{"K": "v", "L": "w", "M": ""} },
		"env gone":     func(s *engine.TaskSpec) { s.Env = nil },
		"cpus":         func(s *engine.TaskSpec) { s.Need.CPUs = 2 },
		"gpus":         func(s *engine.TaskSpec) { s.Need.GPUs = 1 },
		"ram_mb":       func(s *engine.TaskSpec) { s.Need.RAMMB = 101 },
		"label":        func(s *engine.TaskSpec) { s.Need.Label = "y" },
		"timeout":      func(s *engine.TaskSpec) { s.Timeout = time.Minute + time.Second },
		"outputs":      func(s *engine.TaskSpec) { s.Outputs = []string{"out", "log"} },
		"input name":   func(s *engine.TaskSpec) { s.Inputs[0].Name = "a2" },
		"input file":   func(s *engine.TaskSpec) { s.Inputs[0].Path = in2 },
		"input's task": func(s *engine.TaskSpec) { s.Inputs[1].FromTask = "n" },
		"input's path": func(s *engine.TaskSpec) { s.Inputs[1].Path = "out/d" },
		"input gone":   func(s *engine.TaskSpec) { s.Inputs = s.Inputs[:1] },
		"input data":   func(s *engine.TaskSpec) { s.Inputs[0] = engine.Input{Name: "a", Data: []byte("two")} },
	} {
		s := base()
		change(&s)
		if digest(s) == want {
			t.Errorf("%s changed: the digest did not", name)
		}
	}
	for name, change := range map[string]func(*engine.TaskSpec){
		"attempts":           func(s *engine.TaskSpec) { s.Retries = 0 },
		"after":              func(s *engine.TaskSpec) { s.After = []string{"z"} },
		"input file moved":   func(s *engine.TaskSpec) { s.Inputs[0].Path = same },
		"inputs' order":      func(s *engine.TaskSpec) { s.Inputs[0], s.Inputs[1] = s.Inputs[1], s.Inputs[0] },
		"input data, same":   func(s *engine.TaskSpec) { s.Inputs[0] = engine.Input{Name: "a", Data: []byte("one")} },
		"env given in order": func(s *engine.TaskSpec) { s.Env = map[string]string{"L": "w", "K": "v"} },
	} {
		s := base()
		change(&s)
		if digest(s) != want {
			t.Errorf("%s changed: so did the digest", name)
		}
	}
	// The content is read: the same path with other bytes is another
	// task.
	os.WriteFile(in1, []byte("ONE"), 0o644)
	if digest(base()) == want {
		t.Error("the input file's bytes changed: the digest did not")
	}
	os.WriteFile(in1, []byte("one"), 0o644)
	// Two spellings of one line are one task: "60s" and 60, an empty
	// env and none, "out/" and "out".
	a, err := parseTaskLine([]byte(`{"id": "t", "command": ["true"], "timeout": "60s", "env": {}, "outputs": ["out/"]}`), dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := parseTaskLine([]byte(`{"outputs": ["out"], "timeout": 60, "command": ["true"], "id": "t", "attempts": 1}`), dir)
	if err != nil {
		t.Fatal(err)
	}
	if digest(a) != digest(b) {
		t.Error("two spellings of one task have two digests")
	}
	if _, err := specDigest(engine.TaskSpec{ID: "t", Command: []string{"true"}, Inputs: []engine.Input{{Name: "a", Path: filepath.Join(dir, "gone")}}}, fileSums{}); err == nil || !strings.Contains(err.Error(), `input "a"`) {
		t.Errorf("an input that is gone: %v; want an error naming it", err)
	}
}

// resumeFixture is a results directory with earlier results, and the
// tasks file's specs and digests they are checked against.
type resumeFixture struct {
	t       *testing.T
	results *os.Root
	specs   []engine.TaskSpec
	digests map[string][32]byte
}

// task adds spec; with state, an earlier result for it: state, its
// outputs (name to bytes) written under outputs/ and listed, and its
// digest in result.json (as spec says: "" none, "right" the spec's,
// "wrong" another's).
func (f *resumeFixture) task(spec engine.TaskSpec, state engine.TaskState, outputs map[string]string, digest string) {
	f.t.Helper()
	d, err := specDigest(spec, fileSums{})
	if err != nil {
		f.t.Fatal(err)
	}
	f.specs = append(f.specs, spec)
	f.digests[spec.ID] = d
	if state == "" {
		return
	}
	r := engine.TaskResult{ID: spec.ID, State: state}
	for name, body := range outputs {
		p := filepath.Join(f.results.Name(), spec.ID, "outputs", name)
		os.MkdirAll(filepath.Dir(p), 0o700)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			f.t.Fatal(err)
		}
		sum := sha256.Sum256([]byte(body))
		r.Outputs = append(r.Outputs, worker.File{Name: name, Size: int64(len(body)), SHA256: hex.EncodeToString(sum[:])})
	}
	spec256 := ""
	switch digest {
	case "right":
		spec256 = hex.EncodeToString(d[:])
	case "wrong":
		spec256 = strings.Repeat("0", 64)
	}
	if err := writeResult(f.results, spec.ID, r, spec256); err != nil {
		f.t.Fatal(err)
	}
}

// plan is planResume over the fixture's tasks.
func (f *resumeFixture) plan() *resumePlan {
	f.t.Helper()
	lines := make([]int, len(f.specs))
	digests := make([][32]byte, len(f.specs))
	for i, s := range f.specs {
		lines[i], digests[i] = i+1, f.digests[s.ID]
	}
	p, err := planResume(f.results, f.specs, lines, digests)
	if err != nil {
		f.t.Fatal(err)
	}
	return p
}

// TestPlanResume: a task is kept when its result.json says succeeded
// with its digest, its outputs are as brought back, and every task it
// runs after is kept; a task after a kept one runs with the kept one
// out of its after and its output as a file under -results; every other
// task runs, and those with an earlier directory are listed to be moved
// aside (an empty one is not).
func TestPlanResume(t *testing.T) {
	f := &resumeFixture{t: t, results: testResults(t, filepath.Join(t.TempDir(), "results")), digests: map[string][32]byte{}}
	cmd := []string{"true"}
	ok := worker.StateSucceeded
	f.task(engine.TaskSpec{ID: "a", Command: cmd, Outputs: []string{"out"}}, ok, map[string]string{"out/c": "a's"}, "right")
	f.task(engine.TaskSpec{ID: "b", Command: cmd, After: []string{"a"}}, ok, nil, "right")
	f.task(engine.TaskSpec{ID: "failed", Command: cmd}, worker.StateFailed, nil, "right")
	f.task(engine.TaskSpec{ID: "changed", Command: cmd, Outputs: []string{"o"}}, ok, map[string]string{"o": "x"}, "wrong")
	f.task(engine.TaskSpec{ID: "older", Command: cmd}, ok, nil, "")
	f.task(engine.TaskSpec{ID: "deleted", Command: cmd, Outputs: []string{"o"}}, ok, map[string]string{"o": "x"}, "right")
	os.Remove(filepath.Join(f.results.Name(), "deleted", "outputs", "o"))
	f.task(engine.TaskSpec{ID: "edited", Command: cmd, Outputs: []string{"o"}}, ok, map[string]string{"o": "x"}, "right")
	os.WriteFile(filepath.Join(f.results.Name(), "edited", "outputs", "o"), []byte("y"), 0o600)
	f.task(engine.TaskSpec{ID: "after-changed", Command: cmd, After: []string{"a", "changed"}}, ok, nil, "right")
	// from-a takes a's output, and runs after b; both are kept, but its
	// own result did not succeed.
	f.task(engine.TaskSpec{ID: "from-a", Command: cmd, After: []string{"b"}, Inputs: []engine.Input{{Name: "x", FromTask: "a", Path: "out/c"}}}, worker.StateFailed, nil, "right")
	f.task(engine.TaskSpec{ID: "from-changed", Command: cmd, Inputs: []engine.Input{{Name: "x", FromTask: "changed", Path: "o"}, {Name: "y", FromTask: "a", Path: "out/c"}}}, ok, nil, "right")
	// The result of a task after from-a, which runs again, is no
	// longer trusted.
	f.task(engine.TaskSpec{ID: "after-rerun", Command: cmd, After: []string{"from-a"}}, ok, nil, "right")
	f.task(engine.TaskSpec{ID: "new", Command: cmd}, "", nil, "")
	f.task(engine.TaskSpec{ID: "empty", Command: cmd}, "", nil, "")
	os.Mkdir(filepath.Join(f.results.Name(), "empty"), 0o700)

	p := f.plan()
	var run []string
	for _, s := range p.run {
		run = append(run, s.ID)
	}
	if want := []string{"failed", "changed", "older", "deleted", "edited", "after-changed", "from-a", "from-changed", "after-rerun", "new", "empty"}; !slices.Equal(run, want) {
		t.Errorf("run %v; want %v", run, want)
	}
	if p.kept != 2 {
		t.Errorf("kept %d; want 2 (a, b)", p.kept)
	}
	if want := []string{"failed", "changed", "older", "deleted", "edited", "after-changed", "from-a", "from-changed", "after-rerun"}; !slices.Equal(p.aside, want) {
		t.Errorf("aside %v; want %v", p.aside, want)
	}
	for id, want := range map[string]string{
		"failed":        "it ended failed",
		"changed":       "it changed since",
		"older":         "written before -resume was",
		"deleted":       `its output "o" is gone`,
		"edited":        `its output "o" changed since it was brought back`,
		"after-changed": "it runs after task changed, which runs again",
		"after-rerun":   "it runs after task from-a, which runs again",
	} {
		if !strings.Contains(p.why[id], want) {
			t.Errorf("%s runs because %q; want %q", id, p.why[id], want)
		}
	}
	if got, want := p.resumeLine(), "resume: 2 task(s) kept from an earlier run (succeeded, unchanged), 11 to run (2 new, 2 that did not succeed, 2 changed, 2 with an output missing or changed, 3 after a task that runs again)"; got != want {
		t.Errorf("resume line\n%s\nwant\n%s", got, want)
	}
	byID := map[string]engine.TaskSpec{}
	for _, s := range p.run {
		byID[s.ID] = s
	}
	abs, _ := filepath.Abs(f.results.Name())
	aOut := filepath.Join(abs, "a", "outputs", "out", "c")
	if s := byID["from-a"]; len(s.After) != 0 || len(s.Inputs) != 1 || !sameInput(s.Inputs[0], engine.Input{Name: "x", Path: aOut}) {
		t.Errorf("from-a: after %v, inputs %+v; want no after, and x from %s", s.After, s.Inputs, aOut)
	}
	if s := byID["after-changed"]; !slices.Equal(s.After, []string{"changed"}) {
		t.Errorf("after-changed runs after %v; want [changed]", s.After)
	}
	if s := byID["from-changed"]; len(s.Inputs) != 2 || s.Inputs[0].FromTask != "changed" || !sameInput(s.Inputs[1], engine.Input{Name: "y", Path: aOut}) {
		t.Errorf("from-changed's inputs %+v; want x from task changed, y from %s", s.Inputs, aOut)
	}
	// The file's specs are not changed under it.
	if f.specs[8].ID != "from-a" || f.specs[8].Inputs[0].FromTask != "a" || len(f.specs[8].After) != 1 {
		t.Errorf("the file's from-a changed: %+v", f.specs[8])
	}
	if why, ok := p.why["new"]; ok {
		t.Errorf("new has a why, %q; a task with nothing earlier needs none", why)
	}
	for i, s := range p.run {
		if p.digests[i] != f.digests[s.ID] {
			t.Errorf("%s's digest is not its own", s.ID)
		}
	}
}

// sameInput says a and b name the same input the same way.
func sameInput(a, b engine.Input) bool {
	return a.Name == b.Name && a.Path == b.Path && a.FromTask == b.FromTask && string(a.Data) == string(b.Data) && (a.Data == nil) == (b.Data == nil)
}

// TestMoveAside: the directories of tasks that run again go to
// .earlier/STAMP/ID/ under -results, whole; a second move in the same
// second goes to STAMP-2; nothing is deleted.
func TestMoveAside(t *testing.T) {
	results := testResults(t, filepath.Join(t.TempDir(), "results"))
	for _, id := range []string{"a", "b", "c"} {
		os.MkdirAll(filepath.Join(results.Name(), id, "outputs"), 0o700)
		os.WriteFile(filepath.Join(results.Name(), id, "stdout"), []byte(id), 0o600)
	}
	now := time.Date(2026, 3, 1, 12, 0, 5, 0, time.Local)
	dir, err := moveAside(results, []string{"a", "b"}, now)
	if want := filepath.Join(results.Name(), ".earlier", "20260301-120005"); err != nil || dir != want {
		t.Fatalf("moveAside: %q, %v; want %s", dir, err, want)
	}
	os.MkdirAll(filepath.Join(results.Name(), "a"), 0o700)
	dir2, err := moveAside(results, []string{"a", "c"}, now)
	if want := filepath.Join(results.Name(), ".earlier", "20260301-120005-2"); err != nil || dir2 != want {
		t.Fatalf("moveAside again: %q, %v; want %s", dir2, err, want)
	}
	if got, want := listTree(t, results.Name()), "/.earlier /.earlier/20260301-120005 /.earlier/20260301-120005/a /.earlier/20260301-120005/a/outputs /.earlier/20260301-120005/a/stdout /.earlier/20260301-120005/b /.earlier/20260301-120005/b/outputs /.earlier/20260301-120005/b/stdout /.earlier/20260301-120005-2 /.earlier/20260301-120005-2/a /.earlier/20260301-120005-2/c /.earlier/20260301-120005-2/c/outputs /.earlier/20260301-120005-2/c/stdout"; got != want {
		t.Errorf("results hold\n%s\nwant\n%s", got, want)
	}
	if dir, err := moveAside(results, nil, now); dir != "" || err != nil {
		t.Errorf("nothing to move: %q, %v", dir, err)
	}
}

// TestResumeSummary: the summary counts the kept tasks with those run,
// and says all is well when every task run succeeded.
func TestResumeSummary(t *testing.T) {
	results := testResults(t, filepath.Join(t.TempDir(), "results"))
	run := newTaskRun(results, newStory(&strings.Builder{}))
	run.total, run.kept = 2, 3
	run.digests["a"] = sha256.Sum256([]byte("a"))
	code := 0
	for _, id := range []string{"a", "b"} {
		run.taskEnded(engine.TaskResult{ID: id, State: worker.StateSucceeded, ExitCode: &code})
	}
	line, ok := run.summary()
	if want := "summary: 5 task(s): 3 kept from an earlier run, 2 succeeded; results in "; !ok || !strings.HasPrefix(line, want) {
		t.Errorf("summary %q, ok %v; want %q..., true", line, ok, want)
	}
	// a's result.json carries its digest; b, submitted with none, has
	// none (and is never kept).
	sum := sha256.Sum256([]byte("a"))
	for id, want := range map[string]string{"a": hex.EncodeToString(sum[:]), "b": ""} {
		reason, _ := keptResult(results, id, sum)
		b, _ := os.ReadFile(filepath.Join(results.Name(), id, "result.json"))
		if has := strings.Contains(string(b), `"spec_sha256"`); has != (want != "") || (want != "" && !strings.Contains(string(b), want)) {
			t.Errorf("%s's result.json: %s; want spec_sha256 %q", id, b, want)
		}
		if (reason == reasonKept) != (id == "a") {
			t.Errorf("%s kept: %v", id, reason == reasonKept)
		}
	}
	if len(run.digests) != 0 {
		t.Errorf("digests still held after their results were written: %v", run.digests)
	}
}
