package engine

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/worker"
)

// A worker's session binds what it does after attaching to the attach
// itself. A credential proves the engine minted it for a name; it does
// not prove that the process presenting it is the one that attached. A
// burst's job script holds every array task's credential, readable by any
// task of the array and by its prerun (they all run as the job's user).
// So the attach answers with a session secret, 32 random bytes the
// engine made for that attach and sent to nobody else, and work, result
// and detach need it in the Fluksio-Session header beside the
// credential: a copied credential of a live worker gets 401 (no session)
// or 403 (another's), its attach 409, and nothing changes.
//
// One poll at a time per worker: a second GET /v1/work while one is
// open is refused 409 with code poll_open, and the first keeps its
// place, so a task goes out in exactly one poll's answer. (A poll after
// an answer was lost on the way is handed the same task again: the same
// session asks, and the task would otherwise be stuck.)
//
// What it does not do: tell a sibling from its owner before the owner
// attaches. Whoever attaches first with a credential holds its session,
// and the credential attaches once. docs/security.md says what a prerun
// can and cannot see; docs/design/engine-sessions.md why the session is
// neither the connection nor rotated.

// sessionHeader carries the session secret on work, result and detach.
const sessionHeader = worker.SessionHeader

// sessionBytes is the secret's length: as long as the signing secret's
// minimum, more than enough against guessing.
const sessionBytes = 32

// pollOpen is the code of the 409 a second concurrent poll gets: the
// worker should wait a moment and poll again, not attach again.
const pollOpen = worker.CodePollOpen

// newSession returns a fresh session secret, as the worker will send it,
// and the digest the engine keeps instead of the secret.
func newSession() (secret string, digest [sha256.Size]byte) {
	b := make([]byte, sessionBytes)
	// crypto/rand.Read never fails on a supported platform.
	rand.Read(b)
	secret = base64.RawURLEncoding.EncodeToString(b)
	return secret, sha256.Sum256([]byte(secret))
}

// sessionMatches reports whether the header holds the secret whose
// digest is want, in time that does not depend on where they differ.
func sessionMatches(header string, want [sha256.Size]byte) bool {
	got := sha256.Sum256([]byte(header))
	return subtle.ConstantTimeCompare(got[:], want[:]) == 1
}

// sessionLocked returns the worker a request with a valid credential
// speaks for, if session (its session header) is that worker's; else the
// denial and why: notAttached when the credential's worker is not
// attached (it should attach), noSession without a session,
// otherSession with another. b.mu must be held.
func (b *books) sessionLocked(cred host.Credential, session string) (*workerState, denial, string) {
	ws := b.ownedLocked(cred)
	if ws == nil {
		return nil, notAttached, errNotAttached.Error()
	}
	switch {
	case session == "":
		return nil, noSession, "no session: send the session POST /v1/attach answered with in " + sessionHeader
	case !sessionMatches(session, ws.session):
		return nil, otherSession, "worker " + cred.Worker + " is attached in another session; a credential attaches once"
	}
	return ws, allowed, ""
}
