package engine

import (
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"

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
// loads the pair into e.loadedCert. Paths are relative to the configuration
// file's directory.
func checkEngineTLS(block *hcl.Block, e *EngineBlock, configDir string) hcl.Diagnostics {
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
	e.loadedCert = &cert
	return diags
}

// ServerTLS is the listener's TLS configuration, or nil for plain
// HTTP.
func (e *EngineBlock) ServerTLS() *tls.Config {
	if e.loadedCert == nil {
		return nil
	}
	return &tls.Config{Certificates: []tls.Certificate{*e.loadedCert}, MinVersion: tls.VersionTLS12}
}
