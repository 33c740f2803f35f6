package wire

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/fluksio/provision/internal/pb"
	"github.com/fluksio/provision/shared"
)

// Client is the host's view of a plugin: a Provisioner whose methods
// are RPCs. Each method builds a request, calls, and converts; the only
// logic here is turning "the process died" into ErrPluginGone promptly.
type Client struct {
	rpc pb.ProvisionerClient
	// done is cancelled by go-plugin when the plugin process exits.
	done context.Context

	mu   sync.Mutex // guards link
	link *hostLink  // the host's end of HostChannel, once opened

	// dropped counts the plugin's events that found the queue full.
	dropped atomic.Int64
}

var _ shared.Provisioner = (*Client)(nil)

func newGRPCClient(done context.Context, rpc pb.ProvisionerClient) *Client {
	if done == nil {
		done = context.Background()
	}
	return &Client{rpc: rpc, done: done}
}

// call runs one RPC bounded by both the caller's context and the plugin's
// life, so a call in flight when the process is killed returns at once
// instead of waiting for gRPC to notice the socket is gone.
func call[Req, Resp any](c *Client, ctx context.Context, req Req, rpc func(context.Context, Req, ...grpc.CallOption) (Resp, error)) (Resp, error) {
	var zero Resp
	if err := c.done.Err(); err != nil {
		return zero, fmt.Errorf("%w: the plugin process has exited", shared.ErrPluginGone)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(c.done, cancel)
	defer stop()
	resp, err := rpc(ctx, req)
	if err != nil {
		return zero, fromStatus(err, c.done.Err() != nil)
	}
	return resp, nil
}

func (c *Client) Info(ctx context.Context, _ *shared.InfoRequest) (*shared.InfoResponse, error) {
	r, err := call(c, ctx, &pb.InfoRequest{}, c.rpc.Info)
	if err != nil {
		return nil, err
	}
	return &shared.InfoResponse{Kind: r.GetKind(), Version: r.GetVersion(), ContractVersion: r.GetContractVersion(), Capabilities: capabilitiesFromProto(r.GetCapabilities())}, nil
}

func (c *Client) Schema(ctx context.Context, _ *shared.SchemaRequest) (*shared.SchemaResponse, error) {
	r, err := call(c, ctx, &pb.SchemaRequest{}, c.rpc.Schema)
	if err != nil {
		return nil, err
	}
	s, err := schemaFromProto(r.GetSchema())
	if err != nil {
		return nil, fmt.Errorf("the plugin sent a schema with a malformed default: %w", err)
	}
	return &shared.SchemaResponse{Schema: s}, nil
}

func (c *Client) ValidateConfig(ctx context.Context, req *shared.ValidateConfigRequest) (*shared.ValidateConfigResponse, error) {
	r, err := call(c, ctx, &pb.ValidateConfigRequest{Name: req.Name, ConfigJson: req.Config}, c.rpc.ValidateConfig)
	if err != nil {
		return nil, err
	}
	return &shared.ValidateConfigResponse{Diagnostics: diagsFromProto(r.GetDiagnostics())}, nil
}

// Check is the optional Checker: a plugin that does not offer it answers
// UNIMPLEMENTED, which comes back as shared.ErrUnimplemented.
func (c *Client) Check(ctx context.Context, req *shared.CheckRequest) (*shared.CheckResponse, error) {
	r, err := call(c, ctx, &pb.CheckRequest{Name: req.Name, ConfigJson: req.Config, EngineId: req.EngineID, Probe: req.Probe}, c.rpc.Check)
	if err != nil {
		return nil, err
	}
	resp := &shared.CheckResponse{Diagnostics: diagsFromProto(r.GetDiagnostics())}
	for _, f := range r.GetFacts() {
		resp.Facts = append(resp.Facts, shared.Fact{Name: f.GetName(), Value: f.GetValue(), Path: f.GetPath()})
	}
	return resp, nil
}

// Preview is the optional Previewer, as Check is.
func (c *Client) Preview(ctx context.Context, req *shared.PreviewRequest) (*shared.PreviewResponse, error) {
	r, err := call(c, ctx, &pb.PreviewRequest{Name: req.Name, ConfigJson: req.Config, Profile: req.Profile}, c.rpc.Preview)
	if err != nil {
		return nil, err
	}
	return &shared.PreviewResponse{Diagnostics: diagsFromProto(r.GetDiagnostics()), Text: r.GetText()}, nil
}

// Configure opens the host channel first when the request carries a Host
// and none is open yet, so the plugin can publish and mint from the moment
// it is configured.
func (c *Client) Configure(ctx context.Context, req *shared.ConfigureRequest) (*shared.ConfigureResponse, error) {
	if req.Host != nil {
		if err := c.OpenHostChannel(ctx, HostChannel{Name: req.Name, Host: req.Host}); err != nil {
			return nil, err
		}
	}
	r, err := call(c, ctx, &pb.ConfigureRequest{Name: req.Name, ConfigJson: req.Config, EngineId: req.EngineID, CredentialEpoch: req.CredentialEpoch, EngineAddress: req.EngineAddress}, c.rpc.Configure)
	if err != nil {
		return nil, err
	}
	return &shared.ConfigureResponse{Diagnostics: diagsFromProto(r.GetDiagnostics())}, nil
}

func (c *Client) Shapes(ctx context.Context, req *shared.ShapesRequest) (*shared.ShapesResponse, error) {
	//lint:ignore SA1019 the wire carries the deprecated label for a caller that still sets it
	r, err := call(c, ctx, &pb.ShapesRequest{Label: req.Label}, c.rpc.Shapes)
	if err != nil {
		return nil, err
	}
	return &shared.ShapesResponse{Shapes: shapesFromProto(r.GetShapes())}, nil
}

func (c *Client) Covers(ctx context.Context, req *shared.CoversRequest) (*shared.CoversResponse, error) {
	//lint:ignore SA1019 the wire carries the deprecated Covers for a caller that still asks
	r, err := call(c, ctx, &pb.CoversRequest{Need: needToProto(req.Need)}, c.rpc.Covers)
	if err != nil {
		return nil, err
	}
	return &shared.CoversResponse{Covered: r.GetCovered(), Profile: r.GetProfile()}, nil
}

func (c *Client) Provision(ctx context.Context, req *shared.ProvisionRequest) (*shared.ProvisionResponse, error) {
	r, err := call(c, ctx, provisionRequestToProto(req), c.rpc.Provision)
	if err != nil {
		return nil, err
	}
	return provisionResponseFromProto(r), nil
}

func (c *Client) Reconcile(ctx context.Context, req *shared.ReconcileRequest) (*shared.ReconcileResponse, error) {
	r, err := call(c, ctx, &pb.ReconcileRequest{Attached: req.Attached, Delta: req.Delta, Joined: req.Joined, Left: req.Left}, c.rpc.Reconcile)
	if err != nil {
		return nil, err
	}
	return &shared.ReconcileResponse{Arrived: r.GetArrived(), Expired: r.GetExpired()}, nil
}

func (c *Client) Status(ctx context.Context, _ *shared.StatusRequest) (*shared.StatusResponse, error) {
	r, err := call(c, ctx, &pb.StatusRequest{}, c.rpc.Status)
	if err != nil {
		return nil, err
	}
	return clipStatus(statusFromProto(r)), nil
}

func (c *Client) Shutdown(ctx context.Context, req *shared.ShutdownRequest) (*shared.ShutdownResponse, error) {
	deadline := req.Deadline
	if d, ok := ctx.Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
		deadline = d
	}
	r, err := call(c, ctx, &pb.ShutdownRequest{DeadlineUnixNano: unixNano(deadline)}, c.rpc.Shutdown)
	if err != nil {
		return nil, err
	}
	return &shared.ShutdownResponse{Cancelled: r.GetCancelled()}, nil
}

