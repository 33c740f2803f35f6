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
// The worker's credential is minted by the engine per worker, reaches the
// job inside the script, which only the job's owner and root can read from
// the spool, and reaches the worker through the environment, never argv,
// because every user of a compute node can read every process's command
// line.
//
// Nothing here autoscales. There is at most one outstanding request per
// profile; it is forgotten when its worker attaches, cancelled when it has
// waited longer than provision_timeout, and cancelled when the provisioner
// shuts down. A submission still in flight at shutdown is waited for, or
// killed and then looked for by the worker name recorded in the job's
// comment. If sbatch is still running on the login node when squeue looks,
// that job can be missed.
package slurm
