// Soakengine is the engine the soak (make soak, soak/soak_test.go) drives:
// examples/embed's page of engine kit, with two routes more, POST
// /soak/tasks and POST /soak/withdraw, through which the soak submits
// command tasks while the engine runs and takes some back, and a
// journal, -results FILE, where the kit's hooks write what became of
// each task and worker, a JSON line each (journalLine), for the soak to
// check every result against what it submitted.
// host-example takes its tasks on the command line only, and a soak's
// workload changes over time, so the soak runs this instead; it is the
// same kit (engine) host-example is a thin layer over, so what the
// soak finds is the engine's, not this file's.
//
//	soakengine -config FILE -results FILE -task-dir DIR
//
// It serves until SIGTERM or SIGINT, then stops cleanly: workers let go,
// plugins shut down. It keeps nothing across a restart (the kit does not);
// the soak submits again what a killed engine had not finished. The
// journal is appended to with one write a line, so a line a SIGKILLed
// engine wrote is whole and stays.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/engine/hclconfig"
	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/needspec"
)

func main() {
	os.Exit(run())
}

func run() int {
	configPath := flag.String("config", "", "the configuration `file` (engine and provisioner blocks)")
	level := flag.String("log-level", "info", "the log's level (trace, debug, info, warn, error)")
	resultsPath := flag.String("results", "", "append a JSON line to this `file` for each task ended, attempt lost and worker gone")
	taskDir := flag.String("task-dir", "", "keep the tasks' stdout, stderr and outputs under this `directory` (default: the engine's own, removed at its stop)")
	flag.Parse()
	if *configPath == "" {
		fmt.Fprintln(os.Stderr, "usage: soakengine -config FILE [-results FILE] [-task-dir DIR]")
		return 2
	}
	j, err := openJournal(*resultsPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soakengine:", err)
		return 1
	}
	defer j.close()
	cfg, diags := engine.LoadConfig(*configPath)
	if diags.HasErrors() {
		hclconfig.WriteDiagnostics(os.Stderr, cfg.Files, diags)
		return 1
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: "soakengine", Level: hclog.LevelFromString(*level), Output: os.Stderr})
	secret, err := engineSecret(cfg.Engine.SecretEnv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soakengine:", err)
		return 1
	}
	eng, err := engine.New(engine.Config{
		Provisioners: cfg.Provisioners,
		Secret:       secret,
		DropEnv:      []string{cfg.Engine.SecretEnv},
		// The identity comes from the configuration's path, so a
		// restarted engine is the same engine to its plugins, which adopt
		// the jobs the last one left.
		ID:      host.EngineIdentity(cfg.Engine.ID, cfg.Path),
		Listen:  cfg.Engine.Listen,
		Logger:  logger,
		TaskDir: *taskDir,
		Hooks: engine.Hooks{
			TaskEnded: func(r engine.TaskResult) { j.write(journalLine{Kind: "ended", Task: &r}) },
			TaskLost: func(r engine.TaskResult, again bool) {
				j.write(journalLine{Kind: "lost", Task: &r, Again: again})
			},
			WorkerGone: func(w engine.WorkerInfo, why string) {
				j.write(journalLine{Kind: "gone", Worker: w.Name, JobID: w.JobID, Why: why})
			},
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "soakengine:", err)
		return 1
	}
	mux := eng.Mux(nil, true)
	mux.HandleFunc("POST /soak/tasks", submitTasks(eng))
	mux.HandleFunc("POST /soak/withdraw", withdrawTasks(eng))
	if err := eng.Serve(mux); err != nil {
		fmt.Fprintln(os.Stderr, "soakengine:", err)
		return 1
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if diags := eng.Start(ctx); diags.HasErrors() {
		fmt.Fprintln(os.Stderr, "soakengine: cannot start the provisioners:", diags.Error())
	} else {
		fmt.Println("soakengine: started")
		eng.Run(ctx, nil)
	}
	sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, r := range eng.Stop(sctx) {
		fmt.Println(r)
	}
	return 0
}

// engineSecret is the secret in the variable secretEnv names when there
// is one, so that a restarted engine accepts the credentials of the
// workers the last one started (they attach again); else this run's
// own. The variable is unset once read.
func engineSecret(secretEnv string) ([]byte, error) {
	if secretEnv == "" || os.Getenv(secretEnv) == "" {
		return host.RandomSecret(), nil
	}
	secret, err := host.ParseSecret(os.Getenv(secretEnv))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", secretEnv, err)
	}
	os.Unsetenv(secretEnv)
	return secret, nil
}

