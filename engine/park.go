package engine

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Parked long polls. A worker that waits for a task (GET /v1/work) or
// holds its watch while it runs one (GET /v1/watch) keeps a request open
// for up to a poll period, and a big workflow has all its workers doing
// so at once. Held by net/http, each such request costs two goroutines
// (about 11 KB of stack) and the server's buffers and request (about
// 19 KB of live heap: a 4 KB reader, 6 KB of writers, the request): 432
// MB of RSS at 10,000 workers, for connections that carry nothing.
//
// A parked poll costs neither. The handler takes the connection from the
// server (Hijack), and the poll waits as an entry here: a runtime timer
// for its period, the connection's descriptor in an epoll set that hears
// a hang-up (hangups_linux.go), and the worker's books. Whatever ends the
// wait (a task assigned, the timer, Dismiss, Close, the worker hanging
// up) fires the entry once; a short-lived goroutine then asks the books
// for the answer, writes it by hand, and gives the connection back to
// the server through the listener (returnListener), where it is served
// as a fresh one and the worker's next request arrives on it as before.
// For the worker nothing changes: the same answer on the same
// keep-alive connection.
//
// Rejected alternative: tuning net/http. No setting of the server goes
// below about 30 KB a held request; the reader, the writers and the
// goroutines are the server's while a handler runs. A third-party
// event-loop HTTP server would serve parked polls cheaply but would
// replace the hardened server in front of everything else (listener.go).
//
// Its cost: answers to parked polls are written here, not by net/http,
// so they are kept to what a poll answers (200 with JSON, 204, 409, 410,
// 503), and written as net/http writes them, byte for byte but the
// Date: in the request's version (HTTP/1.0 or 1.1), keeping the
// connection or closing it as net/http would (Connection: close, an
// HTTP/1.0 request without keep-alive, the engine stopping), with the
// headers in net/http's order (TestParkedAnswerAsNetHTTP). Bytes of the
// client's next request that the server had read with the poll
// (pipelining) go back to the server with the connection (pendingConn)
// and are served from there, as net/http would serve them. A hang-up is
// heard through epoll, so parking is Linux's (other systems hold polls
// as before); and a connection that comes back is a new connection to
// the server (its ConnState hooks run again, which connGate expects:
// see connGate.park).
//
// What it won't do: park HTTP/2 (the engine's TLS offers HTTP/1.1 only:
// a worker makes one request at a time, so multiplexing buys nothing),
// a request with a body, or a connection without a descriptor (a test's
// in-memory pipe). Those are held on their goroutine as before.

// wakeReason is what ended a parked poll's wait.
type wakeReason int

const (
	wakeTimer  wakeReason = iota + 1 // its poll period passed
	wakeTask                         // a task was assigned to its worker
	wakeLeave                        // Dismiss let the workers go
	wakeDone                         // the books closed
	wakeHangup                       // the worker hung up
	wakeNow                          // the books changed before it parked: answer from them at once
)

// parkedAnswer is what a parked poll answers: a status and, unless nil,
// a value encoded as JSON. none says not to answer (the worker hung up).
type parkedAnswer struct {
	status int
	body   any
	none   bool
}

// parker holds parked polls for one engine's server.
type parker struct {
	gate *connGate
	ln   *returnListener
	// hang hears hang-ups; nil where parking is not available.
	hang *hangups

	// mu guards byFD, ending, nextSeq, and every parkedPoll's fired,
	// timer and seq. It is held for bookkeeping and the epoll registration of one
	// descriptor (a system call that does not block), never while
	// writing to a connection.
	mu sync.Mutex
	// byFD are the polls parked now, by their connection's descriptor.
	byFD map[int]*parkedPoll
	// ending is wakeLeave once Dismiss has let the workers go and
	// wakeDone once the books closed; a poll parked after that is
	// answered at once.
	ending wakeReason
	// nextSeq numbers epoll registrations, so that a hang-up heard for a
	// descriptor that has since been reused is not taken for the new
	// connection's.
	nextSeq uint32

	// polls in flight: from the hijack to the connection given back or
	// closed. close waits for them.
	wg sync.WaitGroup
}

// parkedPoll is one parked request.
type parkedPoll struct {
	p      *parker
	conn   net.Conn
	fd     int
	header http.Header
	// What the request says about its connection, as net/http reads it
	// (see write): is11 is HTTP/1.1; keep10 an HTTP/1.0 request with
	// Connection: keep-alive; wantsClose Connection: close (r.Close).
	is11, keep10, wantsClose bool
	// answer asks the books what to answer; called once, without p.mu.
	answer func(wakeReason) parkedAnswer

	// Guarded by p.mu.
	fired bool
	timer *time.Timer
	seq   uint32
}

