// Command testplugin is the smallest honest provisioner, and the one to
// copy when you write your own in Go: it "starts" machines by remembering
// that it was asked. It shows what a third-party plugin needs beyond its
// own logic (the main function at the bottom), and the tests of shared,
// host-example and bench launch it as a real subprocess. It lives here,
// not under testdata, so that go vet and staticcheck read it like any
// other code. abuse.go and hang.go make it misbehave on purpose, for the
// host's tests, and broken.go breaks the protocol's rules one at a time,
// for the conformance checker's; a plugin of yours needs none of them.
//
// Its configuration:
//
//	greeting       = "hi"     # required
//	foreign_worker = false    # mint credentials for another provisioner's name
//	block_covers   = false    # Covers waits until its context ends
//	fail_provision = false    # every machine fails: worker_provision_failed
//	max_workers    = 0        # the most machines alive at once (on their way
//	                          # and attached); 0: as many as the demand
//
// A profile whose machines fail backs off, as docs/plugin-protocol.md asks
// of every plugin: not asked for again for a second, doubled with each
// failure in a row up to a minute, Provision answering BACKING_OFF and
// Status listing it meanwhile; a worker of it attaching ends that.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/internal/backoff"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/shared/plugin"
)

type config struct {
	Greeting      string `json:"greeting"`
	ForeignWorker bool   `json:"foreign_worker"`
	BlockCovers   bool   `json:"block_covers"`
	FailProvision bool   `json:"fail_provision"`
	MaxWorkers    int    `json:"max_workers"`
}

var shapes = []shared.Shape{
	{Profile: "small", CPUs: 1, RAMMB: 1000},
	{Profile: "gpu", CPUs: 4, GPUs: 1, RAMMB: 16000, Labels: []string{"cuda"}},
}

type memory struct {
	log hclog.Logger

	mu          sync.Mutex // guards everything below
	name        string
	cfg         *config
	host        shared.Host
	outstanding map[string]shared.Outstanding // by worker
	n           int
	shut        bool
	// failed counts, per profile, the machines that failed; backoff
	// holds the profiles backing off.
	failed  map[string]int64
	backoff map[string]*shared.Backoff
}

// Backoff of a profile whose machines fail: backoffBase doubled with each
// failure in a row, up to backoffMax.
const (
	backoffBase = time.Second
	backoffMax  = time.Minute
)

// failedLocked counts a machine of profile that failed and backs the
// profile off. m.mu must be held.
func (m *memory) failedLocked(profile, detail string) {
	if m.failed == nil {
		m.failed, m.backoff = map[string]int64{}, map[string]*shared.Backoff{}
	}
	m.failed[profile]++
	b := m.backoff[profile]
	if b == nil {
		b = &shared.Backoff{Profile: profile}
		m.backoff[profile] = b
	}
	b.Failures++
	b.Until, b.LastError = time.Now().Add(backoff.Delay(backoffBase, backoffMax, b.Failures)), detail
}

// backingOffLocked reports whether profile is backing off now. m.mu must
// be held.
func (m *memory) backingOffLocked(profile string) (*shared.Backoff, bool) {
	b := m.backoff[profile]
	return b, b != nil && time.Now().Before(b.Until)
}

func (m *memory) Info(context.Context, *shared.InfoRequest) (*shared.InfoResponse, error) {
	info := &shared.InfoResponse{Kind: "memory", Version: "0.1.0", ContractVersion: shared.ContractVersion,
		Capabilities: []shared.Capability{shared.CapabilityReconcileDelta}}
	brokenInfo(info)
	return info, nil
}

func (m *memory) Schema(context.Context, *shared.SchemaRequest) (*shared.SchemaResponse, error) {
	return &shared.SchemaResponse{Schema: &shared.Schema{Attributes: []shared.Attribute{
		{Name: "greeting", Type: shared.TypeString, Required: true, Description: "Any word."},
		{Name: "foreign_worker", Type: shared.TypeBool, Default: false, Description: "Mint for a worker that is not ours."},
		{Name: "block_covers", Type: shared.TypeBool, Default: false, Description: "Make Covers hang."},
		{Name: "fail_provision", Type: shared.TypeBool, Default: false, Description: "Make every Provision fail, as a rejected submission does."},
		{Name: "max_workers", Type: shared.TypeInt, Default: 0, Description: "The most machines alive at once, on their way and attached; 0: as many as the demand."},
	}}}, nil
}

