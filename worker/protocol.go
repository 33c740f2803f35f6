package worker

import "time"

// The worker protocol's messages, as the engine (engine) and the
// worker (this package's Run) exchange them over HTTP; docs/worker-protocol.md
// says what each request and answer means and what a worker does on each
// status. They live here, beside the client, and not in the engine,
// because a worker runs on a compute node and must not link the engine
// kit (go-plugin, gRPC, HCL): the engine imports this package, never the
// other way.
//
// Fields are added, never repurposed: both sides ignore fields they do not
// know, so a newer worker talks to an older engine and back.

// SessionHeader carries the session secret an attach was answered with, on
// every later request of the worker (work, result, detach).
const SessionHeader = "Fluksio-Session"

// RunningParam is the query parameter in which a worker with slots
// (FeatureSlots) names, comma-separated, the attempt ids it runs: on GET
// /v1/work every task it runs, so that the engine sends again one whose
// answer was lost on the way; on GET /v1/watch those it has not been
// told to cancel, so that a cancel whose answer was lost is told again.
// A task stays named until its result has been given.
const RunningParam = "running"

// OffsetHeader is on every 2xx answer to POST /v1/work/ID/log/STREAM:
// how many bytes of the stream the engine has now.
const OffsetHeader = "Fluksio-Offset"

// Codes tell apart answers a worker treats differently under one status.
const (
	// CodePollOpen comes with 409 on GET /v1/work: a poll of this worker
	// is still open on the engine's side. Wait a moment and poll again;
	// do not attach again.
	CodePollOpen = "poll_open"
	// CodeLeave comes with 410 on GET /v1/work: the engine is stopping
	// cleanly and lets its workers go. Detach and exit 0, so the job ends
	// as completed rather than failed.
	CodeLeave = "leave"
)

// Need is what a task needs of the machine it runs on.
type Need struct {
	CPUs  int    `json:"cpus"`
	GPUs  int    `json:"gpus"`
	RAMMB int64  `json:"ram_mb"`
	Label string `json:"label,omitempty"`
}

// Features a worker names at attach (AttachRequest.Features): the kinds
// of task it can run. The engine gives a task only to a worker that has
// every feature the task requires (Task.Requires), so a worker that
// predates a kind of task is never handed one; a worker that is handed
// one anyway refuses it (StateFailed, with Error saying which feature it
// lacks) and never "succeeds" at it.
const (
	// FeatureCommand: the worker runs Task.Command in a directory of its
	// own with the task's inputs fetched into it, streams the command's
	// stdout and stderr back, uploads its outputs, and stops it on a
	// cancel, its timeout, the engine's leave or SIGTERM (fluksio-worker).
	FeatureCommand = "command"
	// FeaturePayload: the worker's own code reads Task.Payload (a Go
	// engine's worker built on Serve).
	FeaturePayload = "payload"
	// FeatureSlots (worker protocol 1.1): the worker runs as many tasks
	// at once as its attach's CPUs, GPUs and memory hold. It polls GET
	// /v1/work while it has room, with one poll open at a time, and is
	// given only tasks that fit what is free of it; one GET /v1/watch
	// serves all its tasks, a cancel naming the task by its id; each
	// task's result is its own POST /v1/result. A worker without it is
	// given one task at a time (fluksio-worker names it unless run
	// with --slots=false).
	FeatureSlots = "slots"
)

// Task is one piece of work for one worker, as GET /v1/work answers 200.
// A task with no Command and no Payload is the project's stand-in.
type Task struct {
	// ID names this attempt of the task on the workers' routes
	// (/v1/work/ID/...); every attempt has its own.
	ID   string `json:"id"`
	Need Need   `json:"need"`
	// Name is the engine's id for the task, the same on every attempt
	// (what an operator asks GET /v1/tasks/NAME about); empty for the
	// stand-in.
	Name string `json:"name,omitempty"`
	// Attempt counts from 1.
	Attempt int `json:"attempt,omitempty"`
	// Requires lists the features (FeatureCommand, FeaturePayload) a
	// worker must have to run the task.
	Requires []string `json:"requires,omitempty"`
	// Command is the argv to run, with no shell unless it names one.
	Command []string `json:"command,omitempty"`
	// Env is added to the command's environment.
	Env map[string]string `json:"env,omitempty"`
	// Inputs are fetched into the task's directory before the command
	// runs (GET /v1/work/ID/inputs/NAME), each checked against its size
	// and digest.
	Inputs []File `json:"inputs,omitempty"`
	// Outputs are paths relative to the task's directory, uploaded after
	// the command ends (PUT /v1/work/ID/outputs/PATH), whatever its exit
	// code; one that does not exist is skipped and said.
	Outputs []string `json:"outputs,omitempty"`
	// TimeoutSeconds bounds the command's run; zero means none.
	TimeoutSeconds float64 `json:"timeout_seconds,omitempty"`
	// Payload is opaque to the engine: an engine's own worker reads it.
	Payload []byte `json:"payload,omitempty"`
	// Limits are the engine's bounds for this task; a worker that sends
	// more is cut off, so it stops at them first.
	Limits Limits `json:"limits,omitempty"`
	// WorkSeconds is how long the stand-in takes; zero means the
	// worker's stand-in computation.
	WorkSeconds float64 `json:"work_seconds,omitempty"`
}

