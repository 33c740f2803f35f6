package main

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/hcl/v2"
)

// TLS for the engine's listener. A worker's credential crosses the network
// on every request, so on anything but loopback the listener should speak
// TLS: the engine block names a certificate and key (tls_cert, tls_key),
// and workers verify the engine either against a CA file (--engine-ca) or
// by the SHA-256 of its certificate (--engine-cert-sha256), which suits a
// self-signed certificate made for one engine. Plain HTTP beyond loopback
// still works, because a site may terminate TLS in front of the engine,
// but the engine warns at start.
//
// What it does not do: client certificates for workers (the credential is
// what identifies a worker), and reloading the certificate while running.

// checkEngineTLS validates tls_cert and tls_key of the engine block and
// loads the pair into e.tlsCert. Paths are relative to the configuration
// file's directory.
func checkEngineTLS(block *hcl.Block, e *engineConfig, configDir string) hcl.Diagnostics {
	attrs, _ := block.Body.JustAttributes()
	at := func(name string) *hcl.Range {
		if a, ok := attrs[name]; ok {
			return a.Expr.Range().Ptr()
		}
		return block.DefRange.Ptr()
	}
	var diags hcl.Diagnostics
	if e.MaxConnections < 0 {
		diags = append(diags, &hcl.Diagnostic{
			Severity: hcl.DiagError, Summary: "Invalid max_connections",
			Detail:  fmt.Sprintf("max_connections is %d. Set a positive number, or leave it out for %d.", e.MaxConnections, defaultMaxConnections),
			Subject: at("max_connections"),
		})
	}
	switch {
	case e.TLSCert == "" && e.TLSKey == "":
		return diags
	case e.TLSCert == "" || e.TLSKey == "":
		missing, given := "tls_cert", "tls_key"
		if e.TLSKey == "" {
			missing, given = "tls_key", "tls_cert"
		}
		return append(diags, &hcl.Diagnostic{
			Severity: hcl.DiagError, Summary: "Incomplete TLS settings",
			Detail:  fmt.Sprintf("%s is set but %s is not. Set both (a PEM certificate and its private key), or neither for plain HTTP.", given, missing),
			Subject: at(given),
		})
	}
	resolve := func(p string) string {
		if filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(configDir, p)
	}
	for _, f := range []struct{ attr, path string }{{"tls_cert", e.TLSCert}, {"tls_key", e.TLSKey}} {
		if _, err := os.Stat(resolve(f.path)); err != nil {
			diags = append(diags, &hcl.Diagnostic{
				Severity: hcl.DiagError, Summary: "Cannot read " + f.attr,
				Detail:  fmt.Sprintf("%v. Relative paths are from the configuration file's directory.", err),
				Subject: at(f.attr),
			})
		}
	}
	if diags.HasErrors() {
		return diags
	}
	cert, err := tls.LoadX509KeyPair(resolve(e.TLSCert), resolve(e.TLSKey))
	if err != nil {
		return append(diags, &hcl.Diagnostic{
			Severity: hcl.DiagError, Summary: "Cannot load the TLS certificate",
			Detail:  fmt.Sprintf("%v. tls_cert must be a PEM certificate (chain) and tls_key its PEM private key.", err),
			Subject: at("tls_cert"),
		})
	}
	e.tlsCert = &cert
	return diags
}

// serverTLSConfig is the listener's TLS configuration, or nil for plain
// HTTP.
func (e *engineConfig) serverTLSConfig() *tls.Config {
	if e.tlsCert == nil {
		return nil
	}
	return &tls.Config{Certificates: []tls.Certificate{*e.tlsCert}, MinVersion: tls.VersionTLS12}
}

// plainBeyondLoopback reports whether addr (the listener's) accepts
// connections from other machines in plain HTTP.
func plainBeyondLoopback(addr net.Addr, tlsOn bool) bool {
	if tlsOn {
		return false
	}
	tcp, ok := addr.(*net.TCPAddr)
	return ok && !tcp.IP.IsLoopback()
}

// workerTransport is the worker's HTTP transport: system roots unless
// caFile names a PEM bundle to trust instead, and, with pin (the SHA-256
// of the engine's certificate, in hex), only that certificate. With a pin
// and no CA file the chain is not checked, because a pinned certificate is
// usually self-signed: the pin is the check.
func workerTransport(caFile, pin string) (*http.Transport, error) {
	t := http.DefaultTransport.(*http.Transport).Clone()
	if caFile == "" && pin == "" {
		return t, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("--engine-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--engine-ca %s holds no PEM certificate", caFile)
		}
		cfg.RootCAs = pool
	}
	if pin != "" {
		want, err := hex.DecodeString(strings.TrimPrefix(strings.ToLower(strings.ReplaceAll(pin, ":", "")), "sha256"))
		if err != nil || len(want) != sha256.Size {
			return nil, fmt.Errorf("--engine-cert-sha256 %q is not a SHA-256 in hex (openssl x509 -noout -fingerprint -sha256 prints one)", pin)
		}
		cfg.InsecureSkipVerify = caFile == ""
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the engine presented no certificate")
			}
			got := sha256.Sum256(cs.PeerCertificates[0].Raw)
			if subtle.ConstantTimeCompare(got[:], want) != 1 {
				return fmt.Errorf("%w: the engine's certificate has SHA-256 %x", errEnginePin, got)
			}
			return nil
		}
	}
	t.TLSClientConfig = cfg
	return t, nil
}

// errEnginePin is the worker's verdict on an engine whose certificate is
// not the pinned one.
var errEnginePin = errors.New("engine certificate does not match --engine-cert-sha256")

// engineUnverified reports whether err is the engine failing TLS
// verification, which no retry will change.
func engineUnverified(err error) bool {
	var verr *tls.CertificateVerificationError
	return errors.Is(err, errEnginePin) || errors.As(err, &verr)
}
