// Package host is the engine's side of the contract: Launch starts a
// provisioner plugin as its own process (go-plugin, mutual TLS, gRPC);
// DecodeBlock reads a provisioner block's meta-arguments; LaunchBlock
// launches a block's plugin and decodes the block against its schema,
// and Launched.Configure configures it and holds its mints to the shapes
// it lists; Validate, Check, Preview and a Validator do the checks
// alone; Signer mints and verifies worker credentials; an
// AttachedTracker turns the attached workers into each Reconcile; a
// ProvisionerStatus, its state a Phase, is what an operator reads of a
// plugin.
//
// The claim: the rules every engine needs because a plugin is other
// people's code are here, so that every engine gets them: the
// credential guard, DropEnv, the sha256 pin checked on what is
// executed, the bounds on what a plugin sends. What an engine decides
// for itself is not: when to restart a plugin (the kit's
// engine/internal/supervise), which verified worker may attach (the
// kit's books, engine/admission.go, under their lock), how the plugins'
// status is cached for a page (engine/statuscache.go). Rejected: the
// kit's Supervisor, Admission and StatusCache exported from here, as
// they were first. Their cost: twenty names that only package engine
// used, an admission whose answers were atomic only under a lock of
// another package, and a worker's attach that called into this package
// in three places where it now calls Signer.Verify alone. The cost of
// the move: an engine on this package alone restarts its plugins and
// admits its workers itself (Example).
//
// The seam: Launch and LaunchConfig (what a plugin starts with);
// LaunchBlock and Launched.Configure (a block to a configured plugin,
// which a supervisor restarts as often as it likes); Signer (the
// credential format). A launch's diagnostics carry the launch's error in
// Extra, so that a caller tells what no second launch fixes from a crash.
//
// What it may not touch: the engine's own configuration beyond
// provisioner blocks, its placement policy, its books and its listener.
// It restarts nothing, and keeps no record of which worker attached.
//
// Design records: docs/design/host-plugin-process.md,
// docs/design/host-event-queue.md, docs/design/host-identity.md,
// docs/design/host-credential-format.md,
// docs/design/host-reconcile-deltas.md.
package host