// newParker returns a parker for a server whose listener is ln and whose
// connections gate watches, or nil where polls cannot be parked (no
// epoll: they are held as before).
func newParker(gate *connGate, ln *returnListener) *parker {
	h, err := newHangups()
	if err != nil || gate == nil {
		return nil
	}
	p := &parker{gate: gate, ln: ln, hang: h, byFD: make(map[int]*parkedPoll)}
	h.start(p.hungUp)
	return p
}

// canPark reports whether r can be parked: an HTTP/1 request without a
// body, on a connection the gate knows and that has a descriptor.
func (p *parker) canPark(r *http.Request) bool {
	if p == nil || r.ProtoMajor != 1 || r.ContentLength != 0 || len(r.TransferEncoding) > 0 {
		return false
	}
	e, _ := r.Context().Value(connEntryKey{}).(*connEntry)
	return e != nil && connFD(e.conn) >= 0
}

// connFD is c's descriptor, or -1 if it has none.
func connFD(c net.Conn) int {
	if pc, ok := c.(*pendingConn); ok {
		c = pc.Conn
	}
	if t, ok := c.(*tls.Conn); ok {
		c = t.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return -1
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return -1
	}
	fd := -1
	if err := raw.Control(func(d uintptr) { fd = int(d) }); err != nil {
		return -1
	}
	return fd
}

// hijack takes r's connection from the server for a parked poll. On
// false nothing was taken and nothing written: the caller answers r as
// before.
func (p *parker) hijack(w http.ResponseWriter, r *http.Request) (*parkedPoll, bool) {
	if !p.gate.park(r.Context()) {
		return nil, false
	}
	header := w.Header().Clone()
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		p.gate.unpark(r.Context())
		return nil, false
	}
	fd := connFD(conn)
	if fd < 0 {
		// canPark saw a descriptor; a connection that lost it since is
		// closing anyway.
		conn.Close()
		p.gate.forget(conn)
		return nil, true
	}
	connection := r.Header.Get("Connection")
	pp := &parkedPoll{p: p, conn: conn, fd: fd, header: header, is11: r.ProtoAtLeast(1, 1),
		keep10:     r.ProtoMajor == 1 && r.ProtoMinor == 0 && hasToken(connection, "keep-alive"),
		wantsClose: r.Close || hasToken(connection, "close")}
	if n := brw.Reader.Buffered(); n > 0 {
		// A pipelining client's next request, read with this one: it
		// goes back to the server with the connection.
		buffered, _ := brw.Reader.Peek(n)
		pp.conn = p.gate.rekey(conn, withPending(conn, buffered))
	}
	p.wg.Add(1)
	return pp, true
}

// hasToken reports whether the comma-separated header value v holds
// token, in any case, as net/http reads Connection.
func hasToken(v, token string) bool {
	for _, t := range strings.Split(v, ",") {
		if strings.EqualFold(strings.TrimSpace(t), token) {
			return true
		}
	}
	return false
}

// hold parks pp for at most wait, or answers it at once when now is set
// or the workers are being let go. pp.answer must be set.
func (p *parker) hold(pp *parkedPoll, wait time.Duration, now bool) {
	p.mu.Lock()
	if pp.fired {
		p.mu.Unlock()
		return
	}
	why := p.ending
	if now && why == 0 {
		why = wakeNow
	}
	if why == 0 {
		p.nextSeq++
		pp.seq = p.nextSeq
		if err := p.hang.add(pp.fd, pp.seq); err != nil {
			// Parked without a hang-up watch, it still ends with its
			// period: a dead worker is noticed that much later, where
			// answering at once would have it poll in a tight loop.
			pp.seq = 0
		}
	}
	if why != 0 {
		p.mu.Unlock()
		pp.fire(why)
		return
	}
	p.byFD[pp.fd] = pp
	pp.timer = time.AfterFunc(wait, func() { pp.fire(wakeTimer) })
	p.mu.Unlock()
}

