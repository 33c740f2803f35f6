//go:build !linux

package worker

// protectProcess does nothing outside Linux, where a process's
// environment is not another same-user process's to read in /proc.
func protectProcess() error { return nil }
