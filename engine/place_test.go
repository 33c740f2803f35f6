package engine

import (
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

// TestPlace: with Config.Place set, the engine hands it what waits (in
// the order added, with the features each requires) and the idle
// workers (with theirs), and assigns what it places rather than what
// the router's own rule would; a placement of a worker that is not
// idle, or of a task on a worker without its feature, is left out.
func TestPlace(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex // guards saw
	var saw [][]string
	place := func(waiting []WaitingTask, idle []WorkerInfo) []Placement {
		var ids, names []string
		for _, w := range waiting {
			ids = append(ids, w.ID+":"+requiresKey(w.Requires))
		}
		for _, w := range idle {
			names = append(names, w.Name+":"+requiresKey(w.Features))
		}
		mu.Lock()
		saw = append(saw, append(ids, names...))
		mu.Unlock()
		var out []Placement
		// The last added first; and two that do not hold.
		for i := len(waiting) - 1; i >= 0; i-- {
			out = append(out, Placement{Task: waiting[i].ID, Worker: "nobody"})
			for _, w := range idle {
				out = append(out, Placement{Task: waiting[i].ID, Worker: w.Name})
			}
		}
		return out
	}
	logger, logs := testLogger(t)
	e := taskEngine(t, Config{Place: place, Logger: logger})
	need := e.Add(shared.Need{CPUs: 1}, 0)
	first, err := e.Submit(commandTask("first"))
	if err != nil {
		t.Fatal(err)
	}
	last, err := e.Submit(commandTask("last"))
	if err != nil {
		t.Fatal(err)
	}
	old := joinWorker(t, e, "slurm-place-old")
	// Place puts the command tasks on the old worker first: they are
	// left out, and the stand-in's need, placed after them, is its.
	if task := old.take(); task.Name != "" {
		t.Fatalf("the old worker was handed %+v; want the stand-in (a command task placed on it is left out)", task)
	}
	if l := logs.String(); !strings.Contains(l, "last does not fit slurm-place-old") || !strings.Contains(l, "nobody is not idle") {
		t.Errorf("the placements left out are not logged:\n%s", l)
	}
	w := joinWorker(t, e, "slurm-place", worker.FeatureCommand)
	if task := w.take(); task.Name != last {
		t.Errorf("the worker was handed %s; want %s, as Place said (the router's rule gives %s)", task.Name, last, first)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{need + ":", first + ":command", last + ":command", "slurm-place-old:"}
	if len(saw) == 0 || !slices.Equal(saw[0], want) {
		t.Errorf("Place first saw %q; want %q", saw, want)
	}
}
