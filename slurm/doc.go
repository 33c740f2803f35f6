// Package slurm is a provisioner that asks a Slurm cluster for machines.
//
// A cluster is not a machine that attaches and stays. It is a queue
// somebody else owns, and what comes out of it is an allocation for as long
// as a job holds one. So this provisioner does not run nodes: it asks for a
// machine, with sbatch over ssh to a login node, and what comes back is an
// ordinary worker dialling the engine like any other. Everything downstream
// of that (the protocol, artifacts, cancellation, the books) already works,
// and none of it has to learn what Slurm is.
//
// The alternative, which Covalent takes, is to stage a serialized call and
// a runner onto the login node, submit that, poll the queue, and copy the
// result back: a second way of running a node beside the one that exists,
// with its own transport, its own failure modes and a version lockstep
// between both ends. This package turns that down at the cost of one
// assumption: a compute node can open a connection outward to the engine.
// That holds on most clusters and not on air-gapped ones. Where it does not,
// the unexported payload method, which writes the batch script, is the one
// piece a staged variant would replace.
//
// Unlike the Python original, the script derives #SBATCH resource lines
// from the profile (--cpus-per-task, --mem, --gres=gpu:N) unless the
// profile's own sbatch lines already set that kind of option. A profile
// that says cpus = 4 is matched as a four-CPU machine, so the scheduler
// should be asked for four CPUs.
//
// A profile's shape says how long its machines last (contract 2.8), so
// that the engine asks only for a machine that outlasts the task it is
// for: the profile's --time, else what its partition gives a job without
// one (DefaultTime, capped by MaxTime; MaxTime with DefaultTime=NONE),
// read with one scontrol show partition when Shapes is asked and a
// profile has no --time (partitiontimes.go). Reading it once per Shapes,
// not each poll, costs a stale figure when an administrator changes the
// partition while the engine runs; a reload reads it again. A partition
// the login user cannot see leaves the lifetime unknown, which the
// engine takes as unlimited, as for a plugin before 2.8.
//
// The worker's credential is minted by the engine per worker (a
// submission's credentials in one host-channel round trip a thousand
// where the host speaks contract 2.4; one round trip each before, which
// for a thousand-task array took longer than its sbatch), reaches the
// job inside the script, which only the job's owner and root can read from
// the spool, and reaches the worker through the environment, never argv,
// because every user of a compute node can read every process's command
// line.
//
// The engine tells Provision its whole demand, and this provisioner keeps
// that many machines of each profile on their way, within max_workers,
// max_pending and min_workers (demand.go). A profile's shortfall is one
// submission, a job array for more than one machine, each task one machine
// with its own worker name and credential (array.go), trimmed to the room
// the login user's accounting limits leave (limits.go). The seed kept one
// request per profile; that was a simplification, and reaching twenty
// nodes cost twenty queue waits. A burst also stays under the cluster's
// MaxJobCount, which slurmctld counts for every user and which sbatch
// meets by retrying for two minutes (jobcount.go). A machine is forgotten when its worker
// attaches, cancelled when it has waited too long or the demand falls
// while it is still pending, and cancelled when the provisioner shuts
// down. A submission still in flight at shutdown is waited for, or killed
// and then looked for by the worker name recorded in the job's comment. If
// sbatch is still running on the login node when squeue looks, that job
// can be missed. It owns its books and what it submitted; what is wanted,
// and from which provisioner, is the engine's.
//
// The queue is the truth about a job, so it is read, but cheaply: every
// job of a provisioner is named fluksio-<provisioner> and carries its
// worker in its comment, so one squeue per poll_interval (with 10% jitter)
// covers them all, and none runs while nothing is outstanding. A job that
// ended before its worker attached (it failed, timed out, was cancelled,
// or has left the queue) is forgotten and reported with its state and
// reason, so the profile can be asked for again instead of waiting out
// provision_timeout for a machine that will never come. A job pending for
// a reason that waiting does not clear (PartitionConfig, BadConstraints, a
// per-job QOS limit: the list is neverClear) is cancelled: with Slurm's
// default EnforcePartLimits=NO such jobs are accepted and then wait for
// ever. When squeue fails, nothing is concluded: a controller that does
// not answer says nothing about its jobs, so everything is kept, and the
// outage is logged once.
//
// Waiting in the queue is not being stuck. provision_timeout bounds a
// request from when it was made, as it always has; attach_timeout bounds
// the time from when its job was first seen running to its worker
// attaching, which is where a broken worker shows. The start time squeue
// prints is the login node's local time with no zone, so the poller's own
// clock is used instead.
//
// A profile whose requests keep failing (sbatch refuses them, or their
// jobs die before their workers attach) backs off: 5 s after the first
// failure, doubling to at most 5 minutes, and Provision answers
// backing_off until then without touching the cluster. The router asks on
// every pass, and without this a broken profile would be submitted as
// fast as it asks. A worker of the profile attaching resets it.
//
// sbatch is not idempotent. When its answer is lost (ssh times out or the
// connection drops, as opposed to sbatch saying no) the job may well
// exist, so before reporting a failure the provisioner looks for the
// worker's comment in the queue, and if it is there, that is the job. If
// it is not, or the queue cannot be read either, the machines stay
// outstanding (phase answerLost, shown as UNKNOWN), which keeps a second
// job from being submitted for them, until a poll finds the job or it can
// no longer land: the sbatch was stopped on the login node at its
// deadline (sshrun's remote timeout) and slurmctld has had landingWindow
// to take what it sent (landing.go).
//
// Jobs outlive the process that submitted them. Configure lists the jobs
// still queued under the provisioner's name and adopts each machine, so
// they are watched, expired and cancelled at shutdown like new ones, and
// the engine hears of each; whether they are still wanted is the demand's
// to say. A pending job it cannot account for (an unknown profile, a
// comment that names no worker of this provisioner) is cancelled, since
// nobody would use it. Submissions wait for that first
// look at the queue, so that a plugin restarted after a crash and asked
// for machines at once adopts its predecessor's jobs instead of asking
// for more. A job that is already running is never cancelled on a guess:
// its worker may be attached and busy, and one that is not leaves by
// itself. If the queue cannot be read at Configure,
// each poll tries again. Every squeue keeps to the login user's jobs,
// because another account's engine may give its provisioner the same
// name: squeue prints each job's user and the plugin leaves out the
// others', which --me would do for one more RPC a poll. Every scancel of several
// jobs is one call, for up to 100 ids.
//
// A provisioner can also die without cancelling anything. When a profile
// sets a time limit (--time or -t), the script asks for --deadline of
// provision_timeout plus that limit: Slurm removes a job that can no
// longer end by its deadline, so a job that has not started within
// provision_timeout leaves the queue by itself, state DEADLINE, whether or
// not anybody is left to cancel it. The form now+<seconds>seconds was
// checked against sbatch 22.05 (now+<seconds> means the same). Without a
// time limit there is no end to compute the deadline from: a running job
// is covered by the worker's own max_idle and by its leaving when it
// cannot reach the engine, and a pending one waits for the next
// Configure to adopt or cancel it.
//
// A time limit ends a job with SIGKILL after a grace period. The script
// asks for --signal=B:TERM@60, so the batch shell, which the script
// replaces with the worker, gets SIGTERM a minute before the limit (Slurm
// may send it up to a minute earlier still) and the worker leaves the
// engine cleanly instead of vanishing mid-node. A profile that sets --signal or --deadline itself
// keeps its own.
//
// The cluster's MaxArraySize, MaxJobCount and name are read, never
// guessed: until scontrol show config answers, each poll reads them
// again and bursts are small (facts.go). A controller that rations each
// user's RPCs (slurmctld's rate limiter) makes commands slow, not failed:
// the plugin reads the limiter from the same configuration and takes a
// rationed command for weather, shown as "rate limited", never for an
// outage (slurm/internal/queue/ratelimit.go).
//
// Nothing has to be installed on the cluster: unless worker_command is
// set, the worker a job runs is the fluksio-worker built with this
// plugin, which it copies to the login user's home once per version and
// each job checks by its sha256 before running it (ship.go), as it
// copies its own binary there for the relay (relay.go). It owns that
// directory's files of its naming, and touches nothing else there.
//
// Every command on the login node, Slurm's and the few shell commands
// beside them, is slurm/internal/queue's: one Queue, built from the ssh
// transport, the RPC budget and a small config, spends the budget and
// reads the rate limiter around each and returns typed results. It holds
// none of this package's state, so no command can run under
// Provisioner.mu; the decisions ask it through slurmQueue (ssh.go), which
// their tests give an in-memory queue. Provisioner implements the
// contract and holds the books (the ledger) under mu; the rest of the
// state is on types of their own that share mu: the poller (poller.go),
// the submission pipeline (submit.go), adoption (adopt.go), the
// cancelling (cancel.go), shutdown (shutdown.go), the accounting limits
// (limits.go), the cluster's facts (facts.go), the holds (hold.go), the
// jobs ending under their workers (ends.go), the attached workers
// (attached.go) and the files on the login node (ship.go, joblog.go).
//
// The sbatch language itself (options, --begin, time limits, job and
// array task ids, the job tag) is package slurm/sbatch's, as pure
// functions; the relay daemon that runs on a login node is slurm/relay's;
// running ssh (its argv, the shared connection, the session cap, host
// keys, failing over between login nodes, and every ssh process until it
// has exited) is slurm/sshrun's, which knows ssh and not Slurm. This
// package gives it its settings and decides what its words and its
// Access mean: a lost sbatch answer, a login needed.
// Design records: docs/design/slurm-arrays.md, docs/design/slurm-tags.md,
// docs/design/slurm-begin.md, docs/design/slurm-contradictions.md,
// docs/design/slurm-known-hosts-perms.md, docs/design/slurm-job-count.md,
// docs/design/slurm-job-log.md, docs/design/slurm-metrics.md,
// docs/design/slurm-multinode.md, docs/design/slurm-cancel-pending.md,
// docs/design/slurm-redaction.md, docs/design/slurm-relay.md,
// docs/design/slurm-relay-tls.md, docs/design/slurm-remote-deadline.md,
// docs/design/slurm-rpc-budget.md.
package slurm
