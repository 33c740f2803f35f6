// Authorjob is an engine author's first real job, done with the engine
// kit and its own worker: 30 tasks, each sha256sum of an input that
// exists only on the engine's machine (20 needing 1 CPU, 10 needing 2),
// and a reduce after them that takes their 30 sums as its inputs; one
// task that fails with exit 3 and one after it, which never runs; one
// sleep 300 cancelled once it runs; and one long task that runs again
// if its job is cancelled under it; then a clean stop. It prints one
// line per task and exits 0 when every task ended as it should.
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
	var eng *engine.Engine
	eng, err := engine.New(engine.Config{
		Provisioners: cfg.Provisioners,
		Secret:       host.RandomSecret(),
		ID:           host.EngineIdentity(cfg.Engine.ID, cfg.Path),
		Listen:       cfg.Engine.Listen,
		Hooks: engine.Hooks{
			TaskStarted: func(a engine.Activity) {
				if (a.Task == "sleep" || a.Task == "long") && a.Attempt == 1 {
					fmt.Printf("%s running on job %s\n", a.Task, a.Job)
				}
				if a.Task == "sleep" {
					eng.Cancel(a.Task)
				}
			},
		},
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

	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	ends := eng.Ended(wctx)
	want, err := submitJob(eng, *inputs)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// Each end once, as it comes; then Wait, which has them all.
	ids, ok := each(ends, len(want))
	if !ok {
		return 1
	}
	results, err := eng.Wait(wctx, ids...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := 0
	if len(results) != len(want) {
		fmt.Printf("%d tasks ended, want %d\n", len(results), len(want))
		code = 1
	}
	for _, r := range results {
		if r.State != want[r.ID] {
			fmt.Printf("%s: %s, want %s\n", r.ID, r.State, want[r.ID])
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
	reduce := engine.TaskSpec{ID: "reduce", Need: shared.Need{CPUs: 1}, Command: []string{"sh", "-c", "cat s-* | wc -l"}}
	for i := range 30 {
		id := fmt.Sprintf("sum-%02d", i)
		submit(engine.TaskSpec{
			ID:      id,
			Need:    shared.Need{CPUs: 1 + i/20},
			Command: []string{"sh", "-c", "sha256sum in.bin | tee sum.txt"},
			Inputs:  []engine.Input{{Name: "in.bin", Path: filepath.Join(inputs, fmt.Sprintf("in-%02d.bin", i))}},
			Outputs: []string{"sum.txt"},
			Retries: 2,
		}, worker.StateSucceeded)
		reduce.Inputs = append(reduce.Inputs, engine.Input{Name: "s-" + id, FromTask: id, Path: "sum.txt"})
	}
	submit(reduce, worker.StateSucceeded)
	submit(engine.TaskSpec{ID: "exit3", Need: shared.Need{CPUs: 1}, Command: []string{"sh", "-c", "echo no >&2; exit 3"}}, worker.StateFailed)
	submit(engine.TaskSpec{ID: "after-exit3", Need: shared.Need{CPUs: 1}, Command: []string{"true"}, After: []string{"exit3"}}, worker.StateCancelled)
	submit(engine.TaskSpec{ID: "sleep", Need: shared.Need{CPUs: 1}, Command: []string{"sleep", "300"}}, worker.StateCancelled)
	submit(engine.TaskSpec{ID: "long", Need: shared.Need{CPUs: 1}, Command: []string{"sleep", "15"}, Retries: 2}, worker.StateSucceeded)
	return want, refused
}

// each prints each of n ends as it comes on ends, and returns their
// tasks' ids; false if a task ended twice.
func each(ends <-chan engine.TaskResult, n int) ([]string, bool) {
	ids := make([]string, 0, n)
	seen := map[string]bool{}
	for r := range ends {
		if seen[r.ID] {
			fmt.Printf("%s ended twice\n", r.ID)
			return ids, false
		}
		seen[r.ID] = true
		job := ""
		if len(r.Attempts) > 0 {
			job = r.Attempts[len(r.Attempts)-1].JobID
		}
		fmt.Printf("%s %s attempts=%d job=%s %s\n", r.ID, r.State, len(r.Attempts), job, strings.TrimSpace(r.Stdout))
		if ids = append(ids, r.ID); len(ids) == n {
			break
		}
	}
	return ids, true
}
