package engine

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/internal/loglimit"
)

// The engine's listener is the one part of the engine that every compute
// node can reach, so in a real deployment it is exposed to everyone who can
// run a job, and often to a whole network. It is built to hold under abuse
// from someone without a credential:
//
//   - Every timeout of http.Server is set, so a client that sends half a
//     request, or nothing, or reads its answer a byte a minute, holds its
//     connection for a bounded time. WriteTimeout leaves room for the long
//     poll of GET /v1/work.
//   - A request that cannot be authorized (no credential, a bad, expired
//     or revoked one) is answered 401 before its body is read, and the
//     connection is closed (see workerAPI.refuse): Go's server
//     would otherwise read up to 256 KiB of an unread body before writing the
//     answer, and a client that announces a body and never sends it would
//     hold the connection until ReadTimeout.
//   - Connections are capped (connGate). Those that are not an attached
//     worker's may use only part of the cap; the rest is kept for
//     workers. A connection becomes a worker's when an attach on it
//     succeeds or a request on it carries an attached worker's session
//     (books.sessionLocked, sessionHolds), never for a credential that merely checks
//     out: a detached worker's or a failed job's is good for hours, and
//     is refused (401, 403 or 409) with its connection closed. When the
//     part for strangers is full, the stranger that has been idle
//     longest is dropped to make room, so a flood of idle connections
//     churns itself instead of locking workers out.
//   - The operator's requests (the event stream, /status, the page,
//     /metrics unless open) have a room of their own: at most
//     maxOperatorRequests in progress (operatorAuth), and a connection
//     carrying one counts neither against the cap nor among strangers
//     while it does (MarkOperator), and goes back to the strangers' share
//     when it ends, so an idle one is evicted like any stranger's.
//   - Refusals are logged at a bounded rate (internal/loglimit), so a flood of bad
//     requests costs a line every few seconds, not a line per request.
//
// There is no per-address limit: a large job's compute nodes often share
// one NAT address, and an attacker inside the cluster has many
// (docs/design/engine-listener.md).

const (
	// defaultMaxConnections caps open connections unless engine.max_connections
	// says otherwise. A worker holds one (its long poll, kept alive between
	// polls), so this is also the number of workers one engine can serve.
	defaultMaxConnections = 4096

	// readHeaderTimeout bounds how long a client may take to send its
	// request line and headers; a worker sends them in one write.
	readHeaderTimeout = 10 * time.Second
	// readTimeout bounds the whole request, body included. A result is at
	// most maxResultBody (1 MiB); a minute is generous for that on any link
	// a compute node has.
	readTimeout = 60 * time.Second
	// writeSlack is added to the longest long poll to bound writing an
	// answer.
	writeSlack = 30 * time.Second
	// idleTimeout closes keep-alive connections that carry nothing. A worker
	// polls again at once after each answer, so its connection is idle for
	// milliseconds; ninety seconds is for the one that just reported a
	// result and is thinking.
	idleTimeout = 90 * time.Second
	// maxHeaderBytes: a worker's headers are a few hundred bytes, most of it
	// the credential.
	maxHeaderBytes = 16 << 10
)

// newHTTPServer returns the engine's http.Server with every timeout set and
// gate, if not nil, watching its connections. pollWait is the longest long
// poll the engine holds. TLS, when configured, is its listener's
// (serverListener), not the server's.
func newHTTPServer(handler http.Handler, gate *connGate, pollWait time.Duration) *http.Server {
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      pollWait + writeSlack,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		// The server's own complaints (TLS handshakes failing, bad
		// requests) are what a flood is made of; they go nowhere rather
		// than to stderr unbounded.
		ErrorLog: hclog.NewNullLogger().StandardLogger(nil),
	}
	if gate != nil {
		srv.ConnContext = gate.connContext
		srv.ConnState = gate.connState
	}
	return srv
}

