package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fluksio/provision/internal/termsafe"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

// The task table holds every task submitted (Engine.Submit) from its
// spec to its result: what each attempt's worker is told (the wire
// task), where each input's bytes come from, the attempts, and, while
// an attempt runs, what its worker has sent (the streams' sizes, the
// outputs received, whether it went beyond a limit). The router places
// a task as it places any need (needState.rec points here) and tells
// the table when an attempt begins, reports or is lost; the transfer
// routes (transfer.go) ask it whether an attempt is current and where
// its files go. It owns the tasks' directory (TaskDir/ID: stdout,
// stderr, outputs/) and nothing else on disk: an input's Path is read,
// never written.
//
// What it will not do: keep a task's input Data or Payload beyond the
// caller's own copy (a task holds the caller's slices, and drops them
// when it ends), read an input whole into memory, or keep more than
// keepEnded ended tasks (their directories stay).

// tailBytes is how much of each stream a TaskResult quotes (Stdout,
// Stderr): its last bytes, read from the kept file.
const tailBytes = 4 << 10

// defaultTaskLimits bound what one task moves when Config.TaskLimits
// leaves a bound zero: far above what a test or a demo moves, and far
// below what fills a disk by accident.
var defaultTaskLimits = TaskLimits{Input: 1 << 30, Outputs: 4 << 30, Log: 256 << 20, Files: 10000}

// keepEnded is how many ended tasks the table remembers (Engine.Task
// answers them); the oldest beyond it are forgotten, their directories
// kept. An engine that runs for weeks submits without end.
const keepEnded = 10000

// keptEndedBytes bounds the bytes the ended tasks the table remembers
// hold in words (errors) and output lists: beyond it the oldest are
// forgotten, however few. With keepEnded, it bounds what ended tasks
// cost the engine's memory: about 0.8 KB each besides these, so at most
// about 72 MiB (docs/security.md).
const keptEndedBytes = 64 << 20

// maxErrorText bounds a worker's error (and signal) text as a task keeps
// it; the rest is cut, and the cut said.
const maxErrorText = 4 << 10

// dirBytes is what a directory an output makes counts against
// TaskLimits.Outputs: a block of the engine's disk, though no byte of
// it is the worker's.
const dirBytes = worker.DirBytes

// maxPathLen bounds an input's name or an output's path.
const maxPathLen = 1024

// taskIDRe is what a task's id may be: it names the task's directory
// and a segment of /v1/tasks/ID, so it has no "/" and does not start
// with ".".
var taskIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// The features each kind of task requires, shared by every task of the
// kind: a task holds the slice, not a copy.
var (
	requiresCommand = []string{worker.FeatureCommand}
	requiresPayload = []string{worker.FeaturePayload}
)

// Why Cancel (or Task) could not do what it was asked.
var (
	// ErrNoSuchTask: no task has that id, or it ended long ago and is
	// forgotten (keepEnded).
	ErrNoSuchTask = errors.New("no such task (or it ended long ago and is forgotten)")
	// ErrTaskEnded: the task ended already; nothing is changed.
	ErrTaskEnded = errors.New("the task has ended already")
)

// taskTable is every task the engine holds.
type taskTable struct {
	// limits are Config.TaskLimits with the defaults filled in; fixed
	// at New.
	limits TaskLimits
	now    func() time.Time

	// mu guards root, own, byID, generated, ended and every field of
	// every taskRec and taskRun that is not fixed at Submit. It is held
	// for bookkeeping and for the local file system calls that must not
	// race a new attempt (opening a transfer's file, moving an old
	// attempt's directory aside), never across a request's body, a
	// worker's answer or a hook.
	mu sync.Mutex
	// root is the directory of the tasks' directories; empty until
	// makeRoot. own says it is the engine's to remove at Stop. dirs is
	// root opened (taskfiles.go): every file under it is made through
	// it; nil until makeRoot and after removeRoot.
	root string
	own  bool
	dirs *os.Root
	byID map[string]*taskRec
	// generated counts the ids the engine made ("t-N").
	generated int
	// ended are the ended tasks, oldest first, for forgetting;
	// endedBytes the bytes their words and output lists hold
	// (taskEnd.held), kept under keptEndedBytes.
	ended      []*taskRec
	endedBytes int64
	// attempts names, by attempt id, the task of every attempt of the
	// tasks in byID, so that an attempt id asked for as a task's is
	// answered with the task's (GET /v1/tasks/ID's 404).
	attempts map[string]*taskRec
	// count is how many tasks are in each state, the forgotten ones
	// included; ends counts the tasks ended over time.
	count map[TaskState]int
	ends  endSeries
	// runningCPUs is what the running tasks take of their machines'
	// CPUs (TaskCounts.RunningCPUs), kept with count.
	runningCPUs int
	// dependents are, by task id, the tasks that run after it and have
	// not been released yet (TaskSpec.After). released are those whose
	// last dependency has just succeeded, and skipped the news of those
	// that never run because one ended otherwise: the engine takes both
	// (takeReleased) after each end it tells.
	dependents map[string][]*taskRec
	released   []*taskRec
	skipped    []taskNews
}

