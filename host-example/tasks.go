package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/internal/needspec"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

// taskLine is one line of a -tasks file, as an operator writes it:
//
//	{"id": "a1", "cpus": 2, "command": ["sha256sum", "in.bin"],
//	 "inputs": {"in.bin": "/data/a1.bin"}, "outputs": ["out/"],
//	 "timeout": "10m", "attempts": 2}
//	{"id": "r", "command": ["sort", "a1.txt"], "after": ["a0"],
//	 "inputs": {"a1.txt": {"task": "a1", "path": "out/sum.txt"}}}
//
// Unknown fields are refused, so a misspelt one is not silently dropped.
type taskLine struct {
	ID      string            `json:"id"`
	CPUs    *int              `json:"cpus"`
	GPUs    int               `json:"gpus"`
	RAMMB   int64             `json:"ram_mb"`
	Label   string            `json:"label"`
	Command []string          `json:"command"`
	Env     map[string]string `json:"env"`
	// Inputs maps a name in the task's directory to a file on this
	// machine, or to an output of another task of the file.
	Inputs   map[string]inputValue `json:"inputs"`
	Outputs  []string              `json:"outputs"`
	Timeout  jsonDuration          `json:"timeout"`
	Attempts *int                  `json:"attempts"`
	// After names tasks of the file this one runs after.
	After []string `json:"after"`
}

// inputValue is an input's source: a path on this machine ("data.bin"),
// or another task's output ({"task": "map-1", "path": "counts.txt"}).
type inputValue struct {
	Path string
	Task string
}

func (v *inputValue) UnmarshalJSON(b []byte) error {
	if err := json.Unmarshal(b, &v.Path); err == nil {
		return nil
	}
	var o struct {
		Task string `json:"task"`
		Path string `json:"path"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil || o.Task == "" || o.Path == "" {
		return errors.New(`an input is a path on this machine ("data/in.csv") or another task's output ({"task": "map-1", "path": "counts.txt"})`)
	}
	v.Task, v.Path = o.Task, o.Path
	return nil
}

// defaultAttempts is how many times a task runs at most when no line
// says: once, and twice more if machines are lost under it. A command
// that fails is never run again.
const defaultAttempts = 3

// jsonDuration is a timeout as a Go duration ("90s", "10m") or a number
// of seconds.
type jsonDuration time.Duration

func (d *jsonDuration) UnmarshalJSON(b []byte) error {
	var secs float64
	if err := json.Unmarshal(b, &secs); err == nil {
		if secs < 0 {
			return errors.New("a negative timeout")
		}
		*d = jsonDuration(secs * float64(time.Second))
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return errors.New(`timeout is a duration ("90s", "10m") or a number of seconds`)
	}
	v, err := time.ParseDuration(s)
	if err != nil || v < 0 {
		return fmt.Errorf(`timeout %q is not a duration ("90s", "10m")`, s)
	}
	*d = jsonDuration(v)
	return nil
}

