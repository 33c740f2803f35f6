package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/testutil"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

// TestHoldDoubles: the nth failure in a row of a profile holds it 1 s
// doubled n-1 times, at most 2 minutes.
func TestHoldDoubles(t *testing.T) {
	t.Parallel()
	want := map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 4: 8 * time.Second, 7: 64 * time.Second, 8: 2 * time.Minute, 100: 2 * time.Minute}
	h := newHolds(nil)
	for n := 1; n <= 100; n++ {
		failures, hold, ok := h.failed("hpc", "cpu", "died", shared.FailureDiedBeforeAttach)
		if !ok || failures != n {
			t.Fatalf("failure %d: failures %d, ok %v", n, failures, ok)
		}
		if w, checked := want[n]; checked && hold != w {
			t.Errorf("failure %d in a row holds the profile %s, want %s", n, hold, w)
		}
	}
}

// TestHoldKeepsWhatIsOnItsWay: a held profile is still asked for what the
// plugin last said was on its way, less the failures since, so a failure
// among many pending machines gives none of them up; and an attach of its
// worker lifts the hold.
// TestLimitReachedIsNotHeld: a machine refused for a site's limit does
// not hold its profile back (the room comes back as jobs end, and every
// profile of the login shares the limit); any other failure does.
func TestLimitReachedIsNotHeld(t *testing.T) {
	p := newRouter(nil, newBareBooks(nil, host.NewSigner(testSecret), nil), nil)
	p.observeEvent(shared.Event{Kind: shared.EventWorkerProvisionFailed, Provisioner: "hpc", Profile: "cpu", Class: shared.FailureLimitReached, Detail: "AssocMaxSubmitJobLimit"})
	if held := p.holds.list(); len(held) != 0 {
		t.Errorf("a limit_reached failure held %+v; want nothing held", held)
	}
	p.observeEvent(shared.Event{Kind: shared.EventWorkerProvisionFailed, Provisioner: "hpc", Profile: "cpu", Class: shared.FailureDiedBeforeAttach})
	if held := p.holds.list(); len(held) != 1 || !held[0].Held {
		t.Errorf("a died_before_attach failure held %+v; want cpu held", held)
	}
}

func TestHoldKeepsWhatIsOnItsWay(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	h := newHolds(func() time.Time { return now })
	h.reported("p", []shared.ProfileDemand{{Profile: "cpu", Wanted: 50, OnTheWay: 50}})
	if keep, _ := h.allowance("p", "cpu"); keep != -1 {
		t.Fatalf("allowance before any failure = %d, want -1 (not held)", keep)
	}
	h.failed("p", "cpu", "died", "")
	if keep, _ := h.allowance("p", "cpu"); keep != 49 {
		t.Errorf("allowance after one failure among 50 on the way = %d, want 49", keep)
	}
	// An answer during the hold may lower the allowance, never raise it.
	h.reported("p", []shared.ProfileDemand{{Profile: "cpu", Wanted: 50, OnTheWay: 50}})
	if keep, _ := h.allowance("p", "cpu"); keep != 49 {
		t.Errorf("allowance after an answer during the hold = %d, want still 49", keep)
	}
	now = now.Add(1500 * time.Millisecond)
	if keep, _ := h.allowance("p", "cpu"); keep != -1 {
		t.Errorf("allowance after the 1 s hold = %d, want -1", keep)
	}
	h.failed("p", "cpu", "died again", "")
	if l := h.list(); len(l) != 1 || l[0].Failures != 2 || !l[0].Held || l[0].Until != now.Add(2*time.Second) {
		t.Errorf("list after a second failure = %+v, want 2 failures held 2 s", l)
	}
	if !h.attached("p", "cpu") {
		t.Error("attached did not lift the hold")
	}
	if keep, _ := h.allowance("p", "cpu"); keep != -1 || len(h.list()) != 0 {
		t.Errorf("after an attach: allowance %d, list %+v; want -1 and nothing", keep, h.list())
	}
}

