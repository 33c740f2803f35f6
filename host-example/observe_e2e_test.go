package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/provision/engine"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// observedRun is a real run for the observability tests: the sandbox's
// Slurm, the real plugin, and two profiles. "cpu" gets a worker that
// attaches and does its work; "broken" runs a payload that exits at once
// (its prerun is `exit 3`), so its job ends FAILED before any worker
// attaches, and is asked for again after its backoff. A third, "slow",
// is for needs the test adds: its jobs wait in the queue, PENDING, for
// ten seconds (sbatch --begin) before they start. The run keeps going
// until the test stops it.
type observedRun struct {
	e    *e2e
	p    *engineProc
	base string
}

func startObservedRun(t *testing.T, prefix string, needs ...string) *observedRun {
	t.Helper()
	e := newE2E(t, prefix)
	e.killPluginsAtEnd(t)
	cfg := e.relConfig(t, "  poll_interval  = \"2s\"\n", `  profile "broken" {
    cpus   = 1
    ram_mb = 200
    labels = ["broken"]
    prerun = ["echo 'this payload exits at once' >&2", "exit 3"]
    sbatch = ["--partition=`+e.env.Partition+`", "--time=00:10:00"]
  }
  profile "slow" {
    cpus   = 1
    ram_mb = 200
    labels = ["slow"]
    sbatch = ["--partition=`+e.env.Partition+`", "--time=00:10:00", "--begin=now+10"]
  }
`, e.host, "worker")
	args := []string{"-config", cfg, "-need", "cpus=2,work=2s", "-need", "cpus=1,label=broken", "-timeout", "5m"}
	for _, n := range needs {
		args = append(args, "-need", n)
	}
	p := e.startEngine(t, args...)
	r := &observedRun{e: e, p: p, base: fmt.Sprintf("http://127.0.0.1:%d", e.port)}
	poll(t, 60*time.Second, "the engine to answer GET /health", func() bool {
		if p.exited() {
			t.Fatalf("the engine exited early\nstdout:\n%s\nstderr:\n%s", p.stdout, p.stderr)
		}
		resp, err := http.Get(r.base + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return r
}

// stop ends the run with SIGTERM and checks nothing is left behind.
func (r *observedRun) stop(t *testing.T) {
	t.Helper()
	if err := r.p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	r.p.wait(t, 90*time.Second)
	exitedAt := time.Now()
	r.e.assertCleanedUp(t, exitedAt)
}

// scrape reads GET /metrics with Prometheus' own text parser.
func (r *observedRun) scrape(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(r.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("GET /metrics is not Prometheus text: %v", err)
	}
	return fams
}

// value is the sum of family name's samples whose labels include want
// (a counter's or gauge's value, a histogram's count).
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	f := fams[name]
	if f == nil {
		return 0
	}
	var sum float64
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			match = match && labels[k] == v
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

// TestE2EMetricsMove scrapes /metrics during a real run: as the cpu
// machine is asked for, submitted and attaches, and the broken one's job
// fails at once, the counters move, and no label carries a worker or job
// id.
func TestE2EMetricsMove(t *testing.T) {
	r := startObservedRun(t, "e2e-metrics")
	name := r.e.name
	prov := map[string]string{"provisioner": name}
	cpu := map[string]string{"provisioner": name, "profile": "cpu"}
	broken := map[string]string{"provisioner": name, "profile": "broken"}
	first := r.scrape(t)

	var fams map[string]*dto.MetricFamily
	want := []struct {
		what   string
		name   string
		labels map[string]string
	}{
		{"cpu machines requested", "fluksio_machines_requested_total", cpu},
		{"cpu submissions", "fluksio_submissions_total", cpu},
		{"workers attached", "fluksio_worker_events_total", map[string]string{"provisioner": name, "kind": "attached"}},
		{"cpu time to attach observed", "fluksio_time_to_attach_seconds", cpu},
		{"broken machines that died before attaching", "fluksio_provision_failures_total",
			map[string]string{"provisioner": name, "profile": "broken", "class": "died_before_attach"}},
		{"broken submissions", "fluksio_submissions_total", broken},
		{"sbatch calls timed", "fluksio_cluster_command_duration_seconds", map[string]string{"provisioner": name, "command": "sbatch"}},
		{"squeue calls timed", "fluksio_cluster_command_duration_seconds", map[string]string{"provisioner": name, "command": "squeue"}},
		{"tasks done", "fluksio_tasks_total", map[string]string{"kind": "done"}},
		{"worker_provision_failed events", "fluksio_provisioner_events_total", map[string]string{"provisioner": name, "kind": "worker_provision_failed"}},
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if r.p.exited() {
			t.Fatalf("the engine exited early\nstdout:\n%s\nstderr:\n%s", r.p.stdout, r.p.stderr)
		}
		fams = r.scrape(t)
		var still []string
		for _, w := range want {
			// The cpu machine may well be asked for before the first
			// scrape; the broken profile is asked for again and again,
			// so its counts must move between scrapes.
			if v := value(fams, w.name, w.labels); v < 1 || (w.labels["profile"] == "broken" && v <= value(first, w.name, w.labels)) {
				still = append(still, w.what)
			}
		}
		if len(still) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 3m these have not moved: %s\nstory:\n%s\nstderr:\n%s", strings.Join(still, "; "), r.p.stdout, r.p.stderr)
		}
		time.Sleep(time.Second)
	}
	for _, w := range want {
		t.Logf("%s: %s%v %g -> %g", w.what, w.name, w.labels, value(first, w.name, w.labels), value(fams, w.name, w.labels))
	}
	resp, err := http.Get(r.base + "/ready")
	if err != nil {
		t.Fatal(err)
	}
	var rd struct {
		Ready        bool
		Provisioners []struct {
			Name, Kind string
			Up         bool
			Restarts   int
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&rd); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !rd.Ready || len(rd.Provisioners) != 1 || !rd.Provisioners[0].Up {
		t.Errorf("GET /ready: %s %+v, want 200 and the provisioner up", resp.Status, rd)
	}
	if v := value(fams, "fluksio_plugin_up", prov); v != 1 {
		t.Errorf("fluksio_plugin_up = %g, want 1", v)
	}
	if v := value(fams, "fluksio_plugin_restarts_total", prov); v != 0 {
		t.Errorf("fluksio_plugin_restarts_total = %g, want 0", v)
	}
	if _, ok := fams["fluksio_machines"]; !ok {
		t.Errorf("no fluksio_machines family")
	}
	if v := value(fams, "fluksio_cluster_command_errors_total", map[string]string{"provisioner": name, "kind": "ssh"}); v != 0 {
		t.Errorf("%g ssh errors against a healthy sandbox", v)
	}
	// The plugin's own heap and goroutines, read inside its process at
	// Status (contract 2.8), beside the engine's live heap: the soak
	// judges memory by them.
	if v := value(fams, "fluksio_plugin_heap_live_bytes", map[string]string{"provisioner": name}); v < 1<<20 {
		t.Errorf("fluksio_plugin_heap_live_bytes = %g; want the plugin's live heap, a MB or more", v)
	}
	if v, live := value(fams, "fluksio_plugin_heap_objects_bytes", map[string]string{"provisioner": name}),
		value(fams, "fluksio_plugin_heap_live_bytes", map[string]string{"provisioner": name}); v < live/2 {
		t.Errorf("fluksio_plugin_heap_objects_bytes = %g beside a live heap of %g; want the heap's objects", v, live)
	}
	if v := value(fams, "fluksio_plugin_goroutines", map[string]string{"provisioner": name}); v < 2 {
		t.Errorf("fluksio_plugin_goroutines = %g; want the plugin's goroutines (gRPC's serve at least)", v)
	}
	if v := value(fams, "go_gc_heap_live_bytes", nil); v < 1<<20 {
		t.Errorf("go_gc_heap_live_bytes = %g; want the engine's live heap", v)
	}
	// The plugin's rationed calls (slurm/internal/queue/ratelimit.go) are served, one
	// series a command, whether or not the sandbox rations RPCs.
	if _, ok := fams["fluksio_cluster_command_rationed_total"]; !ok {
		t.Errorf("no fluksio_cluster_command_rationed_total family")
	}
	// Bounded labels: nothing names a worker (they are "<name>-<profile>-…")
	// or a job.
	for fname, f := range fams {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "worker" || l.GetName() == "job" || strings.HasPrefix(l.GetValue(), name+"-") {
					t.Errorf("%s has label %s=%q: a worker or job id", fname, l.GetName(), l.GetValue())
				}
			}
		}
	}
	r.stop(t)
}

// sseClient reads GET /v1/events into a list as the events arrive.
type sseClient struct {
	mu     sync.Mutex
	events []engine.Event
	done   chan struct{}
	cancel context.CancelFunc
}

func openEvents(t *testing.T, url string, header http.Header) *sseClient {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		cancel()
		resp.Body.Close()
		t.Fatalf("GET %s: %s, %s", url, resp.Status, resp.Header.Get("Content-Type"))
	}
	c := &sseClient{done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(c.done)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		var id string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "id: "):
				id = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "data: "):
				var ev engine.Event
				if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev); err != nil || fmt.Sprint(ev.Seq) != id {
					t.Errorf("a bad event (id %q): %q: %v", id, line, err)
					continue
				}
				c.mu.Lock()
				c.events = append(c.events, ev)
				c.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-c.done })
	return c
}

