package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/worker"
)

// TestRunTasksResume runs a map-reduce of 40 tasks through host-example
// run -tasks on real workers (a memory run: no Slurm), kills the engine
// with SIGKILL once some have succeeded, and runs the same file again
// with -resume into the same results: every task whose result.json
// was there, succeeded, is kept (its result.json the same bytes and
// mtime, its command not run again), the rest run once, the reduce's
// sum is right, the directories of the tasks cut short are moved to
// .earlier/, and run exits 0, its summary counting the kept. Then a
// map's command changes and a group's output is deleted: those two run
// again with every task after them (six), the other 34 are kept. In
// between, a run with nothing changed keeps all 40, asks for nothing and
// exits 0.
//
// Each task's command first appends its id to a log outside the
// results, so the log counts the runs of every task across the runs.
func TestRunTasksResume(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "attempts.log")
	var lines []string
	task := func(format string, a ...any) { lines = append(lines, fmt.Sprintf(format, a...)) }
	sum := `awk '{s+=$1} END {print s}'`
	// The reduce and the groups come first: run submits each after
	// what it runs after.
	finalIn := map[string]any{}
	for g := range 4 {
		finalIn[fmt.Sprintf("g%d", g)] = map[string]string{"task": fmt.Sprintf("group-%d", g), "path": "sum"}
	}
	in, _ := json.Marshal(finalIn)
	task(`{"id": "final", "command": ["sh", "-c", "echo final >> %s; cat g* | %s > total"], "inputs": %s, "outputs": ["total"]}`, log, sum, in)
	want := 0
	for g := range 4 {
		groupIn := map[string]any{}
		for k := range 8 {
			groupIn[fmt.Sprintf("c%d", k)] = map[string]string{"task": fmt.Sprintf("map-%02d", 8*g+k), "path": "out/c"}
		}
		in, _ := json.Marshal(groupIn)
		task(`{"id": "group-%d", "command": ["sh", "-c", "echo group-%d >> %s; cat c* | %s > sum"], "inputs": %s, "outputs": ["sum"]}`, g, g, log, sum, in)
	}
	for g := range 3 {
		task(`{"id": "report-%d", "command": ["sh", "-c", "echo report-%d >> %s"], "after": ["group-%d"]}`, g, g, log, g)
	}
	mapLine := func(i, n int) string {
		return fmt.Sprintf(`{"id": "map-%02d", "command": ["sh", "-c", "echo map-%02d >> %s; echo working; sleep 1.2; mkdir -p out; echo %d > out/c"], "outputs": ["out/"]}`, i, i, log, n)
	}
	for i := range 32 {
		lines = append(lines, mapLine(i, 100+i))
		want += 100 + i
	}
	tasks := writeTaskFile(t, len(lines), func(i int) string { return lines[i] })
	results := filepath.Join(dir, "results")
	var ids []string
	for _, l := range lines {
		var v struct{ ID string }
		json.Unmarshal([]byte(l), &v)
		ids = append(ids, v.ID)
	}

	// runsOf counts each task's runs in the log from byte off on, and
	// says where the log ends.
	runsOf := func(off int) (map[string]int, int) {
		b, _ := os.ReadFile(log)
		n := map[string]int{}
		for _, l := range strings.Fields(string(b[off:])) {
			n[l]++
		}
		return n, len(b)
	}
	resultFiles := func() []string {
		m, _ := filepath.Glob(filepath.Join(results, "*", "result.json"))
		return m
	}

	// The first run, killed once 14 tasks have ended and a task that
	// runs has written to its stdout under the results.
	r1 := startMemRun(t, 4, "", "-tasks", tasks, "-results", results, "-timeout", "5m")
	r1.startWorkers(t)
	poll(t, 3*time.Minute, "14 tasks' result.json, and a task's stdout", func() bool {
		if r1.p.exited() {
			t.Fatalf("the first run ended before it was killed\n%s", r1.p.stdout)
		}
		if len(resultFiles()) < 14 {
			return false
		}
		outs, _ := filepath.Glob(filepath.Join(results, "*", "stdout"))
		for _, o := range outs {
			if _, err := os.Stat(filepath.Join(filepath.Dir(o), "result.json")); err != nil {
				return true
			}
		}
		return false
	})
	syscall.Kill(-r1.p.cmd.Process.Pid, syscall.SIGKILL)
	<-r1.p.done
	// Its machines go with it, as the next run's adoption would cancel
	// their jobs.
	r1.mu.Lock()
	for i, w := range r1.workers {
		w.Process.Kill()
		<-r1.done[i]
	}
	r1.mu.Unlock()
	t.Logf("first run killed after %s", time.Since(r1.p.started).Round(time.Millisecond))

	type kept struct {
		body []byte
		mod  time.Time
	}
	before := map[string]kept{}
	for _, f := range resultFiles() {
		b, err := os.ReadFile(f)
		fi, serr := os.Stat(f)
		var res resultFile
		if err != nil || serr != nil || json.Unmarshal(b, &res) != nil {
			t.Fatalf("%s after the kill: %v %v; a result.json that is there is whole", f, err, serr)
		}
		if res.State != worker.StateSucceeded || len(res.SpecSHA256) != 64 {
			t.Fatalf("%s: %s, spec_sha256 %q; want succeeded with its digest", f, res.State, res.SpecSHA256)
		}
		before[res.ID] = kept{b, fi.ModTime()}
	}
	// The tasks cut short left a directory with no result.json.
	var cut []string
	for _, id := range ids {
		if _, ok := before[id]; !ok {
			if _, err := os.Stat(filepath.Join(results, id)); err == nil {
				cut = append(cut, id)
			}
		}
	}
	slices.Sort(cut)
	_, off := runsOf(0)

	// The second: -resume keeps what succeeded and runs the rest.
	r2 := startMemRun(t, 4, "", "-tasks", tasks, "-results", results, "-resume", "-v", "-timeout", "5m")
	r2.startWorkers(t)
	code := r2.p.wait(t, 5*time.Minute)
	took := time.Since(r2.p.started)
	story := r2.p.stdout.String()
	if code != 0 {
		t.Fatalf("the resumed run: exit %d; want 0\n%s\n%s", code, story, r2.p.stderr)
	}
	runs, off2 := runsOf(off)
	for id, k := range before {
		b, _ := os.ReadFile(filepath.Join(results, id, "result.json"))
		fi, err := os.Stat(filepath.Join(results, id, "result.json"))
		if err != nil || !bytes.Equal(b, k.body) || !fi.ModTime().Equal(k.mod) {
			t.Errorf("%s's result.json changed in the resumed run", id)
		}
		if runs[id] != 0 {
			t.Errorf("%s was kept, yet ran %d time(s) again", id, runs[id])
		}
	}
	for _, id := range ids {
		if _, ok := before[id]; !ok && runs[id] != 1 {
			t.Errorf("%s ran %d time(s) in the resumed run; want once", id, runs[id])
		}
		var res resultFile
		b, _ := os.ReadFile(filepath.Join(results, id, "result.json"))
		if err := json.Unmarshal(b, &res); err != nil || res.State != worker.StateSucceeded {
			t.Errorf("%s: %s (%v); want succeeded", id, res.State, err)
		}
	}
	total := func() string {
		b, _ := os.ReadFile(filepath.Join(results, "final", "outputs", "total"))
		return strings.TrimSpace(string(b))
	}
	if got := total(); got != fmt.Sprint(want) {
		t.Errorf("the reduce's total %q; want %d", got, want)
	}
	nkept, nrun := len(before), len(ids)-len(before)
	for _, w := range []string{
		fmt.Sprintf("resume: %d task(s) kept from an earlier run (succeeded, unchanged), %d to run", nkept, nrun),
		fmt.Sprintf("summary: %d task(s): %d kept from an earlier run, %d succeeded", len(ids), nkept, nrun),
	} {
		if !strings.Contains(story, w) {
			t.Errorf("the story lacks %q\n%s", w, story)
		}
	}
	earlier, _ := filepath.Glob(filepath.Join(results, ".earlier", "*", "*"))
	var moved []string
	for _, e := range earlier {
		moved = append(moved, filepath.Base(e))
	}
	slices.Sort(moved)
	if !slices.Equal(moved, cut) {
		t.Errorf("moved aside %v; want the tasks cut short, %v", moved, cut)
	}
	if len(cut) > 0 && !strings.Contains(story, fmt.Sprintf("resume: moved %d earlier task director(ies) of tasks that run again to %s", len(cut), filepath.Join(results, ".earlier"))) {
		t.Errorf("the story does not say what was moved aside\n%s", story)
	}
	var keptNotMaps []string
	for id := range before {
		if !strings.HasPrefix(id, "map-") {
			keptNotMaps = append(keptNotMaps, id)
		}
	}
	t.Logf("killed with %d of %d result.json written (%d cut short, moved aside); resumed: %d kept (beyond maps: %v), %d run, exit %d in %s",
		nkept, len(ids), len(cut), nkept, keptNotMaps, nrun, code, took.Round(time.Millisecond))

	// Again, nothing changed: every task is kept, nothing is asked
	// for or run (no worker is started), and run exits 0.
	// (It exits before it would answer startMemRun's GET /health, so it
	// runs here on the second run's configuration, on a port of its
	// own.)
	cfg, err := os.ReadFile(filepath.Join(r2.dir, "config.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	cfg = regexp.MustCompile(`127\.0\.0\.1:\d+`).ReplaceAll(cfg, []byte(fmt.Sprintf("127.0.0.1:%d", sandboxtest.FreePort(t))))
	cfgFile := filepath.Join(t.TempDir(), "config.hcl")
	os.WriteFile(cfgFile, cfg, 0o644)
	allKept := exec.Command(r2.p.cmd.Path, "run", "-config", cfgFile, "-tasks", tasks, "-results", results, "-resume", "-timeout", "2m")
	allKept.Env = r2.p.cmd.Env
	start := time.Now()
	out, err := allKept.Output()
	if story := string(out); err != nil || !strings.Contains(story, "resume: 40 task(s) kept from an earlier run (succeeded, unchanged), 0 to run") ||
		!strings.Contains(story, "summary: 40 task(s): 40 kept from an earlier run;") || strings.Contains(story, "asked for") {
		t.Errorf("all kept: %v; want exit 0, 40 kept, nothing asked for\n%s", err, story)
	}
	if runs, _ := runsOf(off2); len(runs) != 0 {
		t.Errorf("all kept, yet ran: %v", runs)
	}
	t.Logf("all kept: exit 0 in %s", time.Since(start).Round(time.Millisecond))

	// The third: map-03's command changed, group-1's output deleted.
	lines[slices.Index(ids, "map-03")] = mapLine(3, 1003)
	tasks = writeTaskFile(t, len(lines), func(i int) string { return lines[i] })
	if err := os.Remove(filepath.Join(results, "group-1", "outputs", "sum")); err != nil {
		t.Fatal(err)
	}
	resultOf := func(id string) []byte {
		b, _ := os.ReadFile(filepath.Join(results, id, "result.json"))
		return b
	}
	keptBody := resultOf("map-04")
	r3 := startMemRun(t, 2, "", "-tasks", tasks, "-results", results, "-resume", "-v", "-timeout", "5m")
	r3.startWorkers(t)
	code = r3.p.wait(t, 5*time.Minute)
	took = time.Since(r3.p.started)
	story = r3.p.stdout.String()
	if code != 0 {
		t.Fatalf("the changed run: exit %d; want 0\n%s\n%s", code, story, r3.p.stderr)
	}
	runs, _ = runsOf(off2)
	var rerun []string
	for id, n := range runs {
		if n != 1 {
			t.Errorf("%s ran %d times; want once", id, n)
		}
		rerun = append(rerun, id)
	}
	slices.Sort(rerun)
	if want := []string{"final", "group-0", "group-1", "map-03", "report-0", "report-1"}; !slices.Equal(rerun, want) {
		t.Errorf("ran again: %v; want %v", rerun, want)
	}
	if got := total(); got != fmt.Sprint(want+1003-103) {
		t.Errorf("the reduce's total %q; want %d", got, want+1003-103)
	}
	if !bytes.Equal(resultOf("map-04"), keptBody) {
		t.Error("map-04's result.json changed; it was kept")
	}
	for _, w := range []string{
		"resume: 34 task(s) kept from an earlier run (succeeded, unchanged), 6 to run (1 changed, 1 with an output missing or changed, 4 after a task that runs again)",
		"task map-03 runs: it changed since",
		`task group-1 runs: its output "sum" is gone`,
		"task group-0 runs: it runs after task map-03, which runs again",
		"resume: moved 6 earlier task director(ies) of tasks that run again to",
		"summary: 40 task(s): 34 kept from an earlier run, 6 succeeded",
	} {
		if !strings.Contains(story, w) {
			t.Errorf("the story lacks %q\n%s", w, story)
		}
	}
	t.Logf("changed run: 34 kept, %d run (%v), exit %d in %s", len(rerun), rerun, code, took.Round(time.Millisecond))
}

// TestE2ERunTasksResume is TestRunTasksResume's crash on Slurm: run
// -tasks with a map-reduce of 12 maps on one-CPU machines (max_workers
// 3), the engine and its plugin killed together with SIGKILL once some
// tasks have succeeded (its jobs stay in the queue, as after a crash of
// the engine's machine), then the same file again with -resume into
// the same results: the tasks that had succeeded keep their result.json
// byte for byte, the rest run, the reduce's sum is right, run exits 0,
// and nothing of either run is left in the queue.
func TestE2ERunTasksResume(t *testing.T) {
	e := newE2E(t, "e2e-resume")
	e.killPluginsAtEnd(t)
	cfg := e.taskConfig(t, 1, `  max_workers   = 3
  poll_interval = "2s"`)
	inputs := map[string]any{}
	lines := []string{}
	want := 0
	for i := range 12 {
		id := fmt.Sprintf("map-%02d", i)
		lines = append(lines, fmt.Sprintf(`{"id": %q, "command": ["sh", "-c", "sleep 1; echo %d > count"], "outputs": ["count"]}`, id, 100+i))
		inputs[fmt.Sprintf("c%02d", i)] = map[string]string{"task": id, "path": "count"}
		want += 100 + i
	}
	in, _ := json.Marshal(inputs)
	lines = append([]string{fmt.Sprintf(`{"id": "reduce", "command": ["sh", "-c", "cat c* | awk '{s+=$1} END {print s}' > sum"], "inputs": %s, "outputs": ["sum"]}`, in)}, lines...)
	tasks := writeTaskFile(t, len(lines), func(i int) string { return lines[i] })
	results := filepath.Join(t.TempDir(), "results")
	succeeded := func() map[string][]byte {
		got := map[string][]byte{}
		files, _ := filepath.Glob(filepath.Join(results, "*", "result.json"))
		for _, f := range files {
			b, err := os.ReadFile(f)
			var res resultFile
			if err != nil || json.Unmarshal(b, &res) != nil {
				t.Fatalf("%s: %v; a result.json that is there is whole", f, err)
			}
			if res.State == worker.StateSucceeded {
				got[res.ID] = b
			}
		}
		return got
	}

	p1 := e.startEngine(t, "-config", cfg, "-tasks", tasks, "-results", results, "-timeout", "5m", "-log-level", "debug")
	reapMasters(t, p1)
	poll(t, 3*time.Minute, "3 tasks succeeded in the first run", func() bool {
		if p1.exited() {
			t.Fatalf("the first run ended before it was killed\n%s", p1.stdout)
		}
		return len(succeeded()) >= 3
	})
	// The engine and its plugin at once: no shutdown of the plugin's
	// cancels the jobs.
	syscall.Kill(-p1.cmd.Process.Pid, syscall.SIGKILL)
	p1.waitDone(t, 10*time.Second)
	killedAt := time.Now()
	kept := succeeded()
	left := e.queue(t)
	t.Logf("first run killed after %s: %d of %d succeeded; left in the queue:\n%s",
		killedAt.Sub(p1.started).Round(time.Millisecond), len(kept), len(lines), left)
	if left == "" {
		t.Fatal("the killed run left no job in the queue; the resume's cleanup would prove nothing")
	}
	if len(kept) >= len(lines) {
		t.Fatal("every task succeeded before the kill; the resume would run nothing")
	}

	p2 := e.startEngine(t, "-config", cfg, "-tasks", tasks, "-results", results, "-resume", "-timeout", "5m", "-log-level", "debug")
	code := p2.wait(t, 5*time.Minute)
	exitedAt := time.Now()
	story := p2.stdout.String()
	t.Logf("the resumed run, exit %d in %s:\n%s", code, exitedAt.Sub(p2.started).Round(time.Millisecond), story)
	if code != 0 {
		t.Fatalf("exit %d; want 0\nstderr:\n%s", code, p2.stderr)
	}
	// The killed run's jobs are the resumed run's to clean up: its
	// plugin cancels each (their workers' credentials are of the dead
	// engine's secret), rather than each ending by itself.
	for _, l := range strings.Split(left, "\n") {
		job := regexp.MustCompile(`\bjob=` + regexp.QuoteMeta(strings.Fields(l)[0]) + `(\s|$)`)
		if !slices.ContainsFunc(strings.Split(p2.stderr.String(), "\n"), func(s string) bool {
			return strings.Contains(s, "cancelled a job nobody will use") && job.MatchString(s)
		}) {
			t.Errorf("job %s of the killed run was not cancelled by the resumed run's plugin\nstderr:\n%s", strings.Fields(l)[0], p2.stderr)
		}
	}
	after := succeeded()
	for id, b := range kept {
		if !bytes.Equal(after[id], b) {
			t.Errorf("%s had succeeded before the kill; its result.json changed in the resumed run", id)
		}
	}
	if len(after) != len(lines) {
		t.Errorf("%d of %d tasks succeeded after the resume", len(after), len(lines))
	}
	sum, err := os.ReadFile(filepath.Join(results, "reduce", "outputs", "sum"))
	if err != nil || strings.TrimSpace(string(sum)) != fmt.Sprint(want) {
		t.Errorf("the reduce's sum: %q, %v; want %d", sum, err, want)
	}
	if w := fmt.Sprintf("resume: %d task(s) kept from an earlier run (succeeded, unchanged), %d to run", len(kept), len(lines)-len(kept)); !strings.Contains(story, w) {
		t.Errorf("the story lacks %q", w)
	}
	e.assertCleanedUp(t, exitedAt)
}