// fire ends pp's wait for why; the first call wins. It does no I/O and
// may be called with the books' lock held.
func (pp *parkedPoll) fire(why wakeReason) {
	p := pp.p
	p.mu.Lock()
	if pp.fired {
		p.mu.Unlock()
		return
	}
	pp.fired = true
	if p.byFD[pp.fd] == pp {
		delete(p.byFD, pp.fd)
		if pp.seq != 0 {
			p.hang.remove(pp.fd)
		}
	}
	if pp.timer != nil {
		pp.timer.Stop()
	}
	p.mu.Unlock()
	go pp.finish(why)
}

// hungUp is the hang-up watcher's word that the connection registered
// as (fd, seq) was closed by its worker.
func (p *parker) hungUp(fd int, seq uint32) {
	p.mu.Lock()
	pp := p.byFD[fd]
	if pp != nil && (seq == 0 || pp.seq != seq) {
		pp = nil
	}
	p.mu.Unlock()
	if pp != nil {
		pp.fire(wakeHangup)
	}
}

// finish answers pp and gives its connection back to the server, or
// closes it.
func (pp *parkedPoll) finish(why wakeReason) {
	p := pp.p
	defer p.wg.Done()
	a := pp.answer(why)
	if !a.none {
		// A stopping engine keeps no connection, as net/http's server
		// in Shutdown does not.
		keep, err := pp.write(a, why != wakeDone)
		if err == nil && keep && pp.conn.SetDeadline(time.Time{}) == nil && p.ln.give(pp.conn) {
			return
		}
	}
	pp.conn.Close()
	p.gate.forget(pp.conn)
}

// write writes a, within writeSlack, as net/http writes what writeJSON
// or WriteHeader answers (net/http's chunkWriter.writeHeader):
// the status line in the request's version; the handler's
// headers sorted, then Date, then Connection where net/http adds it;
// keep-alive for HTTP/1.1 unless the request said close, and for
// HTTP/1.0 only when it asked for keep-alive and the answer's length is
// known. keepAlives false is a server that keeps no connection. keep
// says whether the connection may carry the client's next request.
func (pp *parkedPoll) write(a parkedAnswer, keepAlives bool) (keep bool, err error) {
	var body []byte
	if a.body != nil {
		buf, err := encodeJSON(a.body)
		if err != nil {
			a = parkedAnswer{status: http.StatusInternalServerError, body: map[string]string{"error": "could not encode response"}}
			buf, _ = encodeJSON(a.body)
		}
		body = buf
	}
	h := pp.header
	hasLength := body != nil
	if hasLength {
		h.Set("Content-Type", "application/json")
		h.Set("Content-Length", strconv.Itoa(len(body)))
	}
	// 1xx, 204 and 304 carry no body, nor its headers.
	bodyAllowed := a.status >= 200 && a.status != http.StatusNoContent && a.status != http.StatusNotModified
	closeAfter := false
	var connection string
	if pp.keep10 && (hasLength || !bodyAllowed) {
		if _, set := h["Connection"]; !set {
			connection = "keep-alive"
		}
	} else if !pp.is11 || pp.wantsClose {
		closeAfter = true
	}
	if h.Get("Connection") == "close" || !keepAlives {
		closeAfter = true
	}
	if !bodyAllowed {
		h.Del("Content-Type")
		h.Del("Content-Length")
		h.Del("Transfer-Encoding")
		body = nil
	}
	_, hasDate := h["Date"]
	if closeAfter && (!keepAlives || !hasToken(h.Get("Connection"), "close")) {
		h.Del("Connection")
		if pp.is11 {
			connection = "close"
		}
	}

	var out bytes.Buffer
	if pp.is11 {
		out.WriteString("HTTP/1.1 ")
	} else {
		out.WriteString("HTTP/1.0 ")
	}
	if text := http.StatusText(a.status); text != "" {
		out.WriteString(strconv.Itoa(a.status) + " " + text + "\r\n")
	} else {
		fmt.Fprintf(&out, "%03d status code %d\r\n", a.status, a.status)
	}
	if err := h.Write(&out); err != nil {
		return false, err
	}
	if !hasDate {
		out.WriteString("Date: " + time.Now().UTC().Format(http.TimeFormat) + "\r\n")
	}
	if connection != "" {
		out.WriteString("Connection: " + connection + "\r\n")
	}
	out.WriteString("\r\n")
	out.Write(body)
	if err := pp.conn.SetWriteDeadline(time.Now().Add(writeSlack)); err != nil {
		return false, err
	}
	_, err = pp.conn.Write(out.Bytes())
	return !closeAfter, err
}