// grpcServer is the plugin's side: it unpacks each request, hands it to
// the implementation, and packs the answer. Errors become gRPC statuses
// that the client turns back into the same sentinels.
type grpcServer struct {
	pb.UnimplementedProvisionerServer
	impl shared.Provisioner
	link *pluginLink
}

func newGRPCServer(impl shared.Provisioner) *grpcServer {
	return &grpcServer{impl: impl, link: newPluginLink()}
}

func (s *grpcServer) Info(ctx context.Context, _ *pb.InfoRequest) (*pb.InfoResponse, error) {
	r, err := s.impl.Info(ctx, &shared.InfoRequest{})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.InfoResponse{Kind: r.Kind, Version: r.Version, ContractVersion: r.ContractVersion, Capabilities: capabilitiesToProto(r.Capabilities)}, nil
}

func (s *grpcServer) Schema(ctx context.Context, _ *pb.SchemaRequest) (*pb.SchemaResponse, error) {
	r, err := s.impl.Schema(ctx, &shared.SchemaRequest{})
	if err != nil {
		return nil, toStatus(err)
	}
	schema, err := schemaToProto(r.Schema)
	if err != nil {
		return nil, toStatus(fmt.Errorf("the schema has a default that does not encode as JSON: %w", err))
	}
	return &pb.SchemaResponse{Schema: schema}, nil
}

// Check serves the optional Checker, or UNIMPLEMENTED.
func (s *grpcServer) Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	checker, ok := s.impl.(shared.Checker)
	if !ok {
		return nil, toStatus(shared.ErrUnimplemented)
	}
	r, err := checker.Check(ctx, &shared.CheckRequest{Name: req.GetName(), Config: req.GetConfigJson(), EngineID: req.GetEngineId(), Probe: req.GetProbe()})
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &pb.CheckResponse{Diagnostics: diagsToProto(r.Diagnostics)}
	for _, f := range r.Facts {
		resp.Facts = append(resp.Facts, &pb.Fact{Name: f.Name, Value: f.Value, Path: f.Path})
	}
	return resp, nil
}

