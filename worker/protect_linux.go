package worker

import "golang.org/x/sys/unix"

// protectProcess makes the worker's process not dumpable, so that its
// /proc/PID/environ (which holds the credential however the worker's
// own environment changes after it starts), its memory (the session
// secret) and ptrace are closed to processes of the same user, its
// task's commands among them: only root reads them then. A command it
// execs is dumpable again, as every exec'd program is.
func protectProcess() error {
	return unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
}