func validate(raw json.RawMessage) (*config, shared.Diagnostics) {
	var c config
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, shared.Diagnostics{shared.Errorf(nil, "Malformed configuration", "%v", err)}
	}
	if c.MaxWorkers < 0 {
		return nil, shared.Diagnostics{shared.Errorf([]string{"max_workers"}, "Invalid max_workers", "%d machines: give 0 (no cap) or more.", c.MaxWorkers)}
	}
	if c.Greeting == "" || c.Greeting == "boom" {
		path := []string{"greeting"}
		if broken("diagpath") {
			path = nil
		}
		return nil, shared.Diagnostics{shared.Errorf(path, "Invalid greeting", "Say something other than %q.", c.Greeting)}
	}
	return &c, nil
}

func (m *memory) ValidateConfig(_ context.Context, req *shared.ValidateConfigRequest) (*shared.ValidateConfigResponse, error) {
	_, diags := validate(req.Config)
	return &shared.ValidateConfigResponse{Diagnostics: diags}, nil
}

func (m *memory) Configure(_ context.Context, req *shared.ConfigureRequest) (*shared.ConfigureResponse, error) {
	c, diags := validate(req.Config)
	if diags.HasErrors() {
		return &shared.ConfigureResponse{Diagnostics: diags}, nil
	}
	brokenConfigure()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.name, m.cfg, m.host = req.Name, c, req.Host
	m.outstanding = map[string]shared.Outstanding{}
	if abuse("event") && req.Host != nil {
		go abusiveEvent(req.Host)
	}
	if abuse("flood") && req.Host != nil {
		go abusiveFlood(req.Host, req.Name)
	}
	return &shared.ConfigureResponse{}, nil
}

func matching(label string) []shared.Shape {
	var out []shared.Shape
	for _, s := range shapes {
		if label == "" || s.HasLabel(label) {
			out = append(out, s)
		}
	}
	return out
}

func (m *memory) Shapes(_ context.Context, req *shared.ShapesRequest) (*shared.ShapesResponse, error) {
	//lint:ignore SA1019 honoured for a caller that still sets it; hosts send it empty
	return &shared.ShapesResponse{Shapes: matching(req.Label)}, nil
}

func fit(n shared.Need) (shared.Shape, bool) {
	for _, s := range shapes {
		if s.Fits(n) {
			return s, true
		}
	}
	return shared.Shape{}, false
}

