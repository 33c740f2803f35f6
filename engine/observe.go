package engine

import (
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/shared"
)

// observer hears everything the operator may watch (the plugins'
// events, workers and tasks, Provision answers, plugins going down and
// up) and turns each into an event on the stream and a count in the
// metrics. It is the one place that joins them: a worker's profile and
// submission time come from its worker_provisioned event, and are
// needed when it attaches, for the time-to-attach histogram and for the
// attach event's profile.
type observer struct {
	hub     *hub
	metrics *engineMetrics

	// mu guards waiting, waitingBy and told; held only to read or
	// change them.
	mu sync.Mutex
	// waiting holds, by worker name, the machines submitted whose worker
	// has not attached: at most maxWaiting of each provisioner's
	// (waitingBy counts them), so a plugin that reports machines nobody
	// attaches cannot grow it without end, nor take another's room
	// (past the cap, its new ones go untimed).
	waiting   map[string]submitted
	waitingBy map[string]int
	// told holds the (provisioner, reason) pairs whose first event past
	// a bound has been logged: each is said once, and counted always.
	told map[[2]string]bool
}

type submitted struct {
	provisioner, profile string
	at                   time.Time
}

// maxWaiting is well past max_workers' default (256), and as many as a
// provisioner's events may keep records in the books (recordBudget).
const maxWaiting = recordBudget

// Why an event of a plugin's was not fully kept: the label of
// fluksio_provisioner_events_unrecorded_total.
const (
	unrecordedWorker     = "worker_records"
	unrecordedRevocation = "revocations"
	unrecordedTimed      = "attach_timing"
	unrecordedProfile    = "held_profiles"
)

func newObserver(m *engineMetrics) *observer {
	return &observer{hub: newHub(), metrics: m, waiting: map[string]submitted{}, waitingBy: map[string]int{},
		told: map[[2]string]bool{}}
}

// unrecorded counts an event of provisioner's that a bound kept out of
// the engine's books (why: one of the unrecorded reasons), and says so in
// plog the first time for each provisioner and reason.
func (o *observer) unrecorded(plog hclog.Logger, provisioner, why string, err error) {
	o.metrics.unrecorded.WithLabelValues(provisioner, why).Inc()
	o.mu.Lock()
	first := !o.told[[2]string{provisioner, why}]
	o.told[[2]string{provisioner, why}] = true
	o.mu.Unlock()
	if first {
		plog.Warn("the plugin sends more than the engine keeps: its further events are counted and not recorded; said once, counted in fluksio_provisioner_events_unrecorded_total",
			"provisioner", provisioner, "bound", why, "error", err)
	}
}

// pluginEvent is an event a provisioner published (stamped by the host).
// It reports false when the event's machine goes untimed because its
// provisioner has maxWaiting on their way already.
func (o *observer) pluginEvent(ev shared.Event) (timed bool) {
	now := time.Now()
	prof := o.metrics.profileLabel(ev.Provisioner, ev.Profile)
	o.metrics.events.WithLabelValues(ev.Provisioner, kindLabel(ev.Kind)).Inc()
	timed = true
	o.mu.Lock()
	switch ev.Kind {
	case shared.EventWorkerProvisioned:
		if _, ok := o.waiting[ev.Worker]; ok {
			o.waiting[ev.Worker] = submitted{provisioner: ev.Provisioner, profile: prof, at: now}
		} else if o.waitingBy[ev.Provisioner] < maxWaiting {
			o.waiting[ev.Worker] = submitted{provisioner: ev.Provisioner, profile: prof, at: now}
			o.waitingBy[ev.Provisioner]++
		} else {
			timed = false
		}
	case shared.EventWorkerProvisionFailed, shared.EventWorkerCancelled, shared.EventWorkerJobEnded:
		o.forgetLocked(ev.Worker)
	}
	o.mu.Unlock()
	o.hub.publish(Event{Time: now, Kind: EventKind(ev.Kind), Provisioner: ev.Provisioner, Profile: ev.Profile,
		Job: ev.Job, Worker: ev.Worker, Detail: ev.Detail})
	return timed
}

// forgetLocked takes worker off the machines on their way. o.mu must be
// held.
func (o *observer) forgetLocked(worker string) {
	if sub, ok := o.waiting[worker]; ok {
		delete(o.waiting, worker)
		if o.waitingBy[sub.provisioner]--; o.waitingBy[sub.provisioner] <= 0 {
			delete(o.waitingBy, sub.provisioner)
		}
	}
}

// kindLabel is an event kind as a metric label: the contract's kinds as
// they are, any other a plugin makes up "other", so that a plugin cannot
// add a series per event.
func kindLabel(k shared.EventKind) string {
	switch k {
	case shared.EventWorkerProvisioned, shared.EventWorkerProvisionFailed, shared.EventWorkerCancelled, shared.EventWorkerJobEnded:
		return string(k)
	}
	return "other"
}

