package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/fluksio/provision/internal/sandboxtest"
)

// firstScreen is how far down every panel's heading must be: the first
// screen of a laptop's browser.
const firstScreen = 1000

// scaleView is what the scale tests read off the page.
type scaleView struct {
	Shown    float64 `json:"shown"`
	Headings []struct {
		Text string  `json:"text"`
		Top  float64 `json:"top"`
	} `json:"headings"`
	Counts   map[string]int `json:"counts"`
	Done     int            `json:"done"`
	Total    int            `json:"total"`
	Attached int            `json:"attached"`
	Busy     int            `json:"busy"`
	Reasons  map[string]struct {
		Count int    `json:"count"`
		Color string `json:"color"`
	} `json:"reasons"`
	Attention []string `json:"attention"`
	Tasks     []struct {
		Task   string `json:"task"`
		State  string `json:"state"`
		Worker string `json:"worker"`
	} `json:"tasks"`
	TasksMore int `json:"tasksMore"`
	Workers   []struct {
		Worker    string `json:"worker"`
		Task      string `json:"task"`
		AttemptID string `json:"attemptID"`
	} `json:"workers"`
	WorkersMore int `json:"workersMore"`
	// FailedAmber: the count of failed tasks is marked for a person.
	FailedAmber bool   `json:"failedAmber"`
	Ended       int    `json:"ended"`
	Progress    string `json:"progress"`
}

const readScale = `JSON.stringify({
  shown: (performance.getEntriesByName("fluksio-status-shown")[0] || {startTime: 0}).startTime,
  headings: [...document.querySelectorAll("main section h2")].map(h => ({text: h.textContent, top: h.getBoundingClientRect().top + window.scrollY})),
  counts: Object.fromEntries([...document.querySelectorAll("#counts [data-state]")].map(b => [b.dataset.state, Number(b.dataset.count)])),
  done: Number(document.getElementById("progress").dataset.done || -1),
  total: Number(document.getElementById("progress").dataset.total || -1),
  attached: Number(document.getElementById("machines").dataset.attached || -1),
  busy: Number(document.getElementById("machines").dataset.busy || -1),
  reasons: Object.fromEntries([...document.querySelectorAll("#waiting [data-reason]")].map(s => [s.dataset.reason, {count: Number(s.dataset.count), color: getComputedStyle(s).color}])),
  attention: [...document.querySelectorAll("#attention li")].map(l => l.textContent),
  tasks: [...document.querySelectorAll("#tasks tbody tr")].map(r => ({task: r.dataset.task, state: r.dataset.state, worker: r.dataset.worker})),
  tasksMore: Number(document.getElementById("tasks-more").dataset.more || 0),
  workers: [...document.querySelectorAll("#workers tbody tr")].map(r => ({worker: r.dataset.worker, task: r.dataset.task, attemptID: r.dataset.attemptId})),
  workersMore: Number(document.getElementById("workers-more").dataset.more || 0),
  failedAmber: !!document.querySelector('#counts [data-state="failed"].attention'),
  ended: Number(document.getElementById("ended-chart").dataset.ended || 0),
  progress: document.getElementById("progress-text").textContent,
})`

// scalePage is a page in chromium, its console watched.
type scalePage struct {
	ctx context.Context
	// mu guards errs.
	mu   sync.Mutex
	errs []string
	wg   sync.WaitGroup
}

// openPage loads the status page at base in a window of 1280 by
// firstScreen pixels.
func openPage(t *testing.T, base string) *scalePage {
	t.Helper()
	p := &scalePage{ctx: sandboxtest.Browser(t)}
	console := chromedp.Console(p.ctx)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for m, err := range console {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleWarning || m.Type == chromedp.ConsoleException {
				p.mu.Lock()
				p.errs = append(p.errs, m.String()+" "+m.URL)
				p.mu.Unlock()
			}
		}
	}()
	if err := chromedp.Do(p.ctx, chromedp.EmulateViewport(1280, firstScreen), chromedp.Navigate(base+"/")); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *scalePage) read(t *testing.T) scaleView {
	t.Helper()
	return p.evaluate(t, chromedp.Evaluate[string](readScale))
}

