package slurm

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/fluksio/provision/shared"
)

// A failed submission is one of two things, and they are handled apart.
//
// Weather: ssh could not connect, the controller did not answer in time,
// the user is at a job-count limit that clears as jobs end. Asking again
// later may well work, so the profile backs off (5 s doubling to 5 min,
// backoff.go) and is asked for again.
//
// A verdict: Slurm read the script and refused it for something in it,
// such as a partition, account or QOS that does not exist, a time limit
// beyond the partition's, a gres it does not know, an option sbatch does
// not have, more of a node than any node has. Asking again gives the same
// answer every time, and a profile that keeps asking is noise in the
// site's logs and in ours. Such a profile is marked misconfigured: one
// loud log line and Slurm's words in Status, and it is not submitted
// again for misconfiguredHold, or until the plugin is configured again
// (a reload, reconfigure.go, or a restart). The placer
// meanwhile tries the next profile that fits.
//
// They are told apart by Slurm's own words, because its exit codes do
// not: sbatch exits 1 for a bad partition and for a busy controller
// alike, and 255 (which ssh also uses for its own failures) for an
// option it does not know. Only the messages below count as verdicts;
// anything else stays weather, so an unknown message costs retries, never
// a profile that was fine. The list is Slurm 22.05's (slurm_errno.c and
// sbatch's option parsing), checked against the sandbox's sbatch in
// TestRefusalsFromSlurm.

// misconfiguredHold is how long a profile Slurm refused for good is left
// alone. Long, because the answer will not change by itself; not forever,
// because a site can fix its side (create the partition, add the user to
// the account) without our configuration changing, and one sbatch an
// hour is no burden on a controller.
const misconfiguredHold = time.Hour

// verdicts are phrases, lower case, of sbatch refusals that waiting does
// not change.
var verdicts = []string{
	"invalid partition",               // invalid partition specified: X; Invalid partition name specified
	"invalid account",                 // Invalid account or account/partition combination specified
	"invalid qos",                     // Invalid qos specification
	"requested time limit is invalid", // (missing or exceeds some limit)
	"time limit exceeds",              // Requested time limit exceeds partition time limit (older Slurm)
	"invalid --",                      // Invalid --time specification, and other malformed values
	"invalid generic resource",        // Invalid generic resource (gres) specification
	"invalid gres",                    //
	"unrecognized option",             // sbatch: unrecognized option '--bogus'
	"invalid option",                  // sbatch: invalid option -- 'Z'
	"requires an argument",            // sbatch: option '--time' requires an argument
	"requested node configuration is not available", // more memory, CPUs or GPUs than any node has
	"memory specification can not be satisfied",     //
	"more processors requested than permitted",      //
	"invalid feature specification",                 // --constraint with a feature no node has
	"requested reservation is invalid",              //
	"incompatible begin and deadline",               // --begin later than --deadline allows
	"invalid node name",                             // --nodelist with a node that does not exist
	"invalid wckey",                                 //
	"invalid license",                               //
	"not permitted to use this partition",           // User's group not permitted to use this partition
	"node count specification invalid",              //
	"mkdir: cannot create directory",                // log_dir where the login user may not write
	"time limit specification required",             // job_submit/require_timelimit: a profile without --time
	"invalid protocol version",                      // a client older than the controller (releaseMismatch)
	"incompatible versions of client and server code",
	"insane message length",
}

// weather are phrases that say a refusal is passing even when a verdict's
// words appear with them (a message that quotes the option it could not
// send, say).
var weather = []string{
	"socket timed out",
	"unable to contact slurm controller",
	"resource temporarily unavailable",
	"temporarily unable to accept job",
	"slurmctld is busy",
	"connection refused",
	"connection timed out",
	"job violates accounting/qos policy", // job-count limits clear as jobs end
	"qosmaxsubmitjob",
	"assocmaxsubmitjob",
}

// refusedForGood reports whether said, what sbatch printed, is Slurm
// refusing the script for something in it that waiting does not change.
func refusedForGood(said string) bool {
	s := strings.ToLower(said)
	for _, w := range weather {
		if strings.Contains(s, w) {
			return false
		}
	}
	for _, v := range verdicts {
		if strings.Contains(s, v) {
			return true
		}
	}
	return false
}

// submitFailureClass says why a submission failed: misconfigured when
// sbatch ran and refused the script for good (refusedForGood), transient
// for everything else (ssh, a timeout, a lost answer, a credential the
// engine did not mint, a refusal that may pass).
func submitFailureClass(err error, said string) shared.FailureClass {
	if errors.Is(err, errReleaseMismatch) {
		return shared.FailureMisconfigured
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || errors.Is(err, context.DeadlineExceeded) {
		return shared.FailureTransient
	}
	// ssh exits 255 for its own failures and passes the remote exit code
	// on otherwise; sbatch also exits 255 for a bad option, and then says
	// "sbatch:", which ssh's own messages never do.
	if ee.ExitCode() == 255 && !strings.Contains(said, "sbatch:") {
		return shared.FailureTransient
	}
	if refusedForGood(said) {
		return shared.FailureMisconfigured
	}
	return shared.FailureTransient
}

// A login node whose Slurm client is another release than the controller
// cannot submit or read anything, and says so in words that depend on
// which side is newer (measured with 22.05, 24.11 and 26.05):
//
//   - an older client: "Invalid Protocol Version 10752 ... Incompatible
//     versions of client and server code", or "Insane message length";
//   - a newer client: "Zero Bytes were transmitted or received", which is
//     also what a controller that drops a connection once says.
//
// The first kind is a verdict at once. The second is read as weather (the
// answer may have been lost) until the look for the job that follows it
// gets the same words: a dropped connection does not drop every one
// after it, a client of another release does. Either way the operator
// reads that the login node's client is the wrong release, not that the
// controller is slow.

// errReleaseMismatch marks a submission that failed because the login
// node's client cannot talk to the controller at all.
var errReleaseMismatch = errors.New("the login node's Slurm client is another release than slurmctld")

// mismatchWords are the words only a client of another release prints.
var mismatchWords = []string{
	"invalid protocol version",
	"incompatible versions of client and server code",
	"insane message length",
}

// zeroBytes is the newer client's word, ambiguous on its own.
const zeroBytes = "zero bytes were transmitted or received"

// releaseMismatch reports whether said can only come from a client of
// another release than the controller.
func releaseMismatch(said string) bool {
	s := strings.ToLower(said)
	for _, w := range mismatchWords {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}

// saidZeroBytes reports whether said has the newer client's word.
func saidZeroBytes(said string) bool {
	return strings.Contains(strings.ToLower(said), zeroBytes)
}

// mismatchDetail is what an operator reads for a client of the wrong
// release: what Slurm said, what it means and what to do.
// Of what Slurm said, only the line with the telling words is quoted:
// an older client prints four lines, the first of them misleading.
func mismatchDetail(host, said string) string {
	for _, l := range strings.Split(said, "\n") {
		if releaseMismatch(l) || saidZeroBytes(l) {
			said = l
			break
		}
	}
	return fmt.Sprintf("the Slurm client on %s cannot talk to the controller (%s): the login node's sbatch and squeue are another Slurm release than slurmctld, and Slurm's client and controller must be the same release. "+
		"Compare `sbatch --version` on the login node with the cluster's Slurm, and point login at a node whose client matches", host, strings.TrimSpace(said))
}
