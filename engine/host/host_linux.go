package host

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal asks the kernel to send the plugin SIGTERM when
// this process dies, however it dies. The SDK's Serve turns SIGTERM into a
// short Shutdown, so a host killed outright leaves no plugin behind.
//
// The signal is tied to the OS thread that forked the child, not the
// process (golang/go#27505). Go only retires threads whose goroutine locked
// them and exited, which the launching goroutine does not do, so in
// practice it fires when the host dies; the SDK's parent watch covers the
// rest.
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM, Setpgid: true}
}
