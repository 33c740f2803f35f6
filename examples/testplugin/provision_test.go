package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/shared/sharedtest"
)

// configured is the reference plugin configured with cfg, in process,
// its events and mints going to host.
func configured(t *testing.T, cfg string, host shared.Host) *memory {
	t.Helper()
	m := &memory{log: hclog.NewNullLogger()}
	c, err := m.Configure(context.Background(), &shared.ConfigureRequest{Name: "mem", Config: json.RawMessage(cfg), Host: host})
	if err != nil || c.Diagnostics.HasErrors() {
		t.Fatalf("Configure: %v %v", err, c.Diagnostics)
	}
	return m
}

func small(count int) *shared.ProvisionRequest {
	return &shared.ProvisionRequest{Demand: []shared.Demand{{Need: shared.Need{CPUs: 1}, Count: count}}}
}

// TestProvisionWithinMaxWorkers: max_workers 3 and a demand of 5 ask
// for 3 (each minted and announced), say cap; asked again, nothing new
// and capped; a demand of 1 gives up the newest 2.
func TestProvisionWithinMaxWorkers(t *testing.T) {
	ctx := context.Background()
	host := &sharedtest.Host{}
	m := configured(t, `{"greeting":"hi","max_workers":3}`, host)

	resp, err := m.Provision(ctx, small(5))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Profiles) != 1 || resp.Profiles[0] != (shared.ProfileDemand{Profile: "small", Wanted: 5, Requested: 3, OnTheWay: 3, Submissions: 1}) {
		t.Errorf("first Provision's profiles: %+v; want small wanted 5, requested 3, on the way 3", resp.Profiles)
	}
	if o := resp.Outcomes[0]; o.Outcome != shared.OutcomeRequested || o.Condition != shared.ConditionCap || !strings.Contains(o.Detail, "max_workers 3") {
		t.Errorf("first outcome %+v; want requested, held by the cap", o)
	}
	if n := len(host.Minted()); n != 3 {
		t.Errorf("%d credentials minted; want 3", n)
	}

	resp, err = m.Provision(ctx, small(5))
	if err != nil {
		t.Fatal(err)
	}
	if o := resp.Outcomes[0]; o.Outcome != shared.OutcomeCapped || o.Condition != shared.ConditionCap || resp.Profiles[0].Requested != 0 {
		t.Errorf("the same demand again: %+v, %+v; want capped, nothing new", o, resp.Profiles)
	}

	resp, err = m.Provision(ctx, small(1))
	if err != nil {
		t.Fatal(err)
	}
	if p := resp.Profiles[0]; p.Cancelled != 2 || p.OnTheWay != 1 {
		t.Errorf("a demand of 1: %+v; want 2 cancelled, 1 on its way", p)
	}
	kinds := map[shared.EventKind]int{}
	for _, ev := range host.Events() {
		kinds[ev.Kind]++
	}
	if kinds[shared.EventWorkerProvisioned] != 3 || kinds[shared.EventWorkerCancelled] != 2 {
		t.Errorf("events %v; want 3 provisioned, 2 cancelled", kinds)
	}
}

// TestProvisionFailingBacksOff: with fail_provision every machine fails
// as a rejected submission (misconfigured, no credential minted), and
// the next Provision answers its profile backing off.
func TestProvisionFailingBacksOff(t *testing.T) {
	ctx := context.Background()
	host := &sharedtest.Host{}
	m := configured(t, `{"greeting":"hi","fail_provision":true}`, host)
	if _, err := m.Provision(ctx, small(1)); err != nil {
		t.Fatal(err)
	}
	evs := host.Events()
	if len(evs) != 1 || evs[0].Kind != shared.EventWorkerProvisionFailed || evs[0].Class != shared.FailureMisconfigured || len(host.Minted()) != 0 {
		t.Fatalf("events %+v, %d minted; want one worker_provision_failed, misconfigured, none minted", evs, len(host.Minted()))
	}
	resp, err := m.Provision(ctx, small(1))
	if err != nil {
		t.Fatal(err)
	}
	if o := resp.Outcomes[0]; o.Outcome != shared.OutcomeBackingOff || o.Condition != shared.ConditionBackingOff || !strings.Contains(o.Detail, "1 failure(s) in a row") {
		t.Errorf("after the failure: %+v; want backing off after 1 failure", o)
	}
}

// TestBackoffDoubles: a profile's nth failure in a row backs it off 1 s
// doubled n-1 times, at most a minute.
func TestBackoffDoubles(t *testing.T) {
	m := &memory{}
	for n, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, time.Minute, time.Minute} {
		before := time.Now()
		m.mu.Lock()
		m.failedLocked("small", "died")
		b := *m.backoff["small"]
		m.mu.Unlock()
		after := time.Now()
		if b.Failures != n+1 || b.Until.Before(before.Add(want)) || b.Until.After(after.Add(want)) {
			t.Errorf("failure %d: %d failures, until %s after it; want %s", n+1, b.Failures, b.Until.Sub(before), want)
		}
	}
}
