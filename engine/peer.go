package engine

import (
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// The operator's endpoints (GET /status, GET /v1/events, GET /metrics)
// show job ids, host names, error text and task output, and the engine's
// listener is, by design, reachable from every compute node. With no
// auth function given to Mux they answer only a request from this
// machine whose other end runs as the engine's own uid or root and is
// not one of its plugins (LocalUser): the engine's user, who could read
// its log anyway. Anyone else is answered 403. An embedder opens them
// with an auth function of its own (host-example's adds an operator
// token), or to every local user with AllowAnyLocalUser.
//
// The peer's uid is the kernel's: for TCP over loopback, the owner of
// the socket at the other end (one sock_diag request, or /proc/net/tcp
// where the kernel does not answer), for a unix socket SO_PEERCRED. A
// plugin in relay mode dials the engine for every worker connection it
// carries from the login node, as the engine's uid, so a connection
// whose other end a plugin process holds is not the operator's. Where
// the peer cannot be told (another system than Linux, no /proc), the
// request is refused.

// AllowAnyLocalUser is an auth function for Mux that serves the
// operator's endpoints to whoever can connect: every user of this
// machine, and every machine that reaches the listener. It is for an
// engine on a machine of its own user's, or behind a proxy that checks.
func AllowAnyLocalUser(h http.Handler) http.Handler { return h }

// ownUserOnly answers h only to LocalUser's requests, others 403.
func ownUserOnly(plugins func() []int) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			local, err := LocalUser(r, plugins)
			switch {
			case !local:
				err = errors.New("the operator's endpoints answer only the engine's own user on this machine; the embedder opens them with an auth function (Mux)")
			case err == nil:
				h.ServeHTTP(w, r)
				return
			}
			DontReadBody(w)
			WriteError(w, http.StatusForbidden, err.Error())
		})
	}
}

// LocalUser tells who is at the other end of r's connection. local is
// false for a request that did not come from this machine (loopback TCP
// or a unix socket), came through a proxy (it carries a Forwarded,
// X-Forwarded-For or X-Real-IP header), or whose other end is one of
// plugins' processes (nil: none): the caller asks it for credentials.
// Otherwise err is nil when the other end runs as the engine's own uid
// or root, and says why not (another uid, or a peer that cannot be
// told) when it does not.
func LocalUser(r *http.Request, plugins func() []int) (local bool, err error) {
	if proxied(r) {
		return false, nil
	}
	var pids []int
	if plugins != nil {
		pids = plugins()
	}
	var uid int
	if c := requestConn(r); c != nil && c.LocalAddr().Network() == "unix" {
		sc, ok := c.(syscall.Conn)
		if !ok {
			return true, errors.New("a unix socket whose peer cannot be asked")
		}
		u, pid, err := unixPeer(sc)
		if err != nil {
			return true, fmt.Errorf("a unix socket whose peer cannot be told (%v)", err)
		}
		if slices.Contains(pids, pid) {
			return false, nil
		}
		uid = u
	} else {
		if !loopback(r.RemoteAddr) {
			return false, nil
		}
		// One lookup of the peer's socket serves both questions: whose
		// process it is, and whether a plugin's (a relayed worker's).
		socks, err := requestPeer(r)
		if plugins != nil && (err != nil || peerOwnedBy(socks, pids)) {
			return false, nil
		}
		if err == nil && len(socks) != 1 {
			err = fmt.Errorf("%d sockets match %s to the engine", len(socks), r.RemoteAddr)
		}
		if err != nil {
			return true, fmt.Errorf("loopback, but whose process is at the other end cannot be told (%v)", err)
		}
		uid = socks[0].uid
	}
	if uid != os.Getuid() && uid != 0 {
		return true, fmt.Errorf("from uid %d, not the engine's user (uid %d) or root", uid, os.Getuid())
	}
	return true, nil
}

// proxied reports whether r says it came through a proxy.
func proxied(r *http.Request) bool {
	for _, h := range []string{"Forwarded", "X-Forwarded-For", "X-Real-Ip"} {
		if r.Header.Get(h) != "" {
			return true
		}
	}
	return false
}

// loopback reports whether remote (a request's RemoteAddr) is a loopback
// address.
func loopback(remote string) bool {
	hostPart, _, err := net.SplitHostPort(remote)
	if err != nil {
		return false
	}
	ip := net.ParseIP(hostPart)
	return ip != nil && ip.IsLoopback()
}

// requestConn is the connection r came on, unwrapped of TLS, or nil for
// a request the engine's server did not accept.
func requestConn(r *http.Request) net.Conn {
	e, _ := r.Context().Value(connEntryKey{}).(*connEntry)
	if e == nil {
		return nil
	}
	c := e.conn
	if t, ok := c.(*tls.Conn); ok {
		c = t.NetConn()
	}
	return c
}

