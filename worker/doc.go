// Package worker is the engine kit's worker: the program a provisioner
// starts on each machine it gets (fluksio-worker, or host-example worker),
// and the messages of the worker protocol it speaks with the engine
// (docs/worker-protocol.md).
//
// The claim: a worker is an ordinary HTTP client. It attaches with the
// credential its provisioner put in its environment
// (shared.WorkerTokenEnv), long-polls for a task, reports each result and
// detaches when idle for --max-idle, on SIGTERM, or when the engine lets
// it go (CodeLeave); its exit code is what its job shows (0 done, 1 the
// engine refused it or was gone for engineGoneAfter, 2 a bad command
// line).
//
// Rejected: a worker that links the engine or the plugin SDK. It runs on
// compute nodes, next to the user's work; what it needs is net/http and
// the protocol's types, which live here so that the engine imports them
// from its worker and never the other way. The cost: the engine's HTTP
// side (engine's Books) and this client are two halves of one
// protocol in two packages, held together by the types here and by
// engine's tests, which run this client against the real Books.
//
// The seam: shared.WorkerArgs is the command line every provisioner
// builds (the Slurm plugin, the Go test plugin and, by the doc, the
// Python one); ParseArgs reads exactly that, and a test round-trips one
// through the other.
//
// What it won't do: run real work. A task here is a stand-in (count
// primes, or sleep its work_seconds); an engine with real work writes its
// own worker against docs/worker-protocol.md, or wraps Client.
package worker
