package engine

import (
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// The operator's endpoints are for the operator's tools (a browser on
// the status page, curl, host-example status), never for a web page the
// operator happens to have open. A page on another site can make the
// operator's browser send requests to loopback, from the engine's own
// uid, which LocalUser admits: a form's POST (text/plain, no preflight)
// would cancel a task, and a name that resolves to 127.0.0.1 (DNS
// rebinding) would let the page read /status as its own origin. So,
// as the Jupyter server and Prometheus do, every operator request is
// refused unless
//
//   - its Host is the engine's listen address as bound (host:port), or
//     the same port on 127.0.0.1, localhost or [::1] when the engine
//     listens on loopback or on every address, or a name the operator
//     configures (Config.OperatorHosts, engine.operator_hosts); a
//     request over the unix socket, which no browser reaches, has no
//     Host to check;
//   - an Origin it carries names one of those same hosts;
//   - and, if it changes state (any method but GET, HEAD and OPTIONS),
//     it is not marked cross-site or same-site by the browser
//     (Sec-Fetch-Site) and carries a Content-Type a form cannot send
//     (anything but application/x-www-form-urlencoded, multipart/form-data
//     and text/plain) or the header Fluksio-Operator, either of which
//     makes a browser ask first (CORS preflight), which the engine
//     never grants.
//
// Rejected: a CSRF token in the page. The operator's tools are curl and
// scripts as much as the page, and a token they would have to fetch
// first guards nothing a custom header does not; the header is what
// net/http's CrossOriginProtection and the Jupyter server fall back on.
// Rejected too: checking Host on the workers' routes. A worker reaches
// the engine by whatever name its node resolves (a relay, a login
// node's address), and its credential is what it is checked by.

// OperatorHeader is the header an operator's tool may send on a request
// that changes state, in place of a Content-Type a form cannot send:
// "curl -X POST -H 'Fluksio-Operator: 1' URL/v1/tasks/ID/cancel".
const OperatorHeader = "Fluksio-Operator"

// OperatorGuard wraps an operator's endpoint h (Mux wraps each it
// serves; an embedder wraps its own page and routes) so that a request
// from a web page is refused 403 before h sees it: a Host that is not
// the engine's, an Origin of another site, or a state change a form or
// a cross-site script could make. Config.OperatorHosts adds names.
func (e *Engine) OperatorGuard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if why := e.foreignRequest(r); why != "" {
			DontReadBody(w)
			WriteError(w, http.StatusForbidden, why)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// foreignRequest says why r may not reach an operator's endpoint; ""
// when it may.
func (e *Engine) foreignRequest(r *http.Request) string {
	unix := false
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && a.Network() == "unix" {
		unix = true
	}
	if !unix && !e.ownHost(r.Host) {
		return fmt.Sprintf("Host %q is not this engine's address (%s): the operator's endpoints answer only their own address, so that no web page reaches them by another name; name the engine by its address, or add the name to engine.operator_hosts", r.Host, e.addr)
	}
	if origin := r.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		if err != nil || u.Host == "" || !e.ownHost(u.Host) {
			return fmt.Sprintf("Origin %q is not this engine's: the operator's endpoints do not answer another site's page", origin)
		}
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return ""
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site == "cross-site" || site == "same-site" {
		return "a " + site + " request: the operator's endpoints change nothing for another site's page"
	}
	if r.Header.Get(OperatorHeader) != "" {
		return ""
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err == nil && !simpleContentType(mt) {
			return ""
		}
	}
	return fmt.Sprintf("a %s to an operator's endpoint needs the header %s: 1 (or a Content-Type such as application/json), which a web form cannot send", r.Method, OperatorHeader)
}

// simpleContentType reports whether a browser sends mt from a form or a
// script without asking the server first.
func simpleContentType(mt string) bool {
	switch strings.ToLower(mt) {
	case "application/x-www-form-urlencoded", "multipart/form-data", "text/plain":
		return true
	}
	return false
}

// ownHost reports whether hostport (a Host header, or an Origin's host)
// names this engine: its listen address as bound; the same port on a
// loopback name when it listens on loopback or every address; or a
// configured name, with the bound port or none.
func (e *Engine) ownHost(hostport string) bool {
	bound := strings.TrimPrefix(e.addr, "tcp:")
	bhost, bport, err := net.SplitHostPort(bound)
	if err != nil {
		return false
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		// No port: the scheme's default, which the engine listens on
		// only when bound there.
		host, port = strings.Trim(hostport, "[]"), ""
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, name := range e.cfg.OperatorHosts {
		nhost, nport, err := net.SplitHostPort(name)
		if err != nil {
			nhost, nport = strings.Trim(name, "[]"), ""
		}
		if !strings.EqualFold(strings.TrimSuffix(nhost, "."), host) {
			continue
		}
		if (nport != "" && port == nport) || (nport == "" && (port == bport || port == "")) {
			return true
		}
	}
	if port != bport && (port != "" || (bport != "80" && bport != "443")) {
		return false
	}
	if host == bhost {
		return true
	}
	ip := net.ParseIP(bhost)
	if ip == nil || !(ip.IsLoopback() || ip.IsUnspecified()) {
		return false
	}
	return slices.Contains([]string{"127.0.0.1", "localhost", "::1"}, host)
}
