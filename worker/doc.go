// Package worker is the engine kit's worker: the program a provisioner
// starts on each machine it gets (fluksio-worker, or host-example worker),
// the messages of the worker protocol it speaks with the engine
// (docs/worker-protocol.md), and Serve, the same program around a Go
// engine's own function.
//
// A worker is an ordinary HTTP client. It attaches with the credential
// its provisioner put in its environment (shared.WorkerTokenEnv), naming
// the kinds of task it runs (FeatureCommand; FeaturePayload for Serve),
// long-polls for a task, reports each result and detaches when idle for
// --max-idle, on SIGTERM, or when the engine lets it go (CodeLeave); its
// exit code is what its job shows (0 done, 1 the engine refused it or was
// gone for engineGoneAfter, 2 a bad command line).
//
// What it owns on the node: each command task's directory (under
// $TMPDIR, removed once the result is sent), the command's process group
// (killed whole, SIGTERM then SIGKILL after Config.KillGrace, on a
// cancel, a timeout, a log past its limit, the engine's leave, SIGTERM,
// and for whatever the command leaves running), and the transfers of
// the task's inputs, streams and outputs. What it may not touch: the
// engine kit, gRPC, go-plugin and HCL, which it never links (make
// check-plugin-deps); anything on the node outside the task's
// directory, which its outputs may not name or resolve into; and the
// credential, which no command's environment, argv or log holds, and
// which its commands cannot read from its /proc (protectProcess).
//
// The files: program.go the command line and Main, client.go the
// conversation (attach, poll, watch, result, detach, retries), task.go
// the dispatch of a task by kind and the stand-in, command.go the
// command runner, transfer.go the transfers, serve.go Serve, protocol.go
// the messages.
//
// Design records: docs/design/worker-standalone.md,
// docs/design/worker-commands.md.
package worker
