//go:build !linux

package host

import "os/exec"

// setParentDeathSignal has no equivalent outside Linux; there the SDK's
// parent watch alone makes an orphaned plugin exit.
func setParentDeathSignal(*exec.Cmd) {}
