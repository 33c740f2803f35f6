package engine

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

// TaskSpec is a piece of real work an engine submits (Engine.Submit): a
// command with its inputs and outputs, run on a worker that fits Need.
// docs/worker-protocol.md says how it travels to the worker and back.
type TaskSpec struct {
	// ID is the caller's name for the task, unique among the tasks the
	// engine holds; empty means the engine names it.
	ID   string
	Need shared.Need
	// Command is the argv the worker runs, with no shell unless it names
	// one (["sh", "-c", "..."]). A task with no Command and no Payload
	// is refused.
	Command []string
	// Env is added to the command's environment; it may not name the
	// worker's credential variable.
	Env map[string]string
	// Inputs are placed in the task's directory before the command runs.
	Inputs []Input
	// Outputs are paths relative to the task's directory, brought back
	// after the command ends.
	Outputs []string
	// Timeout bounds the command's run; zero means none.
	Timeout time.Duration
	// Retries is how many more times the task runs when its machine is
	// lost under it (never when its command fails).
	Retries int
	// Payload is passed to the worker as it is, for engines whose own
	// worker reads it (worker.Serve).
	Payload []byte
	// After names tasks this one runs after: it waits, asking for no
	// machine, until each has succeeded; if one ends otherwise, it is
	// not run and ends cancelled, its error naming that task and how it
	// ended. Each must be a task the engine holds when this one is
	// submitted, so that tasks form no cycle; an input FromTask implies
	// its task here.
	After []string
}

// Input is one input file of a task: Name in the task's directory, its
// bytes from Path on the engine's machine or from Data. Submit reads it
// once for its size and digest; the worker's copy is checked against
// both. A Path is not followed through a symbolic link as its last
// element, and is served only while it is the file Submit read,
// unchanged (taskfiles.go); else the task fails saying so.
//
// With FromTask, the input is an output of another task: Path is that
// output as its task's Outputs name it, and the bytes are the engine's
// copy of it, its size and digest as that task brought it back, served
// once that task has succeeded (the input implies After). An output the
// task did not bring back fails the task that needs it, saying so.
type Input struct {
	Name     string
	Path     string
	Data     []byte
	FromTask string
}

// TaskState is where a task stands: waiting or running, or how it ended.
type TaskState = worker.TaskState

// The states only the engine knows; worker.StateSucceeded, StateFailed,
// StateCancelled and StateTimedOut are how a run ends.
const (
	TaskWaiting TaskState = "waiting" // not on a worker (first or again)
	TaskRunning TaskState = "running" // on a worker
	// TaskLostState: every attempt's machine was lost under it.
	TaskLostState TaskState = "lost"
)

