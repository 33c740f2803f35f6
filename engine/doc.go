// Package engine is the engine kit: what every engine that launches
// provisioner plugins needs, as a library it imports. An engine gets the
// whole provisioning loop, observable and safe, in one import and a page
// of code (examples/embed is one in under 150 lines).
//
// The claim: provisioning is the same loop in every engine. Launch and
// supervise a plugin per provisioner block (the fleet, over
// engine/internal/supervise); turn needs nobody serves into
// per-provisioner demand, with failover to the next fitting shape or
// provisioner when one cannot fit, is backing off, misconfigured or
// capped, asking only for a shape that holds the need, its time
// included, refusing at Submit what none holds (fit.go) and not asking
// again for a profile whose machine attached and could not take its
// task (mismatch.go) (the router: router.go places waiting needs on idle
// workers, ask.go asks the provisioners for the rest, needstatus.go
// says why each waits); admit the workers that dial back with the
// credentials the engine signed, once each, and notice when they go
// silent (the books, and the worker API over it for the worker protocol
// of docs/worker-protocol.md); tell what happened as typed
// events (Engine.Events, and a Server-Sent Events handler) and as
// Prometheus metrics. Engine wires them together and is the one type an
// embedder holds: New builds it and opens nothing, Serve listens, Start
// launches the plugins, Run passes, Reload applies a changed
// configuration in place (reload.go), Stop ends it all.
//
// It is a library so that every engine gets the same loop and a fix
// reaches them all. Its exported surface is small on purpose, and what is
// an engine's own choice stays out (its CLI, its operator authentication,
// its page, its story).
//
// The seams:
//   - Tasks are TaskSpec: a command (or a payload for an engine's own
//     worker) with inputs, outputs, a timeout and retries. An engine
//     submits them (Engine.Submit), cancels them (Engine.Cancel) and
//     reads each as it stands (Engine.Task), or waits for their ends
//     (Engine.Wait, Engine.Ended); a task after others (TaskSpec.After,
//     Input.FromTask) is held in the task table, not the router, until
//     they have succeeded, so no machine is asked for what cannot run
//     yet, and never a dependency that is not submitted before it, so
//     the tasks form no cycle. The router places each on
//     an idle worker that fits its need and runs its kind of task
//     (WorkerInfo.Features), the task table (tasks.go) keeps its
//     attempts, and the workers move its bytes over the transfer routes
//     (transfer.go). Needs (Engine.Add, Engine.Withdraw, Engine.Needs)
//     are the same placing without a command: the worker's stand-in.
//   - Config.Place replaces the router's own rule for placing waiting
//     tasks on idle workers, for an engine with a task model of its own
//     (place.go).
//   - Hooks hear attaches, results, tasks ended and lost, workers gone,
//     bursts and the plugins' events, for an engine's own story or UI;
//     they are called without any lock, beside the event stream and the
//     metrics, never instead of them, on a goroutine of the engine's
//     own (hooks.go), in the order things happened. Nothing of the
//     embedder's runs on the router's pass or a worker's request: a
//     hook that writes a file a task slows the files, not dispatch.
//     The calls waiting are bounded (4096); when the queue is full,
//     what happened waits for room, so a hook slower than the tasks
//     end paces dispatch once the queue is spent, and nothing is
//     dropped (Cancel alone never waits: a hook may call it). Stop runs
//     what is queued. Rejected: a hook on the goroutine the thing
//     happened on, as before, where host-example's result.json was
//     half the engine's CPU inside the pass; a goroutine per call,
//     which loses the order; dropping when full, which loses a task's
//     end.
//   - Mux takes the engine's operator authentication as a wrapper;
//     without one the operator's endpoints answer only the engine's own
//     user and root on this machine (peer.go), and AllowAnyLocalUser
//     opens them. The embedder adds its own routes beside the kit's.
//
// What it owns, and what it may not touch: it owns the books (who is
// attached, with which credential and session, what each was given) and
// the admission under their lock (which verified worker may attach, as
// which job: admission.go; engine/host only signs and verifies),
// the decision of what to ask each provisioner for, and the tasks'
// directory (Config.TaskDir, or its own under os.TempDir, removed at
// Stop: each task's stdout, stderr and outputs). It reads a task's input
// files and never writes them, and writes no path a worker names outside
// the task's own directory. It never talks to a cluster (only plugins
// do), never reads or writes a plugin's own configuration (engine/host
// decodes a block against the plugin's schema), and never holds a lock
// across a plugin call, a worker's request or a hook: a slow plugin
// delays only itself, a slow worker only its own answer. Liveness is decided by one goroutine (books.watch), never on a
// read: a GET /status or a metrics scrape changes nothing.
//
// The run loop (Engine.Run) is driven by events: a pass runs when a
// worker attaches, reports or leaves, a task is submitted or cancelled,
// or a plugin sends an event or comes up, at once, and at least every
// passInterval for what changes with time alone. Wake-ups during a pass
// merge into one, so passes run back to back at most; nothing rests
// after a pass, since a worker's result and its next task are one pass
// apart (a worker's result can carry its next poll:
// docs/worker-protocol.md). A pass is bounded by what it finds: it
// settles the tasks reported since the last (every task out only when a
// worker left or attached, or once a second), lists the idle workers
// only while a need waits, reads the needs only until the idle workers
// are taken, and asks the provisioners (which reads every need waiting)
// at most once a second unless the demand rose. When the hooks' queue
// empties, Run asks its done again without a pass. Rejected: resting
// three times as long as the last pass took, which kept the router to a
// quarter of a core at ten thousand workers but left a task's end
// waiting a median 11.5 ms for its next assignment; settling only what
// was reported and listing idle workers only while something waits keep
// a pass per result, and a storm of attaches, cheap instead.
//
// Ten thousand workers each hold a long poll open. A poll with nothing to
// say is parked (engine/internal/park): its connection is taken from
// net/http, watched for a hang-up in one epoll set, and answered from a
// timer or the books, so a waiting worker costs a few hundred bytes, not
// a goroutine and a request (docs/benchmarks.md). That is Linux's;
// elsewhere, and with Config.HoldPolls, the server holds the poll.
// docs/design/engine-park.md says why parking and what it costs.
//
// What it won't do: keep state across restarts (the plugins adopt their
// jobs, and the workers attach again; a task under way is not resumed);
// run a task's command itself (the worker does, on its node); keep more
// than the last ended tasks in memory (their directories stay);
// authenticate operators by anything but their uid on this machine (the
// embedder's wrapper does).
//
// Design records: docs/design/engine-kit.md, docs/design/engine-park.md,
// docs/design/engine-sessions.md, docs/design/engine-admission.md,
// docs/design/engine-backoff.md, docs/design/engine-events-sse.md,
// docs/design/engine-listener.md, docs/design/engine-metrics-registry.md.
package engine
