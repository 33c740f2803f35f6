// Package park parks HTTP/1 long polls: a handler whose request has
// nothing to answer yet takes the connection from net/http (Hijack), the
// poll waits as an entry here (a runtime timer for its period, the
// connection's descriptor in an epoll set that hears a hang-up), and
// whatever ends the wait (Poll.Wake, the timer, the client hanging up,
// Parker.Close) fires the entry once. A short-lived goroutine then asks
// the owner for the answer, writes it as net/http writes it, and gives
// the connection back to the server through its Listener, where it is
// served as a new connection and the client's next request arrives on
// it. For the client nothing changes: the same answer on the same
// keep-alive connection.
//
// A held request costs two goroutines and the server's buffers for as
// long as it waits; a parked one costs neither. The engine parks its
// workers' polls and watches, which a big workflow keeps open by the
// thousand and which carry nothing while they wait.
//
// Its cost: answers are written here, not by net/http, so they are kept
// to what a long poll answers (a status and, optionally, a JSON body),
// and written as net/http writes them, byte for byte but the Date, in
// the request's version, keeping the connection or closing it as
// net/http would (Connection: close, HTTP/1.0 without keep-alive, a
// server that is closing), with the headers in net/http's order. Bytes
// of the client's next request that the server had read with the poll
// (pipelining) go back with the connection and are read first. A
// hang-up is heard through epoll, so parking is Linux's: New fails
// elsewhere and its caller holds its polls as net/http handlers.
//
// It relies on one behaviour of net/http that no API promises: a
// connection handed to the server again through its Listener's Accept is
// served as a new connection (ConnContext and ConnState run again, and
// the handler reads what the connection's Read returns first).
// TestReacceptedConnServedAsNew pins it.
//
// What it will not do: park HTTP/2, a request with a body, or a
// connection without a descriptor (an in-memory pipe); CanPark says no,
// and the caller holds those. Why parking and not a tuned or another
// HTTP server: docs/design/engine-park.md.
package park

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
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

// Gate is the server's account of its connections, which a parked
// connection leaves and comes back to. Its methods are called without
// any lock of the parker's.
type Gate interface {
	// Conn is the connection a request's context belongs to, or nil.
	Conn(ctx context.Context) net.Conn
	// Park marks the connection of ctx's request as taken by a parked
	// poll; false if it may not be parked.
	Park(ctx context.Context) bool
	// Unpark undoes Park when the hijack failed.
	Unpark(ctx context.Context)
	// Rekey has the entry of old stand for c, which wraps it.
	Rekey(old, c net.Conn)
	// Forget removes c, a parked connection closed rather than given
	// back.
	Forget(c net.Conn)
}

// Reason is what ended a parked poll's wait.
type Reason int

const (
	Timer   Reason = iota + 1 // its period passed
	Woken                     // its owner woke it (Poll.Wake)
	Hangup                    // the client hung up: nothing is written
	Closing                   // the parker is closing (Close)
)

// Answer is what a parked poll answers: Status and, unless nil, Body
// encoded as JSON. Status 0 answers nothing and closes the connection.
// Close closes it after the answer, as a server that is shutting down
// does.
type Answer struct {
	Status int
	Body   any
	Close  bool
}

// Parker holds the parked polls of one server.
type Parker struct {
	gate         Gate
	ln           *Listener
	writeTimeout time.Duration
	hang         *hangups

	// mu guards byFD, closing, nextSeq, and every Poll's fired, timer
	// and seq. It is held for bookkeeping and the epoll registration of
	// one descriptor (a system call that does not block), never while
	// writing to a connection.
	mu   sync.Mutex
	byFD map[int]*Poll
	// closing is set by Close: a poll held after it is answered at once.
	closing bool
	// nextSeq numbers epoll registrations, so that a hang-up heard for a
	// descriptor that has since been reused is not taken for the new
	// connection's.
	nextSeq uint32

	// wg counts polls from the hijack to the connection given back or
	// closed; Close waits for them.
	wg sync.WaitGroup
}

// Poll is one parked request.
type Poll struct {
	p      *Parker
	conn   net.Conn
	fd     int
	header http.Header
	// What the request says about its connection, as net/http reads it
	// (see write): is11 is HTTP/1.1; keep10 an HTTP/1.0 request with
	// Connection: keep-alive; wantsClose Connection: close.
	is11, keep10, wantsClose bool
	// answer asks the owner what to answer; called once, without p.mu.
	answer func(Reason) Answer

	// Guarded by p.mu.
	fired bool
	timer *time.Timer
	seq   uint32
}

// New returns a parker for a server whose listener is ln and whose
// connections gate accounts for; writeTimeout bounds writing an answer.
// It fails where polls cannot be parked (no epoll).
func New(gate Gate, ln *Listener, writeTimeout time.Duration) (*Parker, error) {
	h, err := newHangups()
	if err != nil {
		return nil, fmt.Errorf("polls cannot be parked here: %w", err)
	}
	p := &Parker{gate: gate, ln: ln, writeTimeout: writeTimeout, hang: h, byFD: make(map[int]*Poll)}
	h.start(p.hungUp)
	return p, nil
}

