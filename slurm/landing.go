package slurm

import (
	"time"
)

// When a submission whose answer was lost can no longer land.
//
// An sbatch cut off at its deadline (ssh ran out of time, the connection
// dropped, slurmctld's rate limiter kept it waiting its turn) may still
// have its job created: the client may have sent its RPC before the cut.
// Declaring it "not submitted" at once, as a queue without its job seemed
// to say, let a job land seconds later under a worker whose credential
// the engine had already revoked, while the profile was asked for again:
// a machine refused and one doubled. So a lost submission stays in the
// books (phaseAnswerLost, counted as on the way, never asked for twice)
// until it can no longer land, and only then is "not submitted" said.
//
// The transport stops every command on the login node by its deadline
// (sshrun's remote timeout), so an sbatch cut off is gone there by the
// end of the time it was given. What it had already sent, slurmctld
// takes within landingWindow. On a login node without timeout nothing
// bounds the sbatch there, and the wait is provision_timeout, as long as
// a queued job's.
//
// Rejected: looking once more a fixed time after the cut without
// stopping the remote sbatch: a rationed client retries for as long as
// the limiter keeps refusing it (30 s and more were seen), and no fixed
// wait covers that.

// landingWindow is how long after the sbatch is gone from the login node
// its job may still appear: twice Slurm's default MessageTimeout (10 s),
// the longest a client waits for slurmctld to answer one RPC.
const landingWindow = 20 * time.Second

// landBy is when the job of a submission whose answer was lost can no
// longer land: landingWindow after the ask's deadline, left is how much
// of it remained when its answer was found lost, or provision_timeout
// after since when the login node cannot stop the sbatch there.
func (su *submitter) landBy(cfg *settings, left time.Duration, since time.Time) time.Time {
	p := su.p
	if !p.q.Transport().StopsThere() {
		return since.Add(cfg.provisionTimeout)
	}
	return p.now().Add(max(left, 0) + landingWindow)
}
