package worker

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

// Task is one piece of work for one worker, as GET /v1/work answers 200.
type Task struct {
	ID   string `json:"id"`
	Need Need   `json:"need"`
	// WorkSeconds is how long the task takes; zero means the worker's
	// stand-in computation.
	WorkSeconds float64 `json:"work_seconds,omitempty"`
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
