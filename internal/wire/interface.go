package wire

import (
	"context"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/fluksio/provision/internal/pb"
	"github.com/fluksio/provision/shared"
)

// ProtocolVersion is the go-plugin protocol version of the wire contract
// in proto/provisioner.proto. It changes only when a change to the wire
// would break one side; additions do not change it (see ContractVersion).
const ProtocolVersion = 2

// PluginName is the name under which the provisioner is dispensed.
const PluginName = "provisioner"

// LogLevelEnv names the environment variable that sets how much a plugin
// logs. The SDK (shared/plugin) reads it; a host sets it from its own
// level, so that one setting reaches the plugins too.
const LogLevelEnv = "FLUKSIO_PLUGIN_LOG_LEVEL"

// Handshake is the go-plugin handshake hosts and plugins share. The magic
// cookie is not a security measure; it stops somebody running a plugin
// binary by hand and getting a screen of gibberish, and stops a host
// launching some other program's plugin by mistake.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  ProtocolVersion,
	MagicCookieKey:   "FLUKSIO_PROVISIONER_PLUGIN",
	MagicCookieValue: "b5f1c3a2-provisioner",
}

// PluginSets is what a host offers and a plugin serves, by protocol
// version. A future protocol 2 adds a key here and both sides pick the
// highest they share.
func PluginSets(impl shared.Provisioner) map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{
		ProtocolVersion: {PluginName: &GRPCPlugin{Impl: impl}},
	}
}

// GRPCPlugin is the go-plugin glue for a Provisioner: on the plugin side
// it serves Impl, on the host side it hands out a client. Most code never
// needs it: plugins call Serve and hosts call Launch. It is exported for
// hosts that drive go-plugin themselves and for in-memory tests.
type GRPCPlugin struct {
	// net/rpc is not offered: its errors cross as strings, and plugins in
	// other languages cannot speak it.
	plugin.NetRPCUnsupportedPlugin

	// Impl is the provisioner served; only the plugin side sets it.
	Impl shared.Provisioner
}

var _ plugin.GRPCPlugin = (*GRPCPlugin)(nil)

// GRPCServer registers the provisioner service.
func (p *GRPCPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	pb.RegisterProvisionerServer(s, newGRPCServer(p.Impl))
	return nil
}

// GRPCClient returns a Provisioner that calls the plugin. go-plugin
// cancels ctx when the plugin process exits, which is how calls learn that
// the plugin is gone without waiting for a transport timeout.
func (p *GRPCPlugin) GRPCClient(ctx context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return newGRPCClient(ctx, pb.NewProvisionerClient(c)), nil
}
