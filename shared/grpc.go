package shared

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/fluksio/provision/shared/internal/pb"
)

// grpcClient is the host's view of a plugin: a Provisioner whose methods
// are RPCs. Each method builds a request, calls, and converts; the only
// logic here is turning "the process died" into ErrPluginGone promptly.
type grpcClient struct {
	rpc pb.ProvisionerClient
	// done is cancelled by go-plugin when the plugin process exits.
	done context.Context

	mu   sync.Mutex // guards link
	link *hostLink  // the host's end of HostChannel, once opened
}

var _ Provisioner = (*grpcClient)(nil)

func newGRPCClient(done context.Context, rpc pb.ProvisionerClient) *grpcClient {
	if done == nil {
		done = context.Background()
	}
	return &grpcClient{rpc: rpc, done: done}
}

// call runs one RPC bounded by both the caller's context and the plugin's
// life, so a call in flight when the process is killed returns at once
// instead of waiting for gRPC to notice the socket is gone.
func call[Req, Resp any](c *grpcClient, ctx context.Context, req Req, rpc func(context.Context, Req, ...grpc.CallOption) (Resp, error)) (Resp, error) {
	var zero Resp
	if err := c.done.Err(); err != nil {
		return zero, fmt.Errorf("%w: the plugin process has exited", ErrPluginGone)
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

func (c *grpcClient) Info(ctx context.Context, _ *InfoRequest) (*InfoResponse, error) {
	r, err := call(c, ctx, &pb.InfoRequest{}, c.rpc.Info)
	if err != nil {
		return nil, err
	}
	return &InfoResponse{Kind: r.GetKind(), Version: r.GetVersion(), ContractVersion: r.GetContractVersion(), Capabilities: r.GetCapabilities()}, nil
}

func (c *grpcClient) Schema(ctx context.Context, _ *SchemaRequest) (*SchemaResponse, error) {
	r, err := call(c, ctx, &pb.SchemaRequest{}, c.rpc.Schema)
	if err != nil {
		return nil, err
	}
	s, err := schemaFromProto(r.GetSchema())
	if err != nil {
		return nil, fmt.Errorf("the plugin sent a schema with a malformed default: %w", err)
	}
	return &SchemaResponse{Schema: s}, nil
}

func (c *grpcClient) ValidateConfig(ctx context.Context, req *ValidateConfigRequest) (*ValidateConfigResponse, error) {
	r, err := call(c, ctx, &pb.ValidateConfigRequest{Name: req.Name, ConfigJson: req.Config}, c.rpc.ValidateConfig)
	if err != nil {
		return nil, err
	}
	return &ValidateConfigResponse{Diagnostics: diagsFromProto(r.GetDiagnostics())}, nil
}

// Configure opens the host channel first when the request carries a Host
// and none is open yet, so the plugin can publish and mint from the moment
// it is configured.
func (c *grpcClient) Configure(ctx context.Context, req *ConfigureRequest) (*ConfigureResponse, error) {
	if req.Host != nil {
		if err := c.openHostChannel(ctx, req.Name, req.Host, nil); err != nil {
			return nil, err
		}
	}
	r, err := call(c, ctx, &pb.ConfigureRequest{Name: req.Name, ConfigJson: req.Config, EngineId: req.EngineID, CredentialEpoch: req.CredentialEpoch}, c.rpc.Configure)
	if err != nil {
		return nil, err
	}
	return &ConfigureResponse{Diagnostics: diagsFromProto(r.GetDiagnostics())}, nil
}

func (c *grpcClient) Shapes(ctx context.Context, req *ShapesRequest) (*ShapesResponse, error) {
	r, err := call(c, ctx, &pb.ShapesRequest{Label: req.Label}, c.rpc.Shapes)
	if err != nil {
		return nil, err
	}
	return &ShapesResponse{Shapes: shapesFromProto(r.GetShapes())}, nil
}

func (c *grpcClient) Covers(ctx context.Context, req *CoversRequest) (*CoversResponse, error) {
	r, err := call(c, ctx, &pb.CoversRequest{Need: needToProto(req.Need)}, c.rpc.Covers)
	if err != nil {
		return nil, err
	}
	return &CoversResponse{Covered: r.GetCovered(), Profile: r.GetProfile()}, nil
}

func (c *grpcClient) Provision(ctx context.Context, req *ProvisionRequest) (*ProvisionResponse, error) {
	r, err := call(c, ctx, &pb.ProvisionRequest{Need: needToProto(req.Need)}, c.rpc.Provision)
	if err != nil {
		return nil, err
	}
	return &ProvisionResponse{Outcome: outcomeFromProto(r.GetOutcome()), Profile: r.GetProfile(), Detail: r.GetDetail()}, nil
}

func (c *grpcClient) Reconcile(ctx context.Context, req *ReconcileRequest) (*ReconcileResponse, error) {
	r, err := call(c, ctx, &pb.ReconcileRequest{Attached: req.Attached}, c.rpc.Reconcile)
	if err != nil {
		return nil, err
	}
	return &ReconcileResponse{Arrived: r.GetArrived(), Expired: r.GetExpired()}, nil
}

func (c *grpcClient) Status(ctx context.Context, _ *StatusRequest) (*StatusResponse, error) {
	r, err := call(c, ctx, &pb.StatusRequest{}, c.rpc.Status)
	if err != nil {
		return nil, err
	}
	return clipStatus(statusFromProto(r)), nil
}

func (c *grpcClient) Shutdown(ctx context.Context, req *ShutdownRequest) (*ShutdownResponse, error) {
	deadline := req.Deadline
	if d, ok := ctx.Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
		deadline = d
	}
	r, err := call(c, ctx, &pb.ShutdownRequest{DeadlineUnixNano: unixNano(deadline)}, c.rpc.Shutdown)
	if err != nil {
		return nil, err
	}
	return &ShutdownResponse{Cancelled: r.GetCancelled()}, nil
}

// grpcServer is the plugin's side: it unpacks each request, hands it to
// the implementation, and packs the answer. Errors become gRPC statuses
// that the client turns back into the same sentinels.
type grpcServer struct {
	pb.UnimplementedProvisionerServer
	impl Provisioner
	link *pluginLink
}

func newGRPCServer(impl Provisioner) *grpcServer {
	return &grpcServer{impl: impl, link: newPluginLink()}
}

func (s *grpcServer) Info(ctx context.Context, _ *pb.InfoRequest) (*pb.InfoResponse, error) {
	r, err := s.impl.Info(ctx, &InfoRequest{})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.InfoResponse{Kind: r.Kind, Version: r.Version, ContractVersion: r.ContractVersion, Capabilities: r.Capabilities}, nil
}

func (s *grpcServer) Schema(ctx context.Context, _ *pb.SchemaRequest) (*pb.SchemaResponse, error) {
	r, err := s.impl.Schema(ctx, &SchemaRequest{})
	if err != nil {
		return nil, toStatus(err)
	}
	schema, err := schemaToProto(r.Schema)
	if err != nil {
		return nil, toStatus(fmt.Errorf("the schema has a default that does not encode as JSON: %w", err))
	}
	return &pb.SchemaResponse{Schema: schema}, nil
}

func (s *grpcServer) ValidateConfig(ctx context.Context, req *pb.ValidateConfigRequest) (*pb.ValidateConfigResponse, error) {
	r, err := s.impl.ValidateConfig(ctx, &ValidateConfigRequest{Name: req.GetName(), Config: req.GetConfigJson()})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.ValidateConfigResponse{Diagnostics: diagsToProto(r.Diagnostics)}, nil
}

func (s *grpcServer) Configure(ctx context.Context, req *pb.ConfigureRequest) (*pb.ConfigureResponse, error) {
	r, err := s.impl.Configure(ctx, &ConfigureRequest{Name: req.GetName(), Config: req.GetConfigJson(), EngineID: req.GetEngineId(), CredentialEpoch: req.GetCredentialEpoch(), Host: s.link})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.ConfigureResponse{Diagnostics: diagsToProto(r.Diagnostics)}, nil
}

func (s *grpcServer) Shapes(ctx context.Context, req *pb.ShapesRequest) (*pb.ShapesResponse, error) {
	r, err := s.impl.Shapes(ctx, &ShapesRequest{Label: req.GetLabel()})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.ShapesResponse{Shapes: shapesToProto(r.Shapes)}, nil
}

func (s *grpcServer) Covers(ctx context.Context, req *pb.CoversRequest) (*pb.CoversResponse, error) {
	r, err := s.impl.Covers(ctx, &CoversRequest{Need: needFromProto(req.GetNeed())})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.CoversResponse{Covered: r.Covered, Profile: r.Profile}, nil
}

func (s *grpcServer) Provision(ctx context.Context, req *pb.ProvisionRequest) (*pb.ProvisionResponse, error) {
	r, err := s.impl.Provision(ctx, &ProvisionRequest{Need: needFromProto(req.GetNeed())})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.ProvisionResponse{Outcome: outcomeToProto(r.Outcome), Profile: r.Profile, Detail: r.Detail}, nil
}

func (s *grpcServer) Reconcile(ctx context.Context, req *pb.ReconcileRequest) (*pb.ReconcileResponse, error) {
	r, err := s.impl.Reconcile(ctx, &ReconcileRequest{Attached: req.GetAttached()})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.ReconcileResponse{Arrived: r.Arrived, Expired: r.Expired}, nil
}

func (s *grpcServer) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	r, err := s.impl.Status(ctx, &StatusRequest{})
	if err != nil {
		return nil, toStatus(err)
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
	r, err := s.impl.Shutdown(ctx, &ShutdownRequest{Deadline: deadline})
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
