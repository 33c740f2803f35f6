package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/testutil"
)

// Who may see the operator's endpoints. The remote addresses are set on
// the request: 192.0.2.7 (TEST-NET-1) stands in for a machine beyond
// loopback, which a test that talks to loopback alone cannot be.
func TestOperatorAccess(t *testing.T) {
	signer := host.NewSigner(testSecret)
	worker, _, err := signer.Sign(claims("slurm-cpu-00000001"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	const token = "operator-token-0123456789"
	basic := func(user, pass string) string {
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	}
	logger, logs := testLogger(t)
	for _, c := range []struct {
		what     string
		token    string // the engine's operator token; "" for none
		remote   string
		header   map[string]string
		want     int
		authHint bool // a 401 asks a browser for the token
	}{
		{"loopback, no credential", token, "127.0.0.1:5000", nil, 200, false},
		{"IPv6 loopback, no credential", "", "[::1]:5000", nil, 200, false},
		{"beyond loopback, no credential", token, "192.0.2.7:5000", nil, 401, true},
		{"beyond loopback, no token configured", "", "192.0.2.7:5000", nil, 403, false},
		{"loopback through a proxy, no credential", token, "127.0.0.1:5000", map[string]string{"X-Forwarded-For": "192.0.2.7"}, 401, true},
		{"beyond loopback, operator token as bearer", token, "192.0.2.7:5000", map[string]string{"Authorization": "Bearer " + token}, 200, false},
		{"beyond loopback, operator token as basic password", token, "192.0.2.7:5000", map[string]string{"Authorization": basic("ops", token)}, 200, false},
		{"beyond loopback, wrong token", token, "192.0.2.7:5000", map[string]string{"Authorization": "Bearer " + token + "x"}, 401, true},
		{"beyond loopback, a worker's credential", token, "192.0.2.7:5000", map[string]string{"Authorization": "Bearer " + worker}, 403, false},
		{"loopback, a worker's credential", token, "127.0.0.1:5000", map[string]string{"Authorization": "Bearer " + worker}, 403, false},
		{"loopback, a worker's credential as basic password", token, "127.0.0.1:5000", map[string]string{"Authorization": basic("x", worker)}, 403, false},
		{"loopback, a worker's credential, no token configured", "", "127.0.0.1:5000", map[string]string{"Authorization": "Bearer " + worker}, 403, false},
	} {
		a := newOperatorAuth(c.token, signer, logger)
		// These requests are built, not sent: no socket to look up, so
		// a loopback peer through no proxy is this process's uid.
		// TestOperatorLoopbackUID asks through real sockets.
		a.local = func(r *http.Request) (bool, error) {
			h, _, _ := net.SplitHostPort(r.RemoteAddr)
			return net.ParseIP(h).IsLoopback() && r.Header.Get("X-Forwarded-For") == "", nil
		}
		h := a.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) }))
		for _, path := range []string{"/status", "/v1/events", "/"} {
			r := httptest.NewRequest(http.MethodGet, path, nil)
			r.RemoteAddr = c.remote
			for k, v := range c.header {
				r.Header.Set(k, v)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, r)
			if rec.Code != c.want {
				t.Errorf("%s, GET %s: %d %s, want %d", c.what, path, rec.Code, strings.TrimSpace(rec.Body.String()), c.want)
			}
			if hint := rec.Header().Get("WWW-Authenticate") != ""; hint != c.authHint {
				t.Errorf("%s: WWW-Authenticate %q", c.what, rec.Header().Get("WWW-Authenticate"))
			}
		}
	}
	if strings.Contains(logs.String(), token) || strings.Contains(logs.String(), worker) {
		t.Errorf("a token reached the log:\n%s", logs)
	}
}

// operator_token_env is checked where it stands in the file.
func TestOperatorConfig(t *testing.T) {
	for _, c := range []struct {
		hcl, summary string
		line, col    int
	}{
		{"engine {\n  operator_token_env = \"not a name\"\n}\n", "Invalid operator_token_env", 2, 24},
		{"engine {\n  secret_env = \"S\"\n  operator_token_env = \"S\"\n}\n", "operator_token_env is secret_env", 3, 24},
	} {
		f := filepath.Join(t.TempDir(), "e.hcl")
		if err := os.WriteFile(f, []byte(c.hcl), 0o644); err != nil {
			t.Fatal(err)
		}
		_, diags := engine.LoadConfig(f)
		if !diags.HasErrors() || diags[0].Summary != c.summary || diags[0].Subject.Start.Line != c.line || diags[0].Subject.Start.Column != c.col {
			t.Errorf("%q: %v, want %q at %d:%d", c.hcl, diags, c.summary, c.line, c.col)
		}
	}
	t.Setenv("FLUKSIO_TEST_OP", "short")
	if _, err := operatorToken("FLUKSIO_TEST_OP"); err == nil || !strings.Contains(err.Error(), "at least 16") {
		t.Errorf("a short token: %v", err)
	}
	t.Setenv("FLUKSIO_TEST_OP", "0123456789abcdef0123")
	if tok, err := operatorToken("FLUKSIO_TEST_OP"); err != nil || tok != "0123456789abcdef0123" || os.Getenv("FLUKSIO_TEST_OP") != "" {
		t.Errorf("token %q, %v; the variable is %q after reading", tok, err, os.Getenv("FLUKSIO_TEST_OP"))
	}
}

