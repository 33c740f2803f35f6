package engine

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/fluksio/provision/internal/needspec"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

// NeedPhase is where a need stands.
type NeedPhase string

const (
	NeedWaiting  NeedPhase = "waiting"
	NeedAssigned NeedPhase = "assigned"
	NeedServed   NeedPhase = "served"
)

// WaitReason is why a waiting need waits, as the page, GET /status and
// a metric show it; Detail says it in words.
type WaitReason string

const (
	// ReasonNotAsked: a provisioner covers it, but none was asked yet.
	ReasonNotAsked WaitReason = "not_asked"
	// ReasonNoFit: no provisioner can start a machine this big.
	ReasonNoFit WaitReason = "no_fit"
	// ReasonTooLong: machines large enough exist, but none lasts the
	// task's timeout plus the worker's end margin.
	ReasonTooLong WaitReason = "too_long"
	// ReasonMismatch: a machine of the profile it was asked of attached
	// and could not take it (a feature it lacks, too little time left,
	// less than its profile says); no other of that profile is asked for
	// it until the mismatch's hold passes, and then one at a time.
	ReasonMismatch WaitReason = "mismatch"
	// ReasonQueued: asked for; its machine is on its way (queued in the
	// scheduler, or starting).
	ReasonQueued WaitReason = "queued"
	// ReasonCapped: a cap of the provisioner's configuration
	// (max_workers, max_pending) holds it below the demand; also a
	// provisioner's CAPPED that names no condition (before contract 2.5).
	ReasonCapped WaitReason = "capped"
	// ReasonSiteLimit: an accounting limit of the site's holds it;
	// weather that clears as jobs end.
	ReasonSiteLimit WaitReason = "site_limit"
	// ReasonThrottled: the site's submit throttle gives submissions back
	// in its own time; weather.
	ReasonThrottled WaitReason = "throttled"
	// ReasonClusterFull: the cluster takes no new job; weather.
	ReasonClusterFull WaitReason = "cluster_full"
	// ReasonLoginNeeded: a person must log in before the provisioner
	// asks for anything.
	ReasonLoginNeeded WaitReason = "login_needed"
	// ReasonBackingOff: the profile's machines failed in a row.
	ReasonBackingOff WaitReason = "backing_off"
	// ReasonMisconfigured: the profile's machines failed for its
	// configuration; the operator must fix it.
	ReasonMisconfigured WaitReason = "misconfigured"
	// ReasonProvisionerDown: the provisioners that cover it are
	// restarting or failed.
	ReasonProvisionerDown WaitReason = "provisioner_down"
	// ReasonError: asking failed (the plugin answered an error).
	ReasonError WaitReason = "error"
)

// asked is what a target last said about a need.
type asked struct {
	reason WaitReason
	desc   string
}

// conditionReasons are the reasons a CAPPED or BACKING_OFF outcome's
// condition makes a need wait for.
var conditionReasons = map[shared.Condition]WaitReason{
	shared.ConditionCap:           ReasonCapped,
	shared.ConditionSiteLimit:     ReasonSiteLimit,
	shared.ConditionThrottled:     ReasonThrottled,
	shared.ConditionClusterFull:   ReasonClusterFull,
	shared.ConditionLoginNeeded:   ReasonLoginNeeded,
	shared.ConditionBackingOff:    ReasonBackingOff,
	shared.ConditionMisconfigured: ReasonMisconfigured,
}

// reasonOf is what a Provision outcome makes a need wait for: its
// condition, where a held-back outcome names one, else the outcome alone
// (a plugin before contract 2.5 names none).
func reasonOf(o shared.DemandOutcome) WaitReason {
	switch o.Outcome {
	case shared.OutcomeNoFit:
		return ReasonNoFit
	case shared.OutcomeBackingOff, shared.OutcomeCapped:
		if r, ok := conditionReasons[o.Condition]; ok {
			return r
		}
		if o.Outcome == shared.OutcomeBackingOff {
			return ReasonBackingOff
		}
		return ReasonCapped
	}
	return ReasonQueued
}