// taskIDForm is what a task id may be: it names the task's directory
// under -results, so nothing a path could make more of.
var taskIDForm = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`)

// maxTaskLine bounds one line of a tasks file.
const maxTaskLine = 1 << 20

// readTasks reads a -tasks file: JSON lines, one task a line (blank
// lines and lines starting with # skipped). It checks the whole file
// before anything is asked for, and an error names the file and the
// line. Inputs are resolved against the file's directory when relative,
// and must exist and be regular files; results is the -results
// directory, opened (openResults), where each task's directory will be,
// which must not hold one already.
func readTasks(file string, results *os.Root) ([]engine.TaskSpec, error) {
	specs, _, err := readTaskLines(file, results)
	return specs, err
}

// readTaskLines is readTasks with the line each task is on.
func readTaskLines(file string, results *os.Root) ([]engine.TaskSpec, []int, error) {
	return readTaskFile(file, results, false)
}

// readTaskFile is readTaskLines; with resume, a task's directory that
// holds an earlier run's results is not refused: planResume decides
// what becomes of it.
func readTaskFile(file string, results *os.Root, resume bool) ([]engine.TaskSpec, []int, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, nil, fmt.Errorf("-tasks: %w", err)
	}
	defer f.Close()
	if resume {
		results = nil
	}
	return parseTaskLines(f, file, filepath.Dir(file), results)
}

// parseTaskLines reads a tasks file from r (name, for errors; base, for
// relative inputs), as readTasks says, with the line each task is on;
// with results nil, the tasks' directories are not looked at.
func parseTaskLines(r io.Reader, name, base string, results *os.Root) ([]engine.TaskSpec, []int, error) {
	var specs []engine.TaskSpec
	var lines []int
	seen := map[string]int{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxTaskLine)
	var errs []error
	line := 0
	for sc.Scan() {
		line++
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 || text[0] == '#' {
			continue
		}
		spec, err := parseTaskLine(text, base)
		if err == nil {
			if first, dup := seen[spec.ID]; dup {
				err = fmt.Errorf("task %q again (first on line %d): ids must be unique", spec.ID, first)
			} else {
				seen[spec.ID] = line
				err = resultsFree(results, spec.ID)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s:%d: %w", name, line, err))
			if len(errs) == 20 {
				errs = append(errs, errors.New("(more errors not shown)"))
				break
			}
			continue
		}
		specs = append(specs, spec)
		lines = append(lines, line)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			err = fmt.Errorf("a line longer than %d bytes", maxTaskLine)
		}
		return nil, nil, fmt.Errorf("%s:%d: %w", name, line+1, err)
	}
	if len(errs) > 0 {
		return nil, nil, errors.Join(errs...)
	}
	if len(specs) == 0 {
		return nil, nil, fmt.Errorf("%s: no tasks (one JSON object a line)", name)
	}
	return inOrder(specs, lines, name)
}

// inOrder checks the tasks' dependencies (after, and inputs from other
// tasks) against the file: each names a task of the file, and an output
// that task lists, and no task runs after itself through others. It
// returns the tasks in an order each comes after those it runs after
// (as Submit takes them), otherwise the file's; an error says where, at
// its line.
func inOrder(specs []engine.TaskSpec, lines []int, name string) ([]engine.TaskSpec, []int, error) {
	deps, err := dependencies(specs, lines, name)
	if err != nil {
		return nil, nil, err
	}
	order, err := placeAfter(deps, func(i int, ring []int) error {
		var ids []string
		for _, j := range ring {
			ids = append(ids, specs[j].ID)
		}
		return fmt.Errorf("%s:%d: task %q runs after itself: %s", name, lines[i], specs[i].ID, strings.Join(ids, " -> "))
	})
	if err != nil {
		return nil, nil, err
	}
	outSpecs, outLines := make([]engine.TaskSpec, len(specs)), make([]int, len(specs))
	for k, i := range order {
		outSpecs[k], outLines[k] = specs[i], lines[i]
	}
	return outSpecs, outLines, nil
}

// dependencies is, for each task, the tasks of the file it runs after,
// by index; an error names, at its line, each that names no task of the
// file, or an output none of that task's outputs covers.
func dependencies(specs []engine.TaskSpec, lines []int, name string) ([][]int, error) {
	at := make(map[string]int, len(specs))
	for i, s := range specs {
		at[s.ID] = i
	}
	deps := make([][]int, len(specs))
	var errs []error
	for i, s := range specs {
		bad := func(format string, a ...any) {
			errs = append(errs, fmt.Errorf("%s:%d: task %q: %s", name, lines[i], s.ID, fmt.Sprintf(format, a...)))
		}
		for _, a := range s.After {
			if j, ok := at[a]; ok {
				deps[i] = append(deps[i], j)
			} else {
				bad("runs after %q, which no line of the file names", a)
			}
		}
		for _, in := range s.Inputs {
			if in.FromTask == "" {
				continue
			}
			j, ok := at[in.FromTask]
			if !ok {
				bad("input %q is from task %q, which no line of the file names", in.Name, in.FromTask)
				continue
			}
			if !slices.ContainsFunc(specs[j].Outputs, func(o string) bool { return in.Path == o || strings.HasPrefix(in.Path, o+"/") }) {
				bad("input %q is task %q's %q, which is none of its outputs (%s)", in.Name, in.FromTask, in.Path, strings.Join(specs[j].Outputs, ", "))
				continue
			}
			deps[i] = append(deps[i], j)
		}
	}
	return deps, errors.Join(errs...)
}

// placeAfter orders the tasks so that each follows those it runs after
// (deps, by index), depth first in their own order otherwise. A task met
// again while its own dependencies are being placed closes a cycle:
// cycle's error is returned, given the task and the ring from it back
// to it.
func placeAfter(deps [][]int, cycle func(i int, ring []int) error) ([]int, error) {
	const (
		unseen = iota
		placing
		placed
	)
	state := make([]int, len(deps))
	var order, path []int
	var visit func(i int) error
	visit = func(i int) error {
		switch state[i] {
		case placed:
			return nil
		case placing:
			return cycle(i, append(slices.Clone(path[slices.Index(path, i):]), i))
		}
		state[i] = placing
		path = append(path, i)
		for _, j := range deps[i] {
			if err := visit(j); err != nil {
				return err
			}
		}
		path = path[:len(path)-1]
		state[i] = placed
		order = append(order, i)
		return nil
	}
	for i := range deps {
		if err := visit(i); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// maxUnheld bounds the tasks and needs unheld lists, as parseTaskLines
// bounds its errors.
const maxUnheld = 20

// unheld checks, once the provisioners have said their shapes, that a
// machine on offer holds every task of the file (name, each task on its
// line of lines) and lasts every -need's work: an error names each that
// none holds, with the longest time and the largest shape there are,
// before anything is asked for. A -need larger than every profile is
// not refused: it waits no_fit and asks nothing, as a need that keeps an
// engine running does.
func unheld(eng *engine.Engine, needs needspec.List, tasks []engine.TaskSpec, name string, lines []int) error {
	var errs []error
	add := func(err error) bool {
		errs = append(errs, err)
		if len(errs) == maxUnheld {
			errs = append(errs, errors.New("(more not shown)"))
			return false
		}
		return true
	}
	for _, n := range needs {
		var fe *engine.FitError
		if err := eng.HoldsWork(n.Need, n.Work); errors.As(err, &fe) && fe.TooLong {
			one := needspec.List{n}
			if !add(fmt.Errorf("-need %s: %w", one.String(), err)) {
				return errors.Join(errs...)
			}
		}
	}
	for i, t := range tasks {
		if err := eng.Holds(t.Need, t.Timeout); err != nil {
			if !add(fmt.Errorf("%s:%d: task %q: %w", name, lines[i], t.ID, err)) {
				break
			}
		}
	}
	return errors.Join(errs...)
}

func parseTaskLine(text []byte, base string) (engine.TaskSpec, error) {
	var tl taskLine
	dec := json.NewDecoder(bytes.NewReader(text))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&tl); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return engine.TaskSpec{}, fmt.Errorf("not a JSON object: %v (col %d)", se, se.Offset)
		}
		// "json: unknown field \"cmd\"" and type errors say what; an
		// unknown field near a known one says which was meant.
		if m := unknownFieldRe.FindStringSubmatch(err.Error()); m != nil {
			if near := nearest(m[1], jsonFields(&taskLine{})); near != "" {
				return engine.TaskSpec{}, fmt.Errorf("unknown field %q; did you mean %q?", m[1], near)
			}
		}
		return engine.TaskSpec{}, errors.New(strings.TrimPrefix(err.Error(), "json: "))
	}
	if dec.More() {
		return engine.TaskSpec{}, errors.New("more than one JSON value on the line; one task a line")
	}
	switch {
	case tl.ID == "":
		return engine.TaskSpec{}, errors.New(`no "id"`)
	case !taskIDForm.MatchString(tl.ID):
		return engine.TaskSpec{}, fmt.Errorf("id %q: use letters, digits, '.', '_' and '-' (at most 128, not starting with '.' or '-'): it names the task's directory", tl.ID)
	case len(tl.Command) == 0 || tl.Command[0] == "":
		return engine.TaskSpec{}, fmt.Errorf(`task %q: "command" is empty; give the argv, such as ["sha256sum", "in.bin"] (["sh", "-c", "..."] for a shell)`, tl.ID)
	}
	spec := engine.TaskSpec{
		ID:      tl.ID,
		Need:    shared.Need{CPUs: 1, GPUs: tl.GPUs, RAMMB: tl.RAMMB, Label: tl.Label},
		Command: tl.Command,
		Env:     tl.Env,
		Timeout: time.Duration(tl.Timeout),
		Retries: defaultAttempts - 1,
	}
	if tl.CPUs != nil {
		spec.Need.CPUs = *tl.CPUs
	}
	switch {
	case spec.Need.CPUs < 1:
		return engine.TaskSpec{}, fmt.Errorf("task %q: cpus must be at least 1", tl.ID)
	case tl.GPUs < 0 || tl.RAMMB < 0:
		return engine.TaskSpec{}, fmt.Errorf("task %q: gpus and ram_mb may not be negative", tl.ID)
	}
	if tl.Attempts != nil {
		if *tl.Attempts < 1 {
			return engine.TaskSpec{}, fmt.Errorf("task %q: attempts must be at least 1 (how many times it may run when machines are lost under it)", tl.ID)
		}
		spec.Retries = *tl.Attempts - 1
	}
	for k := range tl.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return engine.TaskSpec{}, fmt.Errorf("task %q: env name %q is not a variable name", tl.ID, k)
		}
		if k == shared.WorkerTokenEnv {
			return engine.TaskSpec{}, fmt.Errorf("task %q: env may not set %s, the worker's credential", tl.ID, k)
		}
	}
	for _, a := range tl.After {
		if !taskIDForm.MatchString(a) {
			return engine.TaskSpec{}, fmt.Errorf("task %q: after names %q, which is no task id", tl.ID, a)
		}
	}
	spec.After = slices.Clone(tl.After)
	var err error
	if spec.Inputs, err = taskInputs(tl.Inputs, base); err != nil {
		return engine.TaskSpec{}, fmt.Errorf("task %q: %w", tl.ID, err)
	}
	if spec.Outputs, err = taskOutputs(tl.Outputs); err != nil {
		return engine.TaskSpec{}, fmt.Errorf("task %q: %w", tl.ID, err)
	}
	return spec, nil
}

// taskInputs are a line's inputs, name to a path on this machine
// (relative to base) or to another task's output: each name plain and
// inside the task's directory, each path on this machine a regular
// file, each output's path plain.
func taskInputs(inputs map[string]inputValue, base string) ([]engine.Input, error) {
	names := make([]string, 0, len(inputs))
	for n := range inputs {
		names = append(names, n)
	}
	slices.Sort(names)
	var out []engine.Input
	for _, n := range names {
		if err := taskRelative(n); err != nil {
			return nil, fmt.Errorf("input %q: %w", n, err)
		}
		v := inputs[n]
		if v.Task != "" {
			if !taskIDForm.MatchString(v.Task) {
				return nil, fmt.Errorf("input %q: %q is no task id", n, v.Task)
			}
			o := strings.TrimSuffix(v.Path, "/")
			if err := taskRelative(o); err != nil {
				return nil, fmt.Errorf("input %q from task %q: path %q: %w", n, v.Task, v.Path, err)
			}
			out = append(out, engine.Input{Name: n, FromTask: v.Task, Path: o})
			continue
		}
		p := v.Path
		if p == "" {
			return nil, fmt.Errorf("input %q names no file", n)
		}
		if !filepath.IsAbs(p) {
			p = filepath.Join(base, p)
		}
		st, err := os.Stat(p)
		switch {
		case err != nil:
			return nil, fmt.Errorf("input %q: %w", n, err)
		case !st.Mode().IsRegular():
			return nil, fmt.Errorf("input %q: %s is not a regular file", n, p)
		}
		out = append(out, engine.Input{Name: n, Path: p})
	}
	return out, nil
}

// taskOutputs are a line's outputs in their plain form: "out/" says
// out is a directory, as people write it, and the worker brings a
// directory back file by file either way.
func taskOutputs(outputs []string) ([]string, error) {
	out := make([]string, 0, len(outputs))
	for _, o := range outputs {
		o = strings.TrimSuffix(o, "/")
		if err := taskRelative(o); err != nil {
			return nil, fmt.Errorf("output %q: %w", o, err)
		}
		out = append(out, o)
	}
	return out, nil
}

// taskRelative checks a name in a task's directory: relative, with no
// ".." element, as written (not cleaned into something else).
func taskRelative(n string) error {
	switch {
	case n == "" || n == ".":
		return errors.New("an empty name")
	case strings.HasPrefix(n, "/"):
		return errors.New("absolute; names are relative to the task's directory")
	case strings.ContainsRune(n, 0) || strings.Contains(n, `\`):
		return errors.New("a NUL or a backslash in the name")
	case slices.Contains(strings.Split(n, "/"), ".."):
		return errors.New(`a ".." element; names stay inside the task's directory`)
	case path.Clean(n) != n:
		return fmt.Errorf("not in its plain form (%q)", path.Clean(n))
	}
	return nil
}

