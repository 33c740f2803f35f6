package slurm

import "time"

// A hold is a reason to ask the cluster for nothing, for a while or until
// something clears it. Each kind has its own clock and its own words, and
// Provision decides by the kind, never by the words: the words are what
// users see, and tests assert them.

// holdKind is why machines are not asked for.
type holdKind int

const (
	holdNone holdKind = iota
	// holdBackoff: a profile's requests keep failing; each failure
	// doubles the wait (backoff.go).
	holdBackoff
	// holdMisconfigured: Slurm refused a profile for a reason waiting
	// does not change; misconfiguredHold away (refusal.go).
	holdMisconfigured
	// holdClusterFull: slurmctld would not take a job, or the cluster's
	// MaxJobCount trimmed a burst; jobsFullWait away (jobcount.go).
	holdClusterFull
	// holdThrottled: the site's submit rule gives a submission back in its
	// own time; throttleWait away (submitrules.go).
	holdThrottled
	// holdLimitReached: an accounting limit of the login user leaves no
	// room; it clears as the user's jobs end (limits.go).
	holdLimitReached
	// holdLoginNeeded: the login node refuses the login and a person must
	// log in; it clears when a login gets through (logins.go).
	holdLoginNeeded
)

var holdNames = [...]string{"none", "backoff", "misconfigured", "cluster full", "throttled", "limit reached", "login needed"}

func (k holdKind) String() string {
	if int(k) < len(holdNames) {
		return holdNames[k]
	}
	return "unknown"
}

// hold is one hold: its kind, until when it holds (zero: until something
// clears it), and its reason, in the words users see.
type hold struct {
	kind   holdKind
	until  time.Time
	reason string
}

// on reports whether h holds at now.
func (h hold) on(now time.Time) bool {
	return h.kind != holdNone && (h.until.IsZero() || now.Before(h.until))
}

// holds are the holds on the whole provisioner and each profile's
// backoff. Guarded by Provisioner.mu. A profile's own holds (backoff,
// misconfigured) are its backoff's; whether a login is needed is the ssh
// transport's Access (logins.go), which has its own lock.
type holds struct {
	// p is the provisioner whose clock and login the holds read.
	p *Provisioner
	// backoff holds, by profile, the failures since a worker of the
	// profile last attached (backoff.go).
	backoff map[string]*backoff
	// clusterFull holds every submission for jobsFullWait after slurmctld
	// would not take a job or MaxJobCount trimmed a burst.
	clusterFull hold
	// throttled holds every submission until the site's throttle gives
	// one back.
	throttled hold
	// binding is what last held the demand back, for Status: an
	// accounting limit (holdLimitReached) or the cluster's job count
	// (holdClusterFull). It has no until: a submission that goes through
	// unheld, or a demand for nothing, clears it.
	binding hold
}

// holdLocked is what holds prof back at now, in the order Provision
// answers them: the profile's backoff, then the cluster's, the site's
// and the login's holds; holdNone when nothing does. p.mu must be held.
func (h *holds) holdLocked(cfg *settings, prof string, now time.Time) hold {
	if b := h.backoff[prof]; b != nil && b.hold.on(now) {
		return b.hold
	}
	if h.clusterFull.on(now) {
		return h.clusterFull
	}
	if h.throttled.on(now) {
		return h.throttled
	}
	if needed, detail := h.p.loginNeeded(cfg); needed {
		return hold{kind: holdLoginNeeded, reason: detail}
	}
	return hold{}
}
