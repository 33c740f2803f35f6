package slurm

import (
	"fmt"
	"strconv"
	"time"

	doubling "github.com/fluksio/provision/internal/backoff"
)

// Backoff for a profile whose requests keep failing. The router asks on
// every pass of its wait, so without it a profile that sbatch refuses, or
// whose job dies at once, would be submitted to again and again, as fast
// as the engine asks. Each failure doubles the wait before the profile is
// asked for again, from backoffBase up to backoffMax.
//
// A failure is a request that ends without a worker for any reason but a
// slow queue: sbatch refused it, its job ended or could never start
// before its worker attached, or it ran for attach_timeout without its
// worker attaching. An accepted sbatch does not reset the count, since a
// job that then dies before its worker attaches is the same failure one
// step later; a worker of the profile attaching does.

// The backoff's first wait and its cap. Constants: tests move the
// provisioner's clock instead.
const (
	// backoffBase is the wait after one failure: long enough that the
	// router's next pass does not submit again, short enough that a
	// passing hiccup costs little.
	backoffBase = 5 * time.Second
	// backoffMax caps the wait, so that a profile that was fixed on the
	// cluster is asked for again within minutes.
	backoffMax = 5 * time.Minute
)

// backoff is a profile's failures since one of its workers last attached.
type backoff struct {
	failures int
	// hold is holdBackoff, or holdMisconfigured when Slurm refused the
	// profile for good (refusal.go): its until is then misconfiguredHold
	// away, not a doubling. Its reason is the last failure's words.
	hold hold
}

// backoffDelay is the wait after the given number of failures in a row.
func backoffDelay(failures int) time.Duration {
	return doubling.Delay(backoffBase, backoffMax, failures)
}

// countFailureLocked counts a failure for the profile. p.mu must be held.
func (h *holds) countFailureLocked(profile, detail string) {
	b := h.backoff[profile]
	if b == nil {
		b = &backoff{}
		h.backoff[profile] = b
	}
	b.failures++
	b.hold = hold{kind: holdBackoff, until: h.p.now().Add(backoffDelay(b.failures)), reason: truncate(detail)}
}

// markMisconfiguredLocked holds the profile back for misconfiguredHold:
// Slurm refused it for something waiting does not change. p.mu must be
// held.
func (h *holds) markMisconfiguredLocked(profile, said string) {
	h.countFailureLocked(profile, said)
	b := h.backoff[profile]
	b.hold.kind, b.hold.until = holdMisconfigured, h.p.now().Add(misconfiguredHold)
}

// misconfiguredDetail is what a misconfigured profile's answers and notes
// say: Slurm's words, until when, and what to do.
func misconfiguredDetail(profile string, b *backoff) string {
	return fmt.Sprintf("profile %s is misconfigured: Slurm refused it for a reason waiting will not change (%s); not asking for it again until %s. Fix the profile (host-example validate -check shows Slurm's verdict), then reload the engine's configuration (SIGHUP) or restart it",
		profile, b.hold.reason, b.hold.until.UTC().Format(time.RFC3339))
}

// backoffDetail is what a profile backing off answers: its failures,
// until when, and the last failure's words.
func backoffDetail(b *backoff) string {
	return fmt.Sprintf("%s in a row; not asking again until %s. Last: %s",
		failures(b.failures), b.hold.until.Format(time.RFC3339), b.hold.reason)
}

func failures(n int) string {
	if n == 1 {
		return "1 failure"
	}
	return strconv.Itoa(n) + " failures"
}