// openResults makes the -results directory, or takes the one that is
// there only when it is the engine's user's alone (engine.OpenOwnDir:
// owned by this uid, not writable by group or others), and opens it as
// a root that every result is written through: a symbolic link under
// it does not lead out of it. It runs at start, before the
// configuration is read and any machine is asked for; an error says
// what is wrong and the fix.
func openResults(dir string) (*os.Root, error) {
	root, err := engine.OpenOwnDir(dir)
	if err != nil {
		return nil, fmt.Errorf("-results: %w", err)
	}
	return root, nil
}

// resultsFree checks that the task's directory under results holds no
// earlier run's result, which this run would mix with its own.
func resultsFree(results *os.Root, id string) error {
	if results == nil {
		return nil
	}
	dir := filepath.Join(results.Name(), id)
	f, err := results.Open(id)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("task %q: %s: %w; remove it or choose another -results", id, dir, err)
	}
	defer f.Close()
	entries, err := f.ReadDir(1)
	switch {
	case err != nil && !errors.Is(err, io.EOF):
		return fmt.Errorf("task %q: %s: %w", id, dir, err)
	case len(entries) > 0:
		return fmt.Errorf("task %q: %s holds an earlier run's results; give -resume to keep what succeeded and run the rest, or remove it, or choose another -results", id, dir)
	}
	return nil
}

