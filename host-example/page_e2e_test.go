package main

import (
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/internal/sandboxtest"
)

// pageView is what the test reads off the page.
type pageView struct {
	Mark  int      `json:"mark"`
	Provs []string `json:"provs"`
	Jobs  []struct {
		Job     string `json:"job"`
		Profile string `json:"profile"`
		State   string `json:"state"`
	} `json:"jobs"`
	Workers []string `json:"workers"`
	// WorkerCount is the count above the workers' table.
	WorkerCount int      `json:"workerCount"`
	Failures    []string `json:"failures"`
	Bars        int      `json:"bars"`
	Needs       []string `json:"needs"`
	Timeline    int      `json:"timeline"`
}

const readPage = `JSON.stringify({
  mark: window.__loadMark || 0,
  provs: [...document.querySelectorAll('#provisioners [data-provisioner]')].map(e => e.dataset.provisioner),
  jobs: [...document.querySelectorAll('#jobs tbody tr')].map(r => ({job: r.dataset.job, profile: r.children[2].textContent, state: r.children[4].textContent})),
  workers: [...document.querySelectorAll('#workers tbody tr')].map(r => r.dataset.job),
  workerCount: Number(document.getElementById('workers-summary').dataset.count || -1),
  failures: [...document.querySelectorAll('#failures li')].map(l => l.textContent),
  bars: document.querySelectorAll('#tta-chart rect').length,
  needs: [...document.querySelectorAll('#tasks tbody tr')].map(r => r.dataset.reason),
  timeline: document.querySelectorAll('#timeline li').length,
})`

// TestE2EStatusPage loads the status page in a real headless chromium
// during a real run and watches it without reloading: it shows the
// provisioner; the slow profile's job appears PENDING (Slurm's word) and
// turns attached when its worker arrives, which then shows among the
// attached workers; the broken profile's failure shows with Slurm's
// reason; a time-to-attach bar is drawn. Nothing is logged as an error
// in the console, and no request leaves the engine's origin.
func TestE2EStatusPage(t *testing.T) {
	ctx := sandboxtest.Browser(t)
	r := startObservedRun(t, "e2e-page", "cpus=1,label=slow,work=1s")

	// Subscribed before the page loads, so nothing is missed; read on
	// goroutines of their own, which end when the browser is closed.
	var mu sync.Mutex
	var consoleErrors, requests []string
	var readers sync.WaitGroup
	console := chromedp.Console(ctx)
	sent := chromedp.Events(ctx, network.RequestWillBeSent)
	readers.Add(2)
	go func() {
		defer readers.Done()
		for m, err := range console {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleWarning || m.Type == chromedp.ConsoleException {
				mu.Lock()
				consoleErrors = append(consoleErrors, m.String()+" "+m.URL)
				mu.Unlock()
			}
		}
	}()
	go func() {
		defer readers.Done()
		for ev, err := range sent {
			if err != nil {
				return
			}
			mu.Lock()
			requests = append(requests, ev.Request.URL)
			mu.Unlock()
		}
	}()
	if err := chromedp.Do(ctx, chromedp.Navigate(r.base+"/")); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[int](`window.__loadMark = 42`)); err != nil {
		t.Fatal(err)
	}

	var view pageView
	read := func() {
		raw, err := chromedp.Run(ctx, chromedp.Evaluate[string](readPage))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(raw), &view); err != nil {
			t.Fatal(err)
		}
	}
	// The slow job's states as the page showed them, in order, without
	// repeats.
	var slowJob string
	var states []string
	seenFailure := ""
	// The reasons the page gave for a waiting need, as it showed them.
	reasons := map[string]bool{}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if r.p.exited() {
			t.Fatalf("the engine exited early\nstdout:\n%s\nstderr:\n%s", r.p.stdout, r.p.stderr)
		}
		read()
		for _, r := range view.Needs {
			reasons[r] = true
		}
		for _, j := range view.Jobs {
			if j.Profile == "slow" && (slowJob == "" || j.Job == slowJob) {
				slowJob = j.Job
				if len(states) == 0 || states[len(states)-1] != j.State {
					states = append(states, j.State)
				}
			}
		}
		for _, f := range view.Failures {
			if strings.Contains(f, "broken") && strings.Contains(f, "ended FAILED") {
				seenFailure = f
			}
		}
		attachedShown := slowJob != "" && slices.Contains(view.Workers, slowJob)
		if slices.Contains(states, "attached") && attachedShown && seenFailure != "" && view.Bars > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 2m the page shows: %+v\nslow job %q went through %v; failure %q\nstory:\n%s", view, slowJob, states, seenFailure, r.p.stdout)
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("slow job %s on the page: %v; failure: %q; %d timeline entries, %d time-to-attach bars", slowJob, states, seenFailure, view.Timeline, view.Bars)
	if view.WorkerCount != len(view.Workers) {
		t.Errorf("the page counts %d workers attached above a table of %d", view.WorkerCount, len(view.Workers))
	}
	if !slices.Contains(view.Provs, r.e.name) {
		t.Errorf("the page does not show the provisioner %s: %v", r.e.name, view.Provs)
	}
	if i, j := slices.Index(states, "PENDING"), slices.Index(states, "attached"); i < 0 || j < i {
		t.Errorf("the slow job went through %v on the page; want PENDING, then attached", states)
	}
	// While its job waited in Slurm's queue, the need said so, from the
	// engine's typed reason.
	if !reasons[string(engine.ReasonQueued)] {
		t.Errorf("the page never showed a need waiting because %q; it showed %v", engine.ReasonQueued, reasons)
	}
	if view.Mark != 42 {
		t.Errorf("the page was reloaded (its mark is gone)")
	}
	// Closed before the engine stops, whose end the page would rightly
	// report as a lost connection.
	if err := chromedp.Cancel(ctx); err != nil {
		t.Logf("closing the browser: %v", err)
	}
	readers.Wait()
	mu.Lock()
	for _, e := range consoleErrors {
		t.Errorf("console: %s", e)
	}
	for _, u := range requests {
		if !strings.HasPrefix(u, r.base+"/") {
			t.Errorf("a request left the engine's origin: %s", u)
		}
	}
	t.Logf("%d requests, all to %s", len(requests), r.base)
	mu.Unlock()
	r.stop(t)
}
