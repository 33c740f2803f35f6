package shared

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
)

// mockProvisioner is a Provisioner whose methods are closures, so each
// test says exactly what the far side does. Unset methods fail loudly.
type mockProvisioner struct {
	InfoF           func(context.Context, *InfoRequest) (*InfoResponse, error)
	SchemaF         func(context.Context, *SchemaRequest) (*SchemaResponse, error)
	ValidateConfigF func(context.Context, *ValidateConfigRequest) (*ValidateConfigResponse, error)
	ConfigureF      func(context.Context, *ConfigureRequest) (*ConfigureResponse, error)
	ShapesF         func(context.Context, *ShapesRequest) (*ShapesResponse, error)
	CoversF         func(context.Context, *CoversRequest) (*CoversResponse, error)
	ProvisionF      func(context.Context, *ProvisionRequest) (*ProvisionResponse, error)
	ReconcileF      func(context.Context, *ReconcileRequest) (*ReconcileResponse, error)
	StatusF         func(context.Context, *StatusRequest) (*StatusResponse, error)
	ShutdownF       func(context.Context, *ShutdownRequest) (*ShutdownResponse, error)
}

var errUnset = errors.New("mock: method not set")

func (m *mockProvisioner) Info(ctx context.Context, r *InfoRequest) (*InfoResponse, error) {
	if m.InfoF == nil {
		return nil, errUnset
	}
	return m.InfoF(ctx, r)
}
func (m *mockProvisioner) Schema(ctx context.Context, r *SchemaRequest) (*SchemaResponse, error) {
	if m.SchemaF == nil {
		return nil, errUnset
	}
	return m.SchemaF(ctx, r)
}
func (m *mockProvisioner) ValidateConfig(ctx context.Context, r *ValidateConfigRequest) (*ValidateConfigResponse, error) {
	if m.ValidateConfigF == nil {
		return nil, errUnset
	}
	return m.ValidateConfigF(ctx, r)
}
func (m *mockProvisioner) Configure(ctx context.Context, r *ConfigureRequest) (*ConfigureResponse, error) {
	if m.ConfigureF == nil {
		return nil, errUnset
	}
	return m.ConfigureF(ctx, r)
}
func (m *mockProvisioner) Shapes(ctx context.Context, r *ShapesRequest) (*ShapesResponse, error) {
	if m.ShapesF == nil {
		return nil, errUnset
	}
	return m.ShapesF(ctx, r)
}
func (m *mockProvisioner) Covers(ctx context.Context, r *CoversRequest) (*CoversResponse, error) {
	if m.CoversF == nil {
		return nil, errUnset
	}
	return m.CoversF(ctx, r)
}
func (m *mockProvisioner) Provision(ctx context.Context, r *ProvisionRequest) (*ProvisionResponse, error) {
	if m.ProvisionF == nil {
		return nil, errUnset
	}
	return m.ProvisionF(ctx, r)
}
func (m *mockProvisioner) Reconcile(ctx context.Context, r *ReconcileRequest) (*ReconcileResponse, error) {
	if m.ReconcileF == nil {
		return nil, errUnset
	}
	return m.ReconcileF(ctx, r)
}
func (m *mockProvisioner) Status(ctx context.Context, r *StatusRequest) (*StatusResponse, error) {
	if m.StatusF == nil {
		return nil, errUnset
	}
	return m.StatusF(ctx, r)
}
func (m *mockProvisioner) Shutdown(ctx context.Context, r *ShutdownRequest) (*ShutdownResponse, error) {
	if m.ShutdownF == nil {
		return nil, errUnset
	}
	return m.ShutdownF(ctx, r)
}

// inMemory serves impl through the real adapters over an in-memory gRPC
// connection and returns the client side.
func inMemory(t *testing.T, impl Provisioner) *grpcClient {
	t.Helper()
	client, _ := plugin.TestPluginGRPCConn(t, false, map[string]plugin.Plugin{PluginName: &GRPCPlugin{Impl: impl}})
	t.Cleanup(func() { client.Close() })
	raw, err := client.Dispense(PluginName)
	if err != nil {
		t.Fatal(err)
	}
	return raw.(*grpcClient)
}