// serveOperator runs an engine as run does: the workers' endpoints, and
// the operator's /status, event stream and page behind op.wrap, with a
// cap of max connections, on listen; with provisioners, their plugins
// started and the run loop passing, until the test ends.
func serveOperator(t *testing.T, op *operatorAuth, max int, listen string, provisioners []*host.Block, hooks engine.Hooks) *engine.Engine {
	t.Helper()
	logger, _ := testLogger(t)
	e, err := engine.New(engine.Config{Provisioners: provisioners, Secret: testSecret, ID: "test", Listen: listen, MaxConnections: max, Logger: logger, Hooks: hooks})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Stop(context.Background()) })
	mux := e.Mux(op.wrap, false)
	mux.Handle("GET /{$}", op.wrap(pageHandler()))
	if err := e.Serve(mux); err != nil {
		t.Skipf("cannot listen on %s: %v", listen, err)
	}
	if len(provisioners) == 0 {
		return e
	}
	ctx, cancel := context.WithCancel(context.Background())
	if diags := e.Start(ctx); diags.HasErrors() {
		cancel()
		t.Fatal(diags)
	}
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		e.Run(ctx, nil)
	}()
	// Cleanups run last first: the loop ends before Stop.
	t.Cleanup(func() { cancel(); <-ran })
	return e
}

// memoryProvisioner is examples/testplugin as provisioner "slurm", the
// name claims binds: a real plugin that reports each machine it is asked
// for as provisioned (worker_provisioned, with a job), and starts none.
func memoryProvisioner(t *testing.T) []*host.Block {
	t.Helper()
	bin := testutil.BuildTestPlugin(t)
	file := filepath.Join(t.TempDir(), "engine.hcl")
	body := fmt.Sprintf("provisioner \"memory\" \"slurm\" {\n  plugin = %q\n  greeting = \"hi\"\n}\n", bin)
	if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, diags := engine.LoadConfig(file)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	return cfg.Provisioners
}

// attachBody is an attach that claims fits.
const attachBody = `{"hostname":"n01","job_id":"77","cpus":4,"gpus":1,"ram_mb":8000,"labels":["gpu"]}`

