package wire

//lint:file-ignore SA1019 the wire still carries the deprecated Covers and ShapesRequest.Label

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

	"github.com/hashicorp/go-plugin"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/shared/sharedtest"
)

func inMemory(t *testing.T, impl shared.Provisioner) *Client {
	t.Helper()
	client, _ := plugin.TestPluginGRPCConn(t, false, map[string]plugin.Plugin{PluginName: &GRPCPlugin{Impl: impl}})
	t.Cleanup(func() { client.Close() })
	raw, err := client.Dispense(PluginName)
	if err != nil {
		t.Fatal(err)
	}
	return raw.(*Client)
}

func TestRoundTripEveryMethod(t *testing.T) {
	ctx := context.Background()
	deadline := time.Unix(1700000000, 0)
	schema := &shared.Schema{
		Attributes: []shared.Attribute{{Name: "login", Type: shared.TypeString, Required: true, Description: "who"},
			{Name: "max_idle", Type: shared.TypeDuration, Default: "5m"},
			{Name: "cmd", Type: shared.TypeListString, Default: []any{"a", "b"}, Sensitive: true}},
		Blocks: []shared.BlockType{{Name: "profile", Labels: []string{"name"}, MinItems: 1, MaxItems: 3,
			Body: &shared.Schema{Attributes: []shared.Attribute{{Name: "cpus", Type: shared.TypeInt, Default: float64(1)}}}}},
	}
	diags := shared.Diagnostics{
		{Severity: shared.SeverityError, Summary: "Bad", Detail: "fix it", Path: []string{"profile", "1", "cpus"}},
		{Severity: shared.SeverityWarning, Summary: "Hmm"},
	}
	shapes := []shared.Shape{{Profile: "a", CPUs: 1, LifetimeFrom: shared.LifetimeUnlimited},
		{Profile: "b", CPUs: 4, GPUs: 2, RAMMB: 1 << 40, Labels: []string{"x", "y"}, Lifetime: 5 * time.Minute, LifetimeFrom: "--time=00:05:00"}}
	status := &shared.StatusResponse{Name: "n", Kind: "k", Profiles: []string{"a", "b"}, LastError: "oops",
		Outstanding: []shared.Outstanding{{Profile: "a", Job: "12", Worker: "n-a-1", Age: 1500 * time.Millisecond, State: "PENDING", Reason: "Priority"}},
		BackingOff:  []shared.Backoff{{Profile: "b", Failures: 3, Until: time.Unix(1700000000, 5), LastError: "sbatch: nope"}},
		Counts: []shared.ProfileCounts{{Profile: "a", Pending: 1, Starting: 2, Attached: 3,
			Submissions: []shared.Submission{{Job: "12", Machines: 40, OnTheWay: 3, Age: 2500 * time.Millisecond}}}},
		Notes: []string{"job arrays refused"},
		Counters: &shared.Counters{
			Failures: []shared.FailureCount{{Profile: "a", Class: shared.FailureDiedBeforeAttach, Count: 2}},
			Commands: []shared.CommandStats{{Command: "sbatch", Calls: 5, Errors: 1, SSHErrors: 2, Timeouts: 1, Rationed: 3,
				Buckets: []float64{0.1, 1}, BucketCounts: []int64{3, 4}, DurationSum: 2500 * time.Millisecond}},
		},
		Runtime: &shared.Runtime{HeapLiveBytes: 5 << 20, HeapObjectsBytes: 7 << 20, Goroutines: 42}}
	need := shared.Need{CPUs: 3, GPUs: 1, RAMMB: 2048, Label: "x", Lifetime: 135 * time.Second}
	// Every field of the answer set, so that a converter that drops one
	// fails the round trip.
	provisioned := &shared.ProvisionResponse{
		Outcomes: []shared.DemandOutcome{{Outcome: shared.OutcomeCapped, Profile: "b", Detail: "max_pending 2", Condition: shared.ConditionCap}},
		Profiles: []shared.ProfileDemand{{Profile: "b", Wanted: 3, OnTheWay: 2, Attached: 1, Requested: 2, Submissions: 1, Cancelled: 4}},
	}

	impl := &sharedtest.Provisioner{
		InfoF: func(context.Context, *shared.InfoRequest) (*shared.InfoResponse, error) {
			return &shared.InfoResponse{Kind: "k", Version: "1.2.3", ContractVersion: shared.ContractVersion, Capabilities: []shared.Capability{"c", shared.CapabilityReconcileDelta}}, nil
		},
		SchemaF: func(context.Context, *shared.SchemaRequest) (*shared.SchemaResponse, error) {
			return &shared.SchemaResponse{Schema: schema}, nil
		},
		ValidateConfigF: func(_ context.Context, r *shared.ValidateConfigRequest) (*shared.ValidateConfigResponse, error) {
			if r.Name != "n" || string(r.Config) != `{"a":1}` {
				return nil, fmt.Errorf("got %q %s", r.Name, r.Config)
			}
			return &shared.ValidateConfigResponse{Diagnostics: diags}, nil
		},
		ConfigureF: func(_ context.Context, r *shared.ConfigureRequest) (*shared.ConfigureResponse, error) {
			if r.Host == nil {
				return nil, errors.New("the SDK gave the plugin no Host")
			}
			return &shared.ConfigureResponse{Diagnostics: diags[1:]}, nil
		},
		ShapesF: func(_ context.Context, r *shared.ShapesRequest) (*shared.ShapesResponse, error) {
			if r.Label != "x" {
				return nil, fmt.Errorf("label %q", r.Label)
			}
			return &shared.ShapesResponse{Shapes: shapes}, nil
		},
		CoversF: func(_ context.Context, r *shared.CoversRequest) (*shared.CoversResponse, error) {
			return &shared.CoversResponse{Covered: r.Need == need, Profile: "b"}, nil
		},
		ProvisionF: func(_ context.Context, r *shared.ProvisionRequest) (*shared.ProvisionResponse, error) {
			if len(r.Demand) != 1 || r.Demand[0] != (shared.Demand{Need: need, Count: 3}) || !slices.Equal(r.Attached, []string{"w1"}) {
				return nil, fmt.Errorf("request %+v", r)
			}
			return provisioned, nil
		},
		ReconcileF: func(_ context.Context, r *shared.ReconcileRequest) (*shared.ReconcileResponse, error) {
			return &shared.ReconcileResponse{Arrived: r.Attached[:1], Expired: []string{"7"}}, nil
		},
		StatusF: func(context.Context, *shared.StatusRequest) (*shared.StatusResponse, error) { return status, nil },
		ShutdownF: func(ctx context.Context, r *shared.ShutdownRequest) (*shared.ShutdownResponse, error) {
			if !r.Deadline.Equal(deadline) {
				return nil, fmt.Errorf("deadline %v", r.Deadline)
			}
			if d, ok := ctx.Deadline(); !ok || d.After(deadline) {
				return nil, fmt.Errorf("context deadline %v %v", d, ok)
			}
			return &shared.ShutdownResponse{Cancelled: []string{"7", "8"}}, nil
		},
	}
	c := inMemory(t, impl)

	info, err := c.Info(ctx, &shared.InfoRequest{})
	check(t, "Info", err, info, &shared.InfoResponse{Kind: "k", Version: "1.2.3", ContractVersion: shared.ContractVersion, Capabilities: []shared.Capability{"c", shared.CapabilityReconcileDelta}})
	sr, err := c.Schema(ctx, &shared.SchemaRequest{})
	check(t, "Schema", err, sr.Schema, schema)
	vr, err := c.ValidateConfig(ctx, &shared.ValidateConfigRequest{Name: "n", Config: json.RawMessage(`{"a":1}`)})
	check(t, "ValidateConfig", err, vr.Diagnostics, diags)
	cr, err := c.Configure(ctx, &shared.ConfigureRequest{Name: "n", Config: json.RawMessage(`{}`), Host: &sharedtest.Host{}})
	check(t, "Configure", err, cr.Diagnostics, diags[1:])
	shr, err := c.Shapes(ctx, &shared.ShapesRequest{Label: "x"})
	check(t, "Shapes", err, shr.Shapes, shapes)
	cov, err := c.Covers(ctx, &shared.CoversRequest{Need: need})
	check(t, "Covers", err, cov, &shared.CoversResponse{Covered: true, Profile: "b"})
	pr, err := c.Provision(ctx, &shared.ProvisionRequest{Demand: []shared.Demand{{Need: need, Count: 3}}, Attached: []string{"w1"}})
	check(t, "Provision", err, pr, provisioned)
	rr, err := c.Reconcile(ctx, &shared.ReconcileRequest{Attached: []string{"w1", "w2"}})
	check(t, "Reconcile", err, rr, &shared.ReconcileResponse{Arrived: []string{"w1"}, Expired: []string{"7"}})
	st, err := c.Status(ctx, &shared.StatusRequest{})
	check(t, "Status", err, st, status)
	dctx, cancel := context.WithDeadline(ctx, deadline.Add(time.Hour*1e5))
	defer cancel()
	sd, err := c.Shutdown(dctx, &shared.ShutdownRequest{Deadline: deadline})
	check(t, "Shutdown", err, sd, &shared.ShutdownResponse{Cancelled: []string{"7", "8"}})
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
	for _, sentinel := range []error{shared.ErrNotConfigured, shared.ErrShutdown, shared.ErrNoHost, shared.ErrPermissionDenied,
		shared.ErrInvalidArgument, shared.ErrUnimplemented, context.Canceled, context.DeadlineExceeded} {
		t.Run(sentinel.Error(), func(t *testing.T) {
			c := inMemory(t, &sharedtest.Provisioner{ProvisionF: func(context.Context, *shared.ProvisionRequest) (*shared.ProvisionResponse, error) {
				return nil, fmt.Errorf("while asking: %w", sentinel)
			}})
			_, err := c.Provision(context.Background(), &shared.ProvisionRequest{})
			if !errors.Is(err, sentinel) {
				t.Fatalf("got %v (%T), want errors.Is %v", err, err, sentinel)
			}
			if want := "while asking: " + sentinel.Error(); err.Error() != want {
				t.Errorf("message %q, want %q", err, want)
			}
		})
	}
	t.Run("plain error keeps its text", func(t *testing.T) {
		plain := errors.New("the plugin's own words")
		c := inMemory(t, &sharedtest.Provisioner{StatusF: func(context.Context, *shared.StatusRequest) (*shared.StatusResponse, error) {
			return nil, plain
		}})
		_, err := c.Status(context.Background(), &shared.StatusRequest{})
		if err == nil || err.Error() != plain.Error() {
			t.Fatalf("got %v", err)
		}
	})
}