func TestRoundTripEveryMethod(t *testing.T) {
	ctx := context.Background()
	deadline := time.Unix(1700000000, 0)
	schema := &Schema{
		Attributes: []Attribute{{Name: "login", Type: TypeString, Required: true, Description: "who"},
			{Name: "max_idle", Type: TypeDuration, Default: "5m"},
			{Name: "cmd", Type: TypeListString, Default: []any{"a", "b"}, Sensitive: true}},
		Blocks: []BlockType{{Name: "profile", Labels: []string{"name"}, MinItems: 1, MaxItems: 3,
			Body: &Schema{Attributes: []Attribute{{Name: "cpus", Type: TypeInt, Default: float64(1)}}}}},
	}
	diags := Diagnostics{
		{Severity: SeverityError, Summary: "Bad", Detail: "fix it", Path: []string{"profile", "1", "cpus"}},
		{Severity: SeverityWarning, Summary: "Hmm"},
	}
	shapes := []Shape{{Profile: "a", CPUs: 1}, {Profile: "b", CPUs: 4, GPUs: 2, RAMMB: 1 << 40, Labels: []string{"x", "y"}}}
	status := &StatusResponse{Name: "n", Kind: "k", Profiles: []string{"a", "b"}, LastError: "oops",
		Outstanding: []Outstanding{{Profile: "a", Job: "12", Worker: "n-a-1", Age: 1500 * time.Millisecond, State: "PENDING"}},
		BackingOff:  []Backoff{{Profile: "b", Failures: 3, Until: time.Unix(1700000000, 5), LastError: "sbatch: nope"}}}
	need := Need{CPUs: 3, GPUs: 1, RAMMB: 2048, Label: "x"}

	impl := &mockProvisioner{
		InfoF: func(context.Context, *InfoRequest) (*InfoResponse, error) {
			return &InfoResponse{Kind: "k", Version: "1.2.3", ContractVersion: ContractVersion, Capabilities: []string{"c"}}, nil
		},
		SchemaF: func(context.Context, *SchemaRequest) (*SchemaResponse, error) {
			return &SchemaResponse{Schema: schema}, nil
		},
		ValidateConfigF: func(_ context.Context, r *ValidateConfigRequest) (*ValidateConfigResponse, error) {
			if r.Name != "n" || string(r.Config) != `{"a":1}` {
				return nil, fmt.Errorf("got %q %s", r.Name, r.Config)
			}
			return &ValidateConfigResponse{Diagnostics: diags}, nil
		},
		ConfigureF: func(_ context.Context, r *ConfigureRequest) (*ConfigureResponse, error) {
			if r.Host == nil {
				return nil, errors.New("the SDK gave the plugin no Host")
			}
			return &ConfigureResponse{Diagnostics: diags[1:]}, nil
		},
		ShapesF: func(_ context.Context, r *ShapesRequest) (*ShapesResponse, error) {
			if r.Label != "x" {
				return nil, fmt.Errorf("label %q", r.Label)
			}
			return &ShapesResponse{Shapes: shapes}, nil
		},
		CoversF: func(_ context.Context, r *CoversRequest) (*CoversResponse, error) {
			return &CoversResponse{Covered: r.Need == need, Profile: "b"}, nil
		},
		ProvisionF: func(_ context.Context, r *ProvisionRequest) (*ProvisionResponse, error) {
			if r.Need != need {
				return nil, fmt.Errorf("need %+v", r.Need)
			}
			return &ProvisionResponse{Outcome: OutcomeBackingOff, Profile: "b", Detail: "wait"}, nil
		},
		ReconcileF: func(_ context.Context, r *ReconcileRequest) (*ReconcileResponse, error) {
			return &ReconcileResponse{Arrived: r.Attached[:1], Expired: []string{"7"}}, nil
		},
		StatusF: func(context.Context, *StatusRequest) (*StatusResponse, error) { return status, nil },
		ShutdownF: func(ctx context.Context, r *ShutdownRequest) (*ShutdownResponse, error) {
			if !r.Deadline.Equal(deadline) {
				return nil, fmt.Errorf("deadline %v", r.Deadline)
			}
			if d, ok := ctx.Deadline(); !ok || d.After(deadline) {
				return nil, fmt.Errorf("context deadline %v %v", d, ok)
			}
			return &ShutdownResponse{Cancelled: []string{"7", "8"}}, nil
		},
	}
	c := inMemory(t, impl)

	info, err := c.Info(ctx, &InfoRequest{})
	check(t, "Info", err, info, &InfoResponse{Kind: "k", Version: "1.2.3", ContractVersion: ContractVersion, Capabilities: []string{"c"}})
	sr, err := c.Schema(ctx, &SchemaRequest{})
	check(t, "Schema", err, sr.Schema, schema)
	vr, err := c.ValidateConfig(ctx, &ValidateConfigRequest{Name: "n", Config: json.RawMessage(`{"a":1}`)})
	check(t, "ValidateConfig", err, vr.Diagnostics, diags)
	cr, err := c.Configure(ctx, &ConfigureRequest{Name: "n", Config: json.RawMessage(`{}`), Host: &recordingHost{}})
	check(t, "Configure", err, cr.Diagnostics, diags[1:])
	shr, err := c.Shapes(ctx, &ShapesRequest{Label: "x"})
	check(t, "Shapes", err, shr.Shapes, shapes)
	cov, err := c.Covers(ctx, &CoversRequest{Need: need})
	check(t, "Covers", err, cov, &CoversResponse{Covered: true, Profile: "b"})
	pr, err := c.Provision(ctx, &ProvisionRequest{Need: need})
	check(t, "Provision", err, pr, &ProvisionResponse{Outcome: OutcomeBackingOff, Profile: "b", Detail: "wait"})
	rr, err := c.Reconcile(ctx, &ReconcileRequest{Attached: []string{"w1", "w2"}})
	check(t, "Reconcile", err, rr, &ReconcileResponse{Arrived: []string{"w1"}, Expired: []string{"7"}})
	st, err := c.Status(ctx, &StatusRequest{})
	check(t, "Status", err, st, status)
	dctx, cancel := context.WithDeadline(ctx, deadline.Add(time.Hour*1e5))
	defer cancel()
	sd, err := c.Shutdown(dctx, &ShutdownRequest{Deadline: deadline})
	check(t, "Shutdown", err, sd, &ShutdownResponse{Cancelled: []string{"7", "8"}})
}

