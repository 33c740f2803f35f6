//go:build !linux

package engine

import (
	"errors"
	"net"
	"syscall"
)

// diagSocket has no sock_diag to ask outside Linux; the caller then
// reads /proc, and without it the operator check refuses.
func diagSocket(net.IP, uint16, net.IP, uint16) (uid, inode uint32, err error) {
	return 0, 0, errors.New("sock_diag is Linux's")
}

// unixPeer cannot ask the kernel for a unix socket's peer outside Linux
// here; the operator check then refuses.
func unixPeer(syscall.Conn) (uid, pid int, err error) {
	return 0, 0, errors.New("a unix socket's peer is read only on Linux")
}
