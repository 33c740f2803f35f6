package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

// The engine chooses a profile by time as well as size (issue 49): these
// tests count what it asked for.

// askedRE is the story's line for machines asked for.
var askedRE = regexp.MustCompile(`: asked for (\d+) "([^"]+)" machine\(s\)`)

// askedFor sums the machines the story says were asked for, by profile.
func askedFor(story string) map[string]int {
	asked := map[string]int{}
	for _, m := range askedRE.FindAllStringSubmatch(story, -1) {
		n, _ := strconv.Atoi(m[1])
		asked[m[2]] += n
	}
	return asked
}

// writeTasks writes lines as a tasks file and returns its path.
func writeTasks(t *testing.T, lines ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tasks.jsonl")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestE2ETimeChoosesLongEnoughProfile: profiles whose jobs last 1 and 5
// minutes, and one task of timeout 2m: it runs on a 5-minute machine,
// and no 1-minute machine is asked for (one would attach, be unable to
// take it, and be replaced: the storm of issue 49).
func TestE2ETimeChoosesLongEnoughProfile(t *testing.T) {
	t.Parallel()
	e := newE2E(t, "e2e-time")
	path := e.writeConfig(t, fmt.Sprintf(`  profile "short" {
    cpus   = 1
    ram_mb = 200
    sbatch = ["--partition=%[1]s", "--time=00:01:00"]
  }
  profile "small" {
    cpus   = 1
    ram_mb = 200
    sbatch = ["--partition=%[1]s", "--time=00:05:00"]
  }
`, e.env.Partition))
	results := filepath.Join(t.TempDir(), "results")
	tasks := writeTasks(t, `{"id": "two-minutes", "command": ["true"], "timeout": "2m"}`)
	p := e.startEngine(t, "-config", path, "-tasks", tasks, "-results", results, "-timeout", "3m")
	code := p.wait(t, 4*time.Minute)
	story := p.stdout.String()
	if code != 0 {
		t.Errorf("exit %d\nstory:\n%s\nstderr:\n%s", code, story, p.stderr)
	}
	r := readResult(t, results, "two-minutes")
	if r.State != worker.StateSucceeded || len(r.Attempts) != 1 {
		t.Errorf("the task: %s after %d attempt(s); want succeeded at once", r.State, len(r.Attempts))
	}
	asked := askedFor(story)
	if asked["short"] != 0 || asked["small"] != 1 {
		t.Errorf("machines asked for: %v; want 1 small and no short\nstory:\n%s", asked, story)
	}
	t.Logf("a 2-minute task on profiles of 1 and 5 minutes: machines asked %v", asked)
}

// TestE2ETooLongRefusedBeforeAsking: a task of 10 minutes where every
// profile's jobs last 5 is refused before any machine is asked for,
// naming the times: by the tasks file's check (at its line), by -need,
// and by Engine.Submit.
func TestE2ETooLongRefusedBeforeAsking(t *testing.T) {
	t.Parallel()
	e := newE2E(t, "e2e-long")
	path := e.writeConfig(t, fmt.Sprintf(`  profile "small" {
    cpus   = 1
    ram_mb = 200
    sbatch = ["--partition=%s", "--time=00:05:00"]
  }
`, e.env.Partition))
	var lines []string
	for i := range 6 {
		lines = append(lines, fmt.Sprintf(`{"id": "a%d", "command": ["true"], "timeout": "1m"}`, i))
	}
	lines = append(lines, `{"id": "b2", "command": ["true"], "timeout": "10m"}`)
	tasks := writeTasks(t, lines...)
	const words = "timeout 10m is longer than any profile's jobs: the longest is small (5m, --time=00:05:00)"

	p := e.startEngine(t, "-config", path, "-tasks", tasks, "-results", filepath.Join(t.TempDir(), "results"), "-timeout", "1m")
	if code := p.wait(t, 2*time.Minute); code != 2 {
		t.Errorf("exit %d; want 2", code)
	}
	if want := tasks + `:7: task "b2": ` + words; !strings.Contains(p.stderr.String(), want) {
		t.Errorf("stderr lacks %q:\n%s", want, p.stderr)
	}
	if asked := askedFor(p.stdout.String()); len(asked) != 0 {
		t.Errorf("machines asked for: %v; want none\nstory:\n%s", asked, p.stdout)
	}

	p = e.startEngine(t, "-config", path, "-need", "cpus=1,work=10m", "-timeout", "1m")
	if code := p.wait(t, 2*time.Minute); code != 2 {
		t.Errorf("-need: exit %d; want 2", code)
	}
	if want := "-need cpus=1,work=10m0s: work 10m is longer than any profile's jobs: the longest is small (5m, --time=00:05:00)"; !strings.Contains(p.stderr.String(), want) {
		t.Errorf("-need: stderr lacks %q:\n%s", want, p.stderr)
	}
	if asked := askedFor(p.stdout.String()); len(asked) != 0 {
		t.Errorf("-need: machines asked for: %v; want none", asked)
	}

	var mu sync.Mutex
	requested := 0
	eng := e.directEngine(t, path, engine.Hooks{Burst: func(_ string, pd shared.ProfileDemand) {
		mu.Lock()
		requested += pd.Requested
		mu.Unlock()
	}})
	_, err := eng.Submit(engine.TaskSpec{ID: "b2", Need: shared.Need{CPUs: 1}, Command: []string{"true"}, Timeout: 10 * time.Minute})
	var fe *engine.FitError
	if !errors.As(err, &fe) || !errors.Is(err, engine.ErrNothingHolds) || err.Error() != words {
		t.Errorf("Submit: %v (%T); want a FitError %q", err, err, words)
	}
	if len(eng.Needs()) != 0 {
		t.Errorf("the engine holds %d need(s) after the refusal; want none", len(eng.Needs()))
	}
	if _, err := eng.Submit(engine.TaskSpec{ID: "a1", Need: shared.Need{CPUs: 64}, Command: []string{"true"}}); err == nil ||
		!strings.Contains(err.Error(), "needs cpus=64, more than any profile's machines: the largest is small (1 cpus, 200 MB, 5m, --time=00:05:00)") {
		t.Errorf("Submit of 64 cpus: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if requested != 0 || e.queue(t) != "" {
		t.Errorf("%d machine(s) asked for, queue %q; want none", requested, e.queue(t))
	}
}

// TestE2EDefaultTimeLifetime: a profile without --time lasts its
// partition's DefaultTime, 2 minutes on a private sandbox: a 5-minute
// task is refused naming it, a 1-minute one runs.
func TestE2EDefaultTimeLifetime(t *testing.T) {
	env := sandboxtest.PrivateWith(t, "deftime", sandboxtest.Options{DefaultTime: "2"})
	e := newE2EOn(t, "e2e-deft", env)
	path := e.writeConfig(t, fmt.Sprintf(`  profile "plain" {
    cpus   = 1
    ram_mb = 200
    sbatch = ["--partition=%s"]
  }
`, e.env.Partition))
	long := writeTasks(t, `{"id": "five", "command": ["true"], "timeout": "5m"}`)
	p := e.startEngine(t, "-config", path, "-tasks", long, "-results", filepath.Join(t.TempDir(), "results"), "-timeout", "1m")
	if code := p.wait(t, 2*time.Minute); code != 2 {
		t.Errorf("the 5-minute task: exit %d; want 2", code)
	}
	want := long + `:1: task "five": timeout 5m is longer than any profile's jobs: the longest is plain (2m, partition ` + e.env.Partition + `'s DefaultTime=00:02:00)`
	if !strings.Contains(p.stderr.String(), want) {
		t.Errorf("stderr lacks %q:\n%s", want, p.stderr)
	}
	if asked := askedFor(p.stdout.String()); len(asked) != 0 {
		t.Errorf("machines asked for the 5-minute task: %v; want none", asked)
	}

	results := filepath.Join(t.TempDir(), "results")
	short := writeTasks(t, `{"id": "one", "command": ["true"], "timeout": "1m"}`)
	p = e.startEngine(t, "-config", path, "-tasks", short, "-results", results, "-timeout", "2m")
	if code := p.wait(t, 3*time.Minute); code != 0 {
		t.Errorf("the 1-minute task: exit %d\nstory:\n%s\nstderr:\n%s", code, p.stdout, p.stderr)
	}
	if r := readResult(t, results, "one"); r.State != worker.StateSucceeded {
		t.Errorf("the 1-minute task: %s; want succeeded", r.State)
	}
	if asked := askedFor(p.stdout.String()); asked["plain"] != 1 {
		t.Errorf("machines asked for the 1-minute task: %v; want 1 plain", asked)
	}
}

// TestE2EMismatchAsksOnce: a task that requires a feature the profile's
// workers lack (a payload task; host-example's worker runs commands
// alone) gets one machine: it attaches, cannot take the task, idles to
// max_idle (30 s) and leaves, and no other is asked for; GET /status
// says why the task waits (mismatch, the feature named).
func TestE2EMismatchAsksOnce(t *testing.T) {
	t.Parallel()
	e := newE2E(t, "e2e-mism")
	path := e.taskConfig(t, 1, `  poll_interval = "2s"`)
	var mu sync.Mutex
	requested := 0
	var told []engine.Mismatch
	gone := false
	eng := e.directEngine(t, path, engine.Hooks{
		Burst: func(_ string, pd shared.ProfileDemand) {
			mu.Lock()
			requested += pd.Requested
			mu.Unlock()
		},
		Mismatch: func(m engine.Mismatch) {
			mu.Lock()
			told = append(told, m)
			mu.Unlock()
		},
		WorkerGone: func(engine.WorkerInfo, string) {
			mu.Lock()
			gone = true
			mu.Unlock()
		},
	})
	if _, err := eng.Submit(engine.TaskSpec{ID: "wants-payload", Need: shared.Need{CPUs: 1}, Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		eng.Run(ctx, func() bool { return false })
	}()
	defer func() {
		cancel()
		<-ran
	}()
	poll(t, 2*time.Minute, "the machine to attach, mismatch and leave after max_idle", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(told) > 0 && gone
	})
	// The worker is gone and the task still waits: the demand is back,
	// and the router answers it with the mismatch for as long as its
	// hold (5 minutes); 15 passes of the run loop are watched.
	reason, detail := "", ""
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); {
		reason, detail = e.waitingWhy(t, "wants-payload")
		mu.Lock()
		n := requested
		mu.Unlock()
		if n != 1 {
			t.Fatalf("%d machines asked for; want 1", n)
		}
		time.Sleep(time.Second)
	}
	if reason != string(engine.ReasonMismatch) || !strings.Contains(detail, "lacks payload, which the task requires") {
		t.Errorf("GET /status says the task waits %s: %q; want mismatch, naming the feature", reason, detail)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(told) != 1 || told[0].Cause != engine.MismatchFeatures || told[0].Count != 1 {
		t.Errorf("mismatches told %+v; want one, of features", told)
	}
	t.Logf("a machine that cannot take the task: %d asked for; /status: %s", requested, detail)
}

// waitingWhy is GET /status's reason and detail for need id, "" if it
// does not wait.
func (e *e2e) waitingWhy(t *testing.T, id string) (string, string) {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/status", e.port))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct {
		Needs []engine.NeedStatus `json:"needs"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	for _, n := range st.Needs {
		if n.ID == id && n.State == engine.NeedWaiting {
			return string(n.Reason), n.Detail
		}
	}
	return "", ""
}

// directEngine is the kit's engine on config path, serving its routes
// and with its plugins started, without host-example's run around it:
// what an embedder has. It is stopped when the test ends.
func (e *e2e) directEngine(t *testing.T, path string, hooks engine.Hooks) *engine.Engine {
	t.Helper()
	cfg, diags := engine.LoadConfig(path)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	eng, err := engine.New(engine.Config{Provisioners: cfg.Provisioners, Digest: cfg.Digest, Secret: host.RandomSecret(), ID: e.name,
		Listen: cfg.Engine.Listen, Hooks: hooks, TaskDir: t.TempDir(),
		Logger: hclog.New(&hclog.LoggerOptions{Name: "engine", Output: testWriter{t}, Level: hclog.Info})})
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.Serve(eng.Mux(nil, true)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		eng.Stop(ctx)
	})
	if diags := eng.Start(context.Background()); diags.HasErrors() {
		t.Fatal(diags)
	}
	return eng
}

// testWriter writes to the test's log, a line a Write.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