// File is a file of a task's: an input as the engine offers it, or an
// output as the worker uploaded it. Name is relative to the task's
// directory, with no ".." element and no leading "/".
type File struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Limits are the sizes an engine accepts for one task, in bytes, and
// the files it makes for one.
type Limits struct {
	// Outputs bounds the outputs' total, each directory they make
	// counting DirBytes.
	Outputs int64 `json:"outputs,omitempty"`
	// Log bounds each of stdout and stderr as the engine keeps them.
	Log int64 `json:"log,omitempty"`
	// Files bounds the files and directories the outputs make on the
	// engine's side, each an inode; 0 says none (an older engine).
	Files int64 `json:"files,omitempty"`
}

// DirBytes is what a directory the outputs make on the engine's side
// counts against Limits.Outputs: a block of its disk.
const DirBytes = 4096

// TaskState is how a task's run ended, as a worker reports it; the
// engine adds the states only it can know (waiting, running, lost).
type TaskState string

const (
	StateSucceeded TaskState = "succeeded" // the command exited 0
	StateFailed    TaskState = "failed"    // a non-zero exit, a signal, or it could not run (Error says)
	StateCancelled TaskState = "cancelled" // the engine cancelled it
	StateTimedOut  TaskState = "timed_out" // it outlived its timeout
)

// Streams a worker appends to while a task runs
// (POST /v1/work/ID/log/STREAM?offset=N).
const (
	StreamStdout = "stdout"
	StreamStderr = "stderr"
)

// WatchAnswer is GET /v1/watch's 200 answer: stop the task named Cancel
// (kill its command's process group: TERM, then KILL after a grace
// period), report it as StateCancelled, and stay for the next task.
type WatchAnswer struct {
	Cancel string `json:"cancel"`
	Reason string `json:"reason,omitempty"`
}

// AttachRequest is POST /v1/attach's body: the machine as the worker sees
// it. JobID is the scheduler's id of the job the worker runs in, as its
// provisioner recorded it (for Slurm, <array job>_<task> for an array
// task, else the job id); the engine admits the worker only if it matches
// the job the provisioner reported for the worker's credential.
type AttachRequest struct {
	Hostname string   `json:"hostname"`
	JobID    string   `json:"job_id"`
	CPUs     int      `json:"cpus"`
	GPUs     int      `json:"gpus"`
	RAMMB    int64    `json:"ram_mb"`
	Labels   []string `json:"labels"`
	// Features are the kinds of task the worker runs (FeatureCommand,
	// FeaturePayload); none means the stand-in only.
	Features []string `json:"features,omitempty"`
	// EndsAt is when the worker's job must end, in Unix seconds; 0 if not
	// known. The engine gives the worker no task whose timeout would run
	// past EndsAt less EndMargin, and the worker leaves by then.
	EndsAt int64 `json:"ends_at,omitempty"`
}

// AttachResponse is POST /v1/attach's 200 answer.
type AttachResponse struct {
	// Worker is the name the credential gives the worker.
	Worker string `json:"worker"`
	// Session is the secret every later request must carry in
	// SessionHeader.
	Session string `json:"session"`
}

// ResultRequest is POST /v1/result's body. JobID is the same value as on
// attach.
type ResultRequest struct {
	TaskID   string `json:"task_id"`
	Hostname string `json:"hostname"`
	JobID    string `json:"job_id"`
	CPUs     int    `json:"cpus"`
	Output   string `json:"output"`
	// State is how the task ended; empty is the stand-in's success.
	State TaskState `json:"state,omitempty"`
	// ExitCode is the command's exit code, when it exited; Signal names
	// the signal that ended it ("SIGKILL"), when one did.
	ExitCode *int   `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
	// Error says why, in words, when the command could not run or was
	// stopped (an input's digest, an output too large, the timeout).
	Error string `json:"error,omitempty"`
	// Outputs are the outputs uploaded, as the worker read them.
	Outputs []File `json:"outputs,omitempty"`
	// Stdout and Stderr are how many bytes of each stream the worker
	// sent; the engine checks them against what it received.
	Stdout  int64     `json:"stdout,omitempty"`
	Stderr  int64     `json:"stderr,omitempty"`
	Started time.Time `json:"started,omitzero"`
	Ended   time.Time `json:"ended,omitzero"`
}

// ErrorResponse is the body of every answer that is not 2xx.
type ErrorResponse struct {
	Error string `json:"error"`
	// Code is CodePollOpen or CodeLeave where the status alone does not
	// say what to do; empty otherwise.
	Code string `json:"code,omitempty"`
}

// Request body limits the engine enforces: anything bigger is not a
// worker.
const (
	MaxRequestBody = 64 << 10
	// MaxResultBody leaves room for a task's output.
	MaxResultBody = 1 << 20
)