// readFresh has the page fetch GET /status and draw it, then reads it:
// a frame for every answer, as many as the test can read, rather than
// the page's own one every 2 s.
func (p *scalePage) readFresh(t *testing.T) scaleView {
	t.Helper()
	return p.evaluate(t, chromedp.Evaluate[string](`(async () => { await refreshStatus(); return `+readScale+` })()`, chromedp.EvalAwaitPromise))
}

func (p *scalePage) evaluate(t *testing.T, a chromedp.Action[string]) scaleView {
	t.Helper()
	raw, err := chromedp.Run(p.ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	var v scaleView
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// waitView reads the page until cond holds, for up to limit.
func (p *scalePage) waitView(t *testing.T, limit time.Duration, what string, cond func(scaleView) bool) scaleView {
	t.Helper()
	var v scaleView
	poll(t, limit, what, func() bool {
		v = p.read(t)
		return cond(v)
	})
	return v
}

func (p *scalePage) click(t *testing.T, selector string) {
	t.Helper()
	if _, err := chromedp.Run(p.ctx, chromedp.Evaluate[bool](fmt.Sprintf(`(() => { const b = document.querySelector(%q); if (b) b.click(); return !!b })()`, selector))); err != nil {
		t.Fatal(err)
	}
}

// close closes the browser and fails the test on what its console said.
func (p *scalePage) close(t *testing.T) {
	t.Helper()
	if err := chromedp.Cancel(p.ctx); err != nil {
		t.Logf("closing the browser: %v", err)
	}
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range p.errs {
		t.Errorf("console: %s", e)
	}
}

// pageStatus is GET /status as the scale tests compare it with the page.
type pageStatus struct {
	statusPairs
	Summary struct {
		Tasks   map[string]any `json:"tasks"`
		Workers struct {
			Attached int `json:"attached"`
			Busy     int `json:"busy"`
		} `json:"workers"`
		Needs struct {
			ByReason map[string]int `json:"by_reason"`
		} `json:"needs"`
	} `json:"summary"`
	WorkersTotal int `json:"workers_total"`
	NeedsMatched int `json:"needs_matched"`
}

func (s pageStatus) taskCount(state string) int {
	n, _ := s.Summary.Tasks[state].(float64)
	return int(n)
}

// checkLayout fails the test for a panel whose heading is below the
// first screen, or a table longer than the page's cap.
func checkLayout(t *testing.T, what string, v scaleView) {
	t.Helper()
	if len(v.Headings) < 8 {
		t.Errorf("%s: %d panels' headings; want 8", what, len(v.Headings))
	}
	for _, h := range v.Headings {
		if h.Top > firstScreen {
			t.Errorf("%s: the heading %q is %.0f px down; want every panel's within the first %d px", what, h.Text, h.Top, firstScreen)
		}
	}
	if len(v.Tasks) > 100 || len(v.Workers) > 100 {
		t.Errorf("%s: %d task rows and %d worker rows; want at most 100 each", what, len(v.Tasks), len(v.Workers))
	}
}

// checkHolds fails the test on a page that shows a task on two workers,
// a worker on two tasks, or a running task on a worker that the workers'
// table shows holding another.
func checkHolds(t *testing.T, what string, v scaleView) {
	t.Helper()
	holds := map[string]string{}
	on := map[string]string{}
	for _, w := range v.Workers {
		if w.Task == "" {
			continue
		}
		if other, ok := on[w.Task]; ok {
			t.Errorf("%s: task %s on two workers, %s and %s", what, w.Task, other, w.Worker)
		}
		on[w.Task], holds[w.Worker] = w.Worker, w.Task
	}
	seen := map[string]string{}
	for _, r := range v.Tasks {
		if r.State != "running" || r.Worker == "" {
			continue
		}
		if other, ok := seen[r.Worker]; ok {
			t.Errorf("%s: worker %s on two running tasks, %s and %s", what, r.Worker, other, r.Task)
		}
		seen[r.Worker] = r.Task
		if h, listed := holds[r.Worker]; listed && h != r.Task || !listed && len(v.Workers) < 100 {
			t.Errorf("%s: task %s shown running on %s, which the workers' table shows holding %q", what, r.Task, r.Worker, h)
		}
	}
}

// TestPageAtScale loads the status page in a real chromium (1280 by
// 1000 px) on memory runs (no Slurm) of 10,000 tasks (4 running on 4
// real workers, the rest queued under max_workers), 1,000 tasks run
// through 8 workers while the page watches, and 100,000 queued. Each
// time every panel's heading is within the first 1,000 px, the tables
// hold at most 100 rows with a count of the rest, and the counts are
// GET /status's; the workers and tasks the page shows agree on who holds
// what, frame after frame; the backlog under the cap is grey, and
// nothing is amber where nothing needs a person.
func TestPageAtScale(t *testing.T) {
	t.Run("10000", func(t *testing.T) {
		// The first 4 fail at once; the rest run for 10 minutes, 4 at a
		// time, so that what the page shows holds still.
		tasks := writeTaskFile(t, 10000, func(i int) string {
			if i < 4 {
				return fmt.Sprintf(`{"id": "q%05d", "command": ["sh", "-c", "exit 3"]}`, i)
			}
			return fmt.Sprintf(`{"id": "q%05d", "command": ["sleep", "600"]}`, i)
		})
		r := startMemRun(t, 4, tasks)
		r.startWorkers(t)
		var st pageStatus
		// A task is placed between passes; the pass after it (at most
		// provisionEvery later) finds the 4 machines attached and says
		// the rest wait under the cap. Until then they wait as queued.
		poll(t, 60*time.Second, "4 tasks failed, 4 running and 9,992 waiting under the cap", func() bool {
			st = pageStatus{}
			return getJSON(r.base+"/status?limit=100", &st) == nil && st.taskCount("failed") == 4 && st.taskCount("running") == 4 &&
				st.taskCount("waiting") == 9992 && st.Summary.Workers.Busy == 4 && st.Summary.Needs.ByReason["capped"] == 9992
		})
		p := openPage(t, r.base)
		v := p.waitView(t, 30*time.Second, "the page to show 4 running and 9,992 capped", func(v scaleView) bool {
			return v.Counts["running"] == 4 && len(v.Workers) == 4 && v.Reasons["capped"].Count == 9992
		})
		// Read again, now that the page shows it.
		st = pageStatus{}
		if err := getJSON(r.base+"/status?limit=100", &st); err != nil {
			t.Fatal(err)
		}
		t.Logf("10,000 tasks: the status shown %.0f ms after navigation; %q; headings %+v", v.Shown, v.Progress, v.Headings)
		checkLayout(t, "10,000 tasks", v)
		checkHolds(t, "10,000 tasks", v)
		for _, s := range []string{"waiting", "running", "succeeded", "failed"} {
			if v.Counts[s] != st.taskCount(s) {
				t.Errorf("the page counts %d %s; GET /status %d", v.Counts[s], s, st.taskCount(s))
			}
		}
		if v.Total != 10000 || v.Done != 4 || v.Attached != 4 || v.Busy != 4 {
			t.Errorf("the page's progress %d of %d, machines %d attached, %d busy; want 4 of 10,000, 4 and 4", v.Done, v.Total, v.Attached, v.Busy)
		}
		if len(v.Tasks) != 100 || v.TasksMore != 9900 {
			t.Errorf("the tasks' table: %d rows and %d more; want 100 and 9,900", len(v.Tasks), v.TasksMore)
		}
		var pagePairs, statusPairs []string
		for _, w := range v.Workers {
			pagePairs = append(pagePairs, w.Worker+"="+w.Task)
		}
		for _, w := range st.Workers {
			statusPairs = append(statusPairs, w.Name+"="+w.Task)
		}
		slices.Sort(pagePairs)
		slices.Sort(statusPairs)
		if !slices.Equal(pagePairs, statusPairs) {
			t.Errorf("the page's workers hold %v; GET /status says %v", pagePairs, statusPairs)
		}
		capped, ok := v.Reasons["capped"]
		if !ok || capped.Count != st.Summary.Needs.ByReason["capped"] || capped.Color != "rgb(85, 85, 85)" {
			t.Errorf("the backlog under the cap on the page: %+v; want %d, grey (rgb(85, 85, 85)), as GET /status counts it", v.Reasons, st.Summary.Needs.ByReason["capped"])
		}
		// The failed tasks, and nothing else, ask for a person.
		if len(v.Attention) != 1 || !strings.HasPrefix(v.Attention[0], "4 task(s) failed") || !v.FailedAmber {
			t.Errorf("the page asks for a person for %q (the failed count amber: %v); want the 4 failed tasks alone", v.Attention, v.FailedAmber)
		}
		// The running filter lists the 4 running, on the workers that
		// hold them.
		p.click(t, `#task-filters button[data-state="running"]`)
		v = p.waitView(t, 10*time.Second, "the running tasks alone", func(v scaleView) bool {
			return len(v.Tasks) == 4 && !slices.ContainsFunc(v.Tasks, func(r struct {
				Task   string `json:"task"`
				State  string `json:"state"`
				Worker string `json:"worker"`
			}) bool {
				return r.State != "running"
			})
		})
		checkHolds(t, "10,000 tasks, running", v)
		if v.TasksMore != 0 {
			t.Errorf("4 running and %d more", v.TasksMore)
		}
		p.close(t)
	})

	t.Run("1000", func(t *testing.T) {
		tasks := writeTaskFile(t, 1000, func(i int) string { return fmt.Sprintf(`{"id": "r%04d", "command": ["true"]}`, i) })
		r := startMemRun(t, 8, tasks, "-linger", "5m")
		p := openPage(t, r.base)
		p.waitView(t, 30*time.Second, "the page to show 1,000 waiting", func(v scaleView) bool { return v.Counts["waiting"] == 1000 })
		p.click(t, `#task-filters button[data-state="running"]`)
		r.startWorkers(t)
		// Frame after frame as fast as the page fetches and draws, no
		// pause between: each frame is one GET /status answer.
		frames, running := 0, 0
		var v scaleView
		for deadline := time.Now().Add(3 * time.Minute); v.Counts["succeeded"] != 1000; frames++ {
			if time.Now().After(deadline) {
				t.Fatalf("after 3m the page shows %v", v.Counts)
			}
			v = p.readFresh(t)
			if len(v.Tasks) > 0 {
				running++
			}
			checkHolds(t, fmt.Sprintf("1,000 tasks, frame %d", frames), v)
		}
		if running == 0 {
			t.Errorf("no frame of %d showed a task running", frames)
		}
		var st pageStatus
		if err := getJSON(r.base+"/status?limit=100", &st); err != nil {
			t.Fatal(err)
		}
		v = p.read(t)
		t.Logf("1,000 tasks: %d frames read while they ran, %d with tasks running; %q", frames, running, v.Progress)
		checkLayout(t, "1,000 tasks", v)
		if v.Counts["succeeded"] != st.taskCount("succeeded") || v.Done != 1000 || v.Total != 1000 || v.Ended != 1000 {
			t.Errorf("the page: %d succeeded, %d of %d done, %d in the chart; GET /status: %d succeeded", v.Counts["succeeded"], v.Done, v.Total, v.Ended, st.taskCount("succeeded"))
		}
		if !strings.Contains(v.Progress, "1,000 of 1,000 tasks ended") {
			t.Errorf("progress %q", v.Progress)
		}
		p.close(t)
	})

	t.Run("100000 queued", func(t *testing.T) {
		if testing.Short() {
			t.Skip("submits 100,000 tasks")
		}
		tasks := writeTaskFile(t, 100000, func(i int) string { return fmt.Sprintf(`{"id": "z%06d", "command": ["true"]}`, i) })
		r := startMemRun(t, 4, tasks)
		var st pageStatus
		poll(t, 2*time.Minute, "100,000 tasks submitted", func() bool {
			st = pageStatus{}
			return getJSON(r.base+"/status?limit=100", &st) == nil && st.taskCount("waiting") == 100000
		})
		// What the page asks for every 2 s, timed as a figure for the
		// log, not a bound.
		start := time.Now()
		if err := getJSON(r.base+"/status?limit=100", &st); err != nil {
			t.Fatal(err)
		}
		answered := time.Since(start)
		p := openPage(t, r.base)
		v := p.waitView(t, time.Minute, "the page to show 100,000 waiting", func(v scaleView) bool { return v.Shown > 0 && v.Counts["waiting"] == 100000 })
		t.Logf("100,000 queued: GET /status?limit=100 answered in %s; the status shown %.0f ms after navigation; %q", answered.Round(time.Millisecond), v.Shown, v.Progress)
		checkLayout(t, "100,000 queued", v)
		if len(v.Tasks) != 100 || v.TasksMore != 99900 {
			t.Errorf("the tasks' table: %d rows and %d more; want 100 and 99,900", len(v.Tasks), v.TasksMore)
		}
		p.close(t)
	})
}
