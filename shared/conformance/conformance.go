// Package conformance runs a provisioner plugin binary through the
// Provisioner contract, as a host would, and fails the test where the
// plugin breaks it. It is for plugin authors, in any language: build the
// plugin, write a configuration for it, and call Run from a Go test.
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, conformance.Config{
//			Binary: "./bin/provisioner-mykind",
//			HCL:    `endpoint = "https://example.test"`,
//			Invalid: []conformance.Invalid{
//				{HCL: `endpoint = "not a url"`, Path: []string{"endpoint"}},
//			},
//		})
//	}
//
// What it checks, each as a subtest: the handshake (nothing on stdout but
// the handshake line); Info; the schema (valid, stable, and able to decode
// the given HCL); ValidateConfig (accepts the good configuration, rejects
// each broken one with a diagnostic at the expected path); Configure;
// Shapes and Covers agree; Provision answers before its deadline, asks at
// most once per profile and is followed by an event; Reconcile is
// idempotent; Status is well formed; Shutdown returns before its deadline
// and the process exits.
//
// Provision really provisions: point the plugin at something it may use
// (a sandbox cluster, a test account). Shutdown at the end cancels what
// the run asked for.
package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/shared/hclconfig"
	"github.com/fluksio/provision/shared/host"
)

// Config says which plugin to run and how to configure it.
type Config struct {
	// Binary is the plugin executable.
	Binary string
	Args   []string
	Env    []string
	// Name is the provisioner's name; "conformance" if empty.
	Name string
	// HCL is a good configuration: the body of a provisioner block.
	HCL string
	// Invalid lists broken configurations the plugin must reject.
	Invalid []Invalid
	// Need is what to Provision; the smallest shape if zero.
	Need shared.Need
	// EventTimeout bounds the wait for the event that follows a
	// Provision; 60 seconds if zero.
	EventTimeout time.Duration
	// Logger receives the plugin's log; the test log if nil.
	Logger hclog.Logger
}

// Invalid is a broken configuration and where the plugin must say it is
// broken.
type Invalid struct {
	HCL string
	// Path is the diagnostic's expected path into the JSON configuration.
	Path []string
}