// taskRun is run's side of the tasks of a -tasks file: each task's
// result.json under results as it ends, a line per task, and the
// summary.
type taskRun struct {
	// results is the -results directory, dir its name.
	results *os.Root
	story   *story
	// mu guards every field below.
	mu sync.Mutex
	// total counts the tasks submitted; kept those kept from an earlier
	// run (-resume), which are not.
	total, kept int
	ended       map[string]engine.TaskResult
	// digests are the submitted tasks' digests (specDigest), written
	// into their result.json; each is forgotten once written.
	digests map[string][32]byte
	// lost counts attempts whose machine was lost under them.
	lost int
	// failedWrites are result.json files that could not be written.
	failedWrites []error
}

func newTaskRun(results *os.Root, story *story) *taskRun {
	return &taskRun{results: results, story: story, ended: map[string]engine.TaskResult{}, digests: map[string][32]byte{}}
}

// taskEnded is the engine's TaskEnded hook: the task's result.json, and
// its line. The task counts as ended (allEnded, the summary) only once
// its result.json is written, so that a run killed at any moment has
// every task it counted as ended on disk, for -resume.
func (t *taskRun) taskEnded(r engine.TaskResult) {
	t.mu.Lock()
	digest, ok := t.digests[r.ID]
	delete(t.digests, r.ID)
	t.mu.Unlock()
	spec := ""
	if ok {
		spec = hex.EncodeToString(digest[:])
	}
	err := writeResult(t.results, r.ID, r, spec)
	t.mu.Lock()
	t.ended[r.ID] = r
	if err != nil {
		t.failedWrites = append(t.failedWrites, err)
	}
	t.mu.Unlock()
	// A task that succeeded is counted in the progress line, and told
	// with -v; one that did not is a person's to know, by its id.
	if r.State == worker.StateSucceeded {
		t.story.detail("%s", endedLine(r))
	} else {
		t.story.say("%s", endedLine(r))
	}
	if err != nil {
		t.story.say("could not keep %s's result: %v", r.ID, err)
	}
}

