package host

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"

	"github.com/fluksio/provision/shared"
)

// An engine has an identity that survives its restarts, and plugins mark
// what they create with it (the Slurm plugin tags each job's comment), so
// that an engine touches only what is its own, even beside another engine
// on the same cluster account. It is engine { id = "..." } when the
// operator sets one, else derived from the host name and the
// configuration file's absolute path (EngineIdentity). The credential
// epoch travels beside it (CredentialEpoch): a plugin cancels, rather
// than adopts, a job of its engine from another epoch, as that job's
// worker holds a credential the engine will refuse.

// MaxEngineIDLen keeps the id short enough for a Slurm comment beside a
// worker name.
const MaxEngineIDLen = 40

// EngineIdentity returns the configured id, or one derived from the host
// name and path (the configuration file).
func EngineIdentity(configured, path string) string {
	if configured != "" {
		return configured
	}
	host, err := os.Hostname()
	if err != nil {
		host = "unknown"
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		abs = path
	}
	sum := sha256.Sum256([]byte(host + "\x00" + abs))
	// The host name, kept to the name alphabet and shortened, makes the
	// id readable in squeue; the hash makes it unique.
	var b strings.Builder
	for _, c := range strings.ToLower(host) {
		if b.Len() >= 20 {
			break
		}
		if c < 128 && shared.ValidName(string(c)) {
			b.WriteRune(c)
		}
	}
	short := strings.Trim(b.String(), "-._")
	if short == "" {
		short = "engine"
	}
	return short + "-" + hex.EncodeToString(sum[:4])
}

// CredentialEpoch names the signing secret without revealing it: a short
// HMAC of a constant under the secret, so it changes exactly when the
// secret does (a per-run random secret, or a rotated one).
func CredentialEpoch(secret []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("fluksio credential epoch v1"))
	return hex.EncodeToString(m.Sum(nil)[:4])
}

// ValidEngineID reports whether id may be an engine's identity: 1 to
// MaxEngineIDLen characters of shared.ValidName, starting with a letter
// or digit, so that it sits in a Slurm comment and a file name.
func ValidEngineID(id string) bool {
	return len(id) <= MaxEngineIDLen && ValidConfigName(id)
}
