package main

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/fluksio/provision/engine"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/loglimit"
)

// The operator's endpoints (GET /status, GET /v1/events and the page at
// /) show job ids, host names, error text and task output, on a listener
// every compute node reaches. So they answer only a request from the
// engine's own user on this machine, through no proxy and not from a
// plugin (engine.LocalUser), or one with the operator's token, as a
// bearer token or a Basic password; never one whose Authorization is a
// worker credential. GET /metrics is an operator endpoint unless
// engine.open_metrics is set; /health and /ready are open. Operators'
// requests have a room of their own: at most maxOperatorRequests in
// progress, the rest answered 503 at once, and while in progress they
// count neither against max_connections nor among strangers
// (engine.MarkOperator).

// operatorAuth decides who may see the operator's endpoints. Its fields
// are fixed after newOperatorAuth.
type operatorAuth struct {
	// tokenSum is the SHA-256 of the operator's token, nil if none is
	// configured. Comparing sums in constant time does not leak the
	// token's length either.
	tokenSum []byte
	signer   *host.Signer
	logger   hclog.Logger
	refusals *loglimit.Limiter
	// plugins lists the plugin processes' ids, whose loopback
	// connections are relayed workers'; nil for none.
	plugins func() []int
	// local tells whether r came from the engine's own user on this
	// machine (engine.LocalUser, with plugins), unless a test that has
	// no socket stands in for it.
	local func(r *http.Request) (bool, error)
	// slots holds one token per operator request in progress.
	slots chan struct{}
	// busyLogs bounds the log lines about operator requests refused for
	// want of a slot.
	busyLogs *loglimit.Limiter
}

// maxOperatorRequests bounds the operator's requests in progress (event
// streams included), apart from the workers' connections.
const maxOperatorRequests = 16

// minOperatorToken: a token is typed or pasted once into a browser; 16
// bytes of it is beyond guessing at the rate the listener allows.
const minOperatorToken = 16

func newOperatorAuth(token string, signer *host.Signer, logger hclog.Logger) *operatorAuth {
	a := &operatorAuth{signer: signer, logger: logger, refusals: loglimit.New(operatorLogBurst, operatorLogWindow),
		slots: make(chan struct{}, maxOperatorRequests), busyLogs: loglimit.New(operatorLogBurst, operatorLogWindow)}
	a.local = func(r *http.Request) (bool, error) { return engine.LocalUser(r, a.plugins) }
	if token != "" {
		sum := sha256.Sum256([]byte(token))
		a.tokenSum = sum[:]
	}
	return a
}

// operatorToken reads the operator's token from the variable name and
// unsets it, so nothing the engine starts inherits it.
func operatorToken(name string) (string, error) {
	if name == "" {
		return "", nil
	}
	v, _ := lookupSecret(name)
	token := strings.TrimSpace(v)
	forgetSecret(name)
	if token == "" {
		return "", fmt.Errorf("engine.operator_token_env names %s, which is not set; export it (at least %d characters) or remove operator_token_env", name, minOperatorToken)
	}
	if len(token) < minOperatorToken {
		return "", fmt.Errorf("the operator token in $%s is %d characters; use at least %d (for example: openssl rand -hex 16)", name, len(token), minOperatorToken)
	}
	return token, nil
}

// wrap lets h answer only the operator.
func (a *operatorAuth) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if status, why := a.check(r); status != 0 {
			a.refuse(w, r, status, why)
			return
		}
		select {
		case a.slots <- struct{}{}:
			defer func() { <-a.slots }()
		default:
			a.busy(w, r)
			return
		}
		// While it is served (an event stream for as long as it is
		// open), the connection is in the operator's room, not the
		// workers' and not the strangers'.
		defer engine.MarkOperator(r.Context())()
		h.ServeHTTP(w, r)
	})
}

// busy answers an operator's request that found no slot: 503 at once,
// the connection closed after, and a log line at a bounded rate.
func (a *operatorAuth) busy(w http.ResponseWriter, r *http.Request) {
	if ok, leftOut := a.busyLogs.Allow(time.Now()); ok {
		kv := []any{"max", maxOperatorRequests, "path", r.URL.Path, "remote", r.RemoteAddr}
		if leftOut > 0 {
			kv = append(kv, "not_logged_before", leftOut)
		}
		a.logger.Warn("operator requests at their cap: refused one (close an event stream or a page)", kv...)
	}
	engine.DontReadBody(w)
	w.Header().Set("Retry-After", "5")
	engine.WriteError(w, http.StatusServiceUnavailable, fmt.Sprintf(
		"%d operator requests (event streams, pages, /status) are in progress, the most the engine serves at once; close one and retry", maxOperatorRequests))
}

// check returns 0 for a request the operator may make, else the status
// to refuse it with and why.
func (a *operatorAuth) check(r *http.Request) (int, string) {
	if header := r.Header.Get("Authorization"); header != "" {
		token, ok := presented(header)
		switch {
		case !ok:
			return http.StatusUnauthorized, "unreadable Authorization header"
		case a.tokenSum != nil && a.matches(token):
			return 0, ""
		}
		if _, err := a.signer.Verify(token, time.Now()); err == nil {
			return http.StatusForbidden, "a worker's credential does not open the operator's endpoints"
		}
		return http.StatusUnauthorized, "not the operator's token"
	}
	if local, err := a.local(r); local {
		if err != nil {
			return http.StatusForbidden, err.Error() + "; use the operator's token"
		}
		return 0, ""
	}
	if a.tokenSum == nil {
		return http.StatusForbidden, "the operator's endpoints answer only on loopback; set engine.operator_token_env to open them to others with a token"
	}
	return http.StatusUnauthorized, "the operator's token is required from beyond loopback"
}

func (a *operatorAuth) matches(token string) bool {
	sum := sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(sum[:], a.tokenSum) == 1
}

// presented is the token of a Bearer or Basic Authorization header (for
// Basic, the password; the user name is ignored).
func presented(header string) (string, bool) {
	if token, ok := engine.Bearer(header); ok {
		return token, true
	}
	scheme, rest, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return "", false
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(rest))
	if err != nil {
		return "", false
	}
	_, password, ok := strings.Cut(string(raw), ":")
	return password, ok && password != ""
}

// refuse answers status, asks a browser for the token on a 401, and logs
// at a bounded rate; never the header itself.
func (a *operatorAuth) refuse(w http.ResponseWriter, r *http.Request, status int, why string) {
	if ok, leftOut := a.refusals.Allow(time.Now()); ok {
		kv := []any{"reason", why, "path", r.URL.Path, "remote", r.RemoteAddr}
		if leftOut > 0 {
			kv = append(kv, "refusals_not_logged_before", leftOut)
		}
		a.logger.Warn("refused an operator request", kv...)
	}
	engine.DontReadBody(w)
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Basic realm="fluksio operator", charset="UTF-8"`)
	}
	engine.WriteError(w, status, why)
}

// Refused operator requests are logged at most operatorLogBurst per
// operatorLogWindow; the next line logged says how many were left out.
const (
	operatorLogBurst  = 10
	operatorLogWindow = 10 * time.Second
)