// taskRec is one task. Its fields above state are fixed at Submit;
// those that hold what the caller gave (command to sources) are
// dropped, under taskTable.mu, when the task ends. A queued task costs
// what it holds and little more: 100,000 of them are a test's
// (TestTasksQueuedMemory), and its worker's wire task is built only
// when an attempt begins.
type taskRec struct {
	id      string
	retries int
	// need is what it was submitted to run on, for the router when the
	// tasks it runs after have succeeded.
	need shared.Need
	// requires are the features a worker needs to run it, never
	// dropped: the router reads them without the lock.
	requires []string
	command  []string
	// env is Env as "NAME=value" words, sorted: a slice, not a map, for
	// a queued task's sake.
	env     []string
	files   []worker.File
	outputs []string
	timeout time.Duration
	payload []byte
	// sources are where each input's bytes come from, in the order of
	// files: the caller's Path or Data, never a copy; ids are the
	// identities of the Path inputs' files as Submit read them.
	sources []Input
	ids     []fileID

	// Guarded by taskTable.mu.
	state TaskState
	// cancel: Cancel asked for it; the task ends cancelled whatever
	// its attempt comes to.
	cancel   bool
	attempts []Attempt
	// run is the attempt under way; nil while the task waits or after
	// it ended.
	run *taskRun
	// end is how it ended; nil until then.
	end *taskEnd
	// after counts the tasks it runs after that have not ended yet; it
	// is held back from the router until it is zero.
	after int
}

// taskRun is what one attempt's worker has sent. Guarded by
// taskTable.mu.
type taskRun struct {
	// id is the attempt's id ("task-N"), worker its worker's name.
	id, worker string
	streams    [2]streamState
	// outputs are the outputs received, by path; outputBytes their
	// total, reserved the bytes uploads in progress may still write.
	outputs     map[string]worker.File
	outputBytes int64
	reserved    int64
	// inodes counts the files and directories the outputs made, and
	// reservedFiles the files uploads in progress may still add.
	inodes, reservedFiles int64
	// uploads counts the uploads begun, naming their partial files.
	uploads int
	// over says, when the worker sent beyond a limit or the engine
	// refused its transfer for good, why; the task fails with it when
	// its result comes.
	over string
	// sealed is set as the attempt's result is accepted (seal): from
	// then its outputs and streams are final, and an upload still under
	// way is cut (sealedWriter reads it without the lock).
	sealed atomic.Bool
}

// streamState is one stream of an attempt: its size as the engine kept
// it, and whether an append is being written (another is refused 409).
type streamState struct {
	size int64
	busy bool
}

// taskEnd is how a task ended, beside its state.
type taskEnd struct {
	exitCode       *int
	signal, err    string
	outputs        []worker.File
	stdout, stderr int64
	started, ended time.Time
	// held is what its words and output list hold, in bytes, counted
	// against keptEndedBytes.
	held int64
}

// streamIndex is the index in taskRun.streams of a stream's name.
func streamIndex(name string) (int, bool) {
	switch name {
	case worker.StreamStdout:
		return 0, true
	case worker.StreamStderr:
		return 1, true
	}
	return 0, false
}

// streamNames are the streams by index.
var streamNames = [2]string{worker.StreamStdout, worker.StreamStderr}

func newTaskTable(limits TaskLimits, now func() time.Time) *taskTable {
	if limits.Input <= 0 {
		limits.Input = defaultTaskLimits.Input
	}
	if limits.Outputs <= 0 {
		limits.Outputs = defaultTaskLimits.Outputs
	}
	if limits.Log <= 0 {
		limits.Log = defaultTaskLimits.Log
	}
	if limits.Files <= 0 {
		limits.Files = defaultTaskLimits.Files
	}
	if now == nil {
		now = time.Now
	}
	return &taskTable{limits: limits, now: now, byID: map[string]*taskRec{}, attempts: map[string]*taskRec{}, count: map[TaskState]int{},
		dependents: map[string][]*taskRec{}}
}

// -- the directory ---------------------------------------------------------

// makeRoot makes the directory the tasks' directories go in, once:
// dir (Config.TaskDir), made if missing and refused unless the engine's
// own (ownDir), or a directory of the engine's own under os.TempDir,
// which removeRoot removes; either is opened as t.dirs.
func (t *taskTable) makeRoot(dir string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.root != "" {
		return nil
	}
	if dir == "" {
		d, err := os.MkdirTemp("", "fluksio-tasks-")
		if err == nil {
			t.dirs, err = os.OpenRoot(d)
		}
		if err != nil {
			return fmt.Errorf("cannot make a directory for the tasks' files: %w", err)
		}
		t.root, t.own = d, true
		return nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("task directory %s: %w", dir, err)
	}
	if t.dirs, err = ownDir(abs); err != nil {
		return err
	}
	t.root = abs
	return nil
}

// removeRoot removes the engine's own directory of tasks, at Stop; a
// Config.TaskDir is the embedder's and stays.
func (t *taskTable) removeRoot() {
	t.mu.Lock()
	root, own, dirs := t.root, t.own, t.dirs
	t.root, t.own, t.dirs = "", false, nil
	t.mu.Unlock()
	if dirs != nil {
		dirs.Close()
	}
	if own {
		os.RemoveAll(root)
	}
}

// dir is task id's directory; empty before makeRoot or for an id that
// is none.
func (t *taskTable) dir(id string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.dirLocked(id)
}

func (t *taskTable) dirLocked(id string) string {
	if t.root == "" || !taskIDRe.MatchString(id) {
		return ""
	}
	return filepath.Join(t.root, id)
}

// -- submitting ------------------------------------------------------------

