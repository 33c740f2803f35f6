package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/worker"
)

// attemptSpan is one task's run on its machine.
type attemptSpan struct {
	task, worker, job string
	from, to          time.Time
}

// spansOf reads the first attempt of each task's result.json.
func spansOf(t *testing.T, results string, ids []string) []attemptSpan {
	t.Helper()
	var out []attemptSpan
	for _, id := range ids {
		var res engine.TaskResult
		b, err := os.ReadFile(filepath.Join(results, id, "result.json"))
		if err == nil {
			err = json.Unmarshal(b, &res)
		}
		if err != nil || res.State != worker.StateSucceeded || len(res.Attempts) == 0 {
			t.Fatalf("%s: %s, %v; want succeeded", id, res.State, err)
		}
		a := res.Attempts[0]
		out = append(out, attemptSpan{id, a.Worker, a.JobID, a.Started, a.Ended})
	}
	return out
}

// mostAtOnce is the most spans that overlap at any instant, among those
// that keep says.
func mostAtOnce(spans []attemptSpan, keep func(attemptSpan) bool) int {
	type edge struct {
		at   time.Time
		step int
	}
	var edges []edge
	for _, s := range spans {
		if keep(s) {
			edges = append(edges, edge{s.from, 1}, edge{s.to, -1})
		}
	}
	// An end before a start at the same instant: touching spans do not
	// overlap.
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.step - b.step
	})
	n, most := 0, 0
	for _, e := range edges {
		n += e.step
		most = max(most, n)
	}
	return most
}

// askedManyRe finds what a provisioner was asked for in the story.
var askedManyRe = regexp.MustCompile(`: asked for (\d+) "(\S+)" machine\(s\)`)

// TestE2ESlotsPackEightToAMachine: 16 one-CPU tasks of `sleep 6` on a
// profile of 8 CPUs under max_workers = 4: the engine asks for 2
// machines (the tasks' CPUs, not their number: 16 would be capped at 4),
// 2 jobs run them, each machine runs 8 at once and never more, and all
// succeed. One at a time they would take 96 s of one machine.
func TestE2ESlotsPackEightToAMachine(t *testing.T) {
	e := newE2E(t, "e2e-slots")
	cfg := e.writeConfig(t, fmt.Sprintf(`  max_workers = 4
  profile "p8" {
    cpus   = 8
    ram_mb = 800
    sbatch = ["--partition=%s", "--time=00:10:00"]
  }
`, e.env.Partition))
	var ids []string
	tasks := writeTaskFile(t, 16, func(i int) string {
		ids = append(ids, fmt.Sprintf("s%02d", i))
		return fmt.Sprintf(`{"id": "s%02d", "cpus": 1, "command": ["sh", "-c", "test \"$FLUKSIO_CPUS\" = 1 && sleep 6"]}`, i)
	})
	results := filepath.Join(t.TempDir(), "results")
	p := e.startEngine(t, "-config", cfg, "-tasks", tasks, "-results", results, "-timeout", "3m")
	code := p.wait(t, 4*time.Minute)
	exitedAt := time.Now()
	story := p.stdout.String()
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, story, p.stderr)
	}
	asked := 0
	for _, m := range askedManyRe.FindAllStringSubmatch(story, -1) {
		n, _ := strconv.Atoi(m[1])
		asked += n
	}
	spans := spansOf(t, results, ids)
	jobs := map[string]bool{}
	for _, s := range spans {
		jobs[s.job] = true
	}
	first, last := spans[0].from, spans[0].to
	for _, s := range spans {
		first, last = minTime(first, s.from), maxTime(last, s.to)
	}
	var perJob []string
	for j := range jobs {
		n := mostAtOnce(spans, func(s attemptSpan) bool { return s.job == j })
		perJob = append(perJob, fmt.Sprintf("%s:%d", j, n))
		if n != 8 {
			t.Errorf("job %s ran %d tasks at once at most; want 8, its CPUs", j, n)
		}
	}
	t.Logf("asked for %d machine(s), %d job(s) ran the 16 tasks, at most %v at once each, %d in all; makespan %s",
		asked, len(jobs), perJob, mostAtOnce(spans, func(attemptSpan) bool { return true }), last.Sub(first).Round(10*time.Millisecond))
	if asked != 2 || len(jobs) != 2 {
		t.Errorf("asked for %d machine(s), %d job(s) ran the tasks; want 2 and 2\n%s", asked, len(jobs), story)
	}
	e.assertCleanedUp(t, exitedAt)
}

// TestE2ESlotsSplitTheGPUs: two one-GPU tasks on a machine of 2 GPUs
// (the sandbox's gres) run at once, each seeing one device of the
// job's in CUDA_VISIBLE_DEVICES, not the same one; a task of no GPUs
// beside them sees none.
func TestE2ESlotsSplitTheGPUs(t *testing.T) {
	e := newE2E(t, "e2e-gpus")
	if e.env.GPUs < 2 {
		t.Fatalf("the sandbox has %d GPUs; the test needs 2", e.env.GPUs)
	}
	cfg := e.writeConfig(t, fmt.Sprintf(`  max_workers = 1
  profile "g2" {
    cpus   = 4
    gpus   = 2
    ram_mb = 400
    labels = ["cuda"]
    sbatch = ["--partition=%s", "--time=00:10:00"]
  }
`, e.env.Partition))
	show := `echo "${CUDA_VISIBLE_DEVICES-unset}" > dev; sleep 3`
	lines := []string{
		fmt.Sprintf(`{"id": "gpu-a", "cpus": 1, "gpus": 1, "command": ["sh", "-c", %q], "outputs": ["dev"]}`, show),
		fmt.Sprintf(`{"id": "gpu-b", "cpus": 1, "gpus": 1, "command": ["sh", "-c", %q], "outputs": ["dev"]}`, show),
		fmt.Sprintf(`{"id": "cpu-c", "cpus": 1, "command": ["sh", "-c", %q], "outputs": ["dev"]}`, show),
	}
	tasks := writeTaskFile(t, len(lines), func(i int) string { return lines[i] })
	results := filepath.Join(t.TempDir(), "results")
	p := e.startEngine(t, "-config", cfg, "-tasks", tasks, "-results", results, "-timeout", "3m")
	code := p.wait(t, 4*time.Minute)
	exitedAt := time.Now()
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, p.stdout, p.stderr)
	}
	dev := func(id string) string {
		b, err := os.ReadFile(filepath.Join(results, id, "outputs", "dev"))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	a, b, c := dev("gpu-a"), dev("gpu-b"), dev("cpu-c")
	spans := spansOf(t, results, []string{"gpu-a", "gpu-b", "cpu-c"})
	together := mostAtOnce(spans, func(s attemptSpan) bool { return s.task != "cpu-c" })
	t.Logf("CUDA_VISIBLE_DEVICES: gpu-a %q, gpu-b %q, cpu-c %q; the GPU tasks %d at once", a, b, c, together)
	if a == b || strings.Contains(a, ",") || strings.Contains(b, ",") || a == "" || b == "" || a == "unset" || b == "unset" {
		t.Errorf("the GPU tasks saw %q and %q; want one device each, not the same", a, b)
	}
	if c != "" {
		t.Errorf("the task of no GPUs saw %q; want an empty CUDA_VISIBLE_DEVICES", c)
	}
	if together != 2 || spans[0].job != spans[1].job {
		t.Errorf("the GPU tasks ran %d at once on jobs %s and %s; want 2 at once on one job", together, spans[0].job, spans[1].job)
	}
	e.assertCleanedUp(t, exitedAt)
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
