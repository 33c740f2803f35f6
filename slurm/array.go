package slurm

// A burst of machines of one profile is one sbatch --array=0-(N-1): one
// submission, one RPC to slurmctld, however many machines. Each array task
// is one machine, with a worker name of its own (<base>-<task>) and a
// credential of its own, which the script picks by SLURM_ARRAY_TASK_ID.
//
// Why arrays and not one sbatch per machine: docs/design/slurm-arrays.md.
//
// A cluster that refuses arrays (MaxArraySize=0, or sbatch rejects
// --array) gets one sbatch per machine instead, and Status says so.

// The cluster's MaxArraySize is read with the other start-up facts
// (facts.go).

// defaultMaxArraySize is Slurm's own default.
const defaultMaxArraySize = 1001
