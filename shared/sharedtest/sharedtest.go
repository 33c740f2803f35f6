// Package sharedtest has the one fake provisioner and the one fake host
// that tests of every package use, instead of a copy each.
//
// They are fakes for the other side of what a test exercises: a router or
// a wire adapter needs a Provisioner that answers plausibly, a provisioner
// needs a Host that records its events and mints tokens that are easy to
// look for. Neither talks to anything; the real plugin and the real host
// are tested as real subprocesses elsewhere.
//
// It may not be imported by non-test code.
package sharedtest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/fluksio/provision/shared"
)

// Provisioner is a shared.Provisioner in memory. Each method calls its
// field of the same name with F appended when set; otherwise it answers
// plausibly: Shapes and Covers from ShapeList, Provision with OnProvision
// (OutcomeNoFit when nil), the rest with empty answers. Provision counts
// its calls.
type Provisioner struct {
	Name      string
	ShapeList []shared.Shape
	// OnProvision decides what Provision does when ProvisionF is nil.
	OnProvision func(*shared.ProvisionRequest) (*shared.ProvisionResponse, error)

	InfoF           func(context.Context, *shared.InfoRequest) (*shared.InfoResponse, error)
	SchemaF         func(context.Context, *shared.SchemaRequest) (*shared.SchemaResponse, error)
	ValidateConfigF func(context.Context, *shared.ValidateConfigRequest) (*shared.ValidateConfigResponse, error)
	ConfigureF      func(context.Context, *shared.ConfigureRequest) (*shared.ConfigureResponse, error)
	ShapesF         func(context.Context, *shared.ShapesRequest) (*shared.ShapesResponse, error)
	CoversF         func(context.Context, *shared.CoversRequest) (*shared.CoversResponse, error)
	ProvisionF      func(context.Context, *shared.ProvisionRequest) (*shared.ProvisionResponse, error)
	ReconcileF      func(context.Context, *shared.ReconcileRequest) (*shared.ReconcileResponse, error)
	StatusF         func(context.Context, *shared.StatusRequest) (*shared.StatusResponse, error)
	ShutdownF       func(context.Context, *shared.ShutdownRequest) (*shared.ShutdownResponse, error)

	mu    sync.Mutex // guards calls
	calls []*shared.ProvisionRequest
}

var _ shared.Provisioner = (*Provisioner)(nil)

// LastDemand is the demand of the last Provision call, nil before any.
func (p *Provisioner) LastDemand() []shared.Demand {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.calls) == 0 {
		return nil
	}
	return p.calls[len(p.calls)-1].Demand
}

// ProvisionCalls is how many times Provision was called.
func (p *Provisioner) ProvisionCalls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.calls)
}

func (p *Provisioner) Info(ctx context.Context, r *shared.InfoRequest) (*shared.InfoResponse, error) {
	if p.InfoF != nil {
		return p.InfoF(ctx, r)
	}
	return &shared.InfoResponse{Kind: "fake", Version: "0", ContractVersion: shared.ContractVersion}, nil
}

func (p *Provisioner) Schema(ctx context.Context, r *shared.SchemaRequest) (*shared.SchemaResponse, error) {
	if p.SchemaF != nil {
		return p.SchemaF(ctx, r)
	}
	return &shared.SchemaResponse{Schema: &shared.Schema{}}, nil
}

func (p *Provisioner) ValidateConfig(ctx context.Context, r *shared.ValidateConfigRequest) (*shared.ValidateConfigResponse, error) {
	if p.ValidateConfigF != nil {
		return p.ValidateConfigF(ctx, r)
	}
	return &shared.ValidateConfigResponse{}, nil
}

func (p *Provisioner) Configure(ctx context.Context, r *shared.ConfigureRequest) (*shared.ConfigureResponse, error) {
	if p.ConfigureF != nil {
		return p.ConfigureF(ctx, r)
	}
	return &shared.ConfigureResponse{}, nil
}

func (p *Provisioner) Shapes(ctx context.Context, r *shared.ShapesRequest) (*shared.ShapesResponse, error) {
	if p.ShapesF != nil {
		return p.ShapesF(ctx, r)
	}
	var out []shared.Shape
	for _, s := range p.ShapeList {
		//lint:ignore SA1019 the fake honours the deprecated label, as a plugin may
		if r.Label == "" || s.HasLabel(r.Label) {
			out = append(out, s)
		}
	}
	return &shared.ShapesResponse{Shapes: out}, nil
}

func (p *Provisioner) Covers(ctx context.Context, r *shared.CoversRequest) (*shared.CoversResponse, error) {
	if p.CoversF != nil {
		return p.CoversF(ctx, r)
	}
	for _, s := range p.ShapeList {
		if s.Fits(r.Need) {
			return &shared.CoversResponse{Covered: true, Profile: s.Profile}, nil
		}
	}
	return &shared.CoversResponse{}, nil
}

