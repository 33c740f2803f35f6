package engine

// The kernel's own answer to "whose socket is the other end of this
// loopback connection": one sock_diag request (NETLINK_SOCK_DIAG) for
// one socket, looked up by its four-tuple in the kernel's connection
// hash. It costs the same however many connections the machine holds,
// where /proc/net/tcp lists them all as text, and where a sock_diag dump
// (what netlink libraries offer: vishvananda/netlink's SocketGet) walks
// them all in the kernel: with 10,000 workers connected, about 9 ms a
// lookup, for every operator request.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The layout of linux/inet_diag.h: struct inet_diag_req_v2 (56 bytes)
// after a struct nlmsghdr (16), and struct inet_diag_msg (72) in the
// answer.
const (
	nlmsgHeaderLen  = 16
	diagRequestLen  = 56
	diagMessageLen  = 72
	diagNoCookie    = ^uint32(0)
	sockDiagTimeout = time.Second
)

// diagSocket asks the kernel for the TCP socket whose local end is
// src:sport and whose peer is dst:dport, and returns its owner's uid and
// its inode (0 for a connection in TIME_WAIT, which no process holds).
func diagSocket(src net.IP, sport uint16, dst net.IP, dport uint16) (uid, inode uint32, err error) {
	family := uint8(unix.AF_INET6)
	if src.To4() != nil && dst.To4() != nil {
		family = unix.AF_INET
	}
	req := make([]byte, nlmsgHeaderLen+diagRequestLen)
	ne := binary.NativeEndian
	ne.PutUint32(req[0:], uint32(len(req)))
	ne.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(req[6:], unix.NLM_F_REQUEST)
	ne.PutUint32(req[8:], 1) // sequence
	b := req[nlmsgHeaderLen:]
	b[0], b[1] = family, unix.IPPROTO_TCP
	ne.PutUint32(b[4:], ^uint32(0)) // every state
	putSockID(b[8:], family, src, sport, dst, dport)

	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return 0, 0, fmt.Errorf("netlink: %w", err)
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval(sockDiagTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return 0, 0, fmt.Errorf("netlink: %w", err)
	}
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, 0, fmt.Errorf("netlink: %w", err)
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return 0, 0, fmt.Errorf("netlink: %w", err)
	}
	buf = buf[:n]
	if len(buf) < nlmsgHeaderLen {
		return 0, 0, errors.New("netlink: a short answer")
	}
	switch typ := ne.Uint16(buf[4:]); {
	case typ == unix.NLMSG_ERROR:
		if len(buf) >= nlmsgHeaderLen+4 {
			// ENOENT: no socket has that four-tuple.
			if errno := -int32(ne.Uint32(buf[nlmsgHeaderLen:])); errno != 0 {
				return 0, 0, fmt.Errorf("netlink: %w", unix.Errno(errno))
			}
		}
		return 0, 0, errors.New("netlink: an error with no number")
	case typ != unix.SOCK_DIAG_BY_FAMILY || len(buf) < nlmsgHeaderLen+diagMessageLen:
		return 0, 0, fmt.Errorf("netlink: an answer of type %d and %d bytes", typ, len(buf))
	}
	m := buf[nlmsgHeaderLen:]
	// The answer's own four-tuple must be the one asked for.
	want := make([]byte, 48)
	putSockID(want, family, src, sport, dst, dport)
	if m[0] != family || string(m[4:4+36]) != string(want[:36]) {
		return 0, 0, errors.New("netlink: the answer is another socket's")
	}
	return ne.Uint32(m[64:]), ne.Uint32(m[68:]), nil
}

// putSockID writes a struct inet_diag_sockid: ports and addresses in
// network order, no interface, no cookie.
func putSockID(b []byte, family uint8, src net.IP, sport uint16, dst net.IP, dport uint16) {
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	if family == unix.AF_INET {
		copy(b[4:], src.To4())
		copy(b[20:], dst.To4())
	} else {
		copy(b[4:], src.To16())
		copy(b[20:], dst.To16())
	}
	binary.NativeEndian.PutUint32(b[40:], diagNoCookie)
	binary.NativeEndian.PutUint32(b[44:], diagNoCookie)
}

// unixPeer is the uid and pid of the process at the other end of a unix
// socket, as the kernel recorded them when it connected (SO_PEERCRED).
func unixPeer(c syscall.Conn) (uid, pid int, err error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, 0, err
	}
	if credErr != nil {
		return 0, 0, fmt.Errorf("SO_PEERCRED: %w", credErr)
	}
	return int(cred.Uid), int(cred.Pid), nil
}
