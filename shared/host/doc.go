// Package host is the engine's side of the contract: Launch starts a
// provisioner plugin as its own process, completes go-plugin's handshake
// over a unix socket with mutual TLS, opens the host channel and returns a
// Plugin whose Provisioner is the plugin, called over gRPC.
//
// It owns the rules every engine gets for free, because a plugin is code
// of other people: the credential guard (a plugin mints only for its own
// workers, for the shape it names, no longer than the cap, and its events
// are stamped with its own name); the environment a plugin starts with
// (without the signing secret: LaunchConfig.DropEnv); the sha256 pin,
// checked on the very descriptor that is executed; the bounds on what a
// plugin may send and log; and an exit that says what the plugin did
// (ExitStatus, with its last stderr lines).
//
// Rejected alternative: linking provisioners into the engine. A site could
// not add its own without rebuilding, and a plugin that panics would take
// the engine with it. The cost is a process and a socket per provisioner.
//
// What it may not touch: configuration files (shared/hclconfig decodes
// them), the engine's placement or supervision policy (when to restart,
// what to ask for), or the signing secret itself, which stays behind the
// CredentialSigner the engine passes in.
package host