// submit checks spec, reads its inputs for their sizes and digests, and
// adds the task; nothing is added when it returns an error, which says
// what is wrong and what to do. ready says the task may go to the
// router now: it runs after no task that has yet to end. One that runs
// after a task that ended otherwise than succeeded ends at once, its
// news left for takeReleased.
func (t *taskTable) submit(spec TaskSpec) (rec *taskRec, ready bool, err error) {
	if err := t.check(spec); err != nil {
		return nil, false, err
	}
	if spec.ID != "" {
		t.mu.Lock()
		_, dup := t.byID[spec.ID]
		t.mu.Unlock()
		if dup {
			return nil, false, fmt.Errorf("task %s: the engine holds a task of that id already; give another id, or none and the engine names it", spec.ID)
		}
	}
	files := make([]worker.File, len(spec.Inputs))
	var ids []fileID
	for i, in := range spec.Inputs {
		if in.FromTask != "" {
			// Its size and digest are its task's output's, known once
			// that task has succeeded (resolveLocked).
			files[i] = worker.File{Name: in.Name}
			continue
		}
		f, id, err := t.digest(in)
		if err != nil {
			return nil, false, err
		}
		files[i] = f
		if in.Path != "" {
			if ids == nil {
				ids = make([]fileID, len(spec.Inputs))
			}
			ids[i] = id
		}
	}
	requires := requiresCommand
	if len(spec.Command) == 0 {
		requires = requiresPayload
	}
	var env []string
	for k, v := range spec.Env {
		env = append(env, k+"="+v)
	}
	slices.Sort(env)
	rec = &taskRec{need: spec.Need, retries: spec.Retries, requires: requires, command: slices.Clone(spec.Command), env: env, files: files,
		outputs: slices.Clone(spec.Outputs), timeout: spec.Timeout, payload: spec.Payload, sources: slices.Clone(spec.Inputs), ids: ids, state: TaskWaiting}
	t.mu.Lock()
	defer t.mu.Unlock()
	id := spec.ID
	if id == "" {
		for {
			t.generated++
			id = "t-" + strconv.Itoa(t.generated)
			if _, taken := t.byID[id]; !taken {
				break
			}
		}
	} else if _, dup := t.byID[id]; dup {
		return nil, false, fmt.Errorf("task %s: the engine holds a task of that id already; give another id, or none and the engine names it", id)
	}
	deps, err := t.dependenciesLocked(id, spec)
	if err != nil {
		return nil, false, err
	}
	rec.id = id
	t.byID[id] = rec
	t.count[TaskWaiting]++
	if t.ends.start.IsZero() {
		t.ends.start = t.now()
	}
	return rec, t.afterLocked(rec, deps), nil
}

// afterLocked has rec wait for those of deps that have not ended, and
// reports whether it may run now: all of them succeeded already. One
// that ended otherwise ends rec at once (skipLocked). t.mu must be held.
func (t *taskTable) afterLocked(rec *taskRec, deps []*taskRec) bool {
	for _, d := range deps {
		switch {
		case d.end == nil:
			rec.after++
			t.dependents[d.id] = append(t.dependents[d.id], rec)
		case d.state != worker.StateSucceeded:
			t.skipLocked(rec, d)
			return false
		}
	}
	return rec.after == 0 && t.resolveLocked(rec)
}

// dependenciesLocked is the tasks spec runs after (After, and every
// input's FromTask), once each, in the order named; an error names one
// the engine does not hold, or an output that task will not bring back.
// t.mu must be held.
func (t *taskTable) dependenciesLocked(id string, spec TaskSpec) ([]*taskRec, error) {
	var deps []*taskRec
	seen := map[string]bool{}
	add := func(dep string) error {
		if seen[dep] {
			return nil
		}
		seen[dep] = true
		d := t.byID[dep]
		if d == nil {
			return fmt.Errorf("task %s runs after task %s, which the engine does not hold: submit %s first (or it ended long ago and is forgotten)", id, dep, dep)
		}
		deps = append(deps, d)
		return nil
	}
	for _, dep := range spec.After {
		if err := add(dep); err != nil {
			return nil, err
		}
	}
	for _, in := range spec.Inputs {
		if in.FromTask == "" {
			continue
		}
		if in.FromTask == id {
			return nil, fmt.Errorf("input %q is task %s's own output: a task cannot wait for its own end", in.Name, id)
		}
		if err := add(in.FromTask); err != nil {
			return nil, err
		}
		d := t.byID[in.FromTask]
		var names []string
		switch {
		case d.end == nil:
			names = d.outputs
		case d.state == worker.StateSucceeded:
			for _, o := range d.end.outputs {
				names = append(names, o.Name)
			}
		default:
			continue // It will not run: skipLocked says why.
		}
		if !slices.ContainsFunc(names, func(o string) bool { return in.Path == o || strings.HasPrefix(in.Path, o+"/") }) {
			return nil, fmt.Errorf("input %q: task %s has no output %q (its outputs: %s)", in.Name, in.FromTask, in.Path, strings.Join(names, ", "))
		}
	}
	return deps, nil
}

// releaseLocked is what the end of rec, in state, does to the tasks that
// run after it: one whose last dependency succeeded is released (or, if
// an input from one cannot be served, ends failed); every one, when rec
// ended otherwise, ends cancelled without running. t.mu must be held.
func (t *taskTable) releaseLocked(rec *taskRec, state TaskState) {
	waiting := t.dependents[rec.id]
	delete(t.dependents, rec.id)
	for _, d := range waiting {
		if d.end != nil {
			continue
		}
		if state != worker.StateSucceeded {
			t.skipLocked(d, rec)
			continue
		}
		if d.after--; d.after == 0 && t.resolveLocked(d) {
			t.released = append(t.released, d)
		}
	}
}

// skipLocked ends rec cancelled, without running it, because dep, which
// it runs after, ended otherwise than succeeded. t.mu must be held.
func (t *taskTable) skipLocked(rec, dep *taskRec) {
	why := fmt.Sprintf("not run: it runs after task %s, which ended %s", dep.id, dep.state)
	if dep.end != nil && dep.end.err != "" {
		why += " (" + dep.end.err + ")"
	}
	t.endLocked(rec, worker.StateCancelled, &taskEnd{err: why, ended: t.now()})
	t.skipped = append(t.skipped, taskNews{res: t.resultLocked(rec), ended: true})
}