// NeedStatus is one need as GET /status shows it. A need of a task
// Submit made is the task: its ID is the task's id, the one every
// surface names it by; the attempt under way or that served it is a
// number beside it (Attempt), with its AttemptID for the workers'
// routes.
type NeedStatus struct {
	ID string `json:"id"`
	// Spec is the need as -need takes it.
	Spec  string      `json:"spec"`
	Need  worker.Need `json:"need"`
	State NeedPhase   `json:"state"`
	// TaskState is where a task's need's task stands: waiting, running,
	// or how it ended; empty for a need without a task (the stand-in's).
	TaskState TaskState `json:"task_state,omitempty"`
	// Reason is why it waits, while it does.
	Reason WaitReason `json:"reason,omitempty"`
	// Worker, Task, Attempt and AttemptID are set while assigned and
	// once served. Task is the task's id (the need's own, for a task
	// Submit made; empty for the stand-in's work, which is no task).
	Worker    string `json:"worker,omitempty"`
	Task      string `json:"task,omitempty"`
	Attempt   int    `json:"attempt,omitempty"`
	AttemptID string `json:"attempt_id,omitempty"`
	// Detail says what the need is waiting for, or what served it.
	Detail string  `json:"detail"`
	Result *Result `json:"result,omitempty"`
}

// Needs reports every need, in the order they were added.
func (p *router) Needs() []NeedStatus {
	return p.needsWhere(needQuery{limit: -1}).list
}

// needQuery is which needs GET /status lists: those whose state or task
// state is among states (every need when states is empty), the first
// limit of them (all when limit < 0).
type needQuery struct {
	states map[string]bool
	limit  int
}

// needsAnswer is the needs a needQuery lists, how many matched it, the
// count of every need by state and reason, and the need of every
// attempt out, by attempt id.
type needsAnswer struct {
	list    []NeedStatus
	matched int
	summary NeedCounts
	out     map[string]string
}

// NeedCounts is the needs by state, as GET /status's summary has them;
// Waiting's reasons are in ByReason. Forgotten are served needs the
// engine no longer lists (keepServed).
type NeedCounts struct {
	Waiting   int                `json:"waiting"`
	Assigned  int                `json:"assigned"`
	Served    int                `json:"served"`
	Forgotten int                `json:"forgotten"`
	ByReason  map[WaitReason]int `json:"by_reason"`
}

// needCounts is the needs by state and reason, as needsWhere counts
// them, listing none.
func (p *router) needCounts() NeedCounts { return p.needsWhere(needQuery{limit: 0}).summary }

// needsWhere answers q. A need is made a NeedStatus only when it is
// listed: with 100,000 needs waiting a page asks for a hundred, and the
// rest cost their count alone.
func (p *router) needsWhere(q needQuery) needsAnswer {
	p.mu.Lock()
	defer p.mu.Unlock()
	ans := needsAnswer{summary: NeedCounts{Forgotten: p.forgotten, ByReason: map[WaitReason]int{}}, out: map[string]string{}}
	if q.limit < 0 {
		ans.list = make([]NeedStatus, 0, len(p.needs))
	}
	for _, ns := range p.needs {
		phase, taskState := ns.phaseLocked()
		var reason WaitReason
		switch phase {
		case NeedWaiting:
			ans.summary.Waiting++
			reason = ns.waitReason(p.targets)
			ans.summary.ByReason[reason]++
		case NeedAssigned:
			ans.summary.Assigned++
			ans.out[ns.task] = ns.id
		case NeedServed:
			ans.summary.Served++
		}
		if len(q.states) > 0 && !q.states[string(phase)] && !q.states[string(taskState)] && !q.states[string(reason)] {
			continue
		}
		ans.matched++
		if q.limit >= 0 && len(ans.list) >= q.limit {
			continue
		}
		ans.list = append(ans.list, ns.status(p.targets))
	}
	return ans
}

