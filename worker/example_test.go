package worker_test

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

// A Go engine's own worker: its main is Serve with a function that runs
// a task's payload. Serve attaches with the payload feature, polls, runs
// each task, reports its Outcome, and leaves when idle for --max-idle;
// the engine's cancel ends the function's ctx.
func ExampleServe() {
	// The engine here is the package's test double; on a compute node it
	// is the engine whose URL the provisioner passes, and the credential
	// is in the job's environment.
	engine := worker.StartTestEngine()
	defer engine.Close()
	task := engine.AddPayload("world")
	getenv := func(k string) string {
		if k == shared.WorkerTokenEnv {
			return engine.Token()
		}
		return os.Getenv(k)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	code := worker.Serve(ctx, []string{"--url", engine.URL(), "--cpus", "1", "--max-idle", "1"}, getenv,
		func(ctx context.Context, t worker.Task) (worker.Outcome, error) {
			if err := ctx.Err(); err != nil {
				return worker.Outcome{}, err // cancelled before it began
			}
			return worker.Outcome{Output: "hello, " + string(t.Payload)}, nil
		})

	res := engine.Result(task)
	fmt.Println(code, res.State, res.Output)
	// Output: 0 succeeded hello, world
}
