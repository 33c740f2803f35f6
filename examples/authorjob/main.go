// Authorjob is an engine author's first real job, done with the engine
// kit and its own worker: 30 tasks, each sha256sum of an input that
// exists only on the engine's machine (20 needing 1 CPU, 10 needing 2),
// one that fails with exit 3, one sleep 300 cancelled once it runs, and
// one long task that runs again if its job is cancelled under it; then a
// clean stop. It prints one line per task and exits 0 when every task
// ended as it should.
//
//	authorjob -config FILE -inputs DIR
//
// DIR holds in-00.bin … in-29.bin.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

func main() { os.Exit(run()) }

func run() int {
	configPath := flag.String("config", "", "the configuration `file`")
	inputs := flag.String("inputs", "", "the `directory` of in-NN.bin")
	flag.Parse()
	cfg, diags := engine.LoadConfig(*configPath)
	if diags.HasErrors() {
		fmt.Fprintln(os.Stderr, diags.Error())
		return 1
	}
	eng, err := engine.New(engine.Config{
		Provisioners: cfg.Provisioners,
		Secret:       host.RandomSecret(),
		ID:           host.EngineIdentity(cfg.Engine.ID, cfg.Path),
		Listen:       cfg.Engine.Listen,
		Hooks: engine.Hooks{TaskEnded: func(r engine.TaskResult) {
			a := r.Attempts[len(r.Attempts)-1]
			fmt.Printf("%s %s attempts=%d job=%s %s\n", r.ID, r.State, len(r.Attempts), a.JobID, strings.TrimSpace(r.Stdout))
		}},
	})
	if err == nil {
		err = eng.Serve(eng.Mux(nil, false))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx := context.Background()
	defer eng.Stop(ctx)
	if diags := eng.Start(ctx); diags.HasErrors() {
		fmt.Fprintln(os.Stderr, diags.Error())
		return 1
	}

	want, err := submitJob(eng, *inputs)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	told := map[string]bool{}
	done := func() bool {
		ended := 0
		for id := range want {
			r, _ := eng.Task(id)
			if r.State == engine.TaskRunning && !told[id] && (id == "sleep" || id == "long") {
				told[id] = true
				fmt.Printf("%s running on job %s\n", id, r.Attempts[len(r.Attempts)-1].JobID)
				if id == "sleep" {
					eng.Cancel(id)
				}
			}
			if r.State != engine.TaskWaiting && r.State != engine.TaskRunning {
				ended++
			}
		}
		return ended == len(want)
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	eng.Run(rctx, done)
	code := 0
	for id, state := range want {
		if r, _ := eng.Task(id); r.State != state {
			fmt.Printf("%s: %s, want %s\n", id, r.State, state)
			code = 1
		}
	}
	return code
}

// submitJob submits the job's tasks and returns how each must end.
func submitJob(eng *engine.Engine, inputs string) (map[string]worker.TaskState, error) {
	want := map[string]worker.TaskState{}
	var refused error
	submit := func(spec engine.TaskSpec, state worker.TaskState) {
		if _, err := eng.Submit(spec); err != nil {
			refused = err
		}
		want[spec.ID] = state
	}
	for i := range 30 {
		submit(engine.TaskSpec{
			ID:      fmt.Sprintf("sum-%02d", i),
			Need:    shared.Need{CPUs: 1 + i/20},
			Command: []string{"sha256sum", "in.bin"},
			Inputs:  []engine.Input{{Name: "in.bin", Path: filepath.Join(inputs, fmt.Sprintf("in-%02d.bin", i))}},
			Retries: 2,
		}, worker.StateSucceeded)
	}
	submit(engine.TaskSpec{ID: "exit3", Need: shared.Need{CPUs: 1}, Command: []string{"sh", "-c", "echo no >&2; exit 3"}}, worker.StateFailed)
	submit(engine.TaskSpec{ID: "sleep", Need: shared.Need{CPUs: 1}, Command: []string{"sleep", "300"}}, worker.StateCancelled)
	submit(engine.TaskSpec{ID: "long", Need: shared.Need{CPUs: 1}, Command: []string{"sleep", "15"}, Retries: 2}, worker.StateSucceeded)
	return want, refused
}
