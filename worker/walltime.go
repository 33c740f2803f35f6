package worker

// A job's end. A pilot job is a lease with an end: Slurm kills the job at
// its time limit, and a task running then is lost with it. The worker
// knows when that is, says so at attach (AttachRequest.EndsAt), and
// leaves by itself EndMargin before it; the engine gives it no task whose
// timeout would run past that (docs/worker-protocol.md). Rejected:
// Slurm's --signal warning alone, which Slurm may send up to a minute
// early and which kills the task it interrupts; the cost is that a task
// without a timeout is given to a worker with any time left, and may
// still meet the end.

import (
	"strconv"
	"strings"
	"time"
)

// EndMargin is how long before its job's end a worker leaves, and how
// much time a task's timeout must leave before that end for the engine
// to give it the task: the time to stop a command (its kill grace is 10
// s) and to report.
const EndMargin = 15 * time.Second

// jobEnd is when the job must end: SLURM_JOB_END_TIME where Slurm sets it
// (from 23.02), else the job's start plus walltime (--walltime, else
// FLUKSIO_WALLTIME, which the Slurm provisioner's script exports), the
// start being SLURM_JOB_START_TIME, FLUKSIO_JOB_START (the script sets it
// before its prerun lines) or now; zero when no walltime is known.
func jobEnd(getenv func(string) string, walltime time.Duration, now time.Time) time.Time {
	if end := unixEnv(getenv, "SLURM_JOB_END_TIME"); !end.IsZero() {
		return end
	}
	if walltime <= 0 {
		if n, err := strconv.ParseInt(strings.TrimSpace(getenv("FLUKSIO_WALLTIME")), 10, 64); err == nil && n > 0 {
			walltime = time.Duration(n) * time.Second
		}
	}
	if walltime <= 0 {
		return time.Time{}
	}
	start := unixEnv(getenv, "SLURM_JOB_START_TIME")
	if start.IsZero() {
		start = unixEnv(getenv, "FLUKSIO_JOB_START")
	}
	if start.IsZero() || start.After(now) {
		start = now
	}
	return start.Add(walltime)
}

// unixEnv is the variable name as Unix seconds; zero if unset or not a
// positive number.
func unixEnv(getenv func(string) string, name string) time.Time {
	n, err := strconv.ParseInt(strings.TrimSpace(getenv(name)), 10, 64)
	if err != nil || n <= 0 {
		return time.Time{}
	}
	return time.Unix(n, 0)
}