// connGate caps the connections of one http.Server. Its hooks are the
// server's ConnContext and ConnState; a handler marks a connection as a
// worker's with markCredentialed once a worker attached on it or a
// request on it holds an attached worker's session.
type connGate struct {
	// max is the cap on all connections; guests is the cap on those that
	// are not (yet) an attached worker's. Both are fixed after
	// newConnGate.
	max, guests int
	logger      hclog.Logger
	logs        *loglimit.Limiter

	// mu guards conns and every connEntry's fields. It is held only for
	// bookkeeping, never across I/O but a Close of a connection being
	// dropped, which does not block.
	mu    sync.Mutex
	conns map[net.Conn]*connEntry
	// nGuests counts conns entries that are neither credentialed nor
	// operator; nOperators those that are operator.
	nGuests, nOperators int
	// dropped counts connections refused or evicted, for tests and status.
	dropped int
}

// connEntry is one open connection.
type connEntry struct {
	gate  *connGate
	conn  net.Conn
	since time.Time
	// state is the last state the server reported; credentialed says it
	// is an attached worker's (markCredentialed). Both are guarded by
	// gate.mu.
	state        http.ConnState
	credentialed bool
	// operator says an operator's request is in progress on it (and it
	// is not credentialed): it is outside the cap and the strangers'
	// share until the request ends. Guarded by gate.mu.
	operator bool
	// parked says a worker's poll has taken the connection from the
	// server (engine/internal/park): it stays counted, as the worker's,
	// while the server has no word of it, and comes back to the server
	// as the same entry. Guarded by gate.mu.
	parked bool
}

type connEntryKey struct{}

// newConnGate returns a gate for max connections, of which a quarter at
// most may be strangers'.
func newConnGate(max int, logger hclog.Logger, logs *loglimit.Limiter) *connGate {
	if max <= 0 {
		max = defaultMaxConnections
	}
	guests := max / 4
	if guests < 1 {
		guests = 1
	}
	return &connGate{max: max, guests: guests, logger: logger, logs: logs, conns: make(map[net.Conn]*connEntry)}
}

// connContext registers c; the server calls it before connState(StateNew).
// A connection a parked poll gives back keeps its entry, and stays the
// worker's.
func (g *connGate) connContext(ctx context.Context, c net.Conn) context.Context {
	g.mu.Lock()
	e := g.conns[c]
	if e != nil && e.parked {
		e.parked = false
		e.since = time.Now()
	} else {
		e = &connEntry{gate: g, conn: c, since: time.Now()}
		g.conns[c] = e
		g.nGuests++
	}
	g.mu.Unlock()
	return context.WithValue(ctx, connEntryKey{}, e)
}

func (g *connGate) connState(c net.Conn, st http.ConnState) {
	g.mu.Lock()
	e := g.conns[c]
	if e == nil {
		g.mu.Unlock()
		return
	}
	switch st {
	case http.StateHijacked:
		if e.parked {
			e.state = st
			g.mu.Unlock()
			return
		}
		g.removeLocked(e)
		g.mu.Unlock()
		return
	case http.StateClosed:
		g.removeLocked(e)
		g.mu.Unlock()
		return
	case http.StateNew:
		// Admission. The new connection is a stranger; make room for it
		// by dropping the stranger idle longest, or refuse it.
		var victims []net.Conn
		for len(g.conns)-g.nOperators > g.max || g.nGuests > g.guests {
			v := g.oldestIdleGuestLocked(e)
			if v == nil {
				v = e
			}
			g.removeLocked(v)
			g.dropped++
			victims = append(victims, v.conn)
			if v == e {
				break
			}
		}
		e.state = st
		g.mu.Unlock()
		for _, v := range victims {
			v.Close()
		}
		if len(victims) > 0 {
			if ok, more := g.logs.Allow(time.Now()); ok {
				g.logger.Warn("connection limit reached: dropped connections without a credential",
					"dropped", len(victims), "not_logged_before", more, "max_connections", g.max, "max_without_credential", g.guests)
			}
		}
		return
	default:
		e.state = st
	}
	g.mu.Unlock()
}

// oldestIdleGuestLocked is the stranger that has waited longest without a
// request in progress, other than skip; nil if there is none.
func (g *connGate) oldestIdleGuestLocked(skip *connEntry) *connEntry {
	var best *connEntry
	for _, e := range g.conns {
		if e == skip || e.credentialed || (e.state != http.StateNew && e.state != http.StateIdle) {
			continue
		}
		if best == nil || e.since.Before(best.since) {
			best = e
		}
	}
	return best
}

