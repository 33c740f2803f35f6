package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/internal/testutil"
	"github.com/fluksio/provision/shared"
)

// TestPageWorksOtherSitesDoNot: in a real chromium, run's status page
// (its own origin, behind the operator's guard) loads, reads /status and
// shows the provisioner, with nothing logged as an error; a page of
// another site (another port on 127.0.0.1) that posts a form
// (text/plain) and a no-cors fetch to /v1/tasks/ID/cancel, from the
// same browser and the engine's own uid, cancels nothing: both reach the
// engine and are refused 403.
func TestPageWorksOtherSitesDoNot(t *testing.T) {
	ctx := sandboxtest.Browser(t)
	bin := testutil.BuildTestPlugin(t)
	cfgPath := filepath.Join(t.TempDir(), "engine.hcl")
	body := fmt.Sprintf("engine {\n  listen = \"127.0.0.1:0\"\n}\nprovisioner \"memory\" \"mem\" {\n  plugin = %q\n  greeting = \"hi\"\n}\n", bin)
	if err := os.WriteFile(cfgPath, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, diags := engine.LoadConfig(cfgPath)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	logger, logs := testLogger(t)
	d, err := newDaemon(cfg, logger, newStory(&lockedBuffer{}), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.stop)
	if diags := d.start(context.Background()); diags.HasErrors() {
		t.Fatal(diags)
	}
	// A task with no worker to run it waits: the attack's target.
	id, err := d.eng.Submit(engine.TaskSpec{ID: "target", Need: shared.Need{CPUs: 1}, Command: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var consoleErrors, engineRequests []string
	base := strings.TrimSuffix(d.pageURL(), "/")
	// The page itself is behind the guard: a rebound name reads none of
	// it.
	for _, path := range []string{"/", "/app.js"} {
		req, _ := http.NewRequest("GET", base+path, nil)
		req.Host = "evil.example"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("GET %s with Host: evil.example: %d; want 403", path, resp.StatusCode)
		}
	}
	var readers sync.WaitGroup
	console := chromedp.Console(ctx)
	sent := chromedp.Events(ctx, network.ResponseReceived)
	readers.Add(2)
	go func() {
		defer readers.Done()
		for m, err := range console {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleException {
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
			if strings.HasPrefix(ev.Response.URL, base+"/v1/tasks/") {
				mu.Lock()
				engineRequests = append(engineRequests, fmt.Sprintf("%s %d", ev.Response.URL, ev.Response.Status))
				mu.Unlock()
			}
		}
	}()

	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		raw, err := chromedp.Run(ctx, chromedp.Evaluate[string](`JSON.stringify([...document.querySelectorAll('#provisioners [data-provisioner]')].map(e => e.dataset.provisioner))`))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(raw, `"mem"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page shows provisioners %s; want mem, read from /status\n%s", raw, logs)
		}
		time.Sleep(100 * time.Millisecond) // paces the poll; the deadline decides
	}
	mu.Lock()
	if len(consoleErrors) > 0 {
		t.Errorf("the page logged errors: %q", consoleErrors)
	}
	mu.Unlock()

	cancel := base + "/v1/tasks/" + id + "/cancel"
	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><title>cute cats</title>
<iframe name="sink"></iframe>
<form id="f" method="POST" action="%[1]s" enctype="text/plain" target="sink"><input name="x" value="y"></form>
<script>
let loads = 0;
document.querySelector('iframe').addEventListener('load', () => { if (++loads === 1) window.__formDone = true; });
fetch(%[1]q, {method: 'POST', mode: 'no-cors', body: 'x=y', headers: {'Content-Type': 'text/plain'}})
  .then(() => { window.__fetchDone = 'answered'; }, e => { window.__fetchDone = 'failed: ' + e; });
document.getElementById('f').submit();
</script>`, cancel)
	}))
	defer attacker.Close()
	if err := chromedp.Do(ctx, chromedp.Navigate(attacker.URL+"/")); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(30 * time.Second)
	for {
		raw, err := chromedp.Run(ctx, chromedp.Evaluate[string](`JSON.stringify([!!window.__formDone, window.__fetchDone || ''])`))
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		reached := len(engineRequests)
		mu.Unlock()
		if strings.HasPrefix(raw, `[true,"`) && !strings.HasSuffix(raw, `""]`) && reached >= 2 {
			t.Logf("the other site's page: %s", raw)
			break
		}
		if time.Now().After(deadline) {
			mu.Lock()
			t.Fatalf("the other site's requests did not finish: %s; reached the engine: %q", raw, engineRequests)
		}
		time.Sleep(100 * time.Millisecond) // paces the poll; the deadline decides
	}
	mu.Lock()
	reached := slices.Clone(engineRequests)
	mu.Unlock()
	for _, r := range reached {
		if !strings.HasSuffix(r, " 403") {
			t.Errorf("the other site's request was answered %s; want 403", r)
		}
	}
	if res, _ := d.eng.Task(id); res.State != engine.TaskWaiting {
		t.Errorf("the other site's page cancelled the task: %s; reached the engine: %q", res.State, reached)
	}
}