// resolveLocked gives each input of rec from another task the size,
// digest and identity of that task's output as the engine keeps it, and
// reports whether rec may run; when an output was not brought back, rec
// ends failed, saying which. t.mu must be held.
func (t *taskTable) resolveLocked(rec *taskRec) bool {
	for i, in := range rec.sources {
		if in.FromTask == "" {
			continue
		}
		dep := t.byID[in.FromTask]
		var out worker.File
		if dep != nil && dep.end != nil {
			if j := slices.IndexFunc(dep.end.outputs, func(o worker.File) bool { return o.Name == in.Path }); j >= 0 {
				out = dep.end.outputs[j]
			}
		}
		name := path.Join(in.FromTask, "outputs", in.Path)
		var id fileID
		found := false
		if out.Name != "" && t.dirs != nil {
			if st, err := t.dirs.Lstat(name); err == nil && st.Mode().IsRegular() {
				id, _ = statID(st)
				found = true
			}
		}
		if !found {
			why := fmt.Sprintf("input %q: task %s did not bring back its output %q", in.Name, in.FromTask, in.Path)
			t.endLocked(rec, worker.StateFailed, &taskEnd{err: why, ended: t.now()})
			t.skipped = append(t.skipped, taskNews{res: t.resultLocked(rec), ended: true})
			return false
		}
		if rec.ids == nil {
			rec.ids = make([]fileID, len(rec.sources))
		}
		rec.files[i] = worker.File{Name: in.Name, Size: out.Size, SHA256: out.SHA256}
		rec.sources[i] = Input{Name: in.Name, Path: filepath.Join(t.root, name)}
		rec.ids[i] = id
	}
	return true
}

// streamsLocked makes task id's stdout and stderr, empty, where its
// worker sent nothing (or it never ran): an ended task's directory
// always holds both, so a reader tells "nothing written" from "nothing
// kept" without asking. t.mu must be held, as for any file of a task's
// that must not race a new attempt.
func (t *taskTable) streamsLocked(id string) {
	if t.dirLocked(id) == "" || t.dirs == nil {
		return
	}
	if err := t.dirs.Mkdir(id, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return
	}
	for _, name := range streamNames {
		if f, err := t.dirs.OpenFile(path.Join(id, name), os.O_WRONLY|os.O_CREATE, 0o600); err == nil {
			f.Close()
		}
	}
}

// takeReleased returns, and forgets, the tasks released since the last
// call and the news of those that ended without running.
func (t *taskTable) takeReleased() ([]*taskRec, []taskNews) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, s := t.released, t.skipped
	t.released, t.skipped = nil, nil
	return r, s
}

// check is every refusal of spec that reads nothing.
func (t *taskTable) check(spec TaskSpec) error {
	if spec.ID != "" && !taskIDRe.MatchString(spec.ID) {
		return fmt.Errorf("task id %q: use 1 to 128 letters, digits, '.', '_' or '-', starting with a letter or digit (it names the task's directory), or none and the engine names it", spec.ID)
	}
	if len(spec.Command) == 0 && len(spec.Payload) == 0 {
		return errors.New(`the task has no command and no payload: give Command, an argv such as ["sh", "-c", "make test"], or a Payload for an engine's own worker`)
	}
	if len(spec.Command) > 0 && spec.Command[0] == "" {
		return errors.New("the task's command starts with an empty word: Command[0] names the program to run")
	}
	for _, arg := range spec.Command {
		if strings.IndexByte(arg, 0) >= 0 {
			return errors.New("a word of the task's command holds a NUL byte, which no program can be given")
		}
	}
	for k, v := range spec.Env {
		switch {
		case k == shared.WorkerTokenEnv || strings.HasPrefix(k, shared.WorkerTokenEnv+"_"):
			return fmt.Errorf("the task's Env names %s, the worker's credential: a task may neither set nor see it; leave it out", k)
		case k == "" || strings.ContainsAny(k, "=\x00"):
			return fmt.Errorf("the task's Env names %q, which is no variable name (empty, or holding '=' or NUL)", k)
		case strings.IndexByte(v, 0) >= 0:
			return fmt.Errorf("the task's Env variable %s holds a NUL byte, which no environment can", k)
		}
	}
	if spec.Timeout < 0 {
		return fmt.Errorf("the task's Timeout is %s; zero means none, else give a positive duration", spec.Timeout)
	}
	if spec.Retries < 0 {
		return fmt.Errorf("the task's Retries is %d; give 0 (run once) or more", spec.Retries)
	}
	names := map[string]bool{}
	for _, in := range spec.Inputs {
		if err := checkRelPath("input", in.Name); err != nil {
			return err
		}
		if names[in.Name] {
			return fmt.Errorf("input %q is given twice; each input names a file of its own", in.Name)
		}
		names[in.Name] = true
		if in.Path != "" && in.Data != nil {
			return fmt.Errorf("input %q has both a Path and Data; give one", in.Name)
		}
		if in.FromTask != "" {
			if !taskIDRe.MatchString(in.FromTask) {
				return fmt.Errorf("input %q: FromTask %q is no task id", in.Name, in.FromTask)
			}
			if err := checkRelPath("output", in.Path); err != nil {
				return fmt.Errorf("input %q from task %s: %w (Path names the output as that task's Outputs do)", in.Name, in.FromTask, err)
			}
		}
	}
	for _, id := range spec.After {
		switch {
		case !taskIDRe.MatchString(id):
			return fmt.Errorf("the task's After names %q, which is no task id", id)
		case id == spec.ID:
			return fmt.Errorf("task %s runs after itself: a task cannot wait for its own end", id)
		}
	}
	for _, in := range spec.Inputs {
		for d := path.Dir(in.Name); d != "."; d = path.Dir(d) {
			if names[d] {
				return fmt.Errorf("input %q is under input %q, which is a file: rename one", in.Name, d)
			}
		}
	}
	outs := map[string]bool{}
	for _, o := range spec.Outputs {
		if err := checkRelPath("output", o); err != nil {
			return err
		}
		if outs[o] {
			return fmt.Errorf("output %q is given twice", o)
		}
		outs[o] = true
	}
	return nil
}

