package engine

import (
	"net/http"
	"sync"
	"time"

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
	hub     *Hub
	metrics *engineMetrics

	// mu guards waiting; held only to read or change it.
	mu sync.Mutex
	// waiting holds, by worker name, the machines submitted whose worker
	// has not attached: at most maxWaiting, so a plugin that reports
	// machines nobody attaches cannot grow it without end (past the cap,
	// new ones go untimed).
	waiting map[string]submitted
}

type submitted struct {
	provisioner, profile string
	at                   time.Time
}

// maxWaiting is well past max_workers' default (256) times a few
// provisioners.
const maxWaiting = 100_000

func newObserver(m *engineMetrics) *observer {
	return &observer{hub: NewHub(), metrics: m, waiting: map[string]submitted{}}
}

// pluginEvent is an event a provisioner published (stamped by the host).
func (o *observer) pluginEvent(ev shared.Event) {
	now := time.Now()
	prof := o.metrics.profileLabel(ev.Provisioner, ev.Profile)
	o.metrics.events.WithLabelValues(ev.Provisioner, string(ev.Kind)).Inc()
	o.mu.Lock()
	switch ev.Kind {
	case shared.EventWorkerProvisioned:
		if _, ok := o.waiting[ev.Worker]; ok || len(o.waiting) < maxWaiting {
			o.waiting[ev.Worker] = submitted{provisioner: ev.Provisioner, profile: prof, at: now}
		}
	case shared.EventWorkerProvisionFailed, shared.EventWorkerCancelled:
		delete(o.waiting, ev.Worker)
	}
	o.mu.Unlock()
	o.hub.Publish(Event{Time: now, Kind: EventKind(ev.Kind), Provisioner: ev.Provisioner, Profile: ev.Profile,
		Job: ev.Job, Worker: ev.Worker, Detail: ev.Detail})
}

// activity is what happened to a worker or task in the engine.
func (o *observer) activity(a Activity) {
	now := time.Now()
	ev := Event{Time: now, Kind: a.Kind, Provisioner: a.Provisioner, Worker: a.Worker, Job: a.Job, Task: a.Task, Detail: a.Detail}
	o.mu.Lock()
	sub, known := o.waiting[a.Worker]
	if a.Kind == EventWorkerAttached || a.Kind.workerLeft() {
		// Attached, or gone before it did: no longer on its way.
		delete(o.waiting, a.Worker)
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
	o.hub.Publish(ev)
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
	o.hub.Publish(Event{Kind: kind, Provisioner: name, Detail: detail})
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
