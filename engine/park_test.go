package engine

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/testutil"
	"github.com/fluksio/provision/worker"
)

// rawWorker is a worker's connection driven by hand: the test holds no
// goroutine per worker, so the goroutines it counts are the engine's.
type rawWorker struct {
	name, token, session string
	conn                 net.Conn
	r                    *bufio.Reader
}

// attachRaw attaches name over a connection of its own and returns it.
func attachRaw(t *testing.T, e *Books, signer *host.Signer, dial func() (net.Conn, error), name string) *rawWorker {
	t.Helper()
	c, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	w := &rawWorker{name: name, token: sign(t, signer, name, time.Hour), conn: c, r: bufio.NewReader(c)}
	provisioned(e, name, "77")
	fmt.Fprintf(c, "POST /v1/attach HTTP/1.1\r\nHost: engine\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		w.token, len(attachBody), attachBody)
	resp := w.read(t, "attach")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: attach answered %d", name, resp.StatusCode)
	}
	var a worker.AttachResponse
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		t.Fatal(err)
	}
	w.session = a.Session
	return w
}

// send writes a GET of path with the worker's credential and session.
func (w *rawWorker) send(t *testing.T, path string) {
	t.Helper()
	if _, err := fmt.Fprintf(w.conn, "GET %s HTTP/1.1\r\nHost: engine\r\nAuthorization: Bearer %s\r\n%s: %s\r\n\r\n", path, w.token, sessionHeader, w.session); err != nil {
		t.Fatalf("%s: %v", w.name, err)
	}
}

// read reads one answer on the worker's connection, body and all.
func (w *rawWorker) read(t *testing.T, what string) *http.Response {
	t.Helper()
	w.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(w.r, nil)
	if err != nil {
		t.Fatalf("%s: %s: no answer: %v", w.name, what, err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s: %s: body: %v", w.name, what, err)
	}
	resp.Body = io.NopCloser(strings.NewReader(string(body)))
	return resp
}

// serveGoroutines counts the server's connection goroutines: one per
// connection whose request net/http holds.
func serveGoroutines() int {
	buf := make([]byte, 8<<20)
	n := runtime.Stack(buf, true)
	return strings.Count(string(buf[:n]), "net/http.(*conn).serve(")
}

func (p *parker) parked() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.byFD)
}

// parkingBooks serves books whose polls last a minute, as Engine.Serve
// does (startListener), and fails the test where polls cannot be parked.
func parkingBooks(t *testing.T, tlsConfig *tls.Config) (*Books, *host.Signer, string, *connGate) {
	t.Helper()
	signer := host.NewSigner(testSecret)
	e := NewBooks(nil, signer, nil)
	e.PollWait = time.Minute
	addr, gate := startListener(t, e, 0, tlsConfig)
	if e.parker == nil {
		t.Fatal("no parker: epoll unavailable")
	}
	return e, signer, addr, gate
}

// TestParkedPolls: 100 workers long-polling hold no goroutine of the
// server (held by net/http, each held two); a task assigned reaches its
// worker's parked poll, and the period's end answers 204, each on the
// same keep-alive connection, which then carries the next request; a
// worker that hangs up ends its poll at once; Dismiss answers every
// parked poll and watch 410 leave.
func TestParkedPolls(t *testing.T) {
	t.Parallel()
	e, signer, addr, gate := parkingBooks(t, nil)
	dial := func() (net.Conn, error) { return net.Dial("tcp", addr) }

	const n = 100
	workers := make([]*rawWorker, n)
	for i := range workers {
		workers[i] = attachRaw(t, e, signer, dial, fmt.Sprintf("hpc-park-%d", i))
	}
	for i, w := range workers {
		if i == n-1 {
			w.send(t, "/v1/watch")
			continue
		}
		w.send(t, "/v1/work")
	}
	// A handler that has parked its poll still runs on its connection's
	// goroutine until it returns, so the count of those goes to zero
	// only once every handler is done: it is waited for, and a poll held
	// by the server rather than parked keeps it above zero for good.
	waitFor(t, "99 polls and a watch parked, none held by a server goroutine of its connection", func() bool {
		e.mu.Lock()
		polling := 0
		for _, ws := range e.workers {
			polling += ws.polling
		}
		e.mu.Unlock()
		return polling == n-1 && e.parker.parked() == n && serveGoroutines() == 0
	})
	if open, _, _ := gate.counts(); open != n {
		t.Errorf("the gate counts %d connections; want %d (parked ones count)", open, n)
	}

	// A task reaches the parked poll, on the same connection.
	w0 := workers[0]
	if err := e.Assign(w0.name, Task{ID: "t-1", WorkSeconds: 1}); err != nil {
		t.Fatal(err)
	}
	resp := w0.read(t, "the parked poll after Assign")
	var task Task
	json.NewDecoder(resp.Body).Decode(&task)
	if resp.StatusCode != http.StatusOK || task.ID != "t-1" || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("parked poll after Assign: %d %q %+v; want 200 application/json t-1", resp.StatusCode, resp.Header.Get("Content-Type"), task)
	}
	// The connection went back to the server: its next request is
	// served on it (the task is handed out again until its result).
	w0.send(t, "/v1/work")
	if resp := w0.read(t, "the next poll on the same connection"); resp.StatusCode != http.StatusOK {
		t.Fatalf("next poll on the connection given back: %d; want 200", resp.StatusCode)
	}

	// The period's end: a poll asking for 0.2 s is answered 204.
	w1 := workers[1]
	w1.conn.Close()
	waitFor(t, "the first poll of a connection that hung up to end", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.workers[w1.name].polling == 0
	})
	w2 := attachRaw(t, e, signer, dial, "hpc-park-short")
	w2.send(t, "/v1/work?wait=0.2")
	if resp := w2.read(t, "a short poll"); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("short poll: %d; want 204", resp.StatusCode)
	}
	w2.send(t, "/v1/work?wait=0.2")
	if resp := w2.read(t, "a second short poll on the same connection"); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("second short poll: %d; want 204", resp.StatusCode)
	}

	// Dismiss answers the parked ones 410 leave.
	go e.Dismiss(t.Context(), 0)
	for _, w := range workers[2:] {
		resp := w.read(t, "the parked poll at Dismiss")
		var er worker.ErrorResponse
		json.NewDecoder(resp.Body).Decode(&er)
		if resp.StatusCode != http.StatusGone || er.Code != worker.CodeLeave {
			t.Fatalf("%s at Dismiss: %d %+v; want 410 %s", w.name, resp.StatusCode, er, worker.CodeLeave)
		}
	}
}