// Run launches the plugin and checks it. It stops at the first failure
// that makes the rest meaningless (no handshake, no schema).
func Run(t *testing.T, cfg Config) {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "conformance"
	}
	if cfg.EventTimeout == 0 {
		cfg.EventTimeout = 60 * time.Second
	}
	logger := cfg.Logger
	if logger == nil {
		w := &testWriter{t: t}
		defer w.close()
		logger = hclog.New(&hclog.LoggerOptions{Output: w, Level: hclog.Info})
	}
	events := &events{ch: make(chan shared.Event, 64)}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var plugin *host.Plugin
	if !t.Run("handshake", func(t *testing.T) {
		var err error
		plugin, err = host.Launch(ctx, host.LaunchConfig{
			Name: cfg.Name, Path: cfg.Binary, Args: cfg.Args, Env: cfg.Env, Logger: logger,
			Signer: fakeSigner{}, OnEvent: events.add,
		})
		if err != nil {
			t.Fatalf("launch: %v", err)
		}
	}) {
		return
	}
	defer plugin.Kill()
	p := plugin.Provisioner()

	var kind string
	t.Run("info", func(t *testing.T) {
		info, err := p.Info(ctx, &shared.InfoRequest{})
		if err != nil {
			t.Fatal(err)
		}
		kind = info.Kind
		if info.Kind == "" || info.Version == "" {
			t.Errorf("Info must name a kind and a version: %+v", info)
		}
		if major(info.ContractVersion) != major(shared.ContractVersion) {
			t.Errorf("contract version %q, this host speaks %q", info.ContractVersion, shared.ContractVersion)
		}
	})

	var good json.RawMessage
	invalid := make([]json.RawMessage, len(cfg.Invalid))
	if !t.Run("schema", func(t *testing.T) {
		first, err := p.Schema(ctx, &shared.SchemaRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if err := first.Schema.Validate(); err != nil {
			t.Fatalf("the schema is not one a host can use: %v", err)
		}
		again, err := p.Schema(ctx, &shared.SchemaRequest{})
		if err != nil || !reflect.DeepEqual(first.Schema, again.Schema) {
			t.Errorf("Schema answered differently the second time (%v)", err)
		}
		var diags hcl.Diagnostics
		good, diags = decode(cfg.HCL, first.Schema)
		if diags.HasErrors() {
			t.Fatalf("the good configuration does not decode against the plugin's schema: %s", diags.Error())
		}
		for i, inv := range cfg.Invalid {
			raw, diags := decode(inv.HCL, first.Schema)
			if diags.HasErrors() {
				t.Fatalf("invalid case %d is rejected by the schema itself, so it tests nothing of the plugin: %s", i, diags.Error())
			}
			invalid[i] = raw
		}
	}) {
		return
	}

	t.Run("validate", func(t *testing.T) {
		r, err := p.ValidateConfig(ctx, &shared.ValidateConfigRequest{Name: cfg.Name, Config: good})
		if err != nil {
			t.Fatal(err)
		}
		if r.Diagnostics.HasErrors() {
			t.Errorf("the good configuration was rejected: %s", r.Diagnostics.Error())
		}
		for i, inv := range cfg.Invalid {
			r, err := p.ValidateConfig(ctx, &shared.ValidateConfigRequest{Name: cfg.Name, Config: invalid[i]})
			if err != nil {
				t.Fatal(err)
			}
			if !hasPath(r.Diagnostics, inv.Path) {
				t.Errorf("a broken configuration at %s was not reported there; got %q", strings.Join(inv.Path, "."), r.Diagnostics.Error())
			}
		}
	})

	if !t.Run("configure", func(t *testing.T) {
		if _, err := p.Provision(ctx, &shared.ProvisionRequest{Demand: []shared.Demand{{Need: shared.Need{CPUs: 1}, Count: 1}}}); !errors.Is(err, shared.ErrNotConfigured) {
			t.Errorf("Provision before Configure: got %v, want ErrNotConfigured", err)
		}
		r, err := p.Configure(ctx, &shared.ConfigureRequest{Name: cfg.Name, Config: good})
		if err != nil {
			t.Fatal(err)
		}
		if r.Diagnostics.HasErrors() {
			t.Fatalf("Configure rejected the good configuration: %s", r.Diagnostics.Error())
		}
	}) {
		return
	}

	var shapes []shared.Shape
	t.Run("shapes and covers agree", func(t *testing.T) {
		r, err := p.Shapes(ctx, &shared.ShapesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		shapes = r.Shapes
		if len(shapes) == 0 {
			t.Fatal("a configured provisioner offers no shapes")
		}
		biggest := shared.Need{}
		for _, s := range shapes {
			for _, need := range []shared.Need{
				{CPUs: s.CPUs, GPUs: s.GPUs, RAMMB: s.RAMMB},
				{CPUs: s.CPUs, GPUs: s.GPUs, RAMMB: s.RAMMB, Label: s.Profile},
			} {
				c, err := p.Covers(ctx, &shared.CoversRequest{Need: need})
				if err != nil || !c.Covered {
					t.Errorf("Shapes offers %+v but Covers(%+v) says %+v (%v)", s, need, c, err)
				}
			}
			for _, l := range s.Labels {
				lr, err := p.Shapes(ctx, &shared.ShapesRequest{Label: l})
				if err != nil || !containsProfile(lr.Shapes, s.Profile) {
					t.Errorf("Shapes(%q) leaves out %q, which carries that label", l, s.Profile)
				}
			}
			biggest.CPUs = max(biggest.CPUs, s.CPUs)
			biggest.GPUs = max(biggest.GPUs, s.GPUs)
		}
		biggest.CPUs++
		if c, err := p.Covers(ctx, &shared.CoversRequest{Need: biggest}); err != nil || c.Covered {
			t.Errorf("Covers(%+v), more than any shape, says %+v (%v)", biggest, c, err)
		}
	})

	t.Run("provision", func(t *testing.T) {
		need := cfg.Need
		if need == (shared.Need{}) && len(shapes) > 0 {
			need = shared.Need{CPUs: shapes[0].CPUs, GPUs: shapes[0].GPUs, RAMMB: shapes[0].RAMMB}
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		// Two machines that fit, and one need nothing fits: the answer
		// comes entry by entry, and the same demand again asks for
		// nothing new.
		unfit := shared.Need{CPUs: 1 << 20}
		demand := &shared.ProvisionRequest{Demand: []shared.Demand{{Need: need, Count: 2}, {Need: unfit, Count: 1}}}
		r, err := p.Provision(pctx, demand)
		if err != nil {
			t.Fatalf("Provision did not answer within 5s, or failed: %v", err)
		}
		if len(r.Outcomes) != 2 || r.Outcomes[0].Outcome != shared.OutcomeRequested || r.Outcomes[1].Outcome != shared.OutcomeNoFit {
			t.Fatalf("Provision(2 × %+v, 1 × %+v) = %+v, want requested then no_fit", need, unfit, r)
		}
		profile := r.Outcomes[0].Profile
		if pd := profileDemand(r, profile); pd.Wanted < 2 || pd.Requested+pd.OnTheWay < 2 {
			t.Errorf("profile %s after asking for 2: %+v, want 2 wanted and 2 requested or on their way", profile, pd)
		}
		again, err := p.Provision(pctx, demand)
		if err != nil || len(again.Outcomes) != 2 || again.Outcomes[0].Outcome == shared.OutcomeRequested || profileDemand(again, profile).Requested != 0 {
			t.Errorf("the same demand again = %+v (%v), want nothing new asked for", again, err)
		}
		seen := 0
		for seen < 2 {
			select {
			case ev := <-events.ch:
				seen++
				if ev.Profile != profile || (ev.Kind != shared.EventWorkerProvisioned && ev.Kind != shared.EventWorkerProvisionFailed) {
					t.Errorf("event %d after Provision is %+v", seen, ev)
				}
				if ev.Kind == shared.EventWorkerProvisioned && !strings.HasPrefix(ev.Worker, cfg.Name+"-") {
					t.Errorf("worker %q is not named after its provisioner", ev.Worker)
				}
				// Reporting a failure is honest, but it is not
				// provisioning: the kit fails, and says what the plugin
				// said.
				if ev.Kind == shared.EventWorkerProvisionFailed {
					t.Errorf("Provision failed: worker_provision_failed for profile %s: %s", ev.Profile, ev.Detail)
				}
			case <-time.After(cfg.EventTimeout):
				t.Fatalf("%d of 2 worker_provisioned or worker_provision_failed events within %s of Provision", seen, cfg.EventTimeout)
			}
		}
	})

	t.Run("reconcile is idempotent", func(t *testing.T) {
		before, err := p.Status(ctx, &shared.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			r, err := p.Reconcile(ctx, &shared.ReconcileRequest{Attached: []string{"somebody-else-1"}})
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Arrived) != 0 {
				t.Errorf("Reconcile %d forgot %v, which never attached", i, r.Arrived)
			}
		}
		after, err := p.Status(ctx, &shared.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(before.Outstanding) != len(after.Outstanding) {
			t.Errorf("Reconcile changed what is outstanding: %d before, %d after", len(before.Outstanding), len(after.Outstanding))
		}
	})

	t.Run("status", func(t *testing.T) {
		st, err := p.Status(ctx, &shared.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if st.Name != cfg.Name || st.Kind != kind || len(st.Profiles) == 0 {
			t.Errorf("Status = %+v, want name %q, kind %q and its profiles", st, cfg.Name, kind)
		}
		for _, o := range st.Outstanding {
			if !contains(st.Profiles, o.Profile) || o.Age < 0 {
				t.Errorf("outstanding %+v is not for one of the profiles %v", o, st.Profiles)
			}
		}
	})

	t.Run("shutdown", func(t *testing.T) {
		sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if _, err := plugin.Stop(sctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if sctx.Err() != nil {
			t.Error("Shutdown did not return before its deadline")
		}
		select {
		case <-plugin.Exited():
		case <-time.After(10 * time.Second):
			t.Error("the plugin process did not exit after Shutdown")
		}
	})
}

func decode(body string, schema *shared.Schema) (json.RawMessage, hcl.Diagnostics) {
	f, diags := hclsyntax.ParseConfig([]byte(body), "conformance.hcl", hcl.InitialPos)
	if diags.HasErrors() {
		return nil, diags
	}
	return hclconfig.DecodeConfig(f.Body, schema, nil)
}

func hasPath(diags shared.Diagnostics, path []string) bool {
	for _, d := range diags {
		if d.Severity == shared.SeverityError && reflect.DeepEqual(d.Path, path) {
			return true
		}
	}
	return false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func containsProfile(shapes []shared.Shape, profile string) bool {
	for _, s := range shapes {
		if s.Profile == profile {
			return true
		}
	}
	return false
}

func major(v string) string {
	m, _, _ := strings.Cut(v, ".")
	return m
}

type events struct {
	ch chan shared.Event
}

// add keeps the first events; the kit only ever looks at the one after
// its Provision, and must never block the plugin's event stream.
func (e *events) add(ev shared.Event) {
	select {
	case e.ch <- ev:
	default:
	}
}

type fakeSigner struct{}

func (fakeSigner) Sign(_ host.CredentialClaims, ttl time.Duration) (string, time.Time, error) {
	return "conformance-credential", time.Now().Add(ttl), nil
}

// testWriter sends the plugin's log lines to the test log until Run
// returns; go-plugin may log a line after that, and testing panics on a
// Log from a finished test.
type testWriter struct {
	t      *testing.T
	mu     sync.Mutex // guards closed
	closed bool
}

func (w *testWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.t.Log(strings.TrimRight(string(b), "\n"))
	}
	return len(b), nil
}

func (w *testWriter) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
}

// profileDemand is r's entry for profile, zero if there is none.
func profileDemand(r *shared.ProvisionResponse, profile string) shared.ProfileDemand {
	for _, p := range r.Profiles {
		if p.Profile == profile {
			return p
		}
	}
	return shared.ProfileDemand{}
}
