package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fluksio/provision/internal/testutil"
)

// floodEvents is how many events TestPluginFloodBounded's plugin sends:
// enough to take each of its budgets past its bound (a quarter of them
// are worker_provisioned, a half revocations). FLUKSIO_FLOOD_EVENTS sets
// another count, such as the attack's 1,000,000.
func floodEvents(t *testing.T) int {
	n := 200_000
	if v := os.Getenv("FLUKSIO_FLOOD_EVENTS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			t.Fatalf("FLUKSIO_FLOOD_EVENTS=%q: %v", v, err)
		}
	}
	return n
}

// floodHeapBound is how much the test process's live heap may grow over
// a flood, after GC. What the bounds let one provisioner keep: its job
// records and revocations (2 x recordBudget, about 180 bytes each), the
// machines timed (maxWaiting, about 120 bytes), the event history
// (historySize events) and the held profiles (maxHeldProfiles): some 16
// MB, given two and a half times over. Before the bounds, 1,000,000
// events kept 285 MB.
const floodHeapBound = 40 << 20

// TestPluginFloodBounded, with the attack's shape: a real plugin
// subprocess publishes well-formed events as fast as the host
// acknowledges them (200,000 here; the attack sent 1,000,500), each
// about a worker of its own, provisioned, cancelled, failed of a profile
// of its own, or of a kind of its own. What the engine keeps for them
// stops at its bounds: job records and revocations at recordBudget each,
// held profiles at maxHeldProfiles, timed machines at maxWaiting, the
// history at historySize, one metric series per contract kind and
// "other"; the excess is counted by bound, and each bound is said once in
// the log. The live heap after GC grows by less than floodHeapBound.
func TestPluginFloodBounded(t *testing.T) {
	n := floodEvents(t)
	bin := testutil.BuildTestPlugin(t)
	t.Setenv("TESTPLUGIN_ABUSE", "flood")
	t.Setenv("TESTPLUGIN_FLOOD", strconv.Itoa(n))
	body := fmt.Sprintf("engine {\n  listen = \"127.0.0.1:0\"\n}\nprovisioner \"memory\" \"flood\" {\n  plugin = %q\n  greeting = \"hi\"\n}\n", bin)
	cfgPath := filepath.Join(t.TempDir(), "engine.hcl")
	if err := os.WriteFile(cfgPath, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, diags := LoadConfig(cfgPath)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	// The log is counted, not kept: the router logs each failure it
	// holds a profile for, and a kept log would weigh in the heap.
	logs := &lineCounter{keep: "the plugin sends more than the engine keeps"}
	logger := hclog.New(&hclog.LoggerOptions{Level: hclog.Info, Output: logs})
	before := liveHeap()
	d, err := New(Config{Provisioners: cfg.Provisioners, Secret: testSecret, ID: "test", Listen: cfg.Engine.Listen, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop(context.Background())
	start := time.Now()
	if diags := d.Start(context.Background()); diags.HasErrors() {
		t.Fatal(diags)
	}
	// The plugin's last event follows the flood, and the host hands
	// events on in order: once it is in the history, so is the rest.
	waitForLong(t, 5*time.Minute, "the flood's last event", func() bool { return inHistory(d.hub, "flood-flood-end") })
	took := time.Since(start)
	grew := int64(liveHeap()) - int64(before)
	t.Logf("%d events in %s; live heap grew %d MB (bound %d MB); %d log lines; process %s",
		n, took.Round(time.Millisecond), grew>>20, floodHeapBound>>20, logs.lines(), processMemory())

	jobs, revoked := d.books.records("flood")
	if jobs != recordBudget || revoked != recordBudget {
		t.Errorf("the books hold %d job records and %d revocations of the plugin's; want %d each", jobs, revoked, recordBudget)
	}
	d.router.holds.mu.Lock()
	held, heldAll := d.router.holds.per["flood"], len(d.router.holds.m)
	d.router.holds.mu.Unlock()
	if held != maxHeldProfiles || heldAll != maxHeldProfiles {
		t.Errorf("the router keeps %d profiles of the plugin's (%d in all); want %d", held, heldAll, maxHeldProfiles)
	}
	d.obs.mu.Lock()
	timed, timedAll := d.obs.waitingBy["flood"], len(d.obs.waiting)
	d.obs.mu.Unlock()
	if timed != maxWaiting || timedAll != maxWaiting {
		t.Errorf("the observer times %d machines of the plugin's (%d in all); want %d", timed, timedAll, maxWaiting)
	}
	d.hub.mu.Lock()
	history := len(d.hub.history)
	d.hub.mu.Unlock()
	if history != historySize {
		t.Errorf("the history holds %d events; want %d", history, historySize)
	}
	kinds, unrecorded := provisionerMetrics(t, d, "flood")
	if len(kinds) != 4 || kinds["other"] != float64(n/4) {
		t.Errorf("events in %d series by kind, %v of them other; want 4 series: the three contract kinds and other (%d)", len(kinds), kinds["other"], n/4)
	}
	// The revocations are the flood's cancellations and failures, and
	// its last event, a cancellation.
	provisioned, revocations := (n+3)/4, (n+2)/4+(n+1)/4+1
	want := map[string]float64{
		unrecordedWorker:     float64(provisioned - recordBudget),
		unrecordedTimed:      float64(provisioned - maxWaiting),
		unrecordedRevocation: float64(revocations - recordBudget),
		unrecordedProfile:    float64((n+1)/4 - maxHeldProfiles),
	}
	for why, w := range want {
		if unrecorded[why] != w {
			t.Errorf("unrecorded %s: %v; want %v", why, unrecorded[why], w)
		}
	}
	if said := logs.keptLines(); len(said) != len(want) {
		t.Errorf("the bounds were said %d times; want once each of %d:\n%s", len(said), len(want), strings.Join(said, ""))
	}
	if grew > floodHeapBound {
		t.Errorf("the live heap grew %d MB over the flood; want at most %d MB", grew>>20, floodHeapBound>>20)
	}
}

// liveHeap is the heap in use after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// processMemory is the process's resident set and its peak, where
// /proc says them, for the log only: RSS depends on when the runtime
// returns memory, so the test bounds the live heap instead.
func processMemory() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "(no /proc)"
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") || strings.HasPrefix(l, "VmHWM:") {
			out = append(out, strings.Join(strings.Fields(l), " "))
		}
	}
	return strings.Join(out, ", ")
}