// activity is what happened to a worker or task in the engine.
func (o *observer) activity(a Activity) {
	now := time.Now()
	ev := Event{Time: now, Kind: a.Kind, Provisioner: a.Provisioner, Worker: a.Worker, Job: a.Job, Task: a.Task, Attempt: a.Attempt,
		AttemptID: a.AttemptID, Detail: a.Detail}
	o.mu.Lock()
	sub, known := o.waiting[a.Worker]
	if a.Kind == EventWorkerAttached || a.Kind.workerLeft() {
		// Attached, or gone before it did: no longer on its way.
		o.forgetLocked(a.Worker)
	}
	o.mu.Unlock()
	if known && sub.provisioner == a.Provisioner {
		ev.Profile = sub.profile
	}
	switch a.Kind {
	case EventWorkerAttached:
		o.metrics.workerEvents.WithLabelValues(a.Provisioner, "attached").Inc()
		if known && sub.provisioner == a.Provisioner {
			o.metrics.timeToAttach.WithLabelValues(a.Provisioner, sub.profile).Observe(now.Sub(sub.at).Seconds())
		}
	case EventWorkerDetached:
		o.metrics.workerEvents.WithLabelValues(a.Provisioner, "detached").Inc()
	case EventWorkerGone:
		o.metrics.workerEvents.WithLabelValues(a.Provisioner, "gone").Inc()
	case EventWorkerDropped:
		o.metrics.workerEvents.WithLabelValues(a.Provisioner, "dropped").Inc()
	case EventTaskAssigned:
		o.metrics.tasks.WithLabelValues("assigned").Inc()
	case EventTaskDone:
		o.metrics.tasks.WithLabelValues("done").Inc()
	}
	o.hub.publish(ev)
}

// task is what became of a submitted task: an attempt lost, the task
// ended.
func (o *observer) task(n taskNews) {
	var last Attempt
	if k := len(n.res.Attempts); k > 0 {
		last = n.res.Attempts[k-1]
	}
	if n.lost {
		detail := "waits for another worker"
		if !n.again {
			detail = "given up: no retries left"
		}
		o.metrics.tasks.WithLabelValues("lost").Inc()
		o.hub.publish(Event{Kind: EventTaskLost, Provisioner: n.provisioner, Worker: n.worker, Job: last.JobID, Task: n.res.ID,
			Attempt: last.Number, AttemptID: last.AttemptID, Detail: detail})
	}
	if n.ended {
		detail := string(n.res.State)
		if n.res.Error != "" {
			detail += ": " + n.res.Error
		}
		o.metrics.taskEnds.WithLabelValues(string(n.res.State)).Inc()
		o.hub.publish(Event{Kind: EventTaskEnded, Provisioner: n.provisioner, Worker: n.worker, Job: last.JobID, Task: n.res.ID,
			Attempt: last.Number, AttemptID: last.AttemptID, Detail: detail})
	}
}

// burst is a Provision answer that asked for machines or gave some up.
func (o *observer) burst(target string, pd shared.ProfileDemand) {
	prof := o.metrics.profileLabel(target, pd.Profile)
	o.metrics.requested.WithLabelValues(target, prof).Add(float64(pd.Requested))
	o.metrics.submissions.WithLabelValues(target, prof).Add(float64(pd.Submissions))
	o.metrics.cancelled.WithLabelValues(target, prof).Add(float64(pd.Cancelled))
}

// plugin is a plugin going down (kind plugin_down) or coming up again
// (plugin_up).
func (o *observer) plugin(kind EventKind, name, detail string) {
	o.hub.publish(Event{Kind: kind, Provisioner: name, Detail: detail})
}

// health is GET /health: the engine is alive and serving.
func health(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

type readiness struct {
	Ready        bool                 `json:"ready"`
	Provisioners []provisionerReadies `json:"provisioners"`
}

type provisionerReadies struct {
	Name     string `json:"name"`
	Kind     string `json:"kind"`
	Up       bool   `json:"up"`
	Restarts int    `json:"restarts"`
}

// ready is GET /ready: 200 when every configured provisioner's plugin is
// configured and up, 503 otherwise, saying which.
func ready(healthf func() []provHealth) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		rd := readiness{Ready: true, Provisioners: []provisionerReadies{}}
		for _, h := range healthf() {
			rd.Provisioners = append(rd.Provisioners, provisionerReadies{Name: h.name, Kind: h.kind, Up: h.up, Restarts: h.restarts})
			rd.Ready = rd.Ready && h.up
		}
		status := http.StatusOK
		if !rd.Ready {
			status = http.StatusServiceUnavailable
		}
		writeJSON(w, status, rd)
	}
}