// taskLost is the engine's TaskLost hook.
func (t *taskRun) taskLost(r engine.TaskResult, again bool) {
	t.mu.Lock()
	t.lost++
	t.mu.Unlock()
	a := lastAttempt(r)
	if again {
		// The attempt's error names its worker and why it was lost
		// ("its worker W is gone: its job 9_0 was cancelled under its
		// task, ...").
		why := a.Error
		if why == "" {
			why = fmt.Sprintf("its machine was lost (worker %s, job %s)", orDash(a.Worker), orDash(a.JobID))
		}
		t.story.say("task %s runs again (attempt %d): %s", r.ID, len(r.Attempts)+1, why)
	}
}

// allEnded reports whether every task submitted has ended.
func (t *taskRun) allEnded() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.ended) >= t.total
}

// summary is the run's last word on its tasks, and whether every one
// succeeded.
func (t *taskRun) summary() (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	counts := map[engine.TaskState]int{}
	for _, r := range t.ended {
		counts[r.State]++
	}
	var parts []string
	if t.kept > 0 {
		parts = append(parts, fmt.Sprintf("%d kept from an earlier run", t.kept))
	}
	for _, s := range []engine.TaskState{worker.StateSucceeded, worker.StateFailed, worker.StateTimedOut, worker.StateCancelled, engine.TaskLostState} {
		if counts[s] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[s], s))
		}
	}
	if n := t.total - len(t.ended); n > 0 {
		parts = append(parts, fmt.Sprintf("%d not ended", n))
	}
	line := fmt.Sprintf("summary: %d task(s): %s", t.total+t.kept, strings.Join(parts, ", "))
	if t.lost > 0 {
		line += fmt.Sprintf("; %d attempt(s) lost with their machines", t.lost)
	}
	var bad []string
	for id, r := range t.ended {
		if r.State != worker.StateSucceeded {
			bad = append(bad, id)
		}
	}
	if len(bad) > 0 {
		slices.Sort(bad)
		more := ""
		if len(bad) > maxNamedInSummary {
			more = fmt.Sprintf(" and %d more", len(bad)-maxNamedInSummary)
			bad = bad[:maxNamedInSummary]
		}
		line += "; not succeeded: " + strings.Join(bad, ", ") + more
	}
	line += "; results in " + t.results.Name()
	ok := counts[worker.StateSucceeded] == t.total && len(t.failedWrites) == 0
	return line, ok
}