// TestEngineHoldsAPluginThatNeverBacksOff runs the engine as the run
// command does (newDaemon, start, run) with the Go reference plugin in
// its storm mode: every machine it starts fails at once and it asks again
// on the next pass, never backing off. The engine must hold the failing
// profiles itself: at most 15 machines started in the first 10 s, by the
// plugin's own count. Then the failures stop, and the need must be served
// by the next machine. Without the engine's hold the plugin started
// thousands in those 10 s (each failure wakes a pass).
func TestEngineHoldsAPluginThatNeverBacksOff(t *testing.T) {
	bin := testutil.BuildTestPlugin(t)
	dir := t.TempDir()
	storm := filepath.Join(dir, "storm")
	if err := os.WriteFile(storm, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TESTPLUGIN_BREAK", "storm")
	t.Setenv("TESTPLUGIN_STORM_FILE", storm)
	body := fmt.Sprintf("engine {\n  listen = \"127.0.0.1:0\"\n}\nprovisioner \"memory\" \"storm\" {\n  plugin = %q\n  greeting = \"hi\"\n}\n", bin)
	d, runDone, story, logs := runDaemon(t, body, shared.Need{CPUs: 1})
	ctx := context.Background()

	// The window is measured, not waited on for anything: what the plugin
	// started in the first 10 s is the figure.
	select {
	case code := <-runDone:
		t.Fatalf("Run returned (served %v) during the storm\n%s", code, story)
	case <-time.After(10 * time.Second):
	}
	inTen := failedMachines(d)
	held := d.router.holds.list()
	t.Logf("machines the plugin started in the first 10 s, all failing at once: %d; held back: %+v", inTen, held)
	if inTen > 15 {
		t.Errorf("the plugin started %d machines in 10 s; want at most 15\n%s", inTen, logs)
	}
	if inTen == 0 || len(held) == 0 {
		t.Fatalf("no failure seen (started %d, held %+v): the storm mode did not storm\n%s", inTen, held, logs)
	}
	// The hold is in GET /status.
	req, _ := http.NewRequest("GET", "http://"+d.addr+"/status", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var report struct {
		HeldBack []HeldProfile `json:"held_back"`
	}
	err = json.NewDecoder(resp.Body).Decode(&report)
	resp.Body.Close()
	if err != nil || len(report.HeldBack) == 0 || report.HeldBack[0].Provisioner != "storm" {
		t.Errorf("GET /status held_back = %+v (%v); want the storm provisioner's profiles", report.HeldBack, err)
	}
	// And in the metrics.
	resp, err = http.Get("http://" + d.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || !strings.Contains(string(metrics), `fluksio_profile_failures_in_a_row{profile="small",provisioner="storm"}`) ||
		!strings.Contains(string(metrics), `fluksio_profile_held_back{profile="small",provisioner="storm"}`) {
		t.Errorf("GET /metrics (%v, %s) lacks the hold of profile small", err, resp.Status)
	}

	// The failures stop: the next machine the plugin starts stays on its
	// way, and its worker attaches (in this process, as the plugin would
	// start it) and serves the need.
	if err := os.Remove(storm); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	var o shared.Outstanding
	waitForLong(t, 3*engineHoldMax, "a machine that does not fail", func() bool {
		st := d.fleet.sups[0].Status(ctx)
		if st.Status == nil || len(st.Status.Outstanding) == 0 {
			return false
		}
		o = st.Status.Outstanding[0]
		return true
	})
	shape := map[string]host.CredentialClaims{"small": {CPUs: 1, RAMMB: 1000}, "gpu": {CPUs: 4, GPUs: 1, RAMMB: 16000, Labels: []string{"cuda"}}}[o.Profile]
	claims := shape
	claims.Worker, claims.Provisioner = o.Worker, "storm"
	token, _, err := d.books.signer.Sign(claims, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--url", "http://" + d.addr, "--cpus", strconv.Itoa(shape.CPUs), "--gpus", strconv.Itoa(shape.GPUs),
		"--ram-mb", strconv.FormatInt(shape.RAMMB, 10), "--max-idle", "1"}
	if len(shape.Labels) > 0 {
		args = append(args, "--labels", shape.Labels[0])
	}
	env := envMap(map[string]string{shared.WorkerTokenEnv: token, "SLURM_JOB_ID": o.Job})
	workerDone := make(chan int, 1)
	go func() { workerDone <- worker.Run(ctx, args, env, io.Discard, io.Discard) }()
	select {
	case served := <-runDone:
		runDone <- served // for the deferred stop
		if !served {
			t.Fatalf("Run returned before the need was served\n%s", story)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the need was not served within 30 s of the %s machine %s starting\n%s", o.Profile, o.Worker, story)
	}
	t.Logf("failures stopped -> need served by %s (%s): %.1fs; machines started in all: %d",
		o.Worker, o.Profile, time.Since(stopped).Seconds(), failedMachines(d))
	for _, h := range d.router.holds.list() {
		if h.Profile == o.Profile {
			t.Errorf("%s still held back after its worker attached: %+v", o.Profile, h)
		}
	}
	<-workerDone
}

// runDaemon runs the engine with the configuration body as an embedder
// does (New, Serve, Start, Run) for one need, until the test ends.
// runDone gets whether Run saw the need served; a reader must put it
// back, for the cleanup to see.
func runDaemon(t *testing.T, body string, need shared.Need) (d *Engine, runDone chan bool, story, logs *lockedBuffer) {
	t.Helper()
	cfgPath := filepath.Join(t.TempDir(), "engine.hcl")
	if err := os.WriteFile(cfgPath, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, diags := LoadConfig(cfgPath)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	logger, logs := testLogger(t)
	story = &lockedBuffer{}
	d, err := New(Config{Provisioners: cfg.Provisioners, Secret: testSecret, ID: "test", Listen: cfg.Engine.Listen, Logger: logger, Hooks: storyHooks(story)})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Serve(d.Mux(nil, false)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if diags := d.Start(ctx); diags.HasErrors() {
		cancel()
		d.Stop(context.Background())
		t.Fatal(diags)
	}
	d.Add(need, 0)
	runDone = make(chan bool, 1)
	go func() { runDone <- d.Run(ctx, d.Served) }()
	t.Cleanup(func() {
		cancel()
		<-runDone
		d.Stop(context.Background())
	})
	return d, runDone, story, logs
}

// failedMachines is the plugin's own count of machines that failed, from
// its Status counters.
func failedMachines(d *Engine) int64 {
	st := d.fleet.sups[0].Status(context.Background())
	var n int64
	if st.Status != nil && st.Status.Counters != nil {
		for _, f := range st.Status.Counters.Failures {
			n += f.Count
		}
	}
	return n
}

// waitForLong is waitFor with its own deadline.
func waitForLong(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", limit, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