// submitTasks is POST /soak/tasks: it submits the tasks of its body, a
// JSON array of taskRequest, and answers with this process's pid (which
// engine took them, for a soak that restarts it) and, per id,
// "submitted" or why not.
func submitTasks(eng *engine.Engine) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var reqs []taskRequest
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<20)).Decode(&reqs); err != nil {
			engine.WriteError(w, http.StatusBadRequest, err.Error())
			return
		}
		answers := make(map[string]string, len(reqs))
		for _, req := range reqs {
			answers[req.ID] = "submitted"
			spec, err := req.spec()
			if err == nil {
				_, err = eng.Submit(spec)
			}
			if err != nil {
				answers[req.ID] = err.Error()
			}
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"pid": os.Getpid(), "answers": answers})
	}
}

// withdrawTasks is POST /soak/withdraw: it takes tasks back by id
// (id=..., repeated) and answers, per id, "withdrawn" or why not:
// Withdraw cancels a task that waits, and refuses one on a worker or
// ended.
func withdrawTasks(eng *engine.Engine) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil {
			engine.WriteError(w, http.StatusBadRequest, err.Error())
			return
		}
		answers := map[string]string{}
		for _, id := range r.PostForm["id"] {
			answers[id] = "withdrawn"
			if err := eng.Withdraw(id); err != nil {
				answers[id] = err.Error()
			}
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(answers)
	}
}

// taskRequest is one task of POST /soak/tasks: engine.TaskSpec as JSON,
// its need as -need takes it (without count or work).
type taskRequest struct {
	ID             string   `json:"id"`
	Need           string   `json:"need"`
	Command        []string `json:"command"`
	Inputs         []input  `json:"inputs"`
	Retries        int      `json:"retries"`
	TimeoutSeconds float64  `json:"timeout_seconds"`
}

// input is an input file: its name in the task's directory and the path
// its bytes are read from.
type input struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

func (t taskRequest) spec() (engine.TaskSpec, error) {
	n, err := needspec.Parse(t.Need)
	if err != nil {
		return engine.TaskSpec{}, err
	}
	spec := engine.TaskSpec{ID: t.ID, Need: n.Need, Command: t.Command, Retries: t.Retries,
		Timeout: time.Duration(t.TimeoutSeconds * float64(time.Second))}
	for _, in := range t.Inputs {
		spec.Inputs = append(spec.Inputs, engine.Input{Name: in.Name, Path: in.Path})
	}
	return spec, nil
}

// journalLine is one line of the journal: a task that ended (Kind
// "ended", TaskEnded), an attempt whose machine was lost ("lost",
// TaskLost; Again says whether the task waits for another worker), or a
// worker that left the books ("gone", WorkerGone), when the hook heard
// it.
type journalLine struct {
	Kind   string             `json:"kind"`
	At     time.Time          `json:"at"`
	Task   *engine.TaskResult `json:"task,omitempty"`
	Again  bool               `json:"again,omitempty"`
	Worker string             `json:"worker,omitempty"`
	JobID  string             `json:"job_id,omitempty"`
	Why    string             `json:"why,omitempty"`
}

// journal is the -results file; a nil one writes nothing.
type journal struct {
	mu sync.Mutex
	f  *os.File
}

func openJournal(path string) (*journal, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("the results journal: %w", err)
	}
	return &journal{f: f}, nil
}

// write appends l as one line, in one write: the hooks call it from the
// engine's goroutines, and a line is never interleaved or cut by a kill.
func (j *journal) write(l journalLine) {
	if j == nil {
		return
	}
	l.At = time.Now()
	b, err := json.Marshal(l)
	if err != nil {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.f.Write(append(b, '\n'))
}

func (j *journal) close() {
	if j != nil {
		j.f.Close()
	}
}
