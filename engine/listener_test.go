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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluksio/provision/engine/hclconfig"
	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/loglimit"
	"github.com/fluksio/provision/internal/testutil"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

// startListener serves e the way Engine.Serve does (polls parked), with a gate of max
// connections, on a loopback port; it returns the address.
func startListener(t *testing.T, e *books, max int, tlsConfig *tls.Config) (string, *connGate) {
	t.Helper()
	return serveBooks(t, e, max, tlsConfig, true)
}

// serveBooks is startListener with parking on (parkPolls) or off
// (Config.HoldPolls).
func serveBooks(t *testing.T, e *books, max int, tlsConfig *tls.Config, parkPolls bool) (string, *connGate) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gate := newConnGate(max, e.logger, loglimit.New(refusalLogBurst, refusalLogWindow))
	srv := newHTTPServer(booksHandler(e), gate, e.pollWait())
	rl := serverListener(ln, tlsConfig)
	api := apiOf(e)
	if parkPolls {
		api.parker = newParker(gate, rl)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(rl)
	}()
	t.Cleanup(func() {
		e.Close()
		srv.Close()
		<-done
		api.parker.Close()
	})
	return ln.Addr().String(), gate
}

// establishedTo counts the server side of established TCP connections on
// port, as the kernel lists them in /proc/net/tcp: what the engine
// process really holds, not what the gate believes.
func establishedTo(t *testing.T, port int) int {
	t.Helper()
	data, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(":%04X", port)
	n := 0
	for _, line := range strings.Split(string(data), "\n")[1:] {
		f := strings.Fields(line)
		// f[1] is local address:port, f[3] the state; 01 is ESTABLISHED.
		if len(f) > 3 && strings.HasSuffix(f[1], want) && f[3] == "01" {
			n++
		}
	}
	return n
}

// TestListenerRefusesBeforeReadingTheBody: a POST without a credential
// that announces a body and never sends it gets its 401 at once and loses
// its connection. Before, the server waited for the body to drain it and
// held the connection until the client gave up (75 s and more).
func TestListenerRefusesBeforeReadingTheBody(t *testing.T) {
	t.Parallel()
	e := newBareBooks(nil, host.NewSigner(testSecret), nil)
	addr, _ := startListener(t, e, 0, nil)

	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/attach HTTP/1.1\r\nHost: engine\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
	start := time.Now()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer within 5 s to a request whose body never comes: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("status %d; want 401", resp.StatusCode)
	}
	// The server closes its end: the next read sees EOF, not a timeout.
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("connection still open after the 401: read gave %v; want EOF", err)
	}
	t.Logf("401 and close after %s", time.Since(start).Round(time.Millisecond))
}

// TestListenerServerTimeouts: every timeout of the engine's http.Server is
// set, and the write timeout leaves room for the long poll.
func TestListenerServerTimeouts(t *testing.T) {
	t.Parallel()
	srv := newHTTPServer(http.NotFoundHandler(), nil, defaultPollWait)
	for name, d := range map[string]time.Duration{
		"ReadHeaderTimeout": srv.ReadHeaderTimeout, "ReadTimeout": srv.ReadTimeout,
		"WriteTimeout": srv.WriteTimeout, "IdleTimeout": srv.IdleTimeout,
	} {
		if d <= 0 {
			t.Errorf("%s is not set", name)
		}
	}
	if srv.WriteTimeout <= defaultPollWait {
		t.Errorf("WriteTimeout %s would cut a %s long poll short", srv.WriteTimeout, defaultPollWait)
	}
	if srv.MaxHeaderBytes <= 0 || srv.MaxHeaderBytes > 64<<10 {
		t.Errorf("MaxHeaderBytes %d", srv.MaxHeaderBytes)
	}
}

// TestListenerSlowHeadersCutOff: a client that sends half a request line
// and stops loses its connection after ReadHeaderTimeout.
func TestListenerSlowHeadersCutOff(t *testing.T) {
	t.Parallel()
	srv := newHTTPServer(http.NotFoundHandler(), nil, time.Second)
	srv.ReadHeaderTimeout = 300 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, "GET /status HT")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(c); err != nil {
		t.Errorf("the server held a half-sent request for 5 s: %v", err)
	}
}

