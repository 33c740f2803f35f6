package sshrun

import (
	"context"
	"errors"
	"os/exec"
	"regexp"
	"strconv"
	"time"
)

// A remote command dies with the caller's interest in it.
//
// Killing the local ssh does not stop what it started on the login node:
// without a terminal, sshd sends the remote command no signal when the
// client goes, and a command that prints nothing until it ends (an sbatch
// waiting its turn at slurmctld's RPC rate limiter, a squeue behind a slow
// controller) goes on to the end, its answer read by nobody. An sbatch cut
// off that way lands its job later, after the caller gave it up. So every
// call with a deadline runs its command under coreutils' timeout on the
// login node, set to end a little before the local deadline: through a
// shared connection (Multiplex) the remote process is gone by the time
// the caller stops waiting, and ssh brings back timeout's exit status,
// which says so (ErrStoppedThere). On a connection of its own the
// handshake comes out of that time, so the command may outlive the call
// by as much as the handshake took (ConnectTimeout at most), and then
// ends there all the same.
//
// Rejected: a terminal (ssh -tt), whose hangup would reach the command
// when ssh goes, but which merges stderr into stdout, echoes stdin and
// rewrites line ends, and does not hang up when a multiplexed client is
// killed while its master lives on; and killing through a second ssh
// (pkill by a marker), one more session and RPC-free but racy call per
// cut. A login node without timeout (exit 127) runs commands bare, as
// before, and the Transport says so once in its log; the caller then
// cannot know when a cut-off command stops (StopsThere).

// ErrStoppedThere is a command stopped on the login node at its deadline
// by the remote timeout: it was still running, and is not any more. The
// error wraps context.DeadlineExceeded too.
var ErrStoppedThere = errors.New("stopped on the login node at its deadline")

const (
	// killAfter is how long the remote timeout waits after SIGTERM
	// before SIGKILL.
	killAfter = time.Second
	// minRemote is the least time a command is given on the login node.
	minRemote = 200 * time.Millisecond
)

// remoteMargin is how much earlier than the local deadline the remote
// command is stopped: room for timeout's SIGTERM, its SIGKILL a second
// later if need be, and ssh bringing the status back, within what the
// call has.
func remoteMargin(left time.Duration) time.Duration {
	m := left / 5
	return min(max(m, 300*time.Millisecond), killAfter+time.Second)
}

// timeoutMissing is a login shell saying it has no timeout command.
var timeoutMissing = regexp.MustCompile(`(?m)timeout: (command )?not found|timeout: No such file`)

// bounded is remote under the login node's timeout, ending before ctx's
// deadline, and how long it was given there; remote unchanged and 0 when
// ctx has no deadline or the login node has no timeout.
func (t *Transport) bounded(ctx context.Context, remote []string) ([]string, time.Duration) {
	deadline, ok := ctx.Deadline()
	if !ok || t.noTimeout.Load() {
		return remote, 0
	}
	left := time.Until(deadline)
	given := max(left-remoteMargin(left), minRemote).Round(100 * time.Millisecond)
	w := make([]string, 0, len(remote)+5)
	w = append(w, "timeout", "-k", strconv.Itoa(int(killAfter/time.Second)), strconv.FormatFloat(given.Seconds(), 'f', 1, 64))
	return append(w, remote...), given
}

// StopsThere reports whether a command cut off by its deadline is known
// to stop on the login node by then: false on a login node without
// timeout, where it may run on.
func (t *Transport) StopsThere() bool { return !t.noTimeout.Load() }

// stoppedThere reports whether a call's end is the remote timeout's: its
// exit status (124 after SIGTERM, 137 after SIGKILL) once the time it was
// given had passed.
func stoppedThere(err error, given, took time.Duration) bool {
	var ee *exec.ExitError
	if given == 0 || !errors.As(err, &ee) || took < given {
		return false
	}
	return ee.ExitCode() == 124 || ee.ExitCode() == 137
}

// lacksTimeout reports whether a call failed because the login node has
// no timeout command: exit 127, and its shell saying so. Nothing ran.
func lacksTimeout(err error, stderr []byte) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee) && ee.ExitCode() == 127 && timeoutMissing.Match(stderr)
}