// TestParkedPollHangUp: a worker that dies mid-poll, its poll parked,
// is noticed at once (its poll ends, and the sweep may give it up after
// deadAfter), and a task assigned to it then is not taken as delivered.
func TestParkedPollHangUp(t *testing.T) {
	t.Parallel()
	e, signer, addr, _ := parkingBooks(t, nil)
	w := attachRaw(t, e, signer, func() (net.Conn, error) { return net.Dial("tcp", addr) }, "hpc-hangup-1")
	w.send(t, "/v1/work")
	waitFor(t, "the poll parked", func() bool { return e.parker.parked() == 1 })
	w.conn.Close()
	start := time.Now()
	waitFor(t, "the poll to end after the hang-up", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.workers[w.name].polling == 0
	})
	t.Logf("poll ended %s after the hang-up (poll period %s)", time.Since(start).Round(time.Millisecond), e.PollWait)
	if err := e.Assign(w.name, Task{ID: "t-dead"}); err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	delivered := e.workers[w.name].delivered
	e.mu.Unlock()
	if delivered {
		t.Error("a task assigned after the hang-up counts as delivered")
	}
	if n := e.parker.parked(); n != 0 {
		t.Errorf("%d polls still parked", n)
	}
}

// TestParkedPollTLS: over TLS the parked poll's connection goes back to
// the server still encrypted, and carries the next request.
func TestParkedPollTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	testutil.SelfSigned(t, dir)
	os.WriteFile(filepath.Join(dir, "engine.hcl"), []byte("engine {\n  tls_cert = \"engine.crt\"\n  tls_key = \"engine.key\"\n}\n"), 0o644)
	cfg, diags := LoadConfig(filepath.Join(dir, "engine.hcl"))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	e, signer, addr, _ := parkingBooks(t, cfg.Engine.ServerTLS())
	var proto string
	dial := func() (net.Conn, error) {
		c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2", "http/1.1"}})
		if err == nil {
			proto = c.ConnectionState().NegotiatedProtocol
		}
		return c, err
	}
	w := attachRaw(t, e, signer, dial, "hpc-tls-1")
	if proto != "http/1.1" {
		t.Errorf("ALPN chose %q; want http/1.1", proto)
	}
	w.send(t, "/v1/work")
	waitFor(t, "the poll parked", func() bool { return e.parker.parked() == 1 })
	if err := e.Assign(w.name, Task{ID: "t-tls"}); err != nil {
		t.Fatal(err)
	}
	if resp := w.read(t, "the parked poll"); resp.StatusCode != http.StatusOK {
		t.Fatalf("parked poll over TLS: %d", resp.StatusCode)
	}
	w.send(t, "/v1/watch")
	waitFor(t, "the watch parked", func() bool { return e.parker.parked() == 1 })
	e.Close()
	resp := w.read(t, "the parked watch at Close")
	if resp.StatusCode != http.StatusServiceUnavailable || !resp.Close {
		t.Fatalf("parked watch at Close: %d, close %v; want 503 and the connection closed", resp.StatusCode, resp.Close)
	}
}

// TestParkedPollPipelined: a client that sent its next request behind a
// parked poll (pipelining) has those bytes in the server's buffer, which
// a connection given back would lose; the poll is answered with
// "Connection: close" and the connection closed, so the client sends the
// request again on a new one, as HTTP/1.1 has it do.
func TestParkedPollPipelined(t *testing.T) {
	t.Parallel()
	e, signer, addr, _ := parkingBooks(t, nil)
	w := attachRaw(t, e, signer, func() (net.Conn, error) { return net.Dial("tcp", addr) }, "hpc-pipe-1")
	var two bytes.Buffer
	for range 2 {
		fmt.Fprintf(&two, "GET /v1/work?wait=0.2 HTTP/1.1\r\nHost: engine\r\nAuthorization: Bearer %s\r\n%s: %s\r\n\r\n", w.token, sessionHeader, w.session)
	}
	if _, err := w.conn.Write(two.Bytes()); err != nil {
		t.Fatal(err)
	}
	resp := w.read(t, "the first of two pipelined polls")
	if resp.StatusCode != http.StatusNoContent || !resp.Close {
		t.Fatalf("first poll: %d, Connection: %q; want 204 and close", resp.StatusCode, resp.Header.Get("Connection"))
	}
	w.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if b, err := w.r.ReadByte(); err != io.EOF {
		t.Errorf("after the answer the connection gave %q, %v; want it closed (EOF)", b, err)
	}
}