func (m *memory) Covers(ctx context.Context, req *shared.CoversRequest) (*shared.CoversResponse, error) {
	m.mu.Lock()
	block := m.cfg != nil && m.cfg.BlockCovers
	m.mu.Unlock()
	if block {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	s, ok := fit(req.Need)
	return &shared.CoversResponse{Covered: ok, Profile: s.Profile}, nil
}

// Provision keeps, per profile, as many machines on their way as the
// demand maps to it: it adds the difference and, when the demand falls,
// cancels the newest beyond it. A real provisioner would submit in the
// background; this one is quick enough to answer at once.
func (m *memory) Provision(ctx context.Context, req *shared.ProvisionRequest) (*shared.ProvisionResponse, error) {
	m.mu.Lock()
	switch {
	case m.cfg == nil:
		m.mu.Unlock()
		return nil, bareError(shared.ErrNotConfigured)
	case m.shut:
		m.mu.Unlock()
		return nil, bareError(shared.ErrShutdown)
	}
	attached := map[string]bool{}
	for _, w := range req.Attached {
		attached[w] = true
	}
	for w, o := range m.outstanding {
		if attached[w] {
			delete(m.outstanding, w)
			delete(m.backoff, o.Profile)
		}
	}
	resp, add, cancelled := m.demandLocked(req)
	host, failProvision := m.host, m.cfg.FailProvision
	m.mu.Unlock()

	for _, o := range cancelled {
		m.publish(ctx, host, shared.Event{Kind: shared.EventWorkerCancelled, Profile: o.Profile, Job: o.Job, Worker: o.Worker, Detail: "demand fell"})
	}
	storms, minted := m.mint(ctx, host, add, failProvision)
	for i, o := range add {
		m.start(ctx, host, o, storms[i], failProvision, minted[o.Worker])
	}
	if broken("dies") {
		m.dieAll(ctx, host, add)
	}
	return resp, nil
}

// demandLocked answers the demand entry by entry and profile by
// profile, and returns the machines to start and those given up.
func (m *memory) demandLocked(req *shared.ProvisionRequest) (resp *shared.ProvisionResponse, add, cancelled []shared.Outstanding) {
	resp = &shared.ProvisionResponse{}
	wanted := map[string]int{}
	for _, d := range req.Demand {
		s, ok := fit(d.Need)
		if !ok {
			resp.Outcomes = append(resp.Outcomes, shared.DemandOutcome{Outcome: shared.OutcomeNoFit, Detail: "no profile fits"})
			continue
		}
		wanted[s.Profile] += d.Count
		resp.Outcomes = append(resp.Outcomes, shared.DemandOutcome{Outcome: shared.OutcomeOutstanding, Profile: s.Profile})
	}
	// room is how many more machines max_workers allows alive, counting
	// those on their way and those attached; -1: no cap.
	room := -1
	if m.cfg.MaxWorkers > 0 {
		room = max(0, m.cfg.MaxWorkers-len(m.outstanding)-len(req.Attached))
	}
	for _, s := range shapes {
		pd, a, c := m.profileLocked(s, wanted[s.Profile], &room, len(req.Attached), resp.Outcomes)
		add, cancelled = append(add, a...), append(cancelled, c...)
		if pd.Wanted > 0 || pd.OnTheWay > 0 || pd.Cancelled > 0 {
			resp.Profiles = append(resp.Profiles, pd)
		}
	}
	return resp, add, cancelled
}

// profileLocked keeps wanted machines of s's profile on their way,
// within its backoff and the room max_workers leaves, and says so in
// the outcomes of the entries it serves.
func (m *memory) profileLocked(s shared.Shape, wanted int, room *int, attached int, outcomes []shared.DemandOutcome) (pd shared.ProfileDemand, add, cancelled []shared.Outstanding) {
	var mine []shared.Outstanding
	for _, o := range m.outstanding {
		if o.Profile == s.Profile {
			mine = append(mine, o)
		}
	}
	slices.SortFunc(mine, func(a, b shared.Outstanding) int { return strings.Compare(a.Job, b.Job) })
	pd = shared.ProfileDemand{Profile: s.Profile, Wanted: wanted, OnTheWay: len(mine)}
	// say sets the outcome of the profile's entries, or of those still
	// outstanding only.
	say := func(onlyOutstanding bool, to shared.ProvisionOutcome, cond shared.Condition, detail string) {
		for i := range outcomes {
			if outcomes[i].Profile == s.Profile && (!onlyOutstanding || outcomes[i].Outcome == shared.OutcomeOutstanding) {
				outcomes[i].Outcome, outcomes[i].Condition, outcomes[i].Detail = to, cond, detail
			}
		}
	}
	// The storm mode (broken.go) never backs off.
	upTo := pd.Wanted
	if b, ok := m.backingOffLocked(s.Profile); ok && !broken("storm") && len(mine) < pd.Wanted {
		say(false, shared.OutcomeBackingOff, shared.ConditionBackingOff, fmt.Sprintf("%d failure(s) in a row, until %s: %s", b.Failures, b.Until.Format(time.TimeOnly), b.LastError))
		upTo = len(mine)
	}
	if *room >= 0 && upTo > len(mine)+*room {
		upTo = len(mine) + *room
		say(true, shared.OutcomeCapped, shared.ConditionCap, fmt.Sprintf("max_workers %d: %d attached, %d on their way", m.cfg.MaxWorkers, attached, len(m.outstanding)))
	}
	for n := len(mine); n < upTo; n++ {
		if *room > 0 {
			*room--
		}
		m.n++
		owner := m.name
		if m.cfg.ForeignWorker {
			owner = "someone-else"
		}
		o := shared.Outstanding{Profile: s.Profile, Job: fmt.Sprint(1000 + m.n), Worker: fmt.Sprintf("%s-%s-%08x", owner, s.Profile, m.n)}
		m.outstanding[o.Worker] = o
		add = append(add, o)
		pd.Requested++
		pd.OnTheWay++
	}
	for n := len(mine); n > pd.Wanted; n-- {
		o := mine[n-1]
		delete(m.outstanding, o.Worker)
		cancelled = append(cancelled, o)
		pd.Cancelled++
		pd.OnTheWay--
	}
	if pd.Requested > 0 {
		pd.Submissions = 1
		for i := range outcomes {
			if outcomes[i].Profile == s.Profile {
				outcomes[i].Outcome = shared.OutcomeRequested
			}
		}
	}
	return pd, add, cancelled
}

// mint draws whether each machine storms first, so that the credentials
// of those that will be started are asked for in one batch (contract
// 2.4; one at a time from an older host): a credential is worth one
// worker, and none is minted for a machine that dies unstarted. minted
// holds each asked-for worker's error, nil when its credential came.
func (m *memory) mint(ctx context.Context, host shared.Host, add []shared.Outstanding, failProvision bool) (storms []bool, minted map[string]error) {
	storms = make([]bool, len(add))
	mint := &shared.MintCredentialsRequest{}
	minted = map[string]error{}
	for i, o := range add {
		storms[i] = storming()
		if !storms[i] && !failProvision {
			s, _ := fit(shared.Need{Label: o.Profile})
			cpus, gpus := mintShape(i, s)
			req := &shared.MintCredentialRequest{
				Worker: o.Worker, TTL: time.Hour, CPUs: cpus, GPUs: gpus, RAMMB: s.RAMMB, Labels: s.Labels,
			}
			if abuse("bigmint") && i < 2 {
				_, minted[o.Worker] = host.MintCredential(ctx, req)
				continue
			}
			mint.Items = append(mint.Items, req)
		}
	}
	if len(mint.Items) > 0 {
		r, err := shared.MintCredentials(ctx, host, mint)
		for i, it := range mint.Items {
			if err != nil {
				minted[it.Worker] = err
			} else {
				minted[it.Worker] = r.Items[i].Err
			}
		}
	}
	return storms, minted
}

// start announces machine o: provisioned, or, when it storms, the
// configuration fails its submissions, or its credential was refused,
// failed and forgotten.
func (m *memory) start(ctx context.Context, host shared.Host, o shared.Outstanding, storms, failProvision bool, mintErr error) {
	ev := shared.Event{Kind: shared.EventWorkerProvisioned, Profile: o.Profile, Job: o.Job, Worker: o.Worker, Time: time.Now()}
	switch {
	case storms:
		// Started, and dead at once: announced, failed, and forgotten,
		// so that the next Provision asks again.
		m.publish(ctx, host, ev)
		ev.Kind, ev.Detail, ev.Class = shared.EventWorkerProvisionFailed, "the worker exited with status 1 before it attached", shared.FailureDiedBeforeAttach
		m.mu.Lock()
		delete(m.outstanding, o.Worker)
		m.failedLocked(o.Profile, ev.Detail)
		m.mu.Unlock()
	case failProvision:
		// As a submission the cluster rejects: forgotten, the profile
		// backing off (before the event, so that an engine asking
		// again on hearing it is told so), and the event says why.
		ev.Kind, ev.Job, ev.Detail = shared.EventWorkerProvisionFailed, "", "sbatch: error: invalid partition specified: nope"
		ev.Class = shared.FailureMisconfigured
		m.mu.Lock()
		delete(m.outstanding, o.Worker)
		m.failedLocked(o.Profile, ev.Detail)
		m.mu.Unlock()
	case mintErr != nil:
		m.mu.Lock()
		delete(m.outstanding, o.Worker)
		m.mu.Unlock()
		ev.Kind, ev.Detail = shared.EventWorkerProvisionFailed, mintErr.Error()
		// A refusal is this plugin's mistake; anything else (the
		// host gone, a deadline) may clear by itself.
		ev.Class = shared.FailureTransient
		if errors.Is(mintErr, shared.ErrPermissionDenied) || errors.Is(mintErr, shared.ErrInvalidArgument) {
			ev.Class = shared.FailureMisconfigured
		}
	}
	m.publish(ctx, host, ev)
}

// dieAll fails every machine of add still on its way, as if its worker
// exited before it attached (the broken mode "dies").
func (m *memory) dieAll(ctx context.Context, host shared.Host, add []shared.Outstanding) {
	for _, o := range add {
		ev := shared.Event{Kind: shared.EventWorkerProvisionFailed, Profile: o.Profile, Job: o.Job, Worker: o.Worker, Time: time.Now(),
			Detail: "the worker exited with status 1 before it attached", Class: shared.FailureDiedBeforeAttach}
		m.mu.Lock()
		_, ours := m.outstanding[o.Worker]
		if ours {
			delete(m.outstanding, o.Worker)
			m.failedLocked(o.Profile, ev.Detail)
		}
		m.mu.Unlock()
		if ours {
			m.publish(ctx, host, ev)
		}
	}
}

func (m *memory) publish(ctx context.Context, host shared.Host, ev shared.Event) {
	if err := host.Publish(ctx, ev); err != nil {
		m.log.Warn("could not publish", "error", err)
	}
}

func (m *memory) Reconcile(_ context.Context, req *shared.ReconcileRequest) (*shared.ReconcileResponse, error) {
	// Arrivals are among the whole list, or, in a delta (contract 2.4),
	// among those that joined: an outstanding worker cannot have
	// attached before the last call without being in it.
	attached := map[string]bool{}
	for _, w := range req.Attached {
		attached[w] = true
	}
	for _, w := range req.Joined {
		attached[w] = true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	resp := &shared.ReconcileResponse{}
	for w, o := range m.outstanding {
		if attached[w] {
			delete(m.outstanding, w)
			delete(m.backoff, o.Profile)
			resp.Arrived = append(resp.Arrived, w)
		}
	}
	return resp, nil
}

func (m *memory) Status(context.Context, *shared.StatusRequest) (*shared.StatusResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := &shared.StatusResponse{Name: m.name, Kind: "memory", Profiles: []string{"small", "gpu"}}
	for _, o := range m.outstanding {
		st.Outstanding = append(st.Outstanding, o)
	}
	if abuse("status") {
		abusiveStatus(st)
	}
	if len(m.failed) > 0 {
		class := shared.FailureMisconfigured
		if broken("storm") {
			class = shared.FailureDiedBeforeAttach
		}
		st.Counters = &shared.Counters{}
		for _, s := range shapes {
			if n := m.failed[s.Profile]; n > 0 {
				st.Counters.Failures = append(st.Counters.Failures, shared.FailureCount{Profile: s.Profile, Class: class, Count: n})
			}
			if b, ok := m.backingOffLocked(s.Profile); ok {
				st.BackingOff = append(st.BackingOff, *b)
			}
		}
	}
	return st, nil
}

func (m *memory) Shutdown(ctx context.Context, _ *shared.ShutdownRequest) (*shared.ShutdownResponse, error) {
	m.mu.Lock()
	m.shut = true
	var gone []shared.Outstanding
	for _, o := range m.outstanding {
		gone = append(gone, o)
	}
	m.outstanding = map[string]shared.Outstanding{}
	host := m.host
	m.mu.Unlock()
	resp := &shared.ShutdownResponse{}
	for _, o := range gone {
		resp.Cancelled = append(resp.Cancelled, o.Job)
		if host != nil {
			_ = host.Publish(ctx, shared.Event{Kind: shared.EventWorkerCancelled, Profile: o.Profile, Job: o.Job, Worker: o.Worker, Time: time.Now()})
		}
	}
	return resp, nil
}

func main() {
	// For the host's tests of what every command tells a plugin: the
	// variables it was started with, as NAME=VALUE lines in the file
	// TESTPLUGIN_ENV_FILE names ("(unset)" for one that is not set). A
	// plugin of yours reads FLUKSIO_PLUGIN_LOG_LEVEL, which plugin.Serve
	// does for it.
	if f := os.Getenv("TESTPLUGIN_ENV_FILE"); f != "" {
		var b strings.Builder
		for _, name := range []string{plugin.LogLevelEnv, "PLUGIN_MIN_PORT", "PLUGIN_MAX_PORT"} {
			v, ok := os.LookupEnv(name)
			if !ok {
				v = "(unset)"
			}
			fmt.Fprintf(&b, "%s=%s\n", name, v)
		}
		_ = os.WriteFile(f, []byte(b.String()), 0o644)
	}
	if os.Getenv("TESTPLUGIN_STDOUT") != "" {
		fmt.Println("hello from a plugin that forgot stdout is the handshake")
	}
	if abuse("stderr") {
		abusiveStderr()
	}
	brokenCookie()
	plugin.Serve(func(log hclog.Logger) shared.Provisioner { return withHang(&memory{log: log}) })
	if broken("controller") {
		time.Sleep(time.Hour)
	}
}
