package worker

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
)

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
