package engine

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"time"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/worker"
)

// A worker's session binds what it does after attaching to the attach
// itself. A credential proves the engine minted it for a name; it does
// not prove that the process presenting it is the one that attached. A
// burst's job script holds every array task's credential, readable by any
// task of the array and by its prerun (they all run as the job's user),
// so before sessions task 1 could poll GET /v1/work as task 0 with task
// 0's credential, take its task, report a forged result and detach it
// (issue 24, item 2). Now the attach answers with a session secret, 32
// random bytes the engine made for that attach and sent to nobody else,
// and work, result and detach need it in the Fluksio-Session header
// beside the credential: a copied credential of a live worker gets 401
// (no session) or 403 (another's), its attach 409, and nothing changes.
//
// One poll at a time per worker: a second GET /v1/work while one is
// open is refused 409 with code poll_open, and the first keeps its
// place, so a task goes out in exactly one poll's answer. (A poll after
// an answer was lost on the way is handed the same task again: the same
// session asks, and the task would otherwise be stuck.)
//
// Rejected: binding the session to the connection (a worker's requests
// on one keep-alive connection). A connection drops for many reasons a
// worker survives (a proxy's idle timeout, the relay restarting), and a
// reconnect would cost the worker its place. Rejected too: rotating the
// session on every request; a response lost on the way would leave the
// worker holding a secret the engine has already moved past.
//
// What it does not do: tell a sibling from its owner before the owner
// attaches. Whoever attaches first with a credential holds its session,
// and the credential attaches once. docs/security.md says what a prerun
// can and cannot see.

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
// speaks for, if its session header is that worker's; else the status
// and reason to refuse it with: 409 when the credential's worker is not
// attached (it should attach), 401 without a session, 403 with another.
// A session that holds makes the request's connection a worker's
// (markCredentialed); nothing short of it does. e.mu must be held.
func (e *Books) sessionLocked(r *http.Request, cred host.Credential) (*workerState, int, string) {
	ws := e.ownedLocked(cred)
	if ws == nil {
		return nil, http.StatusConflict, errNotAttached.Error()
	}
	header := r.Header.Get(sessionHeader)
	switch {
	case header == "":
		return nil, http.StatusUnauthorized, "no session: send the session POST /v1/attach answered with in " + sessionHeader
	case !sessionMatches(header, ws.session):
		return nil, http.StatusForbidden, "worker " + cred.Worker + " is attached in another session; a credential attaches once"
	}
	markCredentialed(r.Context())
	return ws, 0, ""
}

// refuseSession answers a request whose session does not hold, logs it
// at the rate refusals are logged (a sibling trying a copied credential
// in a loop must not flood the log), and closes the connection.
func (e *Books) refuseSession(w http.ResponseWriter, r *http.Request, status int, worker, reason string) {
	if ok, leftOut := e.refusals.Allow(time.Now()); ok {
		kv := []any{"worker", worker, "reason", reason, "path", r.URL.Path, "remote", r.RemoteAddr}
		if leftOut > 0 {
			kv = append(kv, "refusals_not_logged_before", leftOut)
		}
		e.logger.Warn("refused a worker's request", kv...)
	}
	closeAfter(w)
	WriteError(w, status, reason)
}
