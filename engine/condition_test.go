package engine

import (
	"context"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/shared/sharedtest"
)

// TestConditionIsTheReason: a provisioner's CAPPED or BACKING_OFF that
// names a condition makes the need wait for that condition, so /status
// and fluksio_needs_waiting tell a cap from weather from "a person must
// act"; one that names none (a plugin before contract 2.5) is read by its
// outcome alone, as before.
func TestConditionIsTheReason(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var answer shared.DemandOutcome
	prov := &sharedtest.Provisioner{Name: "hpc", ShapeList: []shared.Shape{{Profile: "small", CPUs: 4}},
		OnProvision: func(r *shared.ProvisionRequest) (*shared.ProvisionResponse, error) {
			mu.Lock()
			defer mu.Unlock()
			resp := &shared.ProvisionResponse{}
			for range r.Demand {
				resp.Outcomes = append(resp.Outcomes, answer)
			}
			return resp, nil
		}}
	p := newRouter(nil, newBareBooks(nil, host.NewSigner(testSecret), nil), []target{{Name: "hpc", P: prov, Shapes: prov.ShapeList}})
	defer p.Close()
	p.Add(shared.Need{CPUs: 1})
	state := &stateCollector{
		health:  func() []provHealth { return nil },
		status:  func(context.Context) []host.ProvisionerStatus { return nil },
		workers: func() map[string]workerCounts { return nil },
		needs:   p.needCounts,
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(state)

	for _, tc := range []struct {
		outcome   shared.ProvisionOutcome
		condition shared.Condition
		want      WaitReason
	}{
		{shared.OutcomeCapped, shared.ConditionLoginNeeded, ReasonLoginNeeded},
		{shared.OutcomeCapped, shared.ConditionCap, ReasonCapped},
		{shared.OutcomeCapped, shared.ConditionSiteLimit, ReasonSiteLimit},
		{shared.OutcomeCapped, shared.ConditionThrottled, ReasonThrottled},
		{shared.OutcomeCapped, shared.ConditionClusterFull, ReasonClusterFull},
		{shared.OutcomeBackingOff, shared.ConditionMisconfigured, ReasonMisconfigured},
		{shared.OutcomeBackingOff, shared.ConditionBackingOff, ReasonBackingOff},
		// A plugin before 2.5 names no condition.
		{shared.OutcomeCapped, shared.ConditionNone, ReasonCapped},
		{shared.OutcomeBackingOff, shared.ConditionNone, ReasonBackingOff},
	} {
		mu.Lock()
		answer = shared.DemandOutcome{Outcome: tc.outcome, Profile: "small", Detail: "said in words", Condition: tc.condition}
		mu.Unlock()
		p.Pass(context.Background())
		st := p.Needs()
		if len(st) != 1 || st[0].State != NeedWaiting || st[0].Reason != tc.want {
			t.Errorf("%s with condition %s: the need is %+v; want it waiting for %s", tc.outcome, tc.condition, st, tc.want)
		}
		if got := waiting(t, reg); got[string(tc.want)] != 1 || sum(got) != 1 {
			t.Errorf("%s with condition %s: fluksio_needs_waiting %v; want 1 for %s alone", tc.outcome, tc.condition, got, tc.want)
		}
	}
}

// waiting is fluksio_needs_waiting by reason, as a scrape gathers it.
func waiting(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	return byReason(t, reg, "fluksio_needs_waiting")
}

// byReason is the gauge name summed by its reason label, as a scrape
// gathers it.
func byReason(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" {
					out[l.GetValue()] += m.GetGauge().GetValue()
				}
			}
		}
	}
	return out
}

func sum(m map[string]float64) float64 {
	var s float64
	for _, v := range m {
		s += v
	}
	return s
}

// TestMachinesPendingByReason: fluksio_machines_pending counts a
// provisioner's pending machines by the scheduler's word for why it
// holds them (contract 2.6's Outstanding.Reason), with a bounded label
// set whatever the plugin sends.
func TestMachinesPendingByReason(t *testing.T) {
	t.Parallel()
	outstanding := []shared.Outstanding{
		{State: "PENDING", Reason: "Priority"}, {State: "PENDING", Reason: "Priority"},
		{State: "PENDING", Reason: "QOSMaxJobsPerUserLimit"}, {State: "PENDING"},
		{State: "RUNNING"}, {State: "PENDING", Reason: `a "reason" of 1,000 words`},
	}
	state := &stateCollector{
		health: func() []provHealth { return nil },
		status: func(context.Context) []host.ProvisionerStatus {
			return []host.ProvisionerStatus{{Name: "hpc", Status: &shared.StatusResponse{Outstanding: outstanding}}}
		},
		workers: func() map[string]workerCounts { return nil },
		needs:   func() NeedCounts { return NeedCounts{} },
		profile: func(_, p string) string { return p },
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(state)
	got := pendingByReason(t, reg)
	want := map[string]float64{"Priority": 2, "QOSMaxJobsPerUserLimit": 1, "unknown": 1, "other": 1}
	if len(got) != len(want) {
		t.Errorf("fluksio_machines_pending = %v; want %v", got, want)
	}
	for r, n := range want {
		if got[r] != n {
			t.Errorf("fluksio_machines_pending{reason=%q} = %v; want %v (all: %v)", r, got[r], n, got)
		}
	}
	// A plugin that sends a reason per machine gets at most
	// maxPendingReasons label values.
	outstanding = nil
	for i := range 100 {
		outstanding = append(outstanding, shared.Outstanding{State: "PENDING", Reason: "Reason" + string(rune('A'+i%26)) + string(rune('a'+i/26))})
	}
	got = pendingByReason(t, reg)
	if len(got) > maxPendingReasons || sum(got) != 100 {
		t.Errorf("%d reasons, %v machines; want at most %d reasons and all 100 counted", len(got), sum(got), maxPendingReasons)
	}
}

func pendingByReason(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	return byReason(t, reg, "fluksio_machines_pending")
}
