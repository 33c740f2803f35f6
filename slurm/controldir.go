package slurm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// A plugin that is killed (SIGKILL, the OOM killer) cannot remove its ssh
// control directory, /tmp/fxssh-<pid>-<random>, and the master in it
// lingers for ControlPersist. The directory's name carries the pid of the
// plugin that made it, so the next plugin to start can tell which are
// left by the dead: it asks each master in them to exit and removes them.
// Only directories owned by this user and made by a process that no longer
// exists are touched; a live plugin's are never.

// controlDirPrefix starts every control directory's name.
const controlDirPrefix = "fxssh-"

// controlDirPattern is the MkdirTemp pattern for this process.
func controlDirPattern() string {
	return controlDirPrefix + strconv.Itoa(os.Getpid()) + "-"
}

// staleControlDirs lists the control directories in base that a dead
// process of this user left.
func staleControlDirs(base string) []string {
	entries, err := os.ReadDir(base)
	if err != nil {
		return nil
	}
	var stale []string
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), controlDirPrefix)
		if !ok || !e.IsDir() {
			continue
		}
		pidStr, _, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		if st, ok := info.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Getuid() {
			continue
		}
		if processAlive(pid) {
			continue
		}
		stale = append(stale, filepath.Join(base, e.Name()))
	}
	return stale
}

// processAlive reports whether pid exists (signal 0 reaches it, or it
// exists and is another user's).
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// cleanStaleControlDirs stops the masters in control directories left by
// dead plugins and removes the directories. It runs at the start of the
// poller, bounded by ctx.
func (p *Provisioner) cleanStaleControlDirs(ctx context.Context, cfg *settings) {
	for _, dir := range staleControlDirs(controlBase()) {
		p.stopMasters(ctx, cfg, dir)
		if err := os.RemoveAll(dir); err != nil {
			p.sshLog(cfg).Debug("could not remove a stale ssh control directory", "dir", dir, "error", err)
			continue
		}
		p.sshLog(cfg).Info("removed the ssh control directory of a plugin that died", "dir", dir)
	}
}