func check(t *testing.T, what string, err error, got, want any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s:\n got %#v\nwant %#v", what, got, want)
	}
}

func TestErrorsCrossTheWire(t *testing.T) {
	for _, sentinel := range []error{ErrNotConfigured, ErrShutdown, ErrNoHost, ErrPermissionDenied,
		ErrInvalidArgument, ErrUnimplemented, context.Canceled, context.DeadlineExceeded} {
		t.Run(sentinel.Error(), func(t *testing.T) {
			c := inMemory(t, &mockProvisioner{ProvisionF: func(context.Context, *ProvisionRequest) (*ProvisionResponse, error) {
				return nil, fmt.Errorf("while asking: %w", sentinel)
			}})
			_, err := c.Provision(context.Background(), &ProvisionRequest{})
			if !errors.Is(err, sentinel) {
				t.Fatalf("got %v (%T), want errors.Is %v", err, err, sentinel)
			}
			if want := "while asking: " + sentinel.Error(); err.Error() != want {
				t.Errorf("message %q, want %q", err, want)
			}
		})
	}
	t.Run("plain error keeps its text", func(t *testing.T) {
		c := inMemory(t, &mockProvisioner{})
		_, err := c.Status(context.Background(), &StatusRequest{})
		if err == nil || err.Error() != errUnset.Error() {
			t.Fatalf("got %v", err)
		}
	})
}

func TestCallerCancellationReachesThePlugin(t *testing.T) {
	entered := make(chan struct{})
	sawCancel := make(chan struct{})
	c := inMemory(t, &mockProvisioner{CoversF: func(ctx context.Context, _ *CoversRequest) (*CoversResponse, error) {
		close(entered)
		<-ctx.Done()
		close(sawCancel)
		return nil, ctx.Err()
	}})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.Covers(ctx, &CoversRequest{})
		errc <- err
	}()
	<-entered
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	select {
	case <-sawCancel:
	case <-time.After(5 * time.Second):
		t.Fatal("the plugin never saw the cancellation")
	}
}

