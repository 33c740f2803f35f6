package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// maxQuietLines is the most a run of tasks that all succeed may print,
// not on a terminal, however many tasks it runs.
const maxQuietLines = 40

// statusPairs is what GET /status says about who holds what.
type statusPairs struct {
	Workers []struct {
		Name      string `json:"name"`
		Task      string `json:"task"`
		AttemptID string `json:"attempt_id"`
	} `json:"workers"`
	Needs []struct {
		ID        string `json:"id"`
		State     string `json:"state"`
		Worker    string `json:"worker"`
		Task      string `json:"task"`
		AttemptID string `json:"attempt_id"`
	} `json:"needs"`
}

// holdsCheck says what in one GET /status answer breaks "a worker holds
// one task, and a task is on one worker": a worker on two assigned
// needs, a task on two workers, a need on a worker the workers' list
// shows holding another attempt. Empty when nothing does.
func holdsCheck(st statusPairs) []string {
	var bad []string
	held := map[string]string{}
	onWorker := map[string]string{}
	for _, w := range st.Workers {
		if w.AttemptID == "" {
			continue
		}
		held[w.Name] = w.AttemptID
		if other, ok := onWorker[w.Task]; ok && w.Task != "" {
			bad = append(bad, fmt.Sprintf("task %s on two workers: %s and %s", w.Task, other, w.Name))
		}
		onWorker[w.Task] = w.Name
	}
	needOn := map[string]string{}
	for _, n := range st.Needs {
		if n.State != "assigned" || n.Worker == "" {
			continue
		}
		if other, ok := needOn[n.Worker]; ok {
			bad = append(bad, fmt.Sprintf("worker %s on two assigned tasks: %s and %s", n.Worker, other, n.ID))
		}
		needOn[n.Worker] = n.ID
		if held[n.Worker] != n.AttemptID {
			bad = append(bad, fmt.Sprintf("task %s shown on %s (attempt %s), which holds %q", n.ID, n.Worker, n.AttemptID, held[n.Worker]))
		}
	}
	return bad
}

// watchHolds reads GET /status's assigned needs and workers over and
// over until ctx ends, and returns the answers it read and what broke
// holdsCheck in them.
func watchHolds(ctx context.Context, base string) (func() (int, []string), *sync.WaitGroup) {
	var mu sync.Mutex
	var reads int
	var bad []string
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			var st statusPairs
			if err := getJSON(base+"/status?state=assigned", &st); err != nil {
				continue
			}
			mu.Lock()
			reads++
			if b := holdsCheck(st); len(b) > 0 && len(bad) < 20 {
				bad = append(bad, b...)
			}
			mu.Unlock()
		}
	}()
	return func() (int, []string) {
		mu.Lock()
		defer mu.Unlock()
		return reads, bad
	}, &wg
}

// TestRunQuietAtScale runs 1,000 tasks of `true` on 8 real workers
// (a memory run: no Slurm) with host-example run -tasks, its stdout not
// a terminal: at most maxQuietLines lines, no line per task, the
// summary counting 1,000 succeeded; meanwhile no GET /status answer
// shows a worker on two tasks or a task on two workers. Then 200 tasks
// of which 5 fail: each failed task is named on a line of its own and
// in the summary, still within maxQuietLines, and the run exits 1.
func TestRunQuietAtScale(t *testing.T) {
	t.Run("all succeed", func(t *testing.T) {
		tasks := writeTaskFile(t, 1000, func(i int) string { return fmt.Sprintf(`{"id": "t%04d", "command": ["true"]}`, i) })
		r := startMemRun(t, 8, tasks, "-timeout", "5m")
		r.startWorkers(t)
		ctx, cancel := context.WithCancel(context.Background())
		seen, watching := watchHolds(ctx, r.base)
		code := r.p.wait(t, 5*time.Minute)
		cancel()
		watching.Wait()
		story := r.p.stdout.String()
		lines := len(r.p.stdout.Lines())
		logLines := strings.Count(r.p.stderr.String(), "\n")
		reads, bad := seen()
		t.Logf("1,000 tasks on 8 workers: exit %d, %d lines of story, %d of log, %d /status answers read during the run\n%s", code, lines, logLines, reads, story)
		if code != 0 {
			t.Errorf("exit %d; want 0\nstderr:\n%s", code, r.p.stderr)
		}
		if lines > maxQuietLines {
			t.Errorf("%d lines of story for 1,000 tasks that succeeded; want at most %d", lines, maxQuietLines)
		}
		if !strings.Contains(story, "summary: 1000 task(s): 1000 succeeded") {
			t.Errorf("no summary of 1000 succeeded")
		}
		if strings.Contains(story, "task t0") {
			t.Errorf("a task that succeeded has a line of its own without -v")
		}
		if reads == 0 {
			t.Errorf("no GET /status answer was read during the run")
		}
		for _, b := range bad {
			t.Errorf("GET /status during the run: %s", b)
		}
	})
	t.Run("some fail", func(t *testing.T) {
		failing := map[string]bool{}
		tasks := writeTaskFile(t, 200, func(i int) string {
			id := fmt.Sprintf("f%03d", i)
			if i%40 == 7 {
				failing[id] = true
				return fmt.Sprintf(`{"id": %q, "command": ["sh", "-c", "echo broke >&2; exit 3"]}`, id)
			}
			return fmt.Sprintf(`{"id": %q, "command": ["true"]}`, id)
		})
		r := startMemRun(t, 4, tasks, "-timeout", "5m")
		r.startWorkers(t)
		code := r.p.wait(t, 5*time.Minute)
		story := r.p.stdout.String()
		lines := len(r.p.stdout.Lines())
		t.Logf("200 tasks, %d failing: exit %d, %d lines of story\n%s", len(failing), code, lines, story)
		if code != 1 {
			t.Errorf("exit %d; want 1 (not every task succeeded)", code)
		}
		if lines > maxQuietLines {
			t.Errorf("%d lines of story; want at most %d", lines, maxQuietLines)
		}
		var summary string
		for _, l := range r.p.stdout.Lines() {
			if strings.Contains(l.text, "] summary: ") {
				summary = l.text
			}
		}
		for id := range failing {
			if !strings.Contains(story, "task "+id+" failed (exit 3)") {
				t.Errorf("failed task %s has no line of its own", id)
			}
			if !strings.Contains(summary, id) {
				t.Errorf("the summary does not name failed task %s: %s", id, summary)
			}
		}
		if !strings.Contains(summary, "195 succeeded, 5 failed") {
			t.Errorf("summary %q; want 195 succeeded, 5 failed", summary)
		}
	})
}
