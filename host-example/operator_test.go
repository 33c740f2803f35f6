package main

import (
	"encoding/base64"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/shared/host"
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
		_, diags := loadConfig(f)
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

// A loopback connection is told by its owner: this process holds the
// client end of a connection it opened, and init (pid 1) does not.
func TestPeerOwnedBy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server := <-accepted
	if server == nil {
		t.Fatal("no connection accepted")
	}
	defer server.Close()
	remote, local := server.RemoteAddr().String(), server.LocalAddr().String()
	if own, err := peerOwnedBy(remote, local, []int{os.Getpid()}); err != nil || !own {
		t.Errorf("this process's own connection: owned %v, %v", own, err)
	}
	if own, err := peerOwnedBy(remote, local, []int{1}); err != nil || own {
		t.Errorf("pid 1 said to own this process's connection: %v, %v", own, err)
	}
	if _, err := peerOwnedBy("@", local, []int{os.Getpid()}); err == nil {
		t.Errorf("a unix socket's peer was judged")
	}
}
