// Package supervise keeps the engine's provisioner plugins running: a
// Supervisor per provisioner block launches and configures its plugin
// (host.LaunchBlock, host.Launched.Configure), and when the process exits
// without being asked to, marks the provisioner down, starts another
// with backoff and configures it again; it kills a plugin that misses
// its deadlines (wedged), stops for good on what no restart fixes
// (UnfixableError), configures the running plugin again in place on a
// reload (Reconfigure), tells it which of its workers are attached
// (Reconcile, through a host.AttachedTracker), reports it
// (host.ProvisionerStatus, host.Phase) and shuts it down with its jobs
// cancelled (Shutdown). Ended and MissedDeadline say how a call to a
// plugin ended, for the Supervisor's own Reconciles and the engine's
// Provisions alike.
//
// The claim: supervision is the engine's policy, not the plugin host's
// rule. engine/host holds what every engine needs because a plugin is
// other people's code (the launch, the pin, the credential guard, the
// bounds); when to restart, what counts as wedged and what is reported
// are the kit's choices, and the kit (package engine, its fleet) is
// their one user. Rejected: the Supervisor exported from engine/host,
// where it was first. Its cost: seven of engine/host's names
// (Supervisor, NewSupervisor, Options, Configured, UnfixableError, Ended,
// MissedDeadline) existed for one sibling. The cost of the move: an
// engine that builds its own loop on engine/host starts a plugin again
// itself (host.LaunchBlock and Configure, as this package does).
//
// The seam: host.LaunchBlock and host.Launched.Configure are all it asks
// of the host; a launch's diagnostics carry the launch's error in Extra,
// which unfixable reads. The engine holds the Supervisors (its fleet,
// engine/fleet.go) and hears them through OnUp, OnDown and OnFailed,
// called without the Supervisor's lock.
//
// What it owns, and what it may not touch: it owns one plugin process at
// a time per block and its phase. It never holds its lock across a call
// to the plugin, never reads the engine's books or router (it is told
// who is attached), never decodes a block's meta-arguments (engine/host
// does) and never mints or checks a credential (the plugin's minting goes
// through the host's guard, with the engine's signer).
//
// Design records: docs/design/engine-supervise-restart.md,
// docs/design/host-reconcile-deltas.md.
package supervise
