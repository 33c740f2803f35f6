package main

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/sandboxtest"
)

// TestE2EOperatorAccess runs the engine with an operator token and a
// fixed signing secret, and asks its operator endpoints from loopback:
// with nothing (allowed: this machine), with the operator's token
// (allowed), and with a worker credential the engine's own secret signed
// (refused, 403, on every one of them). /health and /ready answer anyone;
// /metrics is the operator's unless open_metrics is set. Neither the
// token nor the secret reaches the plugin's environment. A request from
// beyond loopback is TestOperatorAccess's: this test talks to loopback
// alone.
func TestE2EOperatorAccess(t *testing.T) {
	e := newE2E(t, "e2e-operator")
	e.killPluginsAtEnd(t)
	cfg := e.config(t, e.host, "worker")
	secret := strings.Repeat("s3cr3t-", 6)
	withSecretEnv(t, cfg, "FLUKSIO_TEST_OP_SECRET", secret)
	const token = "operator-token-for-the-e2e-test"
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b = bytes.Replace(b, []byte("engine {\n"), []byte("engine {\n  operator_token_env = \"FLUKSIO_TEST_OP_TOKEN\"\n"), 1)
	if err := os.WriteFile(cfg, b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("FLUKSIO_TEST_OP_TOKEN", token)

	p := e.startEngine(t, "-config", cfg)
	base := fmt.Sprintf("http://127.0.0.1:%d", e.port)
	poll(t, 60*time.Second, "the provisioner to be ready", func() bool {
		if p.exited() {
			t.Fatalf("the engine exited early\nstdout:\n%s\nstderr:\n%s", p.stdout, p.stderr)
		}
		resp, err := http.Get(base + "/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	worker, _, err := host.NewSigner([]byte(secret)).Sign(claims(e.name+"-cpu-0badc0de"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	get := func(path, authz string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if authz != "" {
			req.Header.Set("Authorization", authz)
		}
		// The event stream never ends by itself: the status line and
		// headers are all the test reads.
		client := &http.Client{Timeout: 10 * time.Second}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body []byte
		if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			body, _ = io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		}
		return resp.StatusCode, string(body)
	}
	for _, path := range []string{"/status", "/v1/events", "/", "/app.js", "/metrics"} {
		if code, body := get(path, ""); code != 200 {
			t.Errorf("GET %s from loopback: %d %s, want 200", path, code, body)
		}
		if code, body := get(path, "Bearer "+token); code != 200 {
			t.Errorf("GET %s with the operator's token: %d %s, want 200", path, code, body)
		}
		if code, body := get(path, "Bearer "+worker); code != http.StatusForbidden || !strings.Contains(body, "worker's credential") {
			t.Errorf("GET %s with a worker's credential: %d %s, want 403", path, code, body)
		}
	}
	for _, path := range []string{"/health", "/ready"} {
		if code, body := get(path, "Bearer "+worker); code != 200 {
			t.Errorf("GET %s: %d %s, want 200 for anyone", path, code, body)
		}
	}
	procs := e.markedProcs(t)
	if len(procs) == 0 {
		t.Errorf("no plugin process found; the environment check below proves nothing")
	}
	for pid, environ := range procs {
		if bytes.Contains(environ, []byte(token)) || bytes.Contains(environ, []byte(secret)) {
			t.Errorf("process %d (a plugin, or what it started) has the operator token or the secret in its environment", pid)
		}
	}
	if strings.Contains(p.stderr.String(), token) || strings.Contains(p.stderr.String(), worker) {
		t.Errorf("the log has the operator token or the worker's credential")
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 90*time.Second); code != 0 {
		t.Errorf("exit %d after SIGTERM with no needs", code)
	}
	e.assertCleanedUp(t, time.Now())
}

// TestE2EOperatorNotThroughRelay runs the engine on TCP loopback with
// the provisioner in relay mode: a worker's connection reaches the engine
// from the plugin, on loopback. A request without a credential through
// the relay's port on the login node (what anyone on the cluster's
// network can reach) must not see the operator's endpoints, while the
// same request made on this machine does.
func TestE2EOperatorNotThroughRelay(t *testing.T) {
	sandboxtest.RelayCache(t)
	e := newE2E(t, "e2e-op-relay")
	e.killPluginsAtEnd(t)
	cfg := e.config(t, e.host, "worker")
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(string(b), fmt.Sprintf(`engine_url     = "http://127.0.0.1:%d"`, e.port), `reach          = "relay"
  relay_host     = "127.0.0.1"`, 1)
	if !strings.Contains(s, "reach") {
		t.Fatalf("could not rewrite the configuration:\n%s", s)
	}
	if err := os.WriteFile(cfg, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	p := e.startEngine(t, "-config", cfg)
	dialRe := regexp.MustCompile(`the relay is up: .*workers_dial=(\S+)`)
	var relayAddr string
	poll(t, 60*time.Second, "the relay to be up", func() bool {
		if p.exited() {
			t.Fatalf("the engine exited early\nstdout:\n%s\nstderr:\n%s", p.stdout, p.stderr)
		}
		if m := dialRe.FindStringSubmatch(p.stderr.String()); m != nil {
			relayAddr = m[1]
		}
		return relayAddr != ""
	})
	// The relay speaks TLS with a certificate of its own, which workers
	// pin; this client is nobody's worker and takes any.
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for _, path := range []string{"/status", "/v1/events", "/", "/metrics"} {
		resp, err := client.Get("https://" + relayAddr + path)
		if err != nil {
			t.Fatalf("GET %s through the relay: %v", path, err)
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("GET %s through the relay (%s): %s %s, want 403", path, relayAddr, resp.Status, body)
		}
	}
	resp, err := client.Get("https://" + relayAddr + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /health through the relay: %s; the relay itself is not carrying requests, so the 403s above prove nothing", resp.Status)
	}
	resp, err = client.Get(fmt.Sprintf("http://127.0.0.1:%d/status", e.port))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /status on this machine: %s, want 200", resp.Status)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.wait(t, 90*time.Second)
	e.assertCleanedUp(t, time.Now())
}
