package worker

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
)

// groupAlive reports whether a process of group pgid is alive. A zombie
// is not: it is dead and waits for its parent, and an init that does
// not reap (a container's) keeps it for ever, so kill(-pgid, 0), which
// counts zombies, is only the first look, and /proc the second.
func groupAlive(pgid int) bool {
	if syscall.Kill(-pgid, 0) == syscall.ESRCH {
		return false
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return true
	}
	want := []byte(strconv.Itoa(pgid))
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone since the listing
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces and
		// parentheses, so the fields are read after its last ')'.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(stat[i+1:])
		if len(f) >= 3 && bytes.Equal(f[2], want) && f[0][0] != 'Z' && f[0][0] != 'X' {
			return true
		}
	}
	return false
}
