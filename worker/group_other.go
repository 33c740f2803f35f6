//go:build !linux

package worker

import "syscall"

// groupAlive reports whether a process of group pgid is still there
// (zombies included: outside Linux there is no /proc to tell them
// apart, and an init reaps them soon enough).
func groupAlive(pgid int) bool {
	return syscall.Kill(-pgid, 0) != syscall.ESRCH
}