func (g *connGate) removeLocked(e *connEntry) {
	if _, ok := g.conns[e.conn]; !ok {
		return
	}
	delete(g.conns, e.conn)
	switch {
	case e.operator:
		g.nOperators--
	case !e.credentialed:
		g.nGuests--
	}
}

// markCredentialed moves the connection ctx belongs to out of the
// strangers' share. Calling it for a request not served through a gate is
// harmless.
func markCredentialed(ctx context.Context) {
	e, _ := ctx.Value(connEntryKey{}).(*connEntry)
	if e == nil {
		return
	}
	g := e.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, open := g.conns[e.conn]; open && !e.credentialed {
		e.credentialed = true
		if e.operator {
			e.operator = false
			g.nOperators--
		} else {
			g.nGuests--
		}
	}
}

// MarkOperator takes the connection ctx belongs to out of the cap and
// the strangers' share while an operator's request is in progress on it;
// the function it returns puts it back, and is called when the request
// ends. The number of such requests is bounded by operatorAuth, not here.
// A worker's connection stays a worker's.
func MarkOperator(ctx context.Context) (done func()) {
	e, _ := ctx.Value(connEntryKey{}).(*connEntry)
	if e == nil {
		return func() {}
	}
	g := e.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, open := g.conns[e.conn]; !open || e.credentialed || e.operator {
		return func() {}
	}
	e.operator = true
	g.nGuests--
	g.nOperators++
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if _, open := g.conns[e.conn]; open && e.operator {
			e.operator = false
			g.nOperators--
			g.nGuests++
		}
	}
}

// Park marks the connection of ctx's request as about to be taken by a
// parked poll; false if the gate does not know it (the poll is held).
// Only a worker's connection is parked.
func (g *connGate) Park(ctx context.Context) bool {
	e, _ := ctx.Value(connEntryKey{}).(*connEntry)
	if e == nil || e.gate != g {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, open := g.conns[e.conn]; !open || !e.credentialed {
		return false
	}
	e.parked = true
	return true
}

// Unpark undoes Park when the hijack failed: the server still has the
// connection.
func (g *connGate) Unpark(ctx context.Context) {
	e, _ := ctx.Value(connEntryKey{}).(*connEntry)
	if e == nil {
		return
	}
	g.mu.Lock()
	e.parked = false
	g.mu.Unlock()
}

// Rekey has the entry of old, a parked poll's connection, stand for c,
// which wraps it (with the bytes the server had read past the poll).
func (g *connGate) Rekey(old net.Conn, c net.Conn) {
	g.mu.Lock()
	if e := g.conns[old]; e != nil && old != c {
		delete(g.conns, old)
		e.conn = c
		g.conns[c] = e
	}
	g.mu.Unlock()
}

// Forget removes c, a parked poll's connection closed without going back
// to the server.
func (g *connGate) Forget(c net.Conn) {
	g.mu.Lock()
	if e := g.conns[c]; e != nil {
		g.removeLocked(e)
	}
	g.mu.Unlock()
}

// counts reports open connections, strangers among them, and connections
// dropped so far.
func (g *connGate) counts() (open, guests, dropped int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.conns), g.nGuests, g.dropped
}

// Listen listens where engine.listen says: host:port, or unix:PATH
// for a socket made 0600, which no other user can open, so that an
// engine reachable only through a relaying plugin is a supported setup.
// address is where it listens, as network:address, for the plugins.
func Listen(listen string) (ln net.Listener, address string, err error) {
	path, unix := strings.CutPrefix(listen, "unix:")
	if !unix {
		if ln, err = net.Listen("tcp", listen); err != nil {
			return nil, "", err
		}
		return ln, "tcp:" + ln.Addr().String(), nil
	}
	// A socket left by an engine that died is in the way; anything else
	// at the path is not ours to remove.
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, "", fmt.Errorf("%s exists and is not a socket; remove it or choose another path", path)
		}
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil, "", fmt.Errorf("another engine is listening on %s", path)
		}
		os.Remove(path)
	}
	// umask keeps the socket private from the moment it exists; chmod
	// makes sure whatever the umask was.
	old := syscall.Umask(0o177)
	ln, err = net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, "", err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, "", err
	}
	return ln, "unix:" + path, nil
}
