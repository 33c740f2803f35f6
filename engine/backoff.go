package engine

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fluksio/provision/internal/backoff"
	"github.com/fluksio/provision/shared"
)

// The engine's own backoff, since a plugin may not back off itself: each
// worker_provision_failed for a profile holds that profile for
// engineHoldBase, doubled with each failure in a row up to engineHoldMax,
// until a worker of it attaches. A held profile is asked for no more than
// was on its way, and its other needs fail over as if it were BACKING_OFF.
// A failure without a profile holds nothing. docs/design/engine-backoff.md
// says why per profile and per event.
var (
	engineHoldBase = time.Second
	engineHoldMax  = 2 * time.Minute
)

type holdKey struct{ provisioner, profile string }

type holdState struct {
	// failures in a row since the last attach, the last one's detail,
	// and the end of the hold they make.
	failures  int
	lastError string
	// class is the last failure's class, as its plugin said it (empty
	// from a plugin older than contract 2.3).
	class shared.FailureClass
	until time.Time
	// onTheWay is what the plugin last said was on its way for the
	// profile, less the failures since; keep is how many needs a held
	// profile is still asked for: onTheWay when the hold began, never
	// raised while it lasts.
	onTheWay int
	keep     int
}

// holds is the engine's backoff state per provisioner and profile. Its
// methods may be called from any goroutine.
type holds struct {
	now func() time.Time

	mu sync.Mutex // guards m and per
	m  map[holdKey]*holdState
	// per counts each provisioner's profiles in m: at most
	// maxHeldProfiles, so a plugin that names a new profile with each
	// failure cannot grow m without end.
	per map[string]int
}

// maxHeldProfiles bounds the profiles the engine keeps a hold state for,
// per provisioner: a configuration's profiles number in the tens. A
// failure of a profile past it holds nothing, and says so once
// (errTooManyProfiles).
const maxHeldProfiles = 256

// errTooManyProfiles is observeEvent's answer to a failure of a profile
// past maxHeldProfiles.
var errTooManyProfiles = fmt.Errorf("the provisioner's failures name more than %d profiles; failures of further profiles hold nothing", maxHeldProfiles)

func newHolds(now func() time.Time) *holds {
	if now == nil {
		now = time.Now
	}
	return &holds{now: now, m: map[holdKey]*holdState{}, per: map[string]int{}}
}

// get is k's state, made if there is room; nil if there is none.
func (h *holds) get(k holdKey) *holdState {
	st := h.m[k]
	if st == nil {
		if h.per[k.provisioner] >= maxHeldProfiles {
			return nil
		}
		st = &holdState{}
		h.m[k] = st
		h.per[k.provisioner]++
	}
	return st
}

// failed records a failure of one of provisioner's machines of profile
// and returns the hold it makes; ok is false when the provisioner has
// maxHeldProfiles others already, and nothing is held.
func (h *holds) failed(provisioner, profile, detail string, class shared.FailureClass) (failures int, hold time.Duration, ok bool) {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.get(holdKey{provisioner, profile})
	if st == nil {
		return 0, 0, false
	}
	wasHeld := now.Before(st.until)
	st.failures++
	st.lastError, st.class = detail, class
	hold = backoff.Delay(engineHoldBase, engineHoldMax, st.failures)
	st.until = now.Add(hold)
	st.onTheWay = max(0, st.onTheWay-1)
	if wasHeld {
		st.keep = min(st.keep, st.onTheWay)
	} else {
		st.keep = st.onTheWay
	}
	return st.failures, hold, true
}

// attached ends provisioner's hold of profile, if any: a worker of it
// came, so the profile works. It reports whether a hold was lifted.
func (h *holds) attached(provisioner, profile string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.m[holdKey{provisioner, profile}]
	if st == nil {
		return false
	}
	lifted := st.failures > 0
	st.failures, st.until, st.lastError, st.keep = 0, time.Time{}, "", 0
	st.onTheWay = max(0, st.onTheWay-1)
	return lifted
}

// reported takes what a Provision answer said was on its way per profile.
// A held profile's allowance only falls.
func (h *holds) reported(provisioner string, profiles []shared.ProfileDemand) {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := map[string]bool{}
	for _, pd := range profiles {
		seen[pd.Profile] = true
		st := h.get(holdKey{provisioner, pd.Profile})
		if st == nil {
			continue // past maxHeldProfiles: never held, so never limited
		}
		st.onTheWay = max(0, pd.OnTheWay)
		if now.Before(st.until) {
			st.keep = min(st.keep, st.onTheWay)
		}
	}
	// A profile the answer leaves out has nothing wanted and nothing on
	// its way.
	for k, st := range h.m {
		if k.provisioner == provisioner && !seen[k.profile] {
			st.onTheWay, st.keep = 0, 0
		}
	}
}

