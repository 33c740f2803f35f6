package relay

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"math/big"
	"net"
	"time"
)

// Cert is a relay's certificate and key as the relay reads them, and the
// pin the job scripts carry.
type Cert struct {
	// Line is the line Main reads first on its standard input with -tls:
	// the certificate and the key, each DER in base64, and a newline.
	// It is secret: written only to the relay's standard input.
	Line string
	// Pin is the certificate's SHA-256, in hex.
	Pin string
}

// NewCert makes a P-256 key and a self-signed certificate for it. The
// certificate's name is the relay's host when known; workers check the
// pin, not the name.
func NewCert(host string, now time.Time) (*Cert, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("making the relay's TLS key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "fluksio relay"},
		NotBefore:    now.Add(-time.Hour),
		// Longer than any job: the pin is what is checked.
		NotAfter:    now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip := net.ParseIP(host); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else if host != "" {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("making the relay's certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(der)
	return &Cert{
		Line: tlsPrefix + base64.StdEncoding.EncodeToString(der) + " " + base64.StdEncoding.EncodeToString(keyDER) + "\n",
		Pin:  hex.EncodeToString(sum[:]),
	}, nil
}
