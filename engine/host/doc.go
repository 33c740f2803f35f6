// Package host is the engine's side of the contract: Launch starts a
// provisioner plugin as its own process (go-plugin, mutual TLS, gRPC);
// DecodeBlock reads a provisioner block's meta-arguments; a Supervisor
// launches, configures and restarts a plugin, its state a Phase, and
// configures it again in place on a reload (Reconfigure); Validate
// does the checks alone; Signer mints and verifies worker credentials.
// The rules every engine needs because a plugin is other people's code
// (the credential guard, DropEnv, the sha256 pin, bounds on what a plugin
// sends) are here. Which verified worker may attach is not: that is the
// engine's books' (engine/admission.go), under their lock.
//
// Design records: docs/design/host-plugin-process.md,
// docs/design/host-event-queue.md, docs/design/host-identity.md,
// docs/design/host-credential-format.md,
// docs/design/host-reconcile-deltas.md,
// docs/design/host-supervisor-restart.md.
package host
