package host

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
)

// TestSlowEventHandlerStallsNothing: an engine whose event handler blocks
// for 30 s on plugin a's first event delays neither plugin b's
// submissions nor plugin a's own: a's Provision, which mints a
// credential and publishes an event per machine, returns before its
// context's deadline with every credential minted, and b's events reach
// b's handler while a's is still blocked. Before the event queue, a's
// Publish waited for the handler, and Provision ran out its context.
func TestSlowEventHandlerStallsNothing(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex // guards minted
	minted := map[string]int{}
	signer := signerFunc(func(c CredentialClaims, ttl time.Duration) (string, time.Time, error) {
		mu.Lock()
		minted[c.Provisioner]++
		mu.Unlock()
		return "token", time.Now().Add(ttl), nil
	})
	stalled := make(chan struct{})
	release := make(chan struct{})
	var stallOnce sync.Once
	blocked := func(shared.Event) {
		stallOnce.Do(func() {
			close(stalled)
			select {
			case <-release:
			case <-time.After(30 * time.Second):
			}
		})
	}
	bEvents := make(chan shared.Event, 16)
	a := launchTest(t, LaunchConfig{Name: "a", Signer: signer, OnEvent: blocked})
	// Registered after a's Kill, so it runs before it: Kill waits for the
	// handler to take a's queued events.
	t.Cleanup(func() { close(release) })
	b := launchTest(t, LaunchConfig{Name: "b", Signer: signer, OnEvent: func(ev shared.Event) { bEvents <- ev }})
	for _, p := range []*Plugin{a, b} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := p.Provisioner().Configure(ctx, &shared.ConfigureRequest{Name: p.Name(), Config: json.RawMessage(`{"greeting":"hi"}`)})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	provision := func(p *Plugin, count int) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		deadline, _ := ctx.Deadline()
		_, err := p.Provisioner().Provision(ctx, &shared.ProvisionRequest{Demand: []shared.Demand{{Need: shared.Need{CPUs: 1}, Count: count}}})
		return time.Until(deadline), err
	}

	if _, err := provision(a, 1); err != nil {
		t.Fatal(err)
	}
	select {
	case <-stalled:
	case <-time.After(10 * time.Second):
		t.Fatal("a's first event did not reach the handler within 10s")
	}
	// a's handler is blocked from here on. Two more machines of a's:
	// two more mints and two more events.
	left, err := provision(a, 3)
	if err != nil || left <= 0 {
		t.Fatalf("a's Provision with its handler blocked: %v, %s before its deadline; want it done before", err, left)
	}
	t.Logf("a's Provision (2 mints, 2 events) returned %s before its deadline", left)
	left, err = provision(b, 2)
	if err != nil || left <= 0 {
		t.Fatalf("b's Provision with a's handler blocked: %v, %s before its deadline", err, left)
	}
	t.Logf("b's Provision (2 mints, 2 events) returned %s before its deadline", left)
	for i := range 2 {
		select {
		case ev := <-bEvents:
			if ev.Kind != shared.EventWorkerProvisioned || ev.Provisioner != "b" {
				t.Errorf("b's event %d: %+v", i, ev)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("b's event %d did not reach its handler within 10s", i)
		}
	}
	select {
	case <-release:
		t.Fatal("a's handler was released before the checks: they measured nothing")
	default:
	}
	mu.Lock()
	defer mu.Unlock()
	if minted["a"] != 3 || minted["b"] != 2 {
		t.Errorf("minted %v; want a:3 b:2", minted)
	}
	if n := a.DroppedEvents(); n != 0 {
		t.Errorf("%d of a's events dropped; the queue holds %d", n, DefaultEventQueue)
	}
}
