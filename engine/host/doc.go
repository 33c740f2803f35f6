// Package host is the engine's side of the contract: Launch starts a
// provisioner plugin as its own process, completes go-plugin's handshake
// over a unix socket with mutual TLS, opens the host channel and returns a
// Plugin whose Provisioner is the plugin, called over gRPC.
//
// Above Launch, one call takes a provisioner block of the engine's HCL to
// a plugin that is configured and supervised, with its shapes:
// DecodeBlock reads the block's labels and meta-arguments, and a
// Supervisor launches the plugin, decodes the rest of the block against
// the plugin's schema (engine/hclconfig), configures it, publishes its
// shapes (OnUp), and restarts it with backoff when its process exits or
// it misses its deadlines (Deadline); Validate does the checks alone.
// For the workers that come back, Signer mints and verifies credentials
// and Admission decides which verified worker may attach.
//
// It owns the rules every engine gets for free, because a plugin is code
// of other people: the credential guard (a plugin mints only for its own
// workers, for the shape it names, no longer than the cap, and its events
// are stamped with its own name); the environment a plugin starts with
// (without the signing secret: LaunchConfig.DropEnv); the sha256 pin,
// checked on the very descriptor that is executed; the bounds on what a
// plugin may send and log; a warning for whatever a plugin writes to
// stdout after the handshake, which go-plugin alone drops (OnStdout); and
// an exit that says what the plugin did (ExitStatus, with its last stderr
// lines).
//
// A plugin cannot be stalled by the engine: its events wait for
// LaunchConfig.OnEvent in a bounded queue with a dispatcher of their own,
// so a slow handler holds up only that plugin's later events, never its
// credential requests, its calls or another plugin; a full queue drops
// and counts (Plugin.DroppedEvents) rather than make the plugin wait,
// because waiting would need an unbounded backlog or flow control in the
// contract. The Supervisor's state is a Phase, not text: an engine
// switches on it, and ProvisionerStatus.Process is rendered from it. A
// launch that no restart can fix (the pin, the protocol, the kind) ends in
// PhaseFailed with one UnfixableError, not a restart every two minutes.
//
// At ten thousand workers the contract carries changes, not wholes, where
// the other end offers it (its capabilities, shared.HasCapability): a
// burst's credentials come in one host-channel round trip a thousand
// (MintCredentials, each item through the same guard as a single mint),
// and Reconcile tells a plugin what attached and left since its last
// answered call (AttachedTracker), with the whole list on a new process,
// after a failure and once a minute. A plugin or a host that offers
// neither gets what it always got.
//
// Rejected alternative: linking provisioners into the engine. A site could
// not add its own without rebuilding, and a plugin that panics would take
// the engine with it. The cost is a process and a socket per provisioner.
//
// What it may not touch: the engine's own configuration beyond provisioner
// blocks (where plugins live, how it listens), its placement policy (what
// to ask of which provisioner, and when), how workers reach it (HTTP or
// anything else: Admission answers with a Refusal, not a status code),
// and where the signing secret comes from: the engine hands in the bytes
// and decides who else may read them.
package host
