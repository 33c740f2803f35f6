package park

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// assumption is what parking takes of net/http without any API
// promising it; the canary's failures name it.
const assumption = "net/http serves a hijacked connection handed back through its Listener's Accept as a new connection: " +
	"ConnContext and ConnState(StateNew) run for it again, and the server reads first what the connection's Read returns " +
	"(the bytes it had buffered past the hijacked request)"

// canaryListener is the least a listener must be to hand connections
// back to net/http: Accept returns the connections the inner listener
// accepts and those handed back, through one channel.
type canaryListener struct {
	net.Listener
	conns chan net.Conn
	done  chan struct{}
}

func newCanaryListener(inner net.Listener) *canaryListener {
	l := &canaryListener{Listener: inner, conns: make(chan net.Conn), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for {
			c, err := inner.Accept()
			if err != nil {
				return
			}
			l.conns <- c
		}
	}()
	return l
}

func (l *canaryListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// replayConn reads pending before what its connection has yet to give.
type replayConn struct {
	net.Conn
	pending []byte
}

func (c *replayConn) Read(b []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(b, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}

// TestReacceptedConnServedAsNew is the canary for the one behaviour of
// net/http that parking relies on and no API promises (assumption). A
// client sends two requests in one write; the first's handler hijacks
// the connection, takes the second's bytes from the server's buffer,
// answers by hand, and hands the connection back through the listener.
// The server must then answer the second request from those bytes, and
// a third on the same connection, having run ConnContext and
// ConnState(StateNew) for it a second time. If a Go release changes
// this, parking breaks: this test says so first.
func TestReacceptedConnServedAsNew(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := newCanaryListener(inner)
	second := "GET /next?n=2 HTTP/1.1\r\nHost: canary\r\n\r\n"

	var mu sync.Mutex
	contexts := 0
	var states []http.ConnState
	srv := &http.Server{
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			mu.Lock()
			defer mu.Unlock()
			contexts++
			return ctx
		},
		ConnState: func(c net.Conn, st http.ConnState) {
			mu.Lock()
			defer mu.Unlock()
			states = append(states, st)
		},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/hijack" {
				fmt.Fprintf(w, "served %s", r.URL.RawQuery)
				return
			}
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Errorf("hijack: %v", err)
				return
			}
			// The second request is in the server's buffer (Peek reads
			// it there if it had not arrived with the first).
			if _, err := brw.Reader.Peek(len(second)); err != nil {
				t.Errorf("the pipelined request: %v", err)
				conn.Close()
				return
			}
			buffered, _ := brw.Reader.Peek(brw.Reader.Buffered())
			io.WriteString(conn, "HTTP/1.1 204 No Content\r\n\r\n")
			ln.conns <- &replayConn{Conn: conn, pending: append([]byte(nil), buffered...)}
		}),
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Close()
		<-served
	})

	c, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	read := func(what string) (int, string) {
		t.Helper()
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: no answer (%v).\nThe assumption broken: %s.\nParking (engine/internal/park) depends on it: turn it off (park_polls = false, engine.Config.HoldPolls) until the parker is fixed.", what, err, assumption)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(body)
	}

	if _, err := io.WriteString(c, "GET /hijack HTTP/1.1\r\nHost: canary\r\n\r\n"+second); err != nil {
		t.Fatal(err)
	}
	if code, _ := read("the hijacked request"); code != http.StatusNoContent {
		t.Fatalf("the hijacked request answered %d; want the handler's 204", code)
	}
	if code, body := read("the pipelined request, from the bytes given back"); code != http.StatusOK || body != "served n=2" {
		t.Fatalf("the pipelined request answered %d %q; want 200 %q.\nThe assumption broken: %s.", code, body, "served n=2", assumption)
	}
	if _, err := io.WriteString(c, "GET /next?n=3 HTTP/1.1\r\nHost: canary\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if code, body := read("the next request on the connection given back"); code != http.StatusOK || body != "served n=3" {
		t.Fatalf("the next request answered %d %q; want 200 %q.\nThe assumption broken: %s.", code, body, "served n=3", assumption)
	}

	mu.Lock()
	defer mu.Unlock()
	news := strings.Count(fmt.Sprint(states), http.StateNew.String())
	if contexts != 2 || news != 2 {
		t.Fatalf("for one connection hijacked and handed back, ConnContext ran %d times and ConnState went %v; want ConnContext twice and StateNew twice.\nThe assumption broken: %s.\nThe engine's connection gate (connGate.connContext) keeps a parked connection's entry through it: turn parking off (park_polls = false) until it is fixed.",
			contexts, states, assumption)
	}
}