// checkRelPath refuses a name that does not stay inside the task's
// directory, or that is not written the one way it can be: relative,
// cleaned, with no ".." element.
func checkRelPath(kind, p string) error {
	switch {
	case p == "":
		return fmt.Errorf("an %s's name is empty: name a file inside the task's directory, such as data/in.csv", kind)
	case len(p) > maxPathLen:
		return fmt.Errorf("%s %.40q...: longer than %d bytes", kind, p, maxPathLen)
	case termsafe.EscapeLine(p) != p:
		return fmt.Errorf("%s %q: holds a control character or invalid UTF-8; use a printable name", kind, p)
	case strings.HasPrefix(p, "/"):
		return fmt.Errorf("%s %q is absolute: name it relative to the task's directory", kind, p)
	case slices.Contains(strings.Split(p, "/"), ".."):
		return fmt.Errorf("%s %q has a \"..\" element, which leaves the task's directory: name a file inside it", kind, p)
	case p == ".":
		return fmt.Errorf("%s %q is the task's directory itself: name a file or directory inside it", kind, p)
	case path.Clean(p) != p:
		return fmt.Errorf("%s %q is not written plainly: write %q", kind, p, path.Clean(p))
	}
	return nil
}

// digest reads an input once, streaming, for its size and sha256, and
// says the identity of a Path's file (openInput); one larger than the
// input limit is refused, with the limit, and so is a file that changed
// while it was read.
func (t *taskTable) digest(in Input) (worker.File, fileID, error) {
	limit := t.limits.Input
	if in.Path == "" {
		if int64(len(in.Data)) > limit {
			return worker.File{}, fileID{}, fmt.Errorf("input %q: %d bytes of Data; the engine takes at most %d bytes an input (TaskLimits.Input)", in.Name, len(in.Data), limit)
		}
		sum := sha256.Sum256(in.Data)
		return worker.File{Name: in.Name, Size: int64(len(in.Data)), SHA256: hex.EncodeToString(sum[:])}, fileID{}, nil
	}
	f, id, err := openInput(in.Path)
	if err != nil {
		return worker.File{}, fileID{}, fmt.Errorf("input %q: %w", in.Name, err)
	}
	defer f.Close()
	size := id.size
	if size > limit {
		return worker.File{}, fileID{}, fmt.Errorf("input %q: %s is %d bytes; the engine takes at most %d bytes an input (TaskLimits.Input)", in.Name, in.Path, size, limit)
	}
	h := sha256.New()
	n, err := io.Copy(h, io.LimitReader(f, size+1))
	switch {
	case err != nil:
		return worker.File{}, fileID{}, fmt.Errorf("input %q: reading %s: %w", in.Name, in.Path, err)
	case n != size:
		return worker.File{}, fileID{}, fmt.Errorf("input %q: %s changed size while it was read (%d bytes, then %d); submit it when it is written", in.Name, in.Path, size, n)
	}
	if fi, err := f.Stat(); err == nil {
		if now, ok := statID(fi); ok && id.differs(now) != "" {
			return worker.File{}, fileID{}, fmt.Errorf("input %q: %s changed while it was read; submit it when it is written", in.Name, in.Path)
		}
	}
	return worker.File{Name: in.Name, Size: size, SHA256: hex.EncodeToString(h.Sum(nil))}, id, nil
}

// -- attempts --------------------------------------------------------------

// beginOutcome is what begin did.
type beginOutcome int

const (
	begun          beginOutcome = iota // the attempt runs: assign its task
	beginCancelled                     // Cancel asked for the task first: end it cancelled
	beginEnded                         // the task ended already: drop it
)

// begin starts an attempt of rec on w, whose task is base (its ID and
// need, the router's): the attempt is recorded as running, the task's
// directory of an earlier attempt is moved aside and removed (so that
// stdout and stderr start empty, and a late request of the earlier
// attempt's worker writes nowhere that counts), and the task to assign
// is returned.
func (t *taskTable) begin(rec *taskRec, base Task, w WorkerInfo) (Task, beginOutcome) {
	attemptID := base.ID
	t.mu.Lock()
	switch {
	case rec.end != nil:
		t.mu.Unlock()
		return Task{}, beginEnded
	case rec.cancel:
		t.mu.Unlock()
		return Task{}, beginCancelled
	}
	rec.run = &taskRun{id: attemptID, worker: w.Name, outputs: map[string]worker.File{}}
	t.setStateLocked(rec, TaskRunning)
	rec.attempts = append(rec.attempts, Attempt{Number: len(rec.attempts) + 1, AttemptID: attemptID, Worker: w.Name, Provisioner: w.Provisioner,
		JobID: w.JobID, Hostname: w.Hostname, CPUs: max(1, rec.need.CPUs), State: TaskRunning, Started: t.now()})
	t.attempts[attemptID] = rec
	task := base
	task.Name, task.Attempt, task.Requires = rec.id, len(rec.attempts), rec.requires
	task.Command, task.Inputs, task.Outputs, task.Payload = rec.command, rec.files, rec.outputs, rec.payload
	task.TimeoutSeconds = rec.timeout.Seconds()
	task.Limits = worker.Limits{Outputs: t.limits.Outputs, Log: t.limits.Log, Files: t.limits.Files}
	if len(rec.env) > 0 {
		task.Env = make(map[string]string, len(rec.env))
		for _, kv := range rec.env {
			k, v, _ := strings.Cut(kv, "=")
			task.Env[k] = v
		}
	}
	var aside string
	dirs := t.dirs
	if dirs != nil && t.dirLocked(rec.id) != "" {
		if _, err := dirs.Lstat(rec.id); err == nil {
			aside = ".gone-" + rec.id + "-" + attemptID
			if err := dirs.Rename(rec.id, aside); err != nil {
				aside = ""
			}
		}
	}
	t.mu.Unlock()
	if aside != "" {
		dirs.RemoveAll(aside)
	}
	return task, begun
}

