package supervise

import (
	"io"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/shared"
)

// Options are what an engine adds to a plugin's launch: every field of
// host.LaunchConfig but those the block gives (Name, Path, SHA256), so
// that the engine can set whatever an engine on host.Launch can
// (TestOptionsCoverLaunchConfig keeps them in step), and what every
// Configure carries of the engine (EngineID, CredentialEpoch,
// EngineAddress).
type Options struct {
	// Logger receives the plugin's own log lines; nil discards them.
	Logger hclog.Logger
	// Args are the plugin's command-line arguments.
	Args []string
	// Signer mints the credentials the plugin asks for (LaunchConfig).
	Signer host.CredentialSigner
	// MaxCredentialTTL caps what the plugin may ask for; zero means
	// host.DefaultMaxCredentialTTL.
	MaxCredentialTTL time.Duration
	// OnEvent hears the plugin's events, stamped with its name, as
	// LaunchConfig.OnEvent does; EventQueue bounds what waits for it.
	OnEvent    func(shared.Event)
	EventQueue int
	// EngineID and CredentialEpoch go to every Configure
	// (engine/host/identity.go).
	EngineID, CredentialEpoch string
	// EngineAddress goes to every Configure: where the engine listens,
	// as network:address, for plugins that carry workers' connections.
	EngineAddress string
	// Env is added to the plugin's environment (LaunchConfig.Env).
	Env []string
	// DropEnv names variables the plugin must not inherit (the secret's).
	DropEnv []string
	// StartTimeout bounds the handshake; zero means 30 seconds.
	StartTimeout time.Duration
	// OnStdout and Stderr are as in LaunchConfig.
	OnStdout func(line string)
	Stderr   io.Writer
}

// launchConfig is the LaunchConfig of a block's launch
// (host.LaunchBlock fills in Name, Path and SHA256).
func (o Options) launchConfig() host.LaunchConfig {
	return host.LaunchConfig{
		Logger: o.Logger, Args: o.Args,
		Signer: o.Signer, MaxCredentialTTL: o.MaxCredentialTTL,
		OnEvent: o.OnEvent, EventQueue: o.EventQueue,
		Env: o.Env, DropEnv: o.DropEnv, StartTimeout: o.StartTimeout,
		OnStdout: o.OnStdout, Stderr: o.Stderr,
	}
}

// launchTimeout bounds a restart's launch with Info and Schema, as
// host.LaunchBlock bounds its own: the handshake's bound, and 30
// seconds for the rest.
func (o Options) launchTimeout() time.Duration {
	start := o.StartTimeout
	if start <= 0 {
		start = 30 * time.Second
	}
	return start + 30*time.Second
}
