package engine

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fluksio/provision/worker"
)

// The probe's answer says which engine answers, not only that one does:
// "fluksio engine VALUE" (worker.ProbeLine), VALUE drawn at random once
// per process, a value of this run that nothing else can know. validate
// -check -probe hands the value it expects to the probe's worker
// (shared.ProbeAnswerEnv), which says "reached" only on it, so another
// server at the engine's address, answering 200 "fluksio engine", is
// not reached. When the address is taken, validate first asks the
// kernel whose socket answers there (WhoAnswers): another user's is
// refused before any job is submitted; the engine's user's gives the
// value to expect.
//
// Rejected: an HMAC of a challenge under the engine's secret, which
// validate may not hold (secret_env is the engine's environment, not
// the operator's), and which proves no more here than a value of the
// run: the worker's job and the value travel the same private path. A
// process of the engine's own user at the address is taken for the
// engine: that user can run anything as the engine anyway.

// probeValue is this process's value of the run.
var probeValue = newProbeValue()

func newProbeValue() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b[:])
}

// ProbeValue is the value of this process's run in its probe answer.
func ProbeValue() string { return probeValue }

// ErrEngineListening is ServeProbe's error when the engine's address is
// taken: most likely by the engine itself, which answers the probe too.
var ErrEngineListening = errors.New("the engine's listen address is in use")

// ServeProbe serves the engine's answer to a reach probe (ServeProbe the
// handler, worker.ProbePath) where the engine block says it listens, and
// with its TLS, for the time a validate -check -probe runs: the probe's
// worker on a compute node dials engine_url, which leads there. stop
// ends it. An address in use is ErrEngineListening: a running engine
// answers the probe itself.
func (e *EngineBlock) ServeProbe() (stop func(), err error) {
	ln, _, err := Listen(e.Listen)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, ErrEngineListening
		}
		return nil, err
	}
	if cfg := e.ServerTLS(); cfg != nil {
		ln = tls.NewListener(ln, cfg)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+worker.ProbePath, ServeProbe)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}

// ProbeHolder is what holds an address and answers the reach probe there.
type ProbeHolder struct {
	// UID owns the socket that accepted; PID holds it and Command is its
	// name, 0 and "" when no process could be found.
	UID, PID int
	Command  string
	// Status and First are the HTTP status and the first line of the
	// body (at most 256 bytes read) it answered at worker.ProbePath.
	Status, First string
	// Value is the value of the run in an engine's answer; empty when
	// the answer is not an engine's.
	Value string
}

// String says who it is and what it answered.
func (h ProbeHolder) String() string {
	who := fmt.Sprintf("uid %d", h.UID)
	if h.PID > 0 {
		who += fmt.Sprintf(", pid %d (%s)", h.PID, h.Command)
	}
	return fmt.Sprintf("%s, which answered %s %.80q", who, h.Status, h.First)
}

// WhoAnswers asks what holds the engine block's address (ServeProbe's
// ErrEngineListening) and what it answers at worker.ProbePath: the
// kernel says whose socket accepted the connection (sock_diag, or
// /proc/net/tcp), /proc which process holds it. With the engine's TLS,
// the answer counts only under the engine's own certificate.
func (e *EngineBlock) WhoAnswers(ctx context.Context) (ProbeHolder, error) {
	var h ProbeHolder
	if strings.HasPrefix(e.Listen, "unix:") {
		return h, errors.New("the reach probe needs a TCP address: compute nodes cannot dial a unix socket")
	}
	host, port, err := net.SplitHostPort(e.Listen)
	if err != nil {
		return h, err
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, port))
	if err != nil {
		return h, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	ip, p, err := splitIPPort(conn.RemoteAddr().String())
	if err != nil {
		return h, err
	}
	uid, inode, ok := listenerOf(ip, p)
	if !ok {
		return h, fmt.Errorf("no listening socket for %s in /proc/net/tcp", conn.RemoteAddr())
	}
	h.UID = uid
	h.PID, h.Command = socketHolder(inode)
	var rw io.ReadWriter = conn
	if e.loadedCert != nil {
		want := e.loadedCert.Certificate[0]
		rw = tls.Client(conn, &tls.Config{
			// The check is the pin below: the engine's own certificate,
			// whatever names it carries.
			InsecureSkipVerify: true,
			MinVersion:         tls.VersionTLS12,
			VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
				if len(raw) == 0 || !bytes.Equal(raw[0], want) {
					return errors.New("it does not present the engine's certificate (tls_cert)")
				}
				return nil
			},
		})
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(host, port)+worker.ProbePath, nil)
	req.Close = true
	if err := req.Write(rw); err != nil {
		return h, fmt.Errorf("asking %s: %w", e.Listen, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(rw), req)
	if err != nil {
		return h, fmt.Errorf("asking %s: %w", e.Listen, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	first, _, _ := strings.Cut(string(body), "\n")
	h.Status, h.First = resp.Status, strings.TrimSpace(first)
	if v, ok := strings.CutPrefix(h.First, worker.ProbeAnswer+" "); ok && resp.StatusCode == http.StatusOK && validProbeValue(v) {
		h.Value = v
	}
	return h, nil
}

// listenerOf finds the listening TCP socket that accepts connections to
// ip:port in /proc/net/tcp and tcp6, bound to ip or to every address,
// and says its owner and inode. Of several (SO_REUSEPORT), another
// user's comes first: any of them may answer. The listener, not the
// connection: an accepted socket has no inode until the process takes
// it from the queue.
func listenerOf(ip net.IP, port uint64) (uid int, inode string, ok bool) {
	const listening = "0A"
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != listening ||
				!(procAddrIs(f[1], ip, port) || procAddrIs(f[1], net.IPv4zero, port) || procAddrIs(f[1], net.IPv6unspecified, port)) {
				continue
			}
			u, err := strconv.Atoi(f[7])
			if err != nil {
				continue
			}
			if !ok || (uid == os.Getuid() && u != uid) {
				uid, inode, ok = u, f[9], true
			}
		}
	}
	return uid, inode, ok
}

// validProbeValue is a value of the run as newProbeValue makes them.
func validProbeValue(v string) bool {
	b, err := hex.DecodeString(v)
	return err == nil && len(b) == 16
}

// socketHolder finds the process that holds the socket of inode, and
// its name: 0 and "" when none is found (gone, or /proc unreadable).
func socketHolder(inode string) (pid int, command string) {
	target := "socket:[" + inode + "]"
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, dir := range procs {
		fds, err := os.ReadDir(dir + "/fd")
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if link, err := os.Readlink(dir + "/fd/" + fd.Name()); err == nil && link == target {
				pid, _ = strconv.Atoi(filepath.Base(dir))
				comm, _ := os.ReadFile(dir + "/comm")
				return pid, strings.TrimSpace(string(comm))
			}
		}
	}
	return 0, ""
}