func (c *sseClient) all() []engine.Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.events)
}

// kindsOf lists the kinds of the events about worker, in stream order.
func kindsOf(evs []engine.Event, worker string) []string {
	var out []string
	for _, ev := range evs {
		if ev.Worker == worker {
			out = append(out, string(ev.Kind))
		}
	}
	return out
}

// TestE2EEventStream follows GET /v1/events through a real run: the cpu
// machine's events arrive in the order they happened (submitted,
// attached, given its task, done), the broken one's failure arrives with
// Slurm's reason, sequence numbers rise, and a client that connects late
// gets the same events from the history, as does one resuming with
// Last-Event-ID from where it left off.
func TestE2EEventStream(t *testing.T) {
	r := startObservedRun(t, "e2e-events")
	live := openEvents(t, r.base+"/v1/events", nil)

	var cpuWorker string
	var evs []engine.Event
	poll(t, 2*time.Minute, "the cpu worker's task done and a broken machine failed", func() bool {
		if r.p.exited() {
			t.Fatalf("the engine exited early\nstdout:\n%s\nstderr:\n%s", r.p.stdout, r.p.stderr)
		}
		evs = live.all()
		done, failed := false, false
		for _, ev := range evs {
			done = done || ev.Kind == "task_done"
			failed = failed || (ev.Kind == "worker_provision_failed" && ev.Profile == "broken")
			if ev.Kind == "task_done" {
				cpuWorker = ev.Worker
			}
		}
		return done && failed
	})
	for i := 1; i < len(evs); i++ {
		if evs[i].Seq <= evs[i-1].Seq || evs[i].Time.Before(evs[i-1].Time) {
			t.Errorf("event %d (seq %d, %s) came after seq %d (%s)", i, evs[i].Seq, evs[i].Time, evs[i-1].Seq, evs[i-1].Time)
		}
	}
	kinds := kindsOf(evs, cpuWorker)
	if want := []string{"worker_provisioned", "worker_attached", "task_assigned", "task_done"}; !slices.Equal(kinds, want) {
		t.Errorf("the cpu worker's events: %v, want %v", kinds, want)
	}
	var failure engine.Event
	for _, ev := range evs {
		if ev.Kind == "worker_provision_failed" {
			failure = ev
			break
		}
	}
	if failure.Provisioner != r.e.name || failure.Job == "" || failure.Worker == "" || !strings.Contains(failure.Detail, "ended FAILED") {
		t.Errorf("the failure event %+v lacks its provisioner, job, worker or Slurm's reason", failure)
	}
	if k := kindsOf(evs, failure.Worker); len(k) != 2 || k[0] != "worker_provisioned" {
		t.Errorf("the failed worker's events: %v, want worker_provisioned then worker_provision_failed", k)
	}
	for _, ev := range evs {
		if ev.Kind == "worker_attached" && (ev.Profile != "cpu" || ev.Job == "") {
			t.Errorf("the attach event %+v lacks its profile or Slurm job", ev)
		}
	}

	// A late client gets the history: the same events, same numbers.
	late := openEvents(t, r.base+"/v1/events", nil)
	poll(t, 10*time.Second, "the late client to get the history", func() bool { return len(late.all()) >= len(evs) })
	for i, ev := range late.all()[:len(evs)] {
		if ev.Seq != evs[i].Seq || ev.Kind != evs[i].Kind || ev.Worker != evs[i].Worker {
			t.Errorf("history event %d is %+v, the live client saw %+v", i, ev, evs[i])
			break
		}
	}
	// One resuming after the attach gets what came after it, alone.
	var attachSeq uint64
	for _, ev := range evs {
		if ev.Kind == "worker_attached" {
			attachSeq = ev.Seq
		}
	}
	resumed := openEvents(t, r.base+"/v1/events", http.Header{"Last-Event-ID": {fmt.Sprint(attachSeq)}})
	poll(t, 10*time.Second, "the resumed client to get what followed", func() bool { return len(resumed.all()) > 0 })
	if got := resumed.all()[0].Seq; got != attachSeq+1 {
		t.Errorf("resuming after seq %d began at seq %d", attachSeq, got)
	}
	r.stop(t)
	// The engine ends its streams as it stops.
	for _, c := range []*sseClient{live, late, resumed} {
		select {
		case <-c.done:
		case <-time.After(10 * time.Second):
			t.Errorf("a stream stayed open after the engine exited")
		}
	}
	t.Logf("%d events on the live stream; the last: %+v", len(live.all()), live.all()[len(live.all())-1])
}