// pendingConn is a parked poll's connection on its way back to the
// server with bytes the server had read past the poll (a pipelining
// client's next request): Read returns those first.
type pendingConn struct {
	net.Conn
	// mu guards pending: the server reads it, a later parked poll of the
	// connection adds to it.
	mu      sync.Mutex
	pending []byte
}

// withPending returns c with buffered to be read before what c has yet
// to deliver. buffered is copied.
func withPending(c net.Conn, buffered []byte) *pendingConn {
	if pc, ok := c.(*pendingConn); ok {
		// The server read buffered from pc before what pc still holds.
		pc.mu.Lock()
		pc.pending = append(slices.Clone(buffered), pc.pending...)
		pc.mu.Unlock()
		return pc
	}
	return &pendingConn{Conn: c, pending: slices.Clone(buffered)}
}

func (c *pendingConn) Read(b []byte) (int, error) {
	c.mu.Lock()
	if len(c.pending) > 0 {
		n := copy(b, c.pending)
		c.pending = c.pending[n:]
		c.mu.Unlock()
		return n, nil
	}
	c.mu.Unlock()
	return c.Conn.Read(b)
}

// encodeJSON is v as writeJSON encodes it.
func encodeJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	err := json.NewEncoder(&buf).Encode(v)
	return buf.Bytes(), err
}

// end answers every parked poll for why (wakeLeave or wakeDone), and
// every poll parked from now on.
func (p *parker) end(why wakeReason) {
	if p == nil {
		return
	}
	p.mu.Lock()
	if p.ending != wakeDone {
		p.ending = why
	}
	polls := make([]*parkedPoll, 0, len(p.byFD))
	for _, pp := range p.byFD {
		polls = append(polls, pp)
	}
	p.mu.Unlock()
	for _, pp := range polls {
		pp.fire(why)
	}
}

// close answers what is parked as the engine stops, waits for every
// parked poll to be done with, and stops the hang-up watcher.
func (p *parker) close() {
	if p == nil {
		return
	}
	p.end(wakeDone)
	p.wg.Wait()
	p.hang.close()
}

// serverListener is what the engine's server serves on: ln, under TLS
// when tlsConfig is set, taken here rather than by ServeTLS so that a
// parked poll's connection goes back to the server already decrypting;
// HTTP/1.1 only, because a poll parks only on HTTP/1.
func serverListener(ln net.Listener, tlsConfig *tls.Config) *returnListener {
	if tlsConfig != nil {
		cfg := tlsConfig.Clone()
		cfg.NextProtos = []string{"http/1.1"}
		ln = tls.NewListener(ln, cfg)
	}
	return newReturnListener(ln)
}

// returnListener is the server's listener: the connections its inner
// listener accepts, and those parked polls give back. Its one goroutine
// accepts from the inner listener; Close stops it and waits.
type returnListener struct {
	inner net.Listener
	back  chan net.Conn
	fresh chan accepted
	// done is closed by Close; stopped when the accepting goroutine has
	// returned.
	done      chan struct{}
	stopped   chan struct{}
	closeOnce sync.Once
	closeErr  error
}

type accepted struct {
	conn net.Conn
	err  error
}

func newReturnListener(inner net.Listener) *returnListener {
	l := &returnListener{inner: inner, back: make(chan net.Conn), fresh: make(chan accepted),
		done: make(chan struct{}), stopped: make(chan struct{})}
	go l.accept()
	return l
}

func (l *returnListener) accept() {
	defer close(l.stopped)
	for {
		c, err := l.inner.Accept()
		select {
		case l.fresh <- accepted{c, err}:
		case <-l.done:
			if c != nil {
				c.Close()
			}
			return
		}
		// Any other error is the server's to judge: it retries the
		// temporary ones and closes the listener on the rest.
		if errors.Is(err, net.ErrClosed) {
			return
		}
	}
}

// Accept returns the next connection, given back or new.
func (l *returnListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.back:
		return c, nil
	case a := <-l.fresh:
		return a.conn, a.err
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// give hands c back to the server; false if the server no longer
// accepts (the caller closes c).
func (l *returnListener) give(c net.Conn) bool {
	select {
	case l.back <- c:
		return true
	case <-l.done:
		return false
	case <-l.stopped:
		return false
	}
}

// Close stops accepting and waits for the accepting goroutine.
func (l *returnListener) Close() error {
	l.closeOnce.Do(func() {
		close(l.done)
		l.closeErr = l.inner.Close()
		<-l.stopped
	})
	return l.closeErr
}

func (l *returnListener) Addr() net.Addr { return l.inner.Addr() }