// phaseLocked is where ns stands, and its task's state (empty for the
// stand-in's). p.mu must be held.
func (ns *needState) phaseLocked() (NeedPhase, TaskState) {
	var phase NeedPhase
	var state TaskState
	switch {
	case ns.served:
		phase, state = NeedServed, ns.ended
	case ns.task != "":
		phase, state = NeedAssigned, TaskRunning
	default:
		phase, state = NeedWaiting, TaskWaiting
	}
	if ns.rec == nil {
		state = ""
	}
	return phase, state
}

// status is ns as GET /status shows it, among targets. router.mu must
// be held.
func (ns *needState) status(targets []*targetState) NeedStatus {
	st := NeedStatus{ID: ns.id, Spec: needspec.Format(ns.need), Need: toNeedJSON(ns.need), Worker: ns.worker, AttemptID: ns.task}
	st.State, st.TaskState = ns.phaseLocked()
	if ns.rec != nil && (ns.task != "" || ns.served) {
		st.Task = ns.id
	}
	switch {
	case ns.served && ns.result != nil:
		res := *ns.result
		st.Result = &res
		st.Worker, st.AttemptID = res.Worker, res.TaskID
		st.Detail = fmt.Sprintf("served by %s on %s", res.Worker, res.Hostname)
		if ns.rec != nil {
			st.Detail = fmt.Sprintf("task %s on %s (%s)", ns.ended, res.Worker, res.Hostname)
		}
	case ns.served:
		st.Detail = fmt.Sprintf("task %s", ns.ended)
	case ns.task != "":
		st.Detail = fmt.Sprintf("running on %s", ns.worker)
		if ns.lost > 0 {
			st.Detail += fmt.Sprintf(" (attempt %d: its machine was lost under %d before)", ns.lost+1, ns.lost)
		}
	default:
		st.Reason, st.Detail = ns.waitWords(targets)
	}
	if st.AttemptID != "" {
		st.Attempt = int(ns.lost) + 1
	}
	return st
}

// waitReason is why a waiting need waits: the first covering target's
// answer, not asked yet, or, where no target covers it, too long (a
// shape holds its resources, none lasts its time) or no fit. It is the
// one rule: waitWords, /status's summary and filter and the metrics all
// take their reason from it. router.mu must be held.
func (ns *needState) waitReason(targets []*targetState) WaitReason {
	covered, holds := false, false
	for _, ts := range targets {
		if !ts.covers(ns.need) {
			holds = holds || slices.ContainsFunc(ts.Shapes, func(s shared.Shape) bool { return s.HoldsResources(ns.need) })
			continue
		}
		covered = true
		if a := ns.seen(ts.Name); a != nil && a.hasAsked {
			return a.asked.reason
		}
	}
	switch {
	case covered:
		return ReasonNotAsked
	case holds:
		return ReasonTooLong
	}
	return ReasonNoFit
}

// waitWords says why a waiting need waits, and in words: its
// waitReason, and every covering target's answer. router.mu must be
// held.
func (ns *needState) waitWords(targets []*targetState) (WaitReason, string) {
	reason := ns.waitReason(targets)
	var said []string
	for _, ts := range targets {
		if a := ns.seen(ts.Name); a != nil && a.hasAsked && ts.covers(ns.need) {
			said = append(said, ts.Name+" "+a.asked.desc)
		}
	}
	switch {
	case len(said) > 0:
		return reason, "waiting for a worker; " + strings.Join(said, "; ")
	case reason == ReasonNotAsked:
		return reason, "waiting for a worker; no provisioner asked yet"
	}
	var shapes []namedShape
	for _, ts := range targets {
		for _, s := range ts.Shapes {
			shapes = append(shapes, namedShape{ts.Name, s})
		}
	}
	what := "timeout"
	if ns.rec == nil {
		what = "work"
	}
	var fe *FitError
	if err := fitError(shapes, ns.need, what, ns.runFor()); errors.As(err, &fe) {
		if reason == ReasonTooLong {
			return reason, "waiting; nothing is asked for it: " + fe.Error()
		}
		return reason, "waiting; no provisioner can start a machine this big: " + fe.Error()
	}
	return reason, "waiting; no provisioner can start a machine this big"
}
