package host

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/fluksio/provision/shared"
)

// A worker credential is two base64url fields joined by a dot: a payload
// and the HMAC-SHA256 of that payload under the engine's secret. The
// payload is
//
//	v2 \n <expiry, Unix seconds> \n <provisioner> \n <cpus> \n <gpus>
//	   \n <ram_mb> \n <labels, comma-separated> \n <worker name>
//
// so the signature binds the name to the provisioner that asked for it, to
// the most the worker may claim to be, and to the expiry, and all of them
// to the format's version: a token cut from one worker's credential and
// pasted onto another's name no longer verifies, a worker cannot claim
// more than it was minted for, and a v1 payload (name and expiry only) is
// never read as a v2 one. The name comes last because it is the only
// free-form field, and it may not contain a newline; labels are
// shared.ValidName, so they hold no comma. It is not a JWT: a token
// makes no choice about itself ("alg") that an attacker could make.
const tokenVersion = "v2"

// tokenFields is how many newline-separated fields a v2 payload has.
const tokenFields = 8

// MinSecretLen is the shortest secret taken: HMAC-SHA256 gains nothing from
// more and loses a lot from less.
const MinSecretLen = 32

// maxTokenLen bounds what Verify will look at, so a hostile header costs
// a length check and nothing more. Real tokens are about 100 characters.
const maxTokenLen = 1024

// maxWorkerNameLen is long enough for "<provisioner>-<profile>-<suffix>"
// and short enough to sit in a log line.
const maxWorkerNameLen = 253

// Why a credential was refused. The messages name no part of the token,
// so they may be logged and sent back to the worker as they are.
var (
	ErrCredentialMalformed = errors.New("malformed credential")
	ErrCredentialForged    = errors.New("credential signature does not match")
	ErrCredentialExpired   = errors.New("credential has expired")
)

// Signer signs and verifies worker credentials with one secret. It is safe
// for concurrent use: it never changes after NewSigner.
type Signer struct {
	secret []byte
	// now is the clock Sign reads; Verify is given its time instead.
	now func() time.Time
}

// The engine hands its Signer to the plugin host, which mints through it.
var _ CredentialSigner = (*Signer)(nil)

// NewSigner returns a Signer for secret. A secret shorter than 32 bytes is
// a bug in the caller (SecretFromEnv and RandomSecret never return one), so
// it panics rather than sign with something guessable.
func NewSigner(secret []byte) *Signer {
	if len(secret) < MinSecretLen {
		panic(fmt.Sprintf("host: signing secret is %d bytes; need at least %d", len(secret), MinSecretLen))
	}
	return &Signer{secret: bytes.Clone(secret), now: time.Now}
}

// Credential is what a verified token says.
type Credential struct {
	CredentialClaims
	Expires time.Time
}

// Sign returns a credential for c that is good for ttl, and when it stops
// being good. The expiry is whole seconds, rounded down, so a credential
// never outlives what was asked for.
func (s *Signer) Sign(c CredentialClaims, ttl time.Duration) (token string, expires time.Time, err error) {
	if err := checkWorkerName(c.Worker); err != nil {
		return "", time.Time{}, err
	}
	if err := checkClaims(c); err != nil {
		return "", time.Time{}, err
	}
	if ttl <= 0 {
		return "", time.Time{}, fmt.Errorf("credential lifetime %s is not positive", ttl)
	}
	exp := s.now().Add(ttl).Unix()
	payload := []byte(strings.Join([]string{
		tokenVersion, strconv.FormatInt(exp, 10), c.Provisioner,
		strconv.Itoa(c.CPUs), strconv.Itoa(c.GPUs), strconv.FormatInt(c.RAMMB, 10),
		strings.Join(c.Labels, ","), c.Worker,
	}, "\n"))
	enc := base64.RawURLEncoding
	token = enc.EncodeToString(payload) + "." + enc.EncodeToString(s.mac(payload))
	return token, time.Unix(exp, 0), nil
}

// checkClaims refuses claims that could not be carried in a payload and
// read back the same.
func checkClaims(c CredentialClaims) error {
	if !shared.ValidName(c.Provisioner) {
		return fmt.Errorf("provisioner %q is not a valid name", c.Provisioner)
	}
	if c.CPUs < 1 || c.GPUs < 0 || c.RAMMB < 0 {
		return fmt.Errorf("credential shape cpus %d, gpus %d, ram_mb %d: need cpus >= 1 and no negatives", c.CPUs, c.GPUs, c.RAMMB)
	}
	for _, l := range c.Labels {
		if !shared.ValidName(l) {
			return fmt.Errorf("label %q is not a valid name", l)
		}
	}
	return nil
}