// inHistory reports whether the hub's history holds an event for worker.
func inHistory(h *hub, worker string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ev := range h.history {
		if ev.Worker == worker {
			return true
		}
	}
	return false
}

// provisionerMetrics reads a provisioner's events by kind label and its
// unrecorded events by bound from the engine's registry.
func provisionerMetrics(t *testing.T, d *Engine, provisioner string) (kinds, unrecorded map[string]float64) {
	t.Helper()
	// A registry of these two only: the engine's own reads the plugins'
	// state too, which an engine without a fleet has not.
	reg := prometheus.NewRegistry()
	reg.MustRegister(d.obs.metrics.events, d.obs.metrics.unrecorded)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	kinds, unrecorded = map[string]float64{}, map[string]float64{}
	for _, f := range families {
		var into map[string]float64
		var label string
		switch f.GetName() {
		case "fluksio_provisioner_events_total":
			into, label = kinds, "kind"
		case "fluksio_provisioner_events_unrecorded_total":
			into, label = unrecorded, "bound"
		default:
			continue
		}
		for _, m := range f.GetMetric() {
			var prov, key string
			for _, lp := range m.GetLabel() {
				switch lp.GetName() {
				case "provisioner":
					prov = lp.GetValue()
				case label:
					key = lp.GetValue()
				}
			}
			if prov == provisioner {
				into[key] += m.GetCounter().GetValue()
			}
		}
	}
	return kinds, unrecorded
}

// lineCounter counts the lines a logger writes and keeps those holding
// keep.
type lineCounter struct {
	keep string

	mu   sync.Mutex // guards n and kept
	n    int
	kept []string
}

func (c *lineCounter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	if strings.Contains(string(p), c.keep) {
		c.kept = append(c.kept, string(p))
	}
	return len(p), nil
}

func (c *lineCounter) lines() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func (c *lineCounter) keptLines() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.kept...)
}