func TestCallerCancellationReachesThePlugin(t *testing.T) {
	entered := make(chan struct{})
	sawCancel := make(chan struct{})
	c := inMemory(t, &sharedtest.Provisioner{CoversF: func(ctx context.Context, _ *shared.CoversRequest) (*shared.CoversResponse, error) {
		close(entered)
		<-ctx.Done()
		close(sawCancel)
		return nil, ctx.Err()
	}})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.Covers(ctx, &shared.CoversRequest{})
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
	c := inMemory(t, &sharedtest.Provisioner{})
	c.done = done
	cancel()
	if _, err := c.Info(context.Background(), &shared.InfoRequest{}); !errors.Is(err, shared.ErrPluginGone) {
		t.Fatalf("got %v, want ErrPluginGone", err)
	}
}

func TestHostChannelInMemory(t *testing.T) {
	var pluginHost shared.Host
	c := inMemory(t, &sharedtest.Provisioner{ConfigureF: func(_ context.Context, r *shared.ConfigureRequest) (*shared.ConfigureResponse, error) {
		pluginHost = r.Host
		return &shared.ConfigureResponse{}, nil
	}})
	var minted *shared.MintCredentialRequest
	host := &sharedtest.Host{MintF: func(_ context.Context, r *shared.MintCredentialRequest) (*shared.MintCredentialResponse, error) {
		minted = r
		return &shared.MintCredentialResponse{Token: "tok-" + r.Worker, Expires: time.Unix(42, 0)}, nil
	}}
	ctx := context.Background()
	if _, err := c.Configure(ctx, &shared.ConfigureRequest{Name: "n", Host: host}); err != nil {
		t.Fatal(err)
	}

	// Publish from several goroutines at once: the host must see every
	// event, numbered without gaps, in the order they were numbered.
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := pluginHost.Publish(ctx, shared.Event{Kind: shared.EventWorkerProvisioned, Job: fmt.Sprint(i)}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	// A failure's class crosses (contract 2.3); an event without one,
	// as an older plugin sends, arrives unclassified.
	for _, class := range []shared.FailureClass{shared.FailureMisconfigured, ""} {
		if err := pluginHost.Publish(ctx, shared.Event{Kind: shared.EventWorkerProvisionFailed, Class: class}); err != nil {
			t.Fatal(err)
		}
	}
	// So does a job's state (contract 2.6).
	if err := pluginHost.Publish(ctx, shared.Event{Kind: shared.EventWorkerJobEnded, JobState: "NODE_FAIL"}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	events, err := host.WaitEvents(wctx, 53)
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 53 {
		t.Fatalf("host saw %d events, want 53", len(events))
	}
	if events[52].Kind != shared.EventWorkerJobEnded || events[52].JobState != "NODE_FAIL" {
		t.Errorf("worker_job_ended crossed as %+v", events[52])
	}
	for i, ev := range events {
		if ev.Seq != uint64(i+1) {
			t.Fatalf("event %d has seq %d", i, ev.Seq)
		}
	}
	if events[50].Class != shared.FailureMisconfigured || events[51].Class != "" {
		t.Errorf("classes crossed as %q and %q", events[50].Class, events[51].Class)
	}

	cred, err := pluginHost.MintCredential(ctx, &shared.MintCredentialRequest{Worker: "n-a-1", TTL: time.Minute, CPUs: 4, GPUs: 1, RAMMB: 16000, Labels: []string{"cuda"}})
	if err != nil || cred.Token != "tok-n-a-1" || !cred.Expires.Equal(time.Unix(42, 0)) {
		t.Fatalf("mint: %+v %v", cred, err)
	}
	// The shape crosses the wire: the host binds the credential to it.
	if minted == nil || minted.CPUs != 4 || minted.GPUs != 1 || minted.RAMMB != 16000 || !slices.Equal(minted.Labels, []string{"cuda"}) || minted.TTL != time.Minute {
		t.Fatalf("the host was asked to mint %+v", minted)
	}
	host.MintF = func(context.Context, *shared.MintCredentialRequest) (*shared.MintCredentialResponse, error) {
		return nil, shared.ErrPermissionDenied
	}
	if _, err := pluginHost.MintCredential(ctx, &shared.MintCredentialRequest{Worker: "x"}); !errors.Is(err, shared.ErrPermissionDenied) {
		t.Fatalf("refused mint: got %v", err)
	}
}

func TestPluginWithoutHostChannel(t *testing.T) {
	// A plugin configured without a host (an engine that never opened the
	// channel) gets a clear error, not a hang.
	var pluginHost shared.Host
	c := inMemory(t, &sharedtest.Provisioner{ConfigureF: func(_ context.Context, r *shared.ConfigureRequest) (*shared.ConfigureResponse, error) {
		pluginHost = r.Host
		return &shared.ConfigureResponse{}, nil
	}})
	if _, err := c.Configure(context.Background(), &shared.ConfigureRequest{Name: "n"}); err != nil {
		t.Fatal(err)
	}
	if err := pluginHost.Publish(context.Background(), shared.Event{}); !errors.Is(err, shared.ErrNoHost) {
		t.Fatalf("publish: got %v", err)
	}
	if _, err := pluginHost.MintCredential(context.Background(), &shared.MintCredentialRequest{}); !errors.Is(err, shared.ErrNoHost) {
		t.Fatalf("mint: got %v", err)
	}
}

// TestStatusCarriesThePluginsRuntime: a Go plugin whose Status says
// nothing of its runtime has it filled on the way out by the server,
// read in the plugin's process; one that says its own keeps it.
func TestStatusCarriesThePluginsRuntime(t *testing.T) {
	c := inMemory(t, &sharedtest.Provisioner{Name: "quiet"})
	got, err := c.Status(context.Background(), &shared.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if rt := got.Runtime; rt == nil || rt.HeapLiveBytes <= 0 || rt.HeapObjectsBytes <= 0 || rt.Goroutines < 2 {
		t.Errorf("a plugin silent on its runtime answered %+v; want its process's heap and goroutines", rt)
	}
	own := &shared.Runtime{HeapLiveBytes: 1, HeapObjectsBytes: 2, Goroutines: 3}
	c = inMemory(t, &sharedtest.Provisioner{StatusF: func(context.Context, *shared.StatusRequest) (*shared.StatusResponse, error) {
		return &shared.StatusResponse{Runtime: own}, nil
	}})
	if got, err := c.Status(context.Background(), &shared.StatusRequest{}); err != nil || got.Runtime == nil || *got.Runtime != *own {
		t.Errorf("a plugin's own runtime came as %+v, %v; want %+v", got.Runtime, err, own)
	}
}