// unbegin takes back an attempt whose task could not be assigned (its
// worker left meanwhile): the task waits again, as if it never began.
func (t *taskTable) unbegin(rec *taskRec, attemptID string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if rec.run == nil || rec.run.id != attemptID {
		return
	}
	rec.run = nil
	rec.attempts = rec.attempts[:len(rec.attempts)-1]
	delete(t.attempts, attemptID)
	t.setStateLocked(rec, TaskWaiting)
}

// setStateLocked moves rec to state, and the counts with it. t.mu must
// be held.
func (t *taskTable) setStateLocked(rec *taskRec, state TaskState) {
	t.count[rec.state]--
	t.count[state]++
	cpus := max(1, rec.need.CPUs)
	if rec.state == TaskRunning {
		t.runningCPUs -= cpus
	}
	if state == TaskRunning {
		t.runningCPUs += cpus
	}
	rec.state = state
}

// markCancel marks task id cancelled and returns it with its attempt
// under way (empty while it waits); nil and nil for a task cancelled
// already, which nothing more is done for.
func (t *taskTable) markCancel(id string) (*taskRec, taskRun, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	rec := t.byID[id]
	switch {
	case rec == nil:
		return nil, taskRun{}, ErrNoSuchTask
	case rec.end != nil:
		return nil, taskRun{}, ErrTaskEnded
	case rec.cancel:
		return nil, taskRun{}, nil
	}
	rec.cancel = true
	if rec.run == nil {
		return rec, taskRun{}, nil
	}
	return rec, taskRun{id: rec.run.id, worker: rec.run.worker}, nil
}

// stateOf is rec's state now.
func (t *taskTable) stateOf(rec *taskRec) TaskState {
	t.mu.Lock()
	defer t.mu.Unlock()
	return rec.state
}

// hasEnded reports whether rec ended.
func (t *taskTable) hasEnded(rec *taskRec) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return rec.end != nil
}

// cancelled reports whether Cancel asked for rec.
func (t *taskTable) cancelled(rec *taskRec) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return rec.cancel
}

// taskNews is what became of a task at a report or a loss, for the
// hooks, the event stream and the metrics: told after every lock is
// released.
type taskNews struct {
	res TaskResult
	// lost: an attempt's machine was lost; again: the task waits for
	// another worker; ended: the task ended (TaskEnded).
	lost, again, ended bool
	// worker and provisioner are the attempt's, for the event.
	worker, provisioner string
}

// finish records the result of rec's attempt attemptID and ends the
// task: a command's run ends its task, whatever it came to (a task is
// retried only when its machine is lost). The state is the worker's,
// unless the worker sent more than the limits allow or its byte counts
// do not match what the engine received (failed, saying why), or the
// task was cancelled (cancelled).
func (t *taskTable) finish(rec *taskRec, attemptID string, res Result) (taskNews, bool) {
	t.mu.Lock()
	run := rec.run
	if run == nil || run.id != attemptID || rec.end != nil {
		t.mu.Unlock()
		return taskNews{}, false
	}
	rep := res.run
	if rep == nil {
		rep = &worker.ResultRequest{State: worker.StateFailed, Error: "the worker reported no state (a worker that runs only the stand-in)"}
	}
	state, why := rep.State, rep.Error
	// A run stopped by its cancel is not held to its counts: what it
	// sent before the stop is moot, and a run the books took back
	// (books.takeBackCancelledLocked) counted nothing.
	stopped := rec.cancel && rep.State == worker.StateCancelled
	if problem := run.check(rep); problem != "" && !stopped {
		state = worker.StateFailed
		if why != "" {
			problem += "; the worker said: " + why
		}
		why = problem
	}
	// The attempt's worker, provisioner, host and job are the attach's,
	// as begin recorded them: a result's body does not change them.
	a := &rec.attempts[len(rec.attempts)-1]
	a.State, a.Error = state, why
	if !rep.Started.IsZero() {
		a.Started = rep.Started
	}
	a.Ended = rep.Ended
	if a.Ended.IsZero() {
		a.Ended = res.At
	}
	if rec.cancel {
		state = worker.StateCancelled
		if why == "" {
			why = "cancelled"
		}
	}
	outputs := slices.SortedFunc(maps.Values(run.outputs), func(x, y worker.File) int { return strings.Compare(x.Name, y.Name) })
	end := &taskEnd{exitCode: rep.ExitCode, signal: rep.Signal, err: why, outputs: outputs,
		stdout: run.streams[0].size, stderr: run.streams[1].size, started: a.Started, ended: a.Ended}
	t.endLocked(rec, state, end)
	news := taskNews{res: t.resultLocked(rec), ended: true, worker: run.worker, provisioner: a.Provisioner}
	dir, dirs := t.dirLocked(rec.id), t.dirs
	t.mu.Unlock()
	news.res.Stdout, news.res.Stderr = readTails(dirs, dir, end.stdout, end.stderr)
	return news, true
}