// Verify returns what a credential says, if it was signed with this
// secret and has not expired at now. The signature is checked before
// anything in the payload is believed, and compared in constant time. Any
// input, however hostile, gets an error rather than a panic; the error
// wraps ErrCredentialMalformed, ErrCredentialForged or ErrCredentialExpired.
func (s *Signer) Verify(token string, now time.Time) (Credential, error) {
	if token == "" || len(token) > maxTokenLen || !tokenAlphabet(token) {
		return Credential{}, ErrCredentialMalformed
	}
	p64, m64, ok := strings.Cut(token, ".")
	if !ok || strings.Contains(m64, ".") {
		return Credential{}, ErrCredentialMalformed
	}
	// Strict: a token has exactly one spelling, so two strings that differ
	// cannot both verify.
	enc := base64.RawURLEncoding.Strict()
	payload, err := enc.DecodeString(p64)
	if err != nil {
		return Credential{}, ErrCredentialMalformed
	}
	mac, err := enc.DecodeString(m64)
	if err != nil || len(mac) != sha256.Size {
		return Credential{}, ErrCredentialMalformed
	}
	if !hmac.Equal(mac, s.mac(payload)) {
		return Credential{}, ErrCredentialForged
	}

	// Signed by us, so malformed here means another version of us.
	fields := strings.SplitN(string(payload), "\n", tokenFields)
	if len(fields) != tokenFields || fields[0] != tokenVersion {
		return Credential{}, ErrCredentialMalformed
	}
	exp, err1 := strconv.ParseInt(fields[1], 10, 64)
	cpus, err2 := strconv.Atoi(fields[3])
	gpus, err3 := strconv.Atoi(fields[4])
	ram, err4 := strconv.ParseInt(fields[5], 10, 64)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return Credential{}, ErrCredentialMalformed
	}
	c := Credential{
		CredentialClaims: CredentialClaims{
			Worker: fields[7], Provisioner: fields[2], CPUs: cpus, GPUs: gpus, RAMMB: ram,
		},
		Expires: time.Unix(exp, 0),
	}
	if fields[6] != "" {
		c.Labels = strings.Split(fields[6], ",")
	}
	if checkWorkerName(c.Worker) != nil || checkClaims(c.CredentialClaims) != nil {
		return Credential{}, ErrCredentialMalformed
	}
	if !now.Before(c.Expires) {
		return Credential{}, fmt.Errorf("%w: worker %q, at %s", ErrCredentialExpired, c.Worker, c.Expires.UTC().Format(time.RFC3339))
	}
	return c, nil
}

// tokenAlphabet reports whether token holds only base64url characters and
// dots. The base64 decoder skips '\r' and '\n' even in Strict mode, so
// without this a token with a line break inside would verify as well as
// the token itself: two spellings of one credential.
func tokenAlphabet(token string) bool {
	for i := 0; i < len(token); i++ {
		c := token[i]
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// mac is the signature of a payload. The fixed prefix keeps these MACs
// apart from anything else that might one day be signed with the secret.
func (s *Signer) mac(payload []byte) []byte {
	h := hmac.New(sha256.New, s.secret)
	h.Write([]byte("fluksio worker credential\x00"))
	h.Write(payload)
	return h.Sum(nil)
}

// checkWorkerName refuses names that could not be carried in a payload
// or printed in a log line without surprises.
func checkWorkerName(name string) error {
	if name == "" {
		return errors.New("worker name is empty")
	}
	if len(name) > maxWorkerNameLen {
		return fmt.Errorf("worker name is %d bytes; at most %d", len(name), maxWorkerNameLen)
	}
	for _, r := range name {
		if unicode.IsControl(r) || unicode.IsSpace(r) || r == unicode.ReplacementChar {
			return fmt.Errorf("worker name %q has a space, control character or invalid UTF-8", name)
		}
	}
	return nil
}

// RandomSecret is a fresh secret for one engine start.
func RandomSecret() []byte {
	secret := make([]byte, MinSecretLen)
	// crypto/rand.Read never fails on a supported platform (it crashes the
	// program instead), so there is no error to handle.
	rand.Read(secret)
	return secret
}

// SecretFromEnv reads a signing secret from the environment variable
// name. See ParseSecret for what it accepts.
func SecretFromEnv(name string) ([]byte, error) {
	value := os.Getenv(name)
	if value == "" {
		return nil, fmt.Errorf("%s is not set", name)
	}
	secret, err := ParseSecret(value)
	if err != nil {
		// The value itself is never part of the message: it is the secret.
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return secret, nil
}

// ParseSecret accepts a secret as hex (what `openssl rand -hex 32` prints)
// or as raw bytes, with surrounding whitespace ignored either way. A value
// that is valid hex is taken as hex, so that a 64-character hex string
// means 32 bytes and not 64; either way it must come to at least 32 bytes.
func ParseSecret(value string) ([]byte, error) {
	value = strings.TrimSpace(value)
	if b, err := hex.DecodeString(value); err == nil && len(value) > 0 {
		if len(b) < MinSecretLen {
			return nil, fmt.Errorf("hex secret decodes to %d bytes; need at least %d", len(b), MinSecretLen)
		}
		return b, nil
	}
	if len(value) < MinSecretLen {
		return nil, fmt.Errorf("secret is %d bytes; need at least %d (or %d hex digits)", len(value), MinSecretLen, 2*MinSecretLen)
	}
	return []byte(value), nil
}
