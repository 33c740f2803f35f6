package engine

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
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
func attachRaw(t *testing.T, e *books, signer *host.Signer, dial func() (net.Conn, error), name string) *rawWorker {
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

// parked is how many of e's polls are parked now.
func parked(e *books) int { return apiOf(e).parker.Parked() }

// parkingBooks serves books whose polls last a minute, as Engine.Serve
// does (startListener), and fails the test where polls cannot be parked.
func parkingBooks(t *testing.T, tlsConfig *tls.Config) (*books, *host.Signer, string, *connGate) {
	t.Helper()
	signer := host.NewSigner(testSecret)
	e := newBareBooks(nil, signer, nil)
	e.PollWait = time.Minute
	addr, gate := startListener(t, e, 0, tlsConfig)
	if apiOf(e).parker == nil {
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
	// Under -race beside the other packages' tests, 100 connections
	// take more than waitFor's 10 s to park: up to 45 s, within the
	// polls' minute.
	waitForLong(t, 45*time.Second, "99 polls and a watch parked, none held by a server goroutine of its connection", func() bool {
		e.mu.Lock()
		polling := 0
		for _, ws := range e.workers {
			polling += ws.polling
		}
		e.mu.Unlock()
		return polling == n-1 && parked(e) == n && serveGoroutines() == 0
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
	go e.dismiss(t.Context(), 0)
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
	waitFor(t, "the poll parked", func() bool { return parked(e) == 1 })
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
	delivered := e.workers[w.name].findLocked("t-dead").delivered
	e.mu.Unlock()
	if delivered {
		t.Error("a task assigned after the hang-up counts as delivered")
	}
	if n := parked(e); n != 0 {
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
	waitFor(t, "the poll parked", func() bool { return parked(e) == 1 })
	if err := e.Assign(w.name, Task{ID: "t-tls"}); err != nil {
		t.Fatal(err)
	}
	if resp := w.read(t, "the parked poll"); resp.StatusCode != http.StatusOK {
		t.Fatalf("parked poll over TLS: %d", resp.StatusCode)
	}
	w.send(t, "/v1/watch")
	waitFor(t, "the watch parked", func() bool { return parked(e) == 1 })
	e.Close()
	resp := w.read(t, "the parked watch at Close")
	if resp.StatusCode != http.StatusServiceUnavailable || !resp.Close {
		t.Fatalf("parked watch at Close: %d, close %v; want 503 and the connection closed", resp.StatusCode, resp.Close)
	}
}

// TestParkedAnswerAsNetHTTP: a parked poll's answer is what net/http
// writes for the same answer of the same handler, byte for byte but the
// Date's value, and its connection is kept or closed as net/http keeps
// or closes it: for HTTP/1.1, HTTP/1.1 with Connection: close, HTTP/1.0
// (answered HTTP/1.0 and closed; it was answered HTTP/1.1 and kept),
// HTTP/1.0 with Connection: keep-alive, and two polls pipelined in one
// write (both answered on the connection; the second was lost, and the
// connection closed, before), each for a task (200) and for none (204),
// over TCP and TLS. net/http's side is the same books behind a plain
// http.Server, whose polls are held on their goroutine.
func TestParkedAnswerAsNetHTTP(t *testing.T) {
	t.Parallel()
	rows := []struct {
		name    string
		headers string // the request's own, beside Host and the credential
		proto   string
		// pipelined: a second poll (wait=0) in the same write.
		pipelined bool
	}{
		{name: "HTTP/1.1 keep-alive", proto: "HTTP/1.1"},
		{name: "HTTP/1.1 Connection: close", proto: "HTTP/1.1", headers: "Connection: close\r\n"},
		{name: "HTTP/1.0", proto: "HTTP/1.0"},
		{name: "HTTP/1.0 Connection: keep-alive", proto: "HTTP/1.0", headers: "Connection: keep-alive\r\n"},
		{name: "HTTP/1.1 pipelined", proto: "HTTP/1.1", pipelined: true},
	}
	dates := regexp.MustCompile("\r\nDate: [^\r]*\r\n")
	for _, mode := range []string{"tcp", "tls", "tcp held", "tls held"} {
		transport, how, _ := strings.Cut(mode, " ")
		parkPolls := how == ""
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			var tlsConfig *tls.Config
			if transport == "tls" {
				dir := t.TempDir()
				testutil.SelfSigned(t, dir)
				os.WriteFile(filepath.Join(dir, "engine.hcl"), []byte("engine {\n  tls_cert = \"engine.crt\"\n  tls_key = \"engine.key\"\n}\n"), 0o644)
				cfg, diags := LoadConfig(filepath.Join(dir, "engine.hcl"))
				if diags.HasErrors() {
					t.Fatal(diags)
				}
				tlsConfig = cfg.Engine.ServerTLS()
			}
			dialer := func(addr string) func() (net.Conn, error) {
				return func() (net.Conn, error) {
					if tlsConfig == nil {
						return net.Dial("tcp", addr)
					}
					return tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
				}
			}
			signer := host.NewSigner(testSecret)
			parking := newBareBooks(nil, signer, nil)
			parking.PollWait = time.Minute
			parkingAddr, _ := serveBooks(t, parking, 0, tlsConfig, parkPolls)
			if parkPolls && apiOf(parking).parker == nil {
				t.Fatal("no parker: epoll unavailable")
			}

			held := newBareBooks(nil, signer, nil)
			held.PollWait = time.Minute
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := newHTTPServer(booksHandler(held), nil, held.pollWait())
			served := make(chan struct{})
			go func() {
				defer close(served)
				srv.Serve(serverListener(ln, tlsConfig))
			}()
			t.Cleanup(func() {
				held.Close()
				srv.Close()
				<-served
			})

			// exchange sends row's request(s) as w on e, with path the
			// first poll's, has the answer come (answer), and returns
			// the bytes of the answers and whether the connection then
			// carries another request.
			exchange := func(t *testing.T, e *books, w *rawWorker, req string, n int, answer func()) (string, bool) {
				t.Helper()
				if w.r.Buffered() != 0 {
					t.Fatal("bytes after the attach's answer")
				}
				var raw bytes.Buffer
				br := bufio.NewReader(io.TeeReader(w.conn, &raw))
				if _, err := io.WriteString(w.conn, req); err != nil {
					t.Fatal(err)
				}
				answer()
				w.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
				for i := range n {
					resp, err := http.ReadResponse(br, nil)
					if err != nil {
						t.Fatalf("answer %d: %v", i+1, err)
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				got := raw.String()[:raw.Len()-br.Buffered()]
				// Whether the connection is kept: a request without a
				// credential is answered (401) on a kept one; a closed
				// one reads EOF (or a reset).
				if _, err := io.WriteString(w.conn, "GET /v1/work HTTP/1.1\r\nHost: engine\r\n\r\n"); err != nil {
					return got, false
				}
				_, err := http.ReadResponse(br, nil)
				return got, err == nil
			}

			n := 0
			for _, row := range rows {
				for _, task := range []bool{true, false} {
					what := "204"
					if task {
						what = "200"
					}
					t.Run(row.name+" "+what, func(t *testing.T) {
						n++
						name := fmt.Sprintf("hpc-cmp-%d", n)
						request := func(w *rawWorker, path string) string {
							auth := fmt.Sprintf("Authorization: Bearer %s\r\n%s: %s\r\n", w.token, sessionHeader, w.session)
							req := fmt.Sprintf("GET %s %s\r\nHost: engine\r\n%s%s\r\n", path, row.proto, row.headers, auth)
							if row.pipelined {
								req += fmt.Sprintf("GET /v1/work?wait=0 %s\r\nHost: engine\r\n%s%s\r\n", row.proto, row.headers, auth)
							}
							return req
						}
						responses := 1
						if row.pipelined {
							responses = 2
						}

						// net/http's answer: a task assigned to the held
						// poll, or none at once (wait=0).
						hw := attachRaw(t, held, signer, dialer(ln.Addr().String()), name)
						path := "/v1/work?wait=0"
						if task {
							path = "/v1/work"
						}
						want, wantKept := exchange(t, held, hw, request(hw, path), responses, func() {
							if !task {
								return
							}
							waitFor(t, "the held poll", func() bool {
								held.mu.Lock()
								defer held.mu.Unlock()
								return held.workers[name].polling == 1
							})
							if err := held.Assign(name, Task{ID: "t-" + name}); err != nil {
								t.Fatal(err)
							}
						})

						// The engine's answer: a task assigned to the
						// parked poll, or the poll woken with nothing to
						// say; with parking off, as net/http's side.
						pw := attachRaw(t, parking, signer, dialer(parkingAddr), name)
						path = "/v1/work"
						if !parkPolls && !task {
							path = "/v1/work?wait=0"
						}
						got, gotKept := exchange(t, parking, pw, request(pw, path), responses, func() {
							if !parkPolls && !task {
								return
							}
							waitFor(t, "the poll open", func() bool {
								parking.mu.Lock()
								defer parking.mu.Unlock()
								return parking.workers[name].polling == 1 && len(parking.waiting) == 1
							})
							if parkPolls && parked(parking) != 1 {
								t.Fatalf("%d polls parked; want 1", parked(parking))
							}
							if task {
								if err := parking.Assign(name, Task{ID: "t-" + name}); err != nil {
									t.Fatal(err)
								}
								return
							}
							parking.mu.Lock()
							for lp := range parking.waiting {
								lp.fire()
							}
							parking.mu.Unlock()
						})

						want = dates.ReplaceAllString(want, "\r\nDate: (date)\r\n")
						got = dates.ReplaceAllString(got, "\r\nDate: (date)\r\n")
						if got != want || gotKept != wantKept {
							t.Errorf("parked answer (connection kept: %v):\n%q\nnet/http's (kept: %v):\n%q", gotKept, got, wantKept, want)
						}
					})
				}
			}
		})
	}
}

// TestHoldPollsSwitch: an engine parks its workers' polls unless
// Config.HoldPolls (park_polls = false) says to hold them; either way a
// task assigned reaches the waiting poll on its connection.
func TestHoldPollsSwitch(t *testing.T) {
	t.Parallel()
	for _, hold := range []bool{false, true} {
		t.Run(fmt.Sprintf("HoldPolls=%v", hold), func(t *testing.T) {
			t.Parallel()
			e, err := New(Config{Secret: testSecret, ID: "test", Listen: "127.0.0.1:0", HoldPolls: hold})
			if err != nil {
				t.Fatal(err)
			}
			e.books.PollWait = time.Minute
			if err := e.Serve(e.Mux(nil, false)); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Stop(context.Background()) })
			if parking := e.api.parker != nil; parking == hold {
				t.Fatalf("HoldPolls %v: parker set %v", hold, parking)
			}
			name := fmt.Sprintf("hpc-switch-%v", hold)
			w := attachRaw(t, e.books, host.NewSigner(testSecret), func() (net.Conn, error) { return net.Dial("tcp", e.Addr()) }, name)
			w.send(t, "/v1/work")
			waitFor(t, "the poll open", func() bool {
				e.books.mu.Lock()
				defer e.books.mu.Unlock()
				return e.books.workers[name].polling == 1 && len(e.books.waiting) == 1
			})
			if !hold && e.api.parker.Parked() != 1 {
				t.Errorf("%d polls parked; want 1", e.api.parker.Parked())
			}
			if err := e.books.Assign(name, Task{ID: "t-switch"}); err != nil {
				t.Fatal(err)
			}
			var task Task
			resp := w.read(t, "the poll after Assign")
			json.NewDecoder(resp.Body).Decode(&task)
			if resp.StatusCode != http.StatusOK || task.ID != "t-switch" {
				t.Fatalf("poll after Assign: %d %+v; want 200 t-switch", resp.StatusCode, task)
			}
			// Detached, the worker does not hold Stop for dismissWait.
			fmt.Fprintf(w.conn, "POST /v1/detach HTTP/1.1\r\nHost: engine\r\nAuthorization: Bearer %s\r\n%s: %s\r\nContent-Length: 0\r\n\r\n", w.token, sessionHeader, w.session)
			if resp := w.read(t, "the detach"); resp.StatusCode != http.StatusNoContent {
				t.Fatalf("detach: %d", resp.StatusCode)
			}
		})
	}
}

// TestDetachedWhileWaiting: a poll whose worker detached while it waited
// answers 409 and closes its connection, parked or held alike.
func TestDetachedWhileWaiting(t *testing.T) {
	t.Parallel()
	for _, parkPolls := range []bool{true, false} {
		t.Run(fmt.Sprintf("parked=%v", parkPolls), func(t *testing.T) {
			t.Parallel()
			signer := host.NewSigner(testSecret)
			e := newBareBooks(nil, signer, nil)
			addr, _ := serveBooks(t, e, 0, nil, parkPolls)
			dial := func() (net.Conn, error) { return net.Dial("tcp", addr) }
			w := attachRaw(t, e, signer, dial, fmt.Sprintf("hpc-detached-%v", parkPolls))
			w.send(t, "/v1/work?wait=0.5")
			waitFor(t, "the poll open", func() bool {
				e.mu.Lock()
				defer e.mu.Unlock()
				return len(e.waiting) == 1
			})
			if parkPolls && parked(e) != 1 {
				t.Fatalf("%d polls parked; want 1", parked(e))
			}
			// The same worker detaches on a connection of its own.
			c, err := dial()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			other := &rawWorker{name: w.name, token: w.token, session: w.session, conn: c, r: bufio.NewReader(c)}
			fmt.Fprintf(c, "POST /v1/detach HTTP/1.1\r\nHost: engine\r\nAuthorization: Bearer %s\r\n%s: %s\r\nContent-Length: 0\r\n\r\n", w.token, sessionHeader, w.session)
			if resp := other.read(t, "the detach"); resp.StatusCode != http.StatusNoContent {
				t.Fatalf("detach: %d", resp.StatusCode)
			}
			resp := w.read(t, "the poll after the detach")
			if resp.StatusCode != http.StatusConflict || !resp.Close {
				t.Fatalf("poll after its worker detached: %d, close %v; want 409 and the connection closed", resp.StatusCode, resp.Close)
			}
		})
	}
}