func TestCallsAfterThePluginIsGone(t *testing.T) {
	done, cancel := context.WithCancel(context.Background())
	c := inMemory(t, &mockProvisioner{})
	c.done = done
	cancel()
	if _, err := c.Info(context.Background(), &InfoRequest{}); !errors.Is(err, ErrPluginGone) {
		t.Fatalf("got %v, want ErrPluginGone", err)
	}
}

// recordingHost is a Host that remembers what it was told.
type recordingHost struct {
	mu     sync.Mutex // guards events
	events []Event
	mint   func(*MintCredentialRequest) (*MintCredentialResponse, error)
}

func (h *recordingHost) Publish(_ context.Context, ev Event) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, ev)
	return nil
}

func (h *recordingHost) MintCredential(_ context.Context, r *MintCredentialRequest) (*MintCredentialResponse, error) {
	if h.mint == nil {
		return nil, ErrPermissionDenied
	}
	return h.mint(r)
}

func (h *recordingHost) Events() []Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Event(nil), h.events...)
}

func TestHostChannelInMemory(t *testing.T) {
	var pluginHost Host
	c := inMemory(t, &mockProvisioner{ConfigureF: func(_ context.Context, r *ConfigureRequest) (*ConfigureResponse, error) {
		pluginHost = r.Host
		return &ConfigureResponse{}, nil
	}})
	var minted *MintCredentialRequest
	host := &recordingHost{mint: func(r *MintCredentialRequest) (*MintCredentialResponse, error) {
		minted = r
		return &MintCredentialResponse{Token: "tok-" + r.Worker, Expires: time.Unix(42, 0)}, nil
	}}
	ctx := context.Background()
	if _, err := c.Configure(ctx, &ConfigureRequest{Name: "n", Host: host}); err != nil {
		t.Fatal(err)
	}

	// Publish from several goroutines at once: the host must see every
	// event, numbered without gaps, in the order they were numbered.
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := pluginHost.Publish(ctx, Event{Kind: EventWorkerProvisioned, Job: fmt.Sprint(i)}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	events := host.Events()
	if len(events) != 50 {
		t.Fatalf("host saw %d events, want 50", len(events))
	}
	for i, ev := range events {
		if ev.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d", i, ev.Seq)
		}
	}

	cred, err := pluginHost.MintCredential(ctx, &MintCredentialRequest{Worker: "n-a-1", TTL: time.Minute, CPUs: 4, GPUs: 1, RAMMB: 16000, Labels: []string{"cuda"}})
	if err != nil || cred.Token != "tok-n-a-1" || !cred.Expires.Equal(time.Unix(42, 0)) {
		t.Fatalf("mint: %+v %v", cred, err)
	}
	// The shape crosses the wire: the host binds the credential to it.
	if minted == nil || minted.CPUs != 4 || minted.GPUs != 1 || minted.RAMMB != 16000 || !slices.Equal(minted.Labels, []string{"cuda"}) || minted.TTL != time.Minute {
		t.Fatalf("the host was asked to mint %+v", minted)
	}
	host.mint = nil
	if _, err := pluginHost.MintCredential(ctx, &MintCredentialRequest{Worker: "x"}); !errors.Is(err, ErrPermissionDenied) {
		t.Fatalf("refused mint: got %v", err)
	}
}

func TestPluginWithoutHostChannel(t *testing.T) {
	// A plugin configured without a host (an engine that never opened the
	// channel) gets a clear error, not a hang.
	var pluginHost Host
	c := inMemory(t, &mockProvisioner{ConfigureF: func(_ context.Context, r *ConfigureRequest) (*ConfigureResponse, error) {
		pluginHost = r.Host
		return &ConfigureResponse{}, nil
	}})
	if _, err := c.Configure(context.Background(), &ConfigureRequest{Name: "n"}); err != nil {
		t.Fatal(err)
	}
	if err := pluginHost.Publish(context.Background(), Event{}); !errors.Is(err, ErrNoHost) {
		t.Fatalf("publish: got %v", err)
	}
	if _, err := pluginHost.MintCredential(context.Background(), &MintCredentialRequest{}); !errors.Is(err, ErrNoHost) {
		t.Fatalf("mint: got %v", err)
	}
}