// TaskResult is a task as it stands, and its result once it ended: what
// GET /v1/tasks/ID answers and host-example run writes as result.json.
type TaskResult struct {
	ID    string    `json:"id"`
	State TaskState `json:"state"`
	// ExitCode is the command's exit code, when it exited; Signal names
	// the signal that ended it.
	ExitCode *int   `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
	// Error says why, in words, when it did not succeed.
	Error string `json:"error,omitempty"`
	// Stdout and Stderr are the streams' last bytes (at most
	// tailBytes each); the whole streams are in the task's directory on
	// the engine's side.
	Stdout string `json:"stdout,omitempty"`
	Stderr string `json:"stderr,omitempty"`
	// Outputs are the outputs brought back, under the task's directory.
	Outputs []worker.File `json:"outputs,omitempty"`
	Started time.Time     `json:"started,omitzero"`
	Ended   time.Time     `json:"ended,omitzero"`
	// Attempts are every run of the task, the last one last.
	Attempts []Attempt `json:"attempts"`
}

// Attempt is one run of a task on one worker. A task is named by its
// id everywhere; an attempt by its number beside it (Number, from 1),
// and, on the worker's routes alone, by its AttemptID.
type Attempt struct {
	// Number counts the task's attempts from 1.
	Number int `json:"attempt"`
	// AttemptID names this attempt on the workers' routes
	// (/v1/work/ATTEMPT_ID/...); GET /v1/tasks/ID takes the task's id.
	AttemptID   string `json:"attempt_id"`
	Worker      string `json:"worker"`
	Provisioner string `json:"provisioner"`
	JobID       string `json:"job_id"`
	Hostname    string `json:"hostname"`
	// CPUs is what the attempt took of its machine's: its need's, one
	// at least (a machine with slots runs several attempts at once).
	CPUs    int       `json:"cpus"`
	State   TaskState `json:"state"`
	Error   string    `json:"error,omitempty"`
	Started time.Time `json:"started,omitzero"`
	Ended   time.Time `json:"ended,omitzero"`
}

// TaskLimits bound what one task moves, in bytes; zero takes the
// default (defaultTaskLimits).
type TaskLimits struct {
	// Input bounds each input file.
	Input int64
	// Outputs bounds the total of one task's outputs.
	Outputs int64
	// Log bounds each of a task's stdout and stderr as the engine keeps
	// them.
	Log int64
	// Files bounds the files and directories one task's outputs make,
	// each an inode; a directory also counts dirBytes against Outputs.
	Files int64
}

// Submit adds a task and returns its id. The task waits for a worker
// that fits its need and runs the command (FeatureCommand), or the
// payload (FeaturePayload); its inputs are read now, for their sizes and
// digests, and an error says which one and why, with nothing added.
// A task after others (After, Input.FromTask) waits for them and runs
// only if they all succeeded (see TaskSpec.After).
// A task no provisioner's machine can hold (Holds: too large for every
// shape, or its timeout longer than every shape's lifetime) is refused
// with a *FitError, before anything is asked for.
// The task holds the caller's input Data and Payload, not copies: they
// must not change until it ends.
func (e *Engine) Submit(spec TaskSpec) (string, error) {
	if err := e.Holds(spec.Need, spec.Timeout); err != nil {
		return "", err
	}
	rec, ready, err := e.tasks.submit(spec)
	if err != nil {
		return "", err
	}
	if ready {
		e.router.addTask(rec, spec.Need)
	}
	e.release()
	e.poke()
	return rec.id, nil
}

// release gives the router the tasks whose last dependency succeeded,
// and tells the end of those that will never run (takeReleased). It is
// called after every task's end it tells, and after Submit.
func (e *Engine) release() {
	ready, skipped := e.tasks.takeReleased()
	for _, rec := range ready {
		e.router.addTask(rec, rec.need)
	}
	for _, n := range skipped {
		e.tellTask(n, false)
	}
	if len(ready) > 0 {
		e.poke()
	}
}

// Cancel cancels a task: one still waiting is withdrawn, one running is
// stopped on its worker (which stays for the next task). Its result's
// state is then StateCancelled. A task that ended is not changed
// (ErrTaskEnded); an id the engine does not hold is ErrNoSuchTask.
func (e *Engine) Cancel(id string) error {
	rec, run, err := e.tasks.markCancel(id)
	if err != nil || rec == nil {
		return err
	}
	if run.id != "" {
		// On its worker: the worker's watch hears it, and the task ends
		// when its result (or its worker's loss) comes.
		e.books.CancelTask(run.worker, run.id)
		e.poke()
		return nil
	}
	found, withdrawn := e.router.withdrawTask(rec)
	if found && !withdrawn {
		// Placed on a worker this very moment: the router sees the
		// cancel as it assigns it (taskTable.begin, or after Assign).
		e.poke()
		return nil
	}
	if n, ok := e.tasks.end(rec, worker.StateCancelled, "cancelled while it waited"); ok {
		e.tellTask(n, false)
	}
	e.poke()
	return nil
}

// errNotATask: Withdraw was given a need's id, not a task's.
var errNotATask = errors.New("not a task")

// withdrawTask is Withdraw for a task's id: one that waits is
// cancelled; one on a worker is ErrNeedUnderWay and one ended
// ErrNeedServed, as for a need. errNotATask for an id of no task.
func (e *Engine) withdrawTask(id string) error {
	rec, ok := e.tasks.holds(id)
	if !ok {
		return errNotATask
	}
	switch state := e.tasks.stateOf(rec); state {
	case TaskRunning:
		return ErrNeedUnderWay
	case TaskWaiting:
		if err := e.Cancel(id); errors.Is(err, ErrTaskEnded) {
			return ErrNeedServed
		}
		return nil
	}
	return ErrNeedServed
}

// Task reports task id as it stands, and its result once it ended.
func (e *Engine) Task(id string) (TaskResult, bool) { return e.tasks.result(id) }

// TaskDir is where the engine keeps task id's stdout, stderr and
// outputs (under outputs/): Config.TaskDir/ID, or the engine's own
// directory's. It is empty before the engine listens (Serve or Start)
// and for an id no task could have.
func (e *Engine) TaskDir(id string) string { return e.tasks.dir(id) }

// Authenticate checks a request to an embedder's own route as the
// workers' routes are checked: a credential the engine signed, of a
// worker attached now, in the session its attach was answered with, not
// revoked. It returns the worker; an error says why not, and the
// request is the worker protocol's 401 (or 403, for another's session).
func (e *Engine) Authenticate(r *http.Request) (WorkerInfo, error) {
	c, d, reason := e.books.workerOf(r, "")
	if d != allowed {
		return WorkerInfo{}, fmt.Errorf("not an attached worker's request: %s", reason)
	}
	return c.info, nil
}

// serveTask answers GET /v1/tasks/ID: the task as it stands (Task).
func (e *Engine) serveTask(w http.ResponseWriter, r *http.Request) {
	res, ok := e.Task(r.PathValue("id"))
	if !ok {
		e.notATask(w, r.PathValue("id"))
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// attemptNotTask is the 404 of GET /v1/tasks/ID and its cancel given an
// attempt's id: it names the task, so that a script that read an
// attempt id from a worker's log or an older /status finds the task
// rather than a bare "no such task".
type attemptNotTask struct {
	Error     string `json:"error"`
	TaskID    string `json:"task_id"`
	Attempt   int    `json:"attempt"`
	AttemptID string `json:"attempt_id"`
}

// notATask answers 404 for id: naming the task when id is one of its
// attempts' ids, else ErrNoSuchTask. A 404, not a redirect: a client
// that cancels what it is given must not cancel a task it did not name.
func (e *Engine) notATask(w http.ResponseWriter, id string) {
	if task, n, ok := e.tasks.attemptOf(id); ok {
		writeJSON(w, http.StatusNotFound, attemptNotTask{
			Error:  fmt.Sprintf("%s is no task's id: it is attempt %d of task %s; ask /v1/tasks/%s", id, n, task, task),
			TaskID: task, Attempt: n, AttemptID: id})
		return
	}
	WriteError(w, http.StatusNotFound, ErrNoSuchTask.Error())
}

// serveCancel answers POST /v1/tasks/ID/cancel: 204 cancelled (or being
// cancelled on its worker), 404 for no such task, 409 for one that
// ended.
func (e *Engine) serveCancel(w http.ResponseWriter, r *http.Request) {
	switch err := e.Cancel(r.PathValue("id")); {
	case err == nil:
		w.WriteHeader(http.StatusNoContent)
	case errors.Is(err, ErrNoSuchTask):
		e.notATask(w, r.PathValue("id"))
	case errors.Is(err, ErrTaskEnded):
		WriteError(w, http.StatusConflict, err.Error())
	default:
		WriteError(w, http.StatusInternalServerError, err.Error())
	}
}

// taskNews is what the engine does with what became of a task: the
// event stream and the metrics have it, and the embedder's hooks are
// queued (hooks.go), waiting for room in the queue. No lock is held.
func (e *Engine) taskNews(n taskNews) { e.tellTask(n, true) }

// tellTask is taskNews; wait false queues the hooks beyond the queue's
// bound rather than wait for room (Cancel, which a hook may call).
func (e *Engine) tellTask(n taskNews, wait bool) {
	e.obs.task(n)
	lost, ended := e.cfg.Hooks.TaskLost, e.cfg.Hooks.TaskEnded
	if n.lost && lost != nil {
		e.hooks.put(func() { lost(n.res, n.again) }, wait)
	}
	if n.ended && ended != nil {
		e.hooks.put(func() { ended(n.res) }, wait)
	}
	if n.ended {
		e.ends.told(n.res)
		e.release()
	}
}