// allowance is how many needs a pass may still route to provisioner's
// profile: unlimited (-1) unless it is held.
func (h *holds) allowance(provisioner, profile string) (keep int, st holdState) {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	p := h.m[holdKey{provisioner, profile}]
	if p == nil || !now.Before(p.until) {
		return -1, holdState{}
	}
	return p.keep, *p
}

// HeldProfile is one profile the engine holds back, as GET /status shows
// it.
type HeldProfile struct {
	Provisioner string `json:"provisioner"`
	Profile     string `json:"profile"`
	// Failures in a row since a worker of the profile last attached.
	Failures int `json:"failures"`
	// Until is when the hold ends; in the past once it has, until a
	// worker attaches or another failure comes.
	Until     time.Time `json:"until"`
	Held      bool      `json:"held"`
	LastError string    `json:"last_error"`
}

// list is every profile with failures in a row, held or not, sorted.
func (h *holds) list() []HeldProfile {
	now := h.now()
	h.mu.Lock()
	out := []HeldProfile{}
	for k, st := range h.m {
		if st.failures > 0 {
			out = append(out, HeldProfile{Provisioner: k.provisioner, Profile: k.profile, Failures: st.failures,
				Until: st.until, Held: now.Before(st.until), LastError: st.lastError})
		}
	}
	h.mu.Unlock()
	slices.SortFunc(out, func(a, b HeldProfile) int {
		return strings.Compare(a.Provisioner+"\x00"+a.Profile, b.Provisioner+"\x00"+b.Profile)
	})
	return out
}

// holdReason is why a need waits on a held profile: misconfigured when
// its machines' last failure was the configuration's (a restart of the
// same job will not help: the operator must fix it), else backing off.
func holdReason(st holdState) WaitReason {
	if st.class == shared.FailureMisconfigured {
		return ReasonMisconfigured
	}
	return ReasonBackingOff
}

// holdDetail is the outcome's detail for a need the engine did not ask
// for because its profile is held.
func holdDetail(st holdState) string {
	return fmt.Sprintf("held back by the engine: %d failure(s) in a row, until %s (last: %s)",
		st.failures, st.until.Format("15:04:05"), st.lastError)
}

// profileFor is the profile a target's plugin would choose for n: the
// first of its shapes, in its match order, that fits.
func profileFor(shapes []shared.Shape, n shared.Need) (string, bool) {
	for _, s := range shapes {
		if s.Fits(n) {
			return s.Profile, true
		}
	}
	return "", false
}

// observeEvent holds back the profile of a machine a provisioner reports
// failed. ev.Provisioner must be the host's stamp.
//
// A machine refused for a limit (class limit_reached: an association's
// MaxSubmitJobs, a site's submit throttle) is not held: the profile is
// not broken, the room comes back as jobs end, and holding it would fail
// the need over to another profile behind the same limit.
//
// A failure of a profile past the provisioner's maxHeldProfiles holds
// nothing, and the error says so (the caller counts it and says it
// once).
func (p *router) observeEvent(ev shared.Event) error {
	if ev.Kind != shared.EventWorkerProvisionFailed || ev.Profile == "" || ev.Class == shared.FailureLimitReached {
		return nil
	}
	n, hold, ok := p.holds.failed(ev.Provisioner, ev.Profile, ev.Detail, ev.Class)
	if !ok {
		return errTooManyProfiles
	}
	p.demandMoved()
	// Each failure is logged: the holds bound how many there are.
	p.logger.Warn("profile held back: its machines keep failing", "provisioner", ev.Provisioner, "profile", ev.Profile,
		"failures", n, "hold", hold.String(), "class", string(ev.Class), "detail", ev.Detail)
	return nil
}

// workerAttached ends the hold of the profile a provisioner's worker was
// started as: the profile works.
func (p *router) workerAttached(provisioner, profile string) {
	if profile != "" && p.holds.attached(provisioner, profile) {
		p.demandMoved()
		p.logger.Info("profile no longer held back: a worker of it attached", "provisioner", provisioner, "profile", profile)
	}
}

// demandMoved has the next Step ask the provisioners: a profile's hold
// changed, and with it where its needs are asked.
func (p *router) demandMoved() {
	p.mu.Lock()
	p.rising = true
	p.mu.Unlock()
}

// forget drops the holds of provisioner's profiles (a reload changed
// or removed it: what failed may be fixed) and says which profiles were
// held, sorted. The router is to be told the demand moved
// (demandMoved).
func (h *holds) forget(provisioner string) []string {
	h.mu.Lock()
	var lifted []string
	for k, st := range h.m {
		if k.provisioner != provisioner {
			continue
		}
		if st.failures > 0 {
			lifted = append(lifted, k.profile)
		}
		delete(h.m, k)
	}
	delete(h.per, provisioner)
	h.mu.Unlock()
	slices.Sort(lifted)
	return lifted
}
