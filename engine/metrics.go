package engine

import (
	"context"
	"net/http"
	"regexp"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/shared"
)

// GET /metrics serves the engine's metrics in Prometheus' text format,
// made with client_golang. Two kinds:
//
//   - Counted here as things happen: machines requested and submissions
//     per provisioner and profile (the Provision answers), events per
//     kind, workers attaching and leaving, tasks, and the time from a
//     machine's submission to its worker attaching (a histogram).
//   - Read at scrape time (stateCollector): plugin up and restarts (the
//     Supervisor), machines by state and the plugins' own counters
//     (failures by class, command latency and errors), from Status
//     through the same statusCache as GET /status, so a scrape costs at
//     most one Status call per plugin a second; and the engine's workers
//     and tasks, from its own books.
//
// Labels are bounded: provisioner names are the configuration's, profile
// names come from plugins and at most maxProfileLabels distinct pairs are
// kept (the rest are "other"), classes and commands are bounded by the
// wire (internal/wire), and no worker, job or task id is ever a
// label: those are for the event stream.
//
// The registry is the engine's own, not the global default, so that two
// engines in one process keep their own counters and the Go runtime's
// collectors are explicit (docs/design/engine-metrics-registry.md). The
// plugins' own heaps and goroutines, which they report at Status, are
// re-exported per provisioner beside the engine's go_gc_heap_live_bytes
// (docs/design/shared-plugin-runtime.md).

const maxProfileLabels = 256

type engineMetrics struct {
	reg *prometheus.Registry

	requested    *prometheus.CounterVec   // provisioner, profile
	submissions  *prometheus.CounterVec   // provisioner, profile
	cancelled    *prometheus.CounterVec   // provisioner, profile
	events       *prometheus.CounterVec   // provisioner, kind
	unrecorded   *prometheus.CounterVec   // provisioner, bound
	workerEvents *prometheus.CounterVec   // provisioner, kind
	tasks        *prometheus.CounterVec   // kind
	taskEnds     *prometheus.CounterVec   // state
	timeToAttach *prometheus.HistogramVec // provisioner, profile

	// mu guards profiles, the distinct (provisioner, profile) label
	// pairs seen; held only to look up and add.
	mu       sync.Mutex
	profiles map[[2]string]bool
}