// CanPark reports whether r can be parked: an HTTP/1 request without a
// body, on a connection the gate knows and that has a descriptor. A nil
// parker parks nothing.
func (p *Parker) CanPark(r *http.Request) bool {
	if p == nil || r.ProtoMajor != 1 || r.ContentLength != 0 || len(r.TransferEncoding) > 0 {
		return false
	}
	c := p.gate.Conn(r.Context())
	return c != nil && connFD(c) >= 0
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

// Hijack takes r's connection from the server for a poll that answer
// will answer, once, from a goroutine of its own. On false nothing was
// taken and nothing written: the caller answers r itself. A nil Poll
// with true: the connection was taken and is closed (it lost its
// descriptor, which happens only to a connection that is closing).
// The poll waits only once Hold is called; Wake may come before.
func (p *Parker) Hijack(w http.ResponseWriter, r *http.Request, answer func(Reason) Answer) (*Poll, bool) {
	if !p.gate.Park(r.Context()) {
		return nil, false
	}
	header := w.Header().Clone()
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		p.gate.Unpark(r.Context())
		return nil, false
	}
	fd := connFD(conn)
	if fd < 0 {
		conn.Close()
		p.gate.Forget(conn)
		return nil, true
	}
	connection := r.Header.Get("Connection")
	pp := &Poll{p: p, conn: conn, fd: fd, header: header, answer: answer, is11: r.ProtoAtLeast(1, 1),
		keep10:     r.ProtoMajor == 1 && r.ProtoMinor == 0 && hasToken(connection, "keep-alive"),
		wantsClose: r.Close || hasToken(connection, "close")}
	if n := brw.Reader.Buffered(); n > 0 {
		// A pipelining client's next request, read with this one: it
		// goes back to the server with the connection.
		buffered, _ := brw.Reader.Peek(n)
		pc := withPending(conn, buffered)
		p.gate.Rekey(conn, pc)
		pp.conn = pc
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

// Hold parks pp for at most wait; a poll already woken, or held after
// Close, is answered at once.
func (pp *Poll) Hold(wait time.Duration) {
	p := pp.p
	p.mu.Lock()
	if pp.fired {
		p.mu.Unlock()
		return
	}
	if p.closing {
		p.mu.Unlock()
		pp.fire(Closing)
		return
	}
	p.nextSeq++
	pp.seq = p.nextSeq
	if err := p.hang.add(pp.fd, pp.seq); err != nil {
		// Parked without a hang-up watch, it still ends with its
		// period: a dead client is noticed that much later, where
		// answering at once would have it poll in a tight loop.
		pp.seq = 0
	}
	p.byFD[pp.fd] = pp
	pp.timer = time.AfterFunc(wait, func() { pp.fire(Timer) })
	p.mu.Unlock()
}

// Wake ends pp's wait: its owner has something to answer. It does no
// I/O and may be called with the owner's locks held.
func (pp *Poll) Wake() { pp.fire(Woken) }

// fire ends pp's wait for why; the first call wins.
func (pp *Poll) fire(why Reason) {
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
// as (fd, seq) was closed by its client.
func (p *Parker) hungUp(fd int, seq uint32) {
	p.mu.Lock()
	pp := p.byFD[fd]
	if pp != nil && (seq == 0 || pp.seq != seq) {
		pp = nil
	}
	p.mu.Unlock()
	if pp != nil {
		pp.fire(Hangup)
	}
}

// finish answers pp and gives its connection back to the server, or
// closes it.
func (pp *Poll) finish(why Reason) {
	p := pp.p
	defer p.wg.Done()
	a := pp.answer(why)
	if why == Closing {
		a.Close = true
	}
	if why != Hangup && a.Status != 0 {
		keep, err := pp.write(a)
		if err == nil && keep && pp.conn.SetDeadline(time.Time{}) == nil && p.ln.give(pp.conn) {
			return
		}
	}
	pp.conn.Close()
	p.gate.Forget(pp.conn)
}

// write writes a, within the parker's write timeout, as net/http writes
// the same status and JSON body (net/http's chunkWriter.writeHeader):
// the status line in the request's version; the handler's
// headers sorted, then Date, then Connection where net/http adds it;
// keep-alive for HTTP/1.1 unless the request said close, and for
// HTTP/1.0 only when it asked for keep-alive and the answer's length is
// known; a.Close is a server that keeps no connection. keep says whether
// the connection may carry the client's next request.
func (pp *Poll) write(a Answer) (keep bool, err error) {
	keepAlives := !a.Close
	var body []byte
	if a.Body != nil {
		buf, err := encodeJSON(a.Body)
		if err != nil {
			a = Answer{Status: http.StatusInternalServerError, Body: map[string]string{"error": "could not encode response"}}
			buf, _ = encodeJSON(a.Body)
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
	bodyAllowed := a.Status >= 200 && a.Status != http.StatusNoContent && a.Status != http.StatusNotModified
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
	if text := http.StatusText(a.Status); text != "" {
		out.WriteString(strconv.Itoa(a.Status) + " " + text + "\r\n")
	} else {
		fmt.Fprintf(&out, "%03d status code %d\r\n", a.Status, a.Status)
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
	if err := pp.conn.SetWriteDeadline(time.Now().Add(pp.p.writeTimeout)); err != nil {
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

// encodeJSON is v as json.Encoder encodes it, newline and all.
func encodeJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	err := json.NewEncoder(&buf).Encode(v)
	return buf.Bytes(), err
}

// Parked is how many polls wait parked now.
func (p *Parker) Parked() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.byFD)
}

// Close answers every parked poll, and every poll held from now on, for
// Closing, waits for each to be done with, and stops the hang-up
// watcher. A nil parker has nothing to close.
func (p *Parker) Close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.closing = true
	polls := make([]*Poll, 0, len(p.byFD))
	for _, pp := range p.byFD {
		polls = append(polls, pp)
	}
	p.mu.Unlock()
	for _, pp := range polls {
		pp.fire(Closing)
	}
	p.wg.Wait()
	p.hang.close()
}