func TestHostGuard(t *testing.T) {
	var claims []CredentialClaims
	signer := signerFunc(func(c CredentialClaims, ttl time.Duration) (string, time.Time, error) {
		claims = append(claims, c)
		return "signed:" + c.Worker, time.Unix(0, 0).Add(ttl), nil
	})
	var got []Event
	g := &hostGuard{name: "hpc", signer: signer, maxTTL: 2 * time.Hour, onEvent: func(e Event) { got = append(got, e) }, logger: nullLogger()}
	for _, tc := range []struct {
		worker string
		ok     bool
	}{
		{"hpc-cpu-0a1b2c3d", true},
		{"hpc-", false},
		{"hpc", false},
		{"hpcx-cpu-1", false},
		{"other-cpu-1", false},
		{"hpc-cpu-1;rm -rf /", false},
		{"hpc-cpu-1\n", false},
	} {
		_, err := g.MintCredential(context.Background(), &MintCredentialRequest{Worker: tc.worker, TTL: time.Minute, CPUs: 1})
		if tc.ok != (err == nil) || (!tc.ok && !errors.Is(err, ErrPermissionDenied)) {
			t.Errorf("mint %q: err %v, want ok=%v", tc.worker, err, tc.ok)
		}
	}
	r, err := g.MintCredential(context.Background(), &MintCredentialRequest{Worker: "hpc-a-1", TTL: 100 * time.Hour, CPUs: 1})
	if err != nil || !r.Expires.Equal(time.Unix(0, 0).Add(2*time.Hour)) {
		t.Errorf("the TTL was not capped: %+v %v", r, err)
	}
	// No TTL: the default, not the cap.
	r, err = g.MintCredential(context.Background(), &MintCredentialRequest{Worker: "hpc-a-2", CPUs: 1})
	if err != nil || !r.Expires.Equal(time.Unix(0, 0).Add(DefaultCredentialTTL)) {
		t.Errorf("no TTL: %+v %v; want %s", r, err, DefaultCredentialTTL)
	}
	// The credential binds the shape the plugin asked for and the
	// guard's own name as the provisioner.
	claims = nil
	if _, err := g.MintCredential(context.Background(), &MintCredentialRequest{Worker: "hpc-gpu-1", TTL: time.Minute, CPUs: 4, GPUs: 1, RAMMB: 16000, Labels: []string{"cuda"}}); err != nil {
		t.Fatal(err)
	}
	want := CredentialClaims{Worker: "hpc-gpu-1", Provisioner: "hpc", CPUs: 4, GPUs: 1, RAMMB: 16000, Labels: []string{"cuda"}}
	if len(claims) != 1 || !reflect.DeepEqual(claims[0], want) {
		t.Errorf("signed %+v; want %+v", claims, want)
	}
	// A credential for no shape at all, or a label that could mean
	// something to a shell, is refused.
	for _, req := range []*MintCredentialRequest{
		{Worker: "hpc-a-3", TTL: time.Minute},
		{Worker: "hpc-a-3", TTL: time.Minute, CPUs: 1, GPUs: -1},
		{Worker: "hpc-a-3", TTL: time.Minute, CPUs: 1, Labels: []string{"a b"}},
	} {
		if _, err := g.MintCredential(context.Background(), req); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("mint %+v: err %v; want invalid argument", req, err)
		}
	}
	_ = g.Publish(context.Background(), Event{Provisioner: "impostor", Kind: EventWorkerProvisioned})
	if len(got) != 1 || got[0].Provisioner != "hpc" || got[0].Time.IsZero() {
		t.Errorf("event not stamped: %+v", got)
	}
}

type signerFunc func(CredentialClaims, time.Duration) (string, time.Time, error)

func (f signerFunc) Sign(c CredentialClaims, ttl time.Duration) (string, time.Time, error) {
	return f(c, ttl)
}

func nullLogger() hclog.Logger { return hclog.NewNullLogger() }