func (p *Provisioner) Provision(ctx context.Context, r *shared.ProvisionRequest) (*shared.ProvisionResponse, error) {
	p.mu.Lock()
	p.calls = append(p.calls, r)
	p.mu.Unlock()
	switch {
	case p.ProvisionF != nil:
		return p.ProvisionF(ctx, r)
	case p.OnProvision != nil:
		return p.OnProvision(r)
	}
	resp := &shared.ProvisionResponse{}
	for range r.Demand {
		resp.Outcomes = append(resp.Outcomes, shared.DemandOutcome{Outcome: shared.OutcomeNoFit})
	}
	return resp, nil
}

func (p *Provisioner) Reconcile(ctx context.Context, r *shared.ReconcileRequest) (*shared.ReconcileResponse, error) {
	if p.ReconcileF != nil {
		return p.ReconcileF(ctx, r)
	}
	return &shared.ReconcileResponse{}, nil
}

func (p *Provisioner) Status(ctx context.Context, r *shared.StatusRequest) (*shared.StatusResponse, error) {
	if p.StatusF != nil {
		return p.StatusF(ctx, r)
	}
	return &shared.StatusResponse{Name: p.Name, Kind: "fake"}, nil
}

func (p *Provisioner) Shutdown(ctx context.Context, r *shared.ShutdownRequest) (*shared.ShutdownResponse, error) {
	if p.ShutdownF != nil {
		return p.ShutdownF(ctx, r)
	}
	return &shared.ShutdownResponse{}, nil
}

// Host is a shared.Host in memory: it records the events it is given
// and the credential requests it answers. MintF, when set, answers
// instead (a refusal, a slow engine); otherwise the token is
// Token(worker), or "token-"+worker when Token is nil.
type Host struct {
	Token func(worker string) string
	MintF func(context.Context, *shared.MintCredentialRequest) (*shared.MintCredentialResponse, error)

	mu     sync.Mutex // guards events, minted and arrived
	events []shared.Event
	minted []shared.MintCredentialRequest
	// arrived is closed at the next Publish, for WaitEvents; nil until
	// someone waits.
	arrived chan struct{}
}

var _ shared.Host = (*Host)(nil)

func (h *Host) Publish(_ context.Context, ev shared.Event) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, ev)
	if h.arrived != nil {
		close(h.arrived)
		h.arrived = nil
	}
	return nil
}

// WaitEvents waits until n events have been published, or ctx ends, and
// returns those published so far. Over the wire a plugin's Publish
// returns once the host has queued the event, before the host's Publish
// has run, so a test reads Events through this.
func (h *Host) WaitEvents(ctx context.Context, n int) ([]shared.Event, error) {
	for {
		h.mu.Lock()
		if len(h.events) >= n {
			defer h.mu.Unlock()
			return slices.Clone(h.events), nil
		}
		if h.arrived == nil {
			h.arrived = make(chan struct{})
		}
		arrived := h.arrived
		h.mu.Unlock()
		select {
		case <-arrived:
		case <-ctx.Done():
			return h.Events(), fmt.Errorf("%w waiting for %d events", ctx.Err(), n)
		}
	}
}

func (h *Host) MintCredential(ctx context.Context, r *shared.MintCredentialRequest) (*shared.MintCredentialResponse, error) {
	if h.MintF != nil {
		resp, err := h.MintF(ctx, r)
		if err == nil {
			h.mu.Lock()
			h.minted = append(h.minted, *r)
			h.mu.Unlock()
		}
		return resp, err
	}
	token := "token-" + r.Worker
	if h.Token != nil {
		token = h.Token(r.Worker)
	}
	h.mu.Lock()
	h.minted = append(h.minted, *r)
	h.mu.Unlock()
	return &shared.MintCredentialResponse{Token: token, Expires: time.Now().Add(r.TTL)}, nil
}

// Events are the events published so far, oldest first.
func (h *Host) Events() []shared.Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.events)
}

// Minted are the credential requests answered so far.
func (h *Host) Minted() []shared.MintCredentialRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.minted)
}

// Wants is a test's demand as a set: each need asked for is wanted once,
// and stays wanted, as an engine with one waiting node per need would
// keep saying.
type Wants struct {
	mu    sync.Mutex // guards needs
	needs []shared.Demand
}

// Ask adds need (count machines, at least the count already wanted) to
// the demand, sends the whole demand to p, and returns what p did about
// need.
func (w *Wants) Ask(ctx context.Context, p shared.Provisioner, need shared.Need, count int) (*shared.DemandOutcome, *shared.ProvisionResponse, error) {
	w.mu.Lock()
	i := slices.IndexFunc(w.needs, func(d shared.Demand) bool { return d.Need == need })
	if i < 0 {
		w.needs = append(w.needs, shared.Demand{Need: need, Count: count})
		i = len(w.needs) - 1
	}
	w.needs[i].Count = max(w.needs[i].Count, count)
	demand := slices.Clone(w.needs)
	w.mu.Unlock()
	resp, err := p.Provision(ctx, &shared.ProvisionRequest{Demand: demand})
	if err != nil {
		return nil, nil, err
	}
	return &resp.Outcomes[i], resp, nil
}

// Set makes count machines that fit need the demand for it; 0 drops it.
func (w *Wants) Set(need shared.Need, count int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.needs = slices.DeleteFunc(w.needs, func(d shared.Demand) bool { return d.Need == need })
	if count > 0 {
		w.needs = append(w.needs, shared.Demand{Need: need, Count: count})
	}
}