// TestOperatorStreamsLeaveWorkersRoom, with the attack's figures: 40
// event streams from loopback against max_connections = 40. Sixteen are
// served and 24 answered 503 at once; two needs are then added, the
// plugin reports a machine for each, and their two workers attach, take
// a task each, report it and detach, while the 16 streams stay open.
func TestOperatorStreamsLeaveWorkersRoom(t *testing.T) {
	t.Parallel()
	logger, logs := testLogger(t)
	signer := host.NewSigner(testSecret)
	op := newOperatorAuth("", signer, logger)
	const max = 40
	provisioned := make(chan shared.Event, 2)
	hooks := engine.Hooks{PluginEvent: func(ev shared.Event) {
		if ev.Kind == shared.EventWorkerProvisioned {
			provisioned <- ev
		}
	}}
	e := serveOperator(t, op, max, "127.0.0.1:0", memoryProvisioner(t), hooks)
	addr := e.Addr()

	type stream struct {
		code int
		took time.Duration
		body io.ReadCloser
	}
	// One after the other, as a loop of curl would: 40 at once mostly
	// meet the strangers' share first (a quarter of the cap), which drops
	// them before they are read.
	streams := make([]stream, 40)
	for i := range streams {
		// Each stream on a connection of its own, as 40 browsers.
		client := &http.Client{Transport: &http.Transport{}}
		start := time.Now()
		resp, err := client.Get("http://" + addr + "/v1/events")
		if err != nil {
			t.Fatalf("event stream %d: %v", i, err)
		}
		streams[i] = stream{code: resp.StatusCode, took: time.Since(start), body: resp.Body}
	}
	served, busy := 0, 0
	for _, s := range streams {
		switch s.code {
		case http.StatusOK:
			served++
			defer s.body.Close()
		case http.StatusServiceUnavailable:
			busy++
			if s.took > time.Second {
				t.Errorf("a 503 took %v", s.took)
			}
			s.body.Close()
		default:
			t.Errorf("an event stream got %d", s.code)
		}
	}
	if served != maxOperatorRequests || busy != 40-maxOperatorRequests {
		t.Errorf("of 40 event streams %d served and %d refused; want %d and %d", served, busy, maxOperatorRequests, 40-maxOperatorRequests)
	}

	// Both workers get in and finish, the 16 streams open all along.
	e.Add(shared.Need{CPUs: 1}, 0)
	e.Add(shared.Need{CPUs: 1}, 0)
	var workers sync.WaitGroup
	for range 2 {
		var ev shared.Event
		select {
		case ev = <-provisioned:
		case <-time.After(30 * time.Second):
			t.Fatal("the plugin reported no machine for a need within 30 s")
		}
		name, job := ev.Worker, ev.Job
		token, _, err := signer.Sign(claims(name), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		workers.Add(1)
		go func() {
			defer workers.Done()
			client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
			var session string
			req := func(method, path, body string) (int, string) {
				r, _ := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
				r.Header.Set("Authorization", "Bearer "+token)
				if session != "" {
					r.Header.Set(worker.SessionHeader, session)
				}
				resp, err := client.Do(r)
				if err != nil {
					t.Errorf("%s: %s %s: %v", name, method, path, err)
					return 0, ""
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, string(b)
			}
			code, body := req("POST", "/v1/attach", strings.Replace(attachBody, `"77"`, `"`+job+`"`, 1))
			if code != http.StatusOK {
				t.Errorf("%s: attach: %d %s", name, code, body)
				return
			}
			var attached struct{ Session string }
			if err := json.Unmarshal([]byte(body), &attached); err != nil || attached.Session == "" {
				t.Errorf("%s: attach answered %q: no session", name, body)
				return
			}
			session = attached.Session
			// The router hands the worker a need's task on its next pass.
			code, body = req("GET", "/v1/work", "")
			var task engine.Task
			if code != http.StatusOK || json.Unmarshal([]byte(body), &task) != nil || task.ID == "" {
				t.Errorf("%s: poll: %d %s", name, code, body)
				return
			}
			result := fmt.Sprintf(`{"task_id":%q,"hostname":"n01","job_id":"%s","cpus":4,"output":"done"}`, task.ID, job)
			if code, body := req("POST", "/v1/result", result); code != http.StatusNoContent {
				t.Errorf("%s: result: %d %s", name, code, body)
			}
			if code, body := req("POST", "/v1/detach", ""); code/100 != 2 {
				t.Errorf("%s: detach: %d %s", name, code, body)
			}
		}()
	}
	workers.Wait()
	for deadline := time.Now().Add(10 * time.Second); !e.Served(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("needs not served after both workers reported: %+v", e.Needs())
		}
	}
	if n := strings.Count(logs.String(), "operator requests at their cap"); n > operatorLogBurst {
		t.Errorf("%d log lines about the operator's cap; want at most %d", n, operatorLogBurst)
	}
}

// peerURLVar tells the test binary, started again as another user, to
// ask this URL and print the status (TestOperatorLoopbackUID).
const peerURLVar = "FLUKSIO_TEST_OPERATOR_PEER_URL"

// TestOperatorLoopbackUID: loopback is the operator's only from the
// engine's own uid or root. The test binary asks /status, the event
// stream and the page as itself (200), then again as uid 65534 (nobody),
// started with syscall.Credential, which gets 403 on IPv4 and IPv6
// loopback and on IPv4 through an IPv6 socket.
func TestOperatorLoopbackUID(t *testing.T) {
	if url := os.Getenv(peerURLVar); url != "" {
		// The other user's side: print each status, one a line.
		client := &http.Client{Timeout: 5 * time.Second}
		for _, path := range []string{"/status", "/v1/events", "/"} {
			resp, err := client.Get(url + path)
			if err != nil {
				fmt.Printf("%s error %v\n", path, err)
				continue
			}
			resp.Body.Close()
			fmt.Printf("%s %d\n", path, resp.StatusCode)
		}
		return
	}
	logger, logs := testLogger(t)
	signer := host.NewSigner(testSecret)
	// ":0" listens on every address, IPv6 and IPv4 at once, so that a
	// client of 127.0.0.1 is found in /proc/net/tcp6 as ::ffff:127.0.0.1.
	for _, listen := range []string{"127.0.0.1:0", "[::1]:0", ":0"} {
		op := newOperatorAuth("", signer, logger)
		addr := serveOperator(t, op, 40, listen, nil, engine.Hooks{}).Addr()
		url := "http://" + addr
		if listen == ":0" {
			url = fmt.Sprintf("http://127.0.0.1:%d", testutil.PortOf(t, addr))
		}
		client := &http.Client{Timeout: 5 * time.Second}
		for _, path := range []string{"/status", "/"} {
			resp, err := client.Get(url + path)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("%s: GET %s as the engine's own uid: %d, want 200", listen, path, resp.StatusCode)
			}
		}
		if os.Getuid() != 0 {
			t.Skip("asking as another uid needs root to start the process")
		}
		out := testutil.RunAsNobody(t, "TestOperatorLoopbackUID", peerURLVar+"="+url)
		for _, path := range []string{"/status", "/v1/events", "/"} {
			if !strings.Contains(out, path+" 403\n") {
				t.Errorf("%s: GET %s as uid 65534: want 403; the other user saw:\n%s", listen, path, out)
			}
		}
	}
	if !strings.Contains(logs.String(), "from uid 65534") {
		t.Errorf("the refusal does not name the uid:\n%s", logs)
	}
}
