// Package worker is the engine kit's worker: the program a provisioner
// starts on each machine it gets (fluksio-worker, or host-example worker),
// and the messages of the worker protocol it speaks with the engine
// (docs/worker-protocol.md).
//
// A worker is an ordinary HTTP client. It attaches with the credential
// its provisioner put in its environment (shared.WorkerTokenEnv),
// long-polls for a task, reports each result and detaches when idle for
// --max-idle, on SIGTERM, or when the engine lets it go (CodeLeave); its
// exit code is what its job shows (0 done, 1 the engine refused it or was
// gone for engineGoneAfter, 2 a bad command line). A task here is a
// stand-in; an engine with real work wraps Client or writes its own.
//
// Design records: docs/design/worker-standalone.md.
package worker