// maxNamedInSummary bounds the tasks the summary names; each was told
// on its own line as it ended, and its result.json says the rest.
const maxNamedInSummary = 20

// endedLine is a task's line as it ends.
func endedLine(r engine.TaskResult) string {
	a := lastAttempt(r)
	took := ""
	if !r.Started.IsZero() && !r.Ended.IsZero() {
		took = " after " + r.Ended.Sub(r.Started).Round(time.Millisecond).String()
	}
	where := ""
	if a.Worker != "" {
		where = fmt.Sprintf(" on %s (job %s)", a.Worker, orDash(a.JobID))
	}
	how := ""
	switch {
	case r.ExitCode != nil:
		how = fmt.Sprintf(" (exit %d)", *r.ExitCode)
	case r.Signal != "":
		how = " (" + r.Signal + ")"
	}
	line := fmt.Sprintf("task %s %s%s%s%s", r.ID, r.State, how, took, where)
	if r.Error != "" {
		line += ": " + r.Error
	} else if r.State != worker.StateSucceeded {
		if last := lastLine(r.Stderr); last != "" {
			line += "; stderr: " + last
		}
	}
	return line
}

func lastAttempt(r engine.TaskResult) engine.Attempt {
	if len(r.Attempts) == 0 {
		return engine.Attempt{}
	}
	return r.Attempts[len(r.Attempts)-1]
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// writeResult writes r as id/result.json under results, with spec, the
// task's digest (specDigest, in hex; "" for none), whole or not at all,
// through the root: a symbolic link under it (the task's directory made
// one by someone else) is not followed out of it.
//
// It runs for every task, as it ends, so it makes no system call it can
// do without: the task's directory is made with one mkdir, 0700 as the
// engine makes it (which made it already when the task wrote to a
// stream: the first to make it sets its mode), and the file is
// written under a name of its own, synced, and renamed into place
// (BenchmarkWriteResult): a result.json that is there is whole, even
// after the machine went down, and -resume trusts it.
func writeResult(results *os.Root, id string, r engine.TaskResult, spec string) error {
	if err := results.Mkdir(id, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	b, err := json.MarshalIndent(resultFile{TaskResult: r, SpecSHA256: spec}, "", "  ")
	if err != nil {
		return err
	}
	var suffix [8]byte
	rand.Read(suffix[:])
	tmp := path.Join(id, ".result-"+hex.EncodeToString(suffix[:])+".json")
	f, err := results.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	// Whole by the rename, not by fsync: a killed engine (SIGKILL)
	// leaves the page cache to the kernel, and a result lost with the
	// machine's power is one -resume runs again (its parse or its
	// outputs' digests fail). An fsync a result cost 1.8-2.6 ms here,
	// capping a run near 500 results a second.
	_, werr := f.Write(append(b, '\n'))
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		results.Remove(tmp)
		return err
	}
	if err := results.Rename(tmp, path.Join(id, "result.json")); err != nil {
		results.Remove(tmp)
		return err
	}
	return nil
}