// check compares what the worker says it sent with what the engine
// received, and says the first difference in words; empty when they
// agree and no limit was passed.
func (run *taskRun) check(rep *worker.ResultRequest) string {
	if run.over != "" {
		return run.over
	}
	switch rep.State {
	case worker.StateSucceeded, worker.StateFailed, worker.StateCancelled, worker.StateTimedOut:
	default:
		return fmt.Sprintf("the worker reported the state %q, which is none of succeeded, failed, cancelled, timed_out", rep.State)
	}
	for i, sent := range [2]int64{rep.Stdout, rep.Stderr} {
		if got := run.streams[i].size; sent != got {
			return fmt.Sprintf("the worker says it sent %d bytes of %s; the engine received %d", sent, streamNames[i], got)
		}
	}
	listed := map[string]bool{}
	for _, o := range rep.Outputs {
		listed[o.Name] = true
		got, ok := run.outputs[o.Name]
		switch {
		case !ok:
			return fmt.Sprintf("the worker lists output %q, which the engine never received", o.Name)
		case got.Size != o.Size || got.SHA256 != o.SHA256:
			return fmt.Sprintf("output %q: the worker says %d bytes, sha256 %s; the engine received %d bytes, sha256 %s", o.Name, o.Size, o.SHA256, got.Size, got.SHA256)
		}
	}
	for name := range run.outputs {
		if !listed[name] {
			return fmt.Sprintf("output %q was received but the worker's result does not list it", name)
		}
	}
	return ""
}

// lost records that rec's attempt attemptID was lost with its worker:
// the task waits again while its attempts are at most its Retries, else
// it ends lost; a task Cancel asked for ends cancelled.
func (t *taskTable) lost(rec *taskRec, attemptID, why string) (taskNews, bool) {
	t.mu.Lock()
	run := rec.run
	if run == nil || run.id != attemptID || rec.end != nil {
		t.mu.Unlock()
		return taskNews{}, false
	}
	now := t.now()
	a := &rec.attempts[len(rec.attempts)-1]
	a.State, a.Error, a.Ended = TaskLostState, why, now
	rec.run = nil
	news := taskNews{worker: run.worker, provisioner: a.Provisioner}
	end := &taskEnd{started: a.Started, ended: now}
	switch {
	case rec.cancel:
		a.State = worker.StateCancelled
		end.err = "cancelled; " + why
		t.endLocked(rec, worker.StateCancelled, end)
		news.ended = true
	case len(rec.attempts) <= rec.retries:
		t.setStateLocked(rec, TaskWaiting)
		news.lost, news.again = true, true
	default:
		end.err = fmt.Sprintf("its machine was lost under it on every attempt (%d); the last: %s", len(rec.attempts), why)
		t.endLocked(rec, TaskLostState, end)
		news.lost, news.ended = true, true
	}
	news.res = t.resultLocked(rec)
	t.mu.Unlock()
	return news, true
}

// end ends rec as state, saying why, unless it ended already (false).
// It is how a task that never ran to a result ends: cancelled while it
// waited.
func (t *taskTable) end(rec *taskRec, state TaskState, why string) (taskNews, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if rec.end != nil {
		return taskNews{}, false
	}
	rec.run = nil
	t.endLocked(rec, state, &taskEnd{err: why, ended: t.now()})
	return taskNews{res: t.resultLocked(rec), ended: true}, true
}

// endLocked ends rec: its state and end are set, what it held of the
// caller's (inputs, payload) is dropped, and the oldest ended tasks
// beyond keepEnded, or beyond keptEndedBytes of words and output lists,
// are forgotten. t.mu must be held.
func (t *taskTable) endLocked(rec *taskRec, state TaskState, end *taskEnd) {
	t.streamsLocked(rec.id)
	t.setStateLocked(rec, state)
	rec.end, rec.run = end, nil
	rec.command, rec.env, rec.files, rec.outputs, rec.payload, rec.sources, rec.ids = nil, nil, nil, nil, nil, nil, nil
	t.ends.add(t.now())
	end.held = int64(len(end.err) + len(end.signal))
	for _, a := range rec.attempts {
		end.held += int64(len(a.Error))
	}
	for _, o := range end.outputs {
		end.held += int64(len(o.Name)+len(o.SHA256)) + 16
	}
	t.releaseLocked(rec, state)
	t.ended = append(t.ended, rec)
	t.endedBytes += end.held
	for len(t.ended) > keepEnded || (t.endedBytes > keptEndedBytes && len(t.ended) > 1) {
		old := t.ended[0]
		t.ended[0] = nil
		t.ended = t.ended[1:]
		t.endedBytes -= old.end.held
		if t.byID[old.id] == old {
			delete(t.byID, old.id)
			for _, a := range old.attempts {
				if t.attempts[a.AttemptID] == old {
					delete(t.attempts, a.AttemptID)
				}
			}
		}
	}
}

// attemptOf names the task whose attempt id is id, and the attempt's
// number.
func (t *taskTable) attemptOf(id string) (string, int, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	rec := t.attempts[id]
	if rec == nil {
		return "", 0, false
	}
	for _, a := range rec.attempts {
		if a.AttemptID == id {
			return rec.id, a.Number, true
		}
	}
	return "", 0, false
}