// TestListenerConnectionCap: 300 connections that never send a byte do
// not take the engine's sockets: it holds at most max_connections, and a
// worker with a credential still attaches; once attached, its connection
// survives the next flood.
func TestListenerConnectionCap(t *testing.T) {
	t.Parallel()
	logger, logs := testLogger(t)
	signer := host.NewSigner(testSecret)
	e := newBareBooks(logger, signer, nil)
	e.PollWait = 200 * time.Millisecond
	const max = 40
	addr, gate := startListener(t, e, max, nil)
	port := testutil.PortOf(t, addr)

	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	flood := func(n int) {
		for range n {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			idle = append(idle, c)
		}
	}
	flood(300)
	// The kernel completes handshakes before the engine accepts them, so
	// the count settles as the engine works through its accept queue.
	settle := func(what string) {
		t.Helper()
		// Well within readHeaderTimeout, which would close idle
		// connections without any cap.
		deadline := time.Now().Add(readHeaderTimeout / 3)
		for establishedTo(t, port) > max {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the engine holds %d connections; want at most %d", what, establishedTo(t, port), max)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	settle("after 300 idle connections")
	open, _, dropped := gate.counts()
	t.Logf("after 300 idle connections the engine holds %d (cap %d), dropped %d", establishedTo(t, port), max, dropped)
	if open > max {
		t.Errorf("the gate counts %d open", open)
	}

	// A worker gets in all the same, and keeps its connection.
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	token := sign(t, signer, "hpc-cpu-1", time.Hour)
	provisioned(e, "hpc-cpu-1", "77")
	var session string
	req := func(method, path, body string) int {
		r, _ := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer "+token)
		if session != "" {
			r.Header.Set(sessionHeader, session)
		}
		resp, err := client.Do(r)
		if err != nil {
			t.Fatalf("%s %s during the flood: %v", method, path, err)
		}
		defer resp.Body.Close()
		if path == "/v1/attach" && resp.StatusCode == http.StatusOK {
			var a worker.AttachResponse
			json.NewDecoder(resp.Body).Decode(&a)
			session = a.Session
		}
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	if code := req("POST", "/v1/attach", attachBody); code != http.StatusOK {
		t.Fatalf("attach: %d", code)
	}
	flood(300)
	if code := req("GET", "/v1/work?wait=0", ""); code != http.StatusNoContent && code != http.StatusOK {
		t.Errorf("the attached worker's poll after the second flood: %d", code)
	}
	settle("after 300 more")
	if n := strings.Count(logs.String(), "connection limit reached"); n > refusalLogBurst {
		t.Errorf("%d log lines about the connection limit; want at most %d", n, refusalLogBurst)
	}
}

// TestListenerRefusalsLoggedAtABoundedRate: 500 refused requests make
// at most a burst of log lines, and the next logged line counts the rest.
func TestListenerRefusalsLoggedAtABoundedRate(t *testing.T) {
	t.Parallel()
	e, srv, _, logs := serveEngine(t, time.Second)
	_ = e
	client := srv.Client()
	for range 500 {
		r, _ := http.NewRequest("GET", srv.URL+"/v1/work", nil)
		r.Header.Set("Authorization", "Bearer not-a-token")
		resp, err := client.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	if n := strings.Count(logs.String(), "refused a worker"); n > refusalLogBurst {
		t.Errorf("500 refusals made %d log lines; want at most %d", n, refusalLogBurst)
	}
}

// TestStatusFetchedOnceAndBounded: sixteen concurrent GET /status cost one
// call to the plugins, and a plugin reporting 200,000 outstanding jobs is
// listed with maxStatusOutstanding of them and the total.
func TestStatusFetchedOnceAndBounded(t *testing.T) {
	t.Parallel()
	e, srv, _, _ := serveEngine(t, time.Second)
	var calls atomic.Int32
	release := make(chan struct{})
	big := make([]shared.Outstanding, 200000)
	for i := range big {
		big[i] = shared.Outstanding{Profile: "cpu", Job: strconv.Itoa(i), Worker: "hpc-cpu-" + strconv.Itoa(i), State: "PENDING"}
	}
	statusOf(e).provisioners = func(context.Context) []host.ProvisionerStatus {
		calls.Add(1)
		<-release
		return []host.ProvisionerStatus{{Name: "hpc", Kind: "slurm", Process: "running",
			Status: &shared.StatusResponse{Name: "hpc", Kind: "slurm", Outstanding: big}}}
	}
	var wg sync.WaitGroup
	sizes := make([]int, 16)
	for i := range sizes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := srv.Client().Get(srv.URL + "/status")
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			var got struct {
				Provisioners []struct {
					Total  int `json:"outstanding_total"`
					Status struct {
						Outstanding []json.RawMessage `json:"outstanding"`
					} `json:"status"`
				} `json:"provisioners"`
			}
			data, _ := io.ReadAll(resp.Body)
			sizes[i] = len(data)
			if err := json.Unmarshal(data, &got); err != nil || len(got.Provisioners) != 1 {
				t.Errorf("status: %v %.200s", err, data)
				return
			}
			p := got.Provisioners[0]
			if p.Total != 200000 || len(p.Status.Outstanding) != maxStatusOutstanding {
				t.Errorf("outstanding_total %d, listed %d; want 200000, %d", p.Total, len(p.Status.Outstanding), maxStatusOutstanding)
			}
		}()
	}
	waitFor(t, "a status fetch to start", func() bool { return calls.Load() >= 1 })
	close(release)
	wg.Wait()
	if n := calls.Load(); n != 1 {
		t.Errorf("16 concurrent GET /status called the plugins %d times; want 1", n)
	}
	t.Logf("each answer %d bytes", sizes[0])
}

// TestWorkerVerifiesTheEngine: an engine configured with tls_cert and
// tls_key serves TLS; a worker attaches when it trusts the engine's CA or
// pins its certificate, and refuses at once (not after minutes of
// retries) when it does not.
func TestWorkerVerifiesTheEngine(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile, sum := testutil.SelfSigned(t, dir)
	cfgFile := filepath.Join(dir, "engine.hcl")
	os.WriteFile(cfgFile, []byte(`engine {
  tls_cert = "engine.crt"
  tls_key  = "engine.key"
}
`), 0o644)
	cfg, diags := LoadConfig(cfgFile)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	_ = keyFile
	signer := host.NewSigner(testSecret)
	e := newBareBooks(nil, signer, nil)
	addr, _ := startListener(t, e, 0, cfg.Engine.ServerTLS())
	url := "https://" + addr

	isAttached := func(name string) bool {
		for _, w := range e.attached() {
			if w == name {
				return true
			}
		}
		return false
	}
	// check runs a worker until it attaches (then stops it) or exits.
	check := func(name string, wantAttach bool, wantMsg string, extra ...string) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		env := envMap(map[string]string{shared.WorkerTokenEnv: sign(t, signer, name, time.Hour), "SLURM_JOB_ID": "5"})
		provisioned(e, name, "5")
		out := &lockedBuffer{}
		exited := make(chan int, 1)
		go func() {
			exited <- worker.Run(ctx, append([]string{"--url", url, "--cpus", "1", "--max-idle", "600"}, extra...), env, io.Discard, out)
		}()
		deadline := time.Now().Add(20 * time.Second)
		for {
			select {
			case code := <-exited:
				if wantAttach || code == 0 || !strings.Contains(out.String(), wantMsg) {
					t.Errorf("%s: exit %d before attaching, output:\n%s\nwant attach %v, failure mentioning %q", name, code, out, wantAttach, wantMsg)
				}
				return
			default:
			}
			if isAttached(name) {
				if !wantAttach {
					t.Errorf("%s attached; want refused", name)
				}
				cancel()
				<-exited
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s neither attached nor gave up in 20 s:\n%s", name, out)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	check("hpc-ca-1", true, "", "--engine-ca", certFile)
	check("hpc-pin-1", true, "", "--engine-cert-sha256", sum)
	check("hpc-none-1", false, "certificate signed by unknown authority")
	check("hpc-badpin-1", false, "does not match --engine-cert-sha256", "--engine-cert-sha256", strings.Repeat("ab", 32))
}

// TestEngineTLSConfigErrors: half a TLS setting, a missing file and a
// certificate that is not one are refused at load, at the attribute.
func TestEngineTLSConfigErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	testutil.SelfSigned(t, dir)
	os.WriteFile(filepath.Join(dir, "junk.crt"), []byte("not a certificate"), 0o644)
	tests := []struct{ body, summary, at string }{
		{"engine {\n  tls_cert = \"engine.crt\"\n}\n", "Incomplete TLS settings", ":2:14"},
		{"engine {\n  tls_cert = \"engine.crt\"\n  tls_key = \"nope.key\"\n}\n", "Cannot read tls_key", ":3:13"},
		{"engine {\n  tls_cert = \"junk.crt\"\n  tls_key = \"engine.key\"\n}\n", "Cannot load the TLS certificate", ":2:14"},
		{"engine {\n  max_connections = -1\n}\n", "Invalid max_connections", ":2:21"},
	}
	for i, tc := range tests {
		f := filepath.Join(dir, fmt.Sprintf("c%d.hcl", i))
		os.WriteFile(f, []byte(tc.body), 0o644)
		_, diags := LoadConfig(f)
		var b strings.Builder
		hclconfig.WriteDiagnostics(&b, nil, diags)
		if !diags.HasErrors() || diags[0].Summary != tc.summary || diags[0].Subject == nil ||
			fmt.Sprintf(":%d:%d", diags[0].Subject.Start.Line, diags[0].Subject.Start.Column) != tc.at {
			t.Errorf("%q:\n%s\nwant %q at %s", tc.body, b.String(), tc.summary, tc.at)
		}
	}
}

// TestEngineIdentity: the id is the configured one, or derived stably
// from host and path (the same twice, another for another path); the
// epoch follows the secret and nothing else; a bad id is refused at its
// line.
func TestEngineIdentity(t *testing.T) {
	t.Parallel()
	if id := host.EngineIdentity("prod", "/etc/a.hcl"); id != "prod" {
		t.Errorf("configured id: %q", id)
	}
	a, b, c := host.EngineIdentity("", "/etc/a.hcl"), host.EngineIdentity("", "/etc/a.hcl"), host.EngineIdentity("", "/etc/b.hcl")
	if a != b || a == c || !host.ValidConfigName(a) || len(a) > host.MaxEngineIDLen {
		t.Errorf("derived ids %q %q %q", a, b, c)
	}
	s1, s2 := []byte(strings.Repeat("a", 32)), []byte(strings.Repeat("b", 32))
	e1, e1again, e2 := host.CredentialEpoch(s1), host.CredentialEpoch(bytes.Clone(s1)), host.CredentialEpoch(s2)
	if e1 != e1again || e1 == e2 || !shared.ValidName(e1) {
		t.Errorf("epochs %q %q %q: the epoch must follow the secret and nothing else", e1, e1again, e2)
	}
	dir := t.TempDir()
	f := filepath.Join(dir, "e.hcl")
	os.WriteFile(f, []byte("engine {\n  id = \"prod:eu\"\n}\n"), 0o644)
	_, diags := LoadConfig(f)
	if !diags.HasErrors() || diags[0].Summary != "Invalid engine id" || diags[0].Subject.Start.Line != 2 || diags[0].Subject.Start.Column != 8 {
		t.Errorf("diags: %v", diags)
	}
}

// TestRevokedCredentialsHoldNoRoom: the attack of issue 38, item 2. 40
// connections poll with a credential that checks out (signature, expiry)
// but may not act for a worker: a detached worker's, a failed job's, an
// expired one, one whose worker never attached, a live worker's without
// its session or with another, an attach as a worker attached already.
// Each is answered at once (401, 409 or 403 as docs/worker-protocol.md
// says) and its connection closed by the engine, so none holds a
// worker's room: against max_connections = 40 a real worker attaches on
// its first try afterwards. An attach with a credential that checks out
// and a bad body (400) keeps its connection, as a stranger's: the
// strangers' share holds at most a quarter, the real worker's connection
// takes the place of the one idle longest, and it attaches all the same. Before, a connection
// counted as a worker's once its credential's signature and expiry
// checked out, the 40 held every place, and the worker's attach was
// reset until they left.
func TestRevokedCredentialsHoldNoRoom(t *testing.T) {
	t.Parallel()
	signer := host.NewSigner(testSecret)
	// The engine's clock runs ahead while the expired kind is tried.
	var ahead atomic.Int64
	e := newBareBooks(nil, signer, func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) })
	e.PollWait = time.Minute
	const max = 40
	addr, gate := startListener(t, e, max, nil)
	dial := func() (net.Conn, error) { return net.Dial("tcp", addr) }

	// A worker that attached and detached: its credential is revoked.
	gone := attachRaw(t, e, signer, dial, "hpc-gone-1")
	fmt.Fprintf(gone.conn, "POST /v1/detach HTTP/1.1\r\nHost: engine\r\nAuthorization: Bearer %s\r\n%s: %s\r\nContent-Length: 0\r\n\r\n", gone.token, sessionHeader, gone.session)
	if resp := gone.read(t, "detach"); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("detach: %d", resp.StatusCode)
	}
	// A job that failed: its credential was never used, and is revoked.
	failed := sign(t, signer, "hpc-failed-1", time.Hour)
	provisioned(e, "hpc-failed-1", "78")
	e.ObserveEvent(shared.Event{Kind: shared.EventWorkerProvisionFailed, Provisioner: testProvisioner, Worker: "hpc-failed-1", Job: "78"})
	// A job that was recorded but whose worker never attached.
	pending := sign(t, signer, "hpc-pending-1", time.Hour)
	provisioned(e, "hpc-pending-1", "79")
	// A live worker, whose credential a sibling copied.
	live := attachRaw(t, e, signer, dial, "hpc-live-1")

	kinds := []struct {
		name, token, session string
		// attach, if not empty, is the body of a POST /v1/attach sent
		// instead of a poll.
		attach  string
		want    int
		expired bool
		// kept: the engine answers and keeps the connection, a
		// stranger's.
		kept bool
	}{
		{name: "detached", token: gone.token, session: gone.session, want: http.StatusUnauthorized},
		{name: "failed job", token: failed, want: http.StatusUnauthorized},
		{name: "expired", token: sign(t, signer, "hpc-old-1", time.Hour), want: http.StatusUnauthorized, expired: true},
		{name: "never attached", token: pending, want: http.StatusConflict},
		{name: "no session", token: live.token, want: http.StatusUnauthorized},
		{name: "another session", token: live.token, session: strings.Repeat("x", 43), want: http.StatusForbidden},
		{name: "attach of an attached worker", token: live.token, attach: attachBody, want: http.StatusConflict},
		{name: "attach with a bad body", token: pending, attach: "{}", want: http.StatusBadRequest, kept: true},
	}
	for i, k := range kinds {
		if k.expired {
			ahead.Store(int64(2 * time.Hour))
		}
		hostile := make([]net.Conn, 0, max)
		for n := range max {
			c, err := dial()
			if err != nil {
				t.Fatal(err)
			}
			hostile = append(hostile, c)
			session := ""
			if k.session != "" {
				session = sessionHeader + ": " + k.session + "\r\n"
			}
			if k.attach != "" {
				fmt.Fprintf(c, "POST /v1/attach HTTP/1.1\r\nHost: engine\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s", k.token, len(k.attach), k.attach)
			} else {
				fmt.Fprintf(c, "GET /v1/work HTTP/1.1\r\nHost: engine\r\nAuthorization: Bearer %s\r\n%s\r\n", k.token, session)
			}
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("%s: connection %d: no answer within 5 s: %v", k.name, n, err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != k.want {
				t.Fatalf("%s: connection %d answered %d; want %d", k.name, n, resp.StatusCode, k.want)
			}
			if k.kept {
				continue
			}
			// The engine closed it: the next read is EOF, not a timeout.
			if b, err := br.ReadByte(); err != io.EOF {
				t.Fatalf("%s: connection %d still open after its %d: read gave %q, %v; want EOF", k.name, n, k.want, b, err)
			}
		}
		ahead.Store(0)
		// The 40 are still open on the client's side; the real worker
		// attaches on a connection of its own, on its first try (attachRaw
		// fails the test on anything but 200 within its deadline), and
		// its poll is served.
		w := attachRaw(t, e, signer, dial, fmt.Sprintf("hpc-real-%d", i))
		w.send(t, "/v1/work?wait=0")
		if resp := w.read(t, "the real worker's poll"); resp.StatusCode != http.StatusNoContent {
			t.Fatalf("%s: the real worker's poll: %d; want 204", k.name, resp.StatusCode)
		}
		open, guests, dropped := gate.counts()
		t.Logf("%s: 40 connections answered %d (closed: %v); the real worker attached; gate: %d open, %d without a worker, %d dropped", k.name, k.want, !k.kept, open, guests, dropped)
		for _, c := range hostile {
			c.Close()
		}
	}
	// The live worker was not disturbed by its copied credential.
	live.send(t, "/v1/work?wait=0")
	if resp := live.read(t, "the live worker's poll"); resp.StatusCode != http.StatusNoContent {
		t.Errorf("the live worker's poll after the siblings: %d; want 204", resp.StatusCode)
	}
}