// requestPeer finds the socket at the other end of r's TCP connection,
// both ends on this machine (peerSockets).
func requestPeer(r *http.Request) ([]peerSocket, error) {
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return nil, errors.New("the request has no local address")
	}
	return peerSockets(r.RemoteAddr, local.String())
}

// peerOwnedBy reports whether one of pids holds one of socks: a process
// holding a socket has "socket:[inode]" among its descriptors.
func peerOwnedBy(socks []peerSocket, pids []int) bool {
	var inodes []string
	for _, s := range socks {
		inodes = append(inodes, "socket:["+s.inode+"]")
	}
	for _, pid := range pids {
		if pid <= 0 {
			continue
		}
		dir := "/proc/" + strconv.Itoa(pid) + "/fd"
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue // gone: it holds nothing
		}
		for _, fd := range fds {
			link, err := os.Readlink(dir + "/" + fd.Name())
			if err == nil && slices.Contains(inodes, link) {
				return true
			}
		}
	}
	return false
}

// peerSocket is the other end of a loopback connection, as
// /proc/net/tcp lists it: the socket's owner and inode.
type peerSocket struct {
	uid   int
	inode string
}

// peerSockets finds the socket whose local address and port are
// remote's and whose peer is local: the other end of the connection the
// engine accepted from remote. It asks the kernel for that socket alone
// (sockdiag_linux.go), which costs the same however many connections the
// machine holds. /proc/net/tcp, read where the kernel does not answer,
// lists every socket as text: with 10,000 workers connected, reading it
// for each operator request made GET /status take 214 ms.
func peerSockets(remote, local string) ([]peerSocket, error) {
	rip, rport, err := splitIPPort(remote)
	if err != nil {
		return nil, err
	}
	lip, lport, err := splitIPPort(local)
	if err != nil {
		return nil, err
	}
	if s, ok := peerSocketByNetlink(rip, rport, lip, lport); ok {
		return []peerSocket{s}, nil
	}
	return peerSocketsFromProc(rip, rport, lip, lport)
}

// peerSocketByNetlink asks the kernel for the TCP socket from rip:rport
// to lip:lport (diagSocket). It says false when the kernel cannot answer
// for one live socket (no netlink in a sandbox, or the connection is one
// in TIME_WAIT), and the caller reads /proc instead, which lists every
// socket the four-tuple matches.
func peerSocketByNetlink(rip net.IP, rport uint64, lip net.IP, lport uint64) (peerSocket, bool) {
	uid, inode, err := diagSocket(rip, uint16(rport), lip, uint16(lport))
	if err != nil || inode == 0 {
		return peerSocket{}, false
	}
	return peerSocket{uid: int(uid), inode: strconv.FormatUint(uint64(inode), 10)}, true
}

// peerSocketsFromProc finds the same socket in /proc/net/tcp and
// /proc/net/tcp6.
func peerSocketsFromProc(rip net.IP, rport uint64, lip net.IP, lport uint64) ([]peerSocket, error) {
	var out []peerSocket
	found := false
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		found = true
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || !procAddrIs(f[1], rip, rport) || !procAddrIs(f[2], lip, lport) {
				continue
			}
			uid, err := strconv.Atoi(f[7])
			if err != nil || f[9] == "0" {
				// Inode 0 is a socket no process holds any more: an
				// earlier connection between the same ports in
				// TIME_WAIT, which a busy machine reuses within
				// seconds. It is nobody's, and never the peer.
				continue
			}
			out = append(out, peerSocket{uid: uid, inode: f[9]})
		}
	}
	if !found {
		return nil, errors.New("/proc/net/tcp cannot be read")
	}
	return out, nil
}

func splitIPPort(addr string) (net.IP, uint64, error) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, 0, err
	}
	ip := net.ParseIP(h)
	port, err := strconv.ParseUint(p, 10, 16)
	if ip == nil || err != nil {
		return nil, 0, fmt.Errorf("%q is not an IP address and port", addr)
	}
	return ip, port, nil
}

// procAddrIs says the address of /proc/net/tcp{,6} (hex, each 32-bit
// word in the host's byte order, then ":" and the hex port) is ip:port;
// an IPv4 address matches its IPv6-mapped form.
func procAddrIs(hexAddr string, ip net.IP, port uint64) bool {
	h, p, ok := strings.Cut(hexAddr, ":")
	if !ok {
		return false
	}
	if n, err := strconv.ParseUint(p, 16, 16); err != nil || n != port {
		return false
	}
	raw, err := hex.DecodeString(h)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return false
	}
	got := make(net.IP, len(raw))
	for i := 0; i < len(raw); i += 4 {
		w := binary.NativeEndian.Uint32(raw[i : i+4])
		binary.BigEndian.PutUint32(got[i:i+4], w)
	}
	return got.Equal(ip)
}