// Preview serves the optional Previewer, or UNIMPLEMENTED.
func (s *grpcServer) Preview(ctx context.Context, req *pb.PreviewRequest) (*pb.PreviewResponse, error) {
	previewer, ok := s.impl.(shared.Previewer)
	if !ok {
		return nil, toStatus(shared.ErrUnimplemented)
	}
	r, err := previewer.Preview(ctx, &shared.PreviewRequest{Name: req.GetName(), Config: req.GetConfigJson(), Profile: req.GetProfile()})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.PreviewResponse{Diagnostics: diagsToProto(r.Diagnostics), Text: r.Text}, nil
}

func (s *grpcServer) ValidateConfig(ctx context.Context, req *pb.ValidateConfigRequest) (*pb.ValidateConfigResponse, error) {
	r, err := s.impl.ValidateConfig(ctx, &shared.ValidateConfigRequest{Name: req.GetName(), Config: req.GetConfigJson()})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.ValidateConfigResponse{Diagnostics: diagsToProto(r.Diagnostics)}, nil
}

func (s *grpcServer) Configure(ctx context.Context, req *pb.ConfigureRequest) (*pb.ConfigureResponse, error) {
	r, err := s.impl.Configure(ctx, &shared.ConfigureRequest{Name: req.GetName(), Config: req.GetConfigJson(), EngineID: req.GetEngineId(), CredentialEpoch: req.GetCredentialEpoch(), EngineAddress: req.GetEngineAddress(), Host: s.link})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.ConfigureResponse{Diagnostics: diagsToProto(r.Diagnostics)}, nil
}

func (s *grpcServer) Shapes(ctx context.Context, req *pb.ShapesRequest) (*pb.ShapesResponse, error) {
	//lint:ignore SA1019 the wire carries the deprecated label for a caller that still sets it
	r, err := s.impl.Shapes(ctx, &shared.ShapesRequest{Label: req.GetLabel()})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.ShapesResponse{Shapes: shapesToProto(r.Shapes)}, nil
}

func (s *grpcServer) Covers(ctx context.Context, req *pb.CoversRequest) (*pb.CoversResponse, error) {
	//lint:ignore SA1019 the wire carries the deprecated Covers for a caller that still asks
	r, err := s.impl.Covers(ctx, &shared.CoversRequest{Need: needFromProto(req.GetNeed())})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.CoversResponse{Covered: r.Covered, Profile: r.Profile}, nil
}

func (s *grpcServer) Provision(ctx context.Context, req *pb.ProvisionRequest) (*pb.ProvisionResponse, error) {
	r, err := s.impl.Provision(ctx, provisionRequestFromProto(req))
	if err != nil {
		return nil, toStatus(err)
	}
	return provisionResponseToProto(r), nil
}

func (s *grpcServer) Reconcile(ctx context.Context, req *pb.ReconcileRequest) (*pb.ReconcileResponse, error) {
	r, err := s.impl.Reconcile(ctx, &shared.ReconcileRequest{Attached: req.GetAttached(), Delta: req.GetDelta(), Joined: req.GetJoined(), Left: req.GetLeft()})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.ReconcileResponse{Arrived: r.Arrived, Expired: r.Expired}, nil
}

func (s *grpcServer) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	r, err := s.impl.Status(ctx, &shared.StatusRequest{})
	if err != nil {
		return nil, toStatus(err)
	}
	if r.Runtime == nil {
		// This process is the plugin's: its runtime says what it holds,
		// whether the implementation remembered to or not.
		r.Runtime = shared.ReadRuntime()
	}
	return statusToProto(r), nil
}

func (s *grpcServer) Shutdown(ctx context.Context, req *pb.ShutdownRequest) (*pb.ShutdownResponse, error) {
	// The host's deadline travels as a time, not only as the gRPC
	// deadline, so an implementation can plan its last scancel before it.
	deadline := fromUnixNano(req.GetDeadlineUnixNano())
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	r, err := s.impl.Shutdown(ctx, &shared.ShutdownRequest{Deadline: deadline})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.ShutdownResponse{Cancelled: r.Cancelled}, nil
}

// secondsToDuration converts a wire TTL, refusing nonsense rather than
// letting a negative or huge float wrap around.
func secondsToDuration(s float64) time.Duration {
	if s <= 0 {
		return 0
	}
	if s > float64(1<<62)/float64(time.Second) {
		return time.Duration(1 << 62)
	}
	return seconds(s)
}

// Exited is closed once go-plugin has seen the plugin process exit.
func (c *Client) Exited() <-chan struct{} { return c.done.Done() }

// WaitHostChannel waits for the host's end of HostChannel to finish, if
// it was ever opened.
func (c *Client) WaitHostChannel() {
	c.mu.Lock()
	link := c.link
	c.mu.Unlock()
	if link != nil {
		<-link.done
	}
}