func newEngineMetrics(state *stateCollector) *engineMetrics {
	m := &engineMetrics{reg: prometheus.NewRegistry(), profiles: map[[2]string]bool{}}
	pp := []string{"provisioner", "profile"}
	m.requested = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fluksio_machines_requested_total",
		Help: "Machines the provisioners asked their clusters for, as their Provision answers said."}, pp)
	m.submissions = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fluksio_submissions_total",
		Help: "Submissions (sbatch calls, one per burst) the provisioners made for those machines."}, pp)
	m.cancelled = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fluksio_machines_given_up_total",
		Help: "Pending machines given up because the demand fell."}, pp)
	m.events = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fluksio_provisioner_events_total",
		Help: "Events the provisioners published, by kind (worker_provisioned, worker_provision_failed, worker_cancelled, other)."},
		[]string{"provisioner", "kind"})
	m.unrecorded = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fluksio_provisioner_events_unrecorded_total",
		Help: "Events a provisioner published past a bound of what the engine keeps for it, by bound (worker_records: the worker was not recorded and cannot attach; revocations: a revocation was not kept; attach_timing: its time to attach is not measured; held_profiles: the failure held no profile back)."},
		[]string{"provisioner", "bound"})
	m.workerEvents = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fluksio_worker_events_total",
		Help: "Workers attaching and leaving, by kind (attached, detached, gone, dropped)."}, []string{"provisioner", "kind"})
	m.tasks = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fluksio_tasks_total",
		Help: "Tasks handed to workers (assigned), finished (done), and attempts of submitted tasks whose machine was lost (lost)."}, []string{"kind"})
	m.taskEnds = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fluksio_tasks_ended_total",
		Help: "Submitted tasks ended, by state (succeeded, failed, cancelled, timed_out, lost)."}, []string{"state"})
	m.timeToAttach = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "fluksio_time_to_attach_seconds",
		Help:    "From a machine's submission (the provisioner's worker_provisioned event) to its worker attaching.",
		Buckets: []float64{1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 3600}}, pp)
	m.reg.MustRegister(m.requested, m.submissions, m.cancelled, m.events, m.unrecorded, m.workerEvents, m.tasks, m.taskEnds, m.timeToAttach,
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
			// go_gc_heap_live_bytes beside the go_memstats_* defaults: the
			// live heap, as plugins report theirs (fluksio_plugin_heap_live_bytes).
			collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/live:bytes$`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if state != nil {
		state.profile = m.profileLabel
		m.reg.MustRegister(state)
	}
	return m
}

// profileLabel is profile, or "other" once maxProfileLabels distinct
// pairs have been seen.
func (m *engineMetrics) profileLabel(provisioner, profile string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := [2]string{provisioner, profile}
	if m.profiles[k] {
		return profile
	}
	if len(m.profiles) >= maxProfileLabels {
		return "other"
	}
	m.profiles[k] = true
	return profile
}

func (m *engineMetrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// provHealth is one provisioner's plugin, as stateCollector reads it.
type provHealth struct {
	name, kind string
	up         bool
	restarts   int
}

// stateCollector reads, at each scrape, what is a level rather than a
// count of happenings. Its functions are set before it is registered
// and never changed.
type stateCollector struct {
	health  func() []provHealth
	status  func(context.Context) []host.ProvisionerStatus
	workers func() map[string]workerCounts
	// needs counts the needs by state and the waiting ones by reason
	// (the served ones the router no longer lists included), as
	// /status's summary does: no need is rendered for a scrape.
	needs func() NeedCounts
	// held is the engine's own backoff (backoff.go); nil means none.
	held    func() []HeldProfile
	profile func(provisioner, profile string) string
}

type workerCounts struct{ idle, busy, cpus, cpusBusy int }

var (
	descUp = prometheus.NewDesc("fluksio_plugin_up",
		"1 while the provisioner's plugin is running and configured, 0 while it is down or restarting.", []string{"provisioner", "kind"}, nil)
	descRestarts = prometheus.NewDesc("fluksio_plugin_restarts_total",
		"Times the provisioner's plugin was restarted after it exited on its own or was killed as wedged.", []string{"provisioner"}, nil)
	descMachines = prometheus.NewDesc("fluksio_machines",
		"Machines by state, as the provisioner reports them: pending (queued or being submitted), starting (running, worker not attached), attached.",
		[]string{"provisioner", "profile", "state"}, nil)
	descPending = prometheus.NewDesc("fluksio_machines_pending",
		"Machines pending in the scheduler's queue, by why it holds them, in its own word (Slurm's pending reason: Priority, Resources, QOSMaxJobsPerUserLimit...); unknown when the plugin does not say, other past the first few reasons of a provisioner.",
		[]string{"provisioner", "reason"}, nil)
	descFailures = prometheus.NewDesc("fluksio_provision_failures_total",
		"Machines that ended without a worker, by class: transient, misconfigured, died_before_attach, timed_out, limit_reached. Counted by the plugin since its process started.",
		[]string{"provisioner", "profile", "class"}, nil)
	descCommandSeconds = prometheus.NewDesc("fluksio_cluster_command_duration_seconds",
		"How long the provisioner's commands on the cluster took (for Slurm: sbatch, squeue, scancel, scontrol over ssh).",
		[]string{"provisioner", "command"}, nil)
	descCommandErrors = prometheus.NewDesc("fluksio_cluster_command_errors_total",
		"Cluster commands that failed, by kind: error (the command failed), ssh (ssh could not run it), timeout.",
		[]string{"provisioner", "command", "kind"}, nil)
	descCommandRationed = prometheus.NewDesc("fluksio_cluster_command_rationed_total",
		"Cluster commands that waited their turn at the cluster's own rate limit (Slurm's per-user RPC rate limiter) and answered late or ran out of their deadline for it: weather, not errors.",
		[]string{"provisioner", "command"}, nil)
	descStatusUp = prometheus.NewDesc("fluksio_plugin_status_ok",
		"1 if the provisioner answered Status at this scrape, 0 if not (its machines and counters are then missing).", []string{"provisioner"}, nil)
	descPluginHeapLive = prometheus.NewDesc("fluksio_plugin_heap_live_bytes",
		"The plugin process's heap the last garbage collection found reachable, as the plugin reads it from its runtime at Status (contract 2.8; absent when it does not say).",
		[]string{"provisioner"}, nil)
	descPluginHeapObjects = prometheus.NewDesc("fluksio_plugin_heap_objects_bytes",
		"The plugin process's heap objects, live and garbage not yet collected, as the plugin reads them at Status (contract 2.8; absent when it does not say).",
		[]string{"provisioner"}, nil)
	descPluginGoroutines = prometheus.NewDesc("fluksio_plugin_goroutines",
		"The plugin process's goroutines (another language's threads), as the plugin reads them at Status (contract 2.8; absent when it does not say).",
		[]string{"provisioner"}, nil)
	descWorkers = prometheus.NewDesc("fluksio_workers",
		"Workers attached to the engine now, idle or busy with a task.", []string{"provisioner", "state"}, nil)
	descWorkerCPUs = prometheus.NewDesc("fluksio_worker_cpus",
		"The attached workers' CPUs, busy (taken by the tasks they run) or free: a worker with slots runs as many tasks as it holds.", []string{"provisioner", "state"}, nil)
	descHeld = prometheus.NewDesc("fluksio_profile_held_back",
		"1 while the engine holds the profile back because its machines failed in a row (whatever the plugin does about it), 0 once the hold is over.",
		[]string{"provisioner", "profile"}, nil)
	descFailuresInARow = prometheus.NewDesc("fluksio_profile_failures_in_a_row",
		"Machines of the profile that failed since one of its workers last attached, as the engine counts them for its hold.",
		[]string{"provisioner", "profile"}, nil)
	descTasks = prometheus.NewDesc("fluksio_tasks",
		"The engine's tasks (needs) by state: waiting, assigned, served.", []string{"state"}, nil)
	descWaiting = prometheus.NewDesc("fluksio_needs_waiting",
		"Needs waiting for a worker, by why: not_asked, no_fit, too_long, mismatch, queued, capped, site_limit, throttled, cluster_full, login_needed, backing_off, misconfigured, provisioner_down, error.", []string{"reason"}, nil)
)

// waitReasons are the reasons the waiting gauge always has, zero or not.
var waitReasons = []WaitReason{ReasonNotAsked, ReasonNoFit, ReasonTooLong, ReasonMismatch, ReasonQueued, ReasonCapped, ReasonSiteLimit, ReasonThrottled, ReasonClusterFull, ReasonLoginNeeded,
	ReasonBackingOff, ReasonMisconfigured, ReasonProvisionerDown, ReasonError}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descUp, descRestarts, descMachines, descPending, descFailures, descCommandSeconds, descCommandErrors, descCommandRationed, descStatusUp,
		descPluginHeapLive, descPluginHeapObjects, descPluginGoroutines, descWorkers, descWorkerCPUs, descTasks, descWaiting, descHeld, descFailuresInARow} {
		ch <- d
	}
}

// statusScrapeTimeout bounds the Status part of a scrape; Prometheus'
// default scrape timeout is 10 s.
const statusScrapeTimeout = 5 * time.Second

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	for _, h := range c.health() {
		ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, b2f(h.up), h.name, h.kind)
		ch <- prometheus.MustNewConstMetric(descRestarts, prometheus.CounterValue, float64(h.restarts), h.name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), statusScrapeTimeout)
	defer cancel()
	for _, ps := range c.status(ctx) {
		ch <- prometheus.MustNewConstMetric(descStatusUp, prometheus.GaugeValue, b2f(ps.Status != nil), ps.Name)
		if ps.Status == nil {
			continue
		}
		c.collectStatus(ch, ps.Name, ps.Status)
	}
	// The registry sorts what it gathers; maps can be walked in any order.
	for name, n := range c.workers() {
		ch <- prometheus.MustNewConstMetric(descWorkers, prometheus.GaugeValue, float64(n.idle), name, "idle")
		ch <- prometheus.MustNewConstMetric(descWorkers, prometheus.GaugeValue, float64(n.busy), name, "busy")
		ch <- prometheus.MustNewConstMetric(descWorkerCPUs, prometheus.GaugeValue, float64(n.cpusBusy), name, "busy")
		ch <- prometheus.MustNewConstMetric(descWorkerCPUs, prometheus.GaugeValue, float64(n.cpus-n.cpusBusy), name, "free")
	}
	counts := c.needs()
	phases := map[NeedPhase]int{NeedWaiting: counts.Waiting, NeedAssigned: counts.Assigned, NeedServed: counts.Served + counts.Forgotten}
	reasons := counts.ByReason
	for _, phase := range []NeedPhase{NeedWaiting, NeedAssigned, NeedServed} {
		ch <- prometheus.MustNewConstMetric(descTasks, prometheus.GaugeValue, float64(phases[phase]), string(phase))
	}
	for _, r := range waitReasons {
		ch <- prometheus.MustNewConstMetric(descWaiting, prometheus.GaugeValue, float64(reasons[r]), string(r))
	}
	if c.held != nil {
		// Summed per label set, as collectStatus does: profiles beyond
		// maxProfileLabels share "other".
		held, inARow := map[[2]string]float64{}, map[[2]string]float64{}
		for _, h := range c.held() {
			k := [2]string{h.Provisioner, c.profile(h.Provisioner, h.Profile)}
			held[k] = max(held[k], b2f(h.Held))
			inARow[k] += float64(h.Failures)
		}
		for k := range inARow {
			ch <- prometheus.MustNewConstMetric(descHeld, prometheus.GaugeValue, held[k], k[0], k[1])
			ch <- prometheus.MustNewConstMetric(descFailuresInARow, prometheus.GaugeValue, inARow[k], k[0], k[1])
		}
	}
}

func (c *stateCollector) collectStatus(ch chan<- prometheus.Metric, name string, st *shared.StatusResponse) {
	// Two entries for one label set would fail the whole scrape, and a
	// plugin may repeat itself: each label set is summed first.
	machines := map[[2]string]float64{}
	for _, pc := range st.Counts {
		prof := c.profile(name, pc.Profile)
		machines[[2]string{prof, "pending"}] += float64(pc.Pending)
		machines[[2]string{prof, "starting"}] += float64(pc.Starting)
		machines[[2]string{prof, "attached"}] += float64(pc.Attached)
	}
	for k, n := range machines {
		ch <- prometheus.MustNewConstMetric(descMachines, prometheus.GaugeValue, n, name, k[0], k[1])
	}
	pending := map[string]float64{}
	for _, o := range st.Outstanding {
		if o.State != "PENDING" {
			continue
		}
		r := pendingReasonLabel(o.Reason)
		if _, ok := pending[r]; !ok && len(pending) >= maxPendingReasons-1 {
			r = "other" // the last of maxPendingReasons
		}
		pending[r]++
	}
	for r, n := range pending {
		ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, n, name, r)
	}
	if rt := st.Runtime; rt != nil {
		for _, g := range []struct {
			desc *prometheus.Desc
			v    int64
		}{{descPluginHeapLive, rt.HeapLiveBytes}, {descPluginHeapObjects, rt.HeapObjectsBytes}, {descPluginGoroutines, rt.Goroutines}} {
			if g.v > 0 {
				ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, float64(g.v), name)
			}
		}
	}
	if st.Counters == nil {
		return
	}
	failures := map[[2]string]float64{}
	for _, f := range st.Counters.Failures {
		failures[[2]string{c.profile(name, f.Profile), string(f.Class)}] += float64(f.Count)
	}
	for k, n := range failures {
		ch <- prometheus.MustNewConstMetric(descFailures, prometheus.CounterValue, n, name, k[0], k[1])
	}
	seen := map[string]bool{}
	for _, cs := range st.Counters.Commands {
		if seen[cs.Command] {
			continue
		}
		seen[cs.Command] = true
		buckets := make(map[float64]uint64, len(cs.Buckets))
		for i, b := range cs.Buckets {
			buckets[b] = uint64(cs.BucketCounts[i])
		}
		ch <- prometheus.MustNewConstHistogram(descCommandSeconds, uint64(cs.Calls), cs.DurationSum.Seconds(), buckets, name, cs.Command)
		ch <- prometheus.MustNewConstMetric(descCommandErrors, prometheus.CounterValue, float64(cs.Errors), name, cs.Command, "error")
		ch <- prometheus.MustNewConstMetric(descCommandErrors, prometheus.CounterValue, float64(cs.SSHErrors), name, cs.Command, "ssh")
		ch <- prometheus.MustNewConstMetric(descCommandErrors, prometheus.CounterValue, float64(cs.Timeouts), name, cs.Command, "timeout")
		ch <- prometheus.MustNewConstMetric(descCommandRationed, prometheus.CounterValue, float64(cs.Rationed), name, cs.Command)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// maxPendingReasons bounds the reasons fluksio_machines_pending has for
// one provisioner: Slurm's words are a few dozen, but a plugin may send
// anything, and a label value per string would grow without end.
const maxPendingReasons = 16

// pendingReasonLabel is a pending reason as a label value: the plugin's
// word when it is one (letters, digits, '_', ':', '(' and ')', as
// Slurm's are, at most 64 bytes), "unknown" when it gives none, and
// "other" for anything else.
func pendingReasonLabel(reason string) string {
	if reason == "" || reason == "None" {
		return "unknown"
	}
	if len(reason) > 64 {
		return "other"
	}
	for _, c := range []byte(reason) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == ':' || c == '(' || c == ')') {
			return "other"
		}
	}
	return reason
}