// TaskCounts is the tasks by state, as GET /status's summary has them:
// every task submitted, the ones the engine no longer lists included.
type TaskCounts struct {
	Submitted int `json:"submitted"`
	Waiting   int `json:"waiting"`
	Running   int `json:"running"`
	Succeeded int `json:"succeeded"`
	Failed    int `json:"failed"`
	Cancelled int `json:"cancelled"`
	TimedOut  int `json:"timed_out"`
	Lost      int `json:"lost"`
	// RunningCPUs is what the running tasks take of their machines'
	// CPUs: each its need's, one at least.
	RunningCPUs int `json:"running_cpus"`
	// Ended is the tasks ended over time, for a chart.
	Ended EndSeries `json:"ended"`
}

// counts is the tasks by state now.
func (t *taskTable) counts() TaskCounts {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := TaskCounts{Waiting: t.count[TaskWaiting], Running: t.count[TaskRunning], Succeeded: t.count[worker.StateSucceeded],
		Failed: t.count[worker.StateFailed], Cancelled: t.count[worker.StateCancelled], TimedOut: t.count[worker.StateTimedOut],
		Lost: t.count[TaskLostState], RunningCPUs: t.runningCPUs}
	for _, n := range t.count {
		c.Submitted += n
	}
	c.Ended = t.ends.export()
	return c
}

// maxEndBuckets bounds the series of ends: when a run outgrows it, two
// buckets become one of twice the width, so that a run of a minute and
// one of a week are both a chart of at most this many bars, in memory
// of that size.
const maxEndBuckets = 120

// endSeries counts ends in buckets of step from start (the first
// submission). Guarded by taskTable.mu.
type endSeries struct {
	start  time.Time
	step   time.Duration
	counts []int
}

// add counts an end at now.
func (s *endSeries) add(now time.Time) {
	if s.step == 0 {
		s.step = time.Second
	}
	if s.start.IsZero() || now.Before(s.start) {
		s.start = now
	}
	i := int(now.Sub(s.start) / s.step)
	for i >= maxEndBuckets {
		merged := make([]int, (len(s.counts)+1)/2, maxEndBuckets)
		for j, n := range s.counts {
			merged[j/2] += n
		}
		s.counts, s.step = merged, 2*s.step
		i = int(now.Sub(s.start) / s.step)
	}
	for len(s.counts) <= i {
		s.counts = append(s.counts, 0)
	}
	s.counts[i]++
}

// EndSeries is tasks ended over time: Counts[i] ended in the
// StepSeconds from Start plus i steps. Start is the first submission.
type EndSeries struct {
	Start       time.Time `json:"start,omitzero"`
	StepSeconds float64   `json:"step_seconds"`
	Counts      []int     `json:"counts"`
}

func (s *endSeries) export() EndSeries {
	step := s.step
	if step == 0 {
		step = time.Second
	}
	return EndSeries{Start: s.start, StepSeconds: step.Seconds(), Counts: append([]int{}, s.counts...)}
}

// -- reading ---------------------------------------------------------------

// result is task id as it stands, with its streams' tails.
func (t *taskTable) result(id string) (TaskResult, bool) {
	t.mu.Lock()
	rec := t.byID[id]
	if rec == nil {
		t.mu.Unlock()
		return TaskResult{}, false
	}
	res := t.resultLocked(rec)
	var stdout, stderr int64
	switch {
	case rec.end != nil:
		stdout, stderr = rec.end.stdout, rec.end.stderr
	case rec.run != nil:
		stdout, stderr = rec.run.streams[0].size, rec.run.streams[1].size
	}
	dir, dirs := t.dirLocked(id), t.dirs
	t.mu.Unlock()
	res.Stdout, res.Stderr = readTails(dirs, dir, stdout, stderr)
	return res, true
}

// resultLocked is rec as it stands, but for the streams' tails (read
// from files, without the lock). t.mu must be held.
func (t *taskTable) resultLocked(rec *taskRec) TaskResult {
	res := TaskResult{ID: rec.id, State: rec.state, Attempts: slices.Clone(rec.attempts)}
	if res.Attempts == nil {
		res.Attempts = []Attempt{}
	}
	if e := rec.end; e != nil {
		res.ExitCode, res.Signal, res.Error = e.exitCode, e.signal, e.err
		res.Outputs, res.Started, res.Ended = slices.Clone(e.outputs), e.started, e.ended
	} else if n := len(rec.attempts); n > 0 {
		res.Started = rec.attempts[n-1].Started
	}
	return res
}

// readTails reads the last tailBytes of the kept stdout and stderr of
// a task's directory dir (a path, for its name under dirs), up to the
// sizes the engine accepted; a file that cannot be read (its directory
// removed by its owner, or dirs closed at Stop) reads empty.
func readTails(dirs *os.Root, dir string, stdout, stderr int64) (string, string) {
	if dir == "" || dirs == nil {
		return "", ""
	}
	id := filepath.Base(dir)
	return readTail(dirs, path.Join(id, worker.StreamStdout), stdout), readTail(dirs, path.Join(id, worker.StreamStderr), stderr)
}

func readTail(dirs *os.Root, p string, size int64) string {
	if size <= 0 {
		return ""
	}
	f, err := dirs.Open(p)
	if err != nil {
		return ""
	}
	defer f.Close()
	n := min(size, tailBytes)
	buf := make([]byte, n)
	got, _ := f.ReadAt(buf, size-n)
	return string(buf[:got])
}

// holds reports whether the engine holds a task of id (ended or not).
func (t *taskTable) holds(id string) (*taskRec, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	rec := t.byID[id]
	return rec, rec != nil
}
