package slurm

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fluksio/provision/shared"
)

// Provision reads the engine's whole demand and keeps, per profile, as
// many machines on their way as it maps to (raised to min_workers), within
// the caps. It asks for the shortfall in one submission (a job array, see
// array.go) and gives up pending machines beyond the demand, newest first;
// a machine already running is never given up, because its worker is
// about to attach. The books are level-triggered: the same demand twice
// asks for nothing new, and a profile with a submission in flight waits
// for it to end before it asks for more. Provision returns at once; the
// submission and any scancel run on goroutines of their own.
func (p *Provisioner) Provision(_ context.Context, req *shared.ProvisionRequest) (*shared.ProvisionResponse, error) {
	if req == nil {
		return nil, shared.ErrInvalidArgument
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.shut {
		return nil, shared.ErrShutdown
	}
	cfg := p.cfg
	if cfg == nil {
		return nil, shared.ErrNotConfigured
	}
	p.arrivedLocked(req.Attached)
	attached := cfg.attachedByProfile(req.Attached)
	p.workers.attached = attached

	resp := &shared.ProvisionResponse{Outcomes: make([]shared.DemandOutcome, len(req.Demand))}
	wanted := wantedByProfile(cfg, p.learnt, req.Demand, resp.Outcomes)

	counts := p.countsLocked()
	pass := &provisionPass{answers: map[string]demandAnswer{}, now: p.now()}
	for _, prof := range cfg.Profiles {
		c := counts[prof.Name]
		pass.alive += c.pending + c.starting + attached[prof.Name]
		pass.pending += c.pending
	}
	order := coldFirst(cfg.Profiles, counts, attached)
	pass.shares = p.sharesLocked(cfg, order, wanted, attached, counts, pass)
	for _, prof := range order {
		c := counts[prof.Name]
		want := max(wanted[prof.Name], prof.MinWorkers)
		pd := shared.ProfileDemand{Profile: prof.Name, Wanted: want, OnTheWay: c.pending + c.starting, Attached: attached[prof.Name]}
		a := demandAnswer{outcome: shared.OutcomeOutstanding}
		switch short := want - pd.OnTheWay; {
		case short > 0:
			a = p.askLocked(cfg, prof, short, c, &pd, pass)
		case short < 0 && !p.adoption.adoptPending:
			// Until the first look at the queue the books may be short
			// of what is there; nothing is given up on a partial count.
			given := p.giveUpPendingLocked(prof.Name, -short, pass.now)
			pass.cancels = append(pass.cancels, given...)
			pd.Cancelled, pd.OnTheWay = len(given), pd.OnTheWay-len(given)
		}
		if a.outcome == shared.OutcomeOutstanding && a.detail == "" && wanted[prof.Name] > 0 {
			// Only a profile the demand names is answered, so only its
			// detail is worth the look through the books.
			a.detail = p.onTheWayDetailLocked(prof.Name, pass.now)
		}
		pass.answers[prof.Name] = a
		if pd.Wanted > 0 || pd.OnTheWay > 0 || pd.Attached > 0 || pd.Cancelled > 0 {
			resp.Profiles = append(resp.Profiles, pd)
		}
	}
	if pass.limited.kind != holdNone {
		p.holds.binding = pass.limited
		p.lim.recountLaterLocked(cfg, pass.now)
	} else if len(pass.batches) > 0 || len(wanted) == 0 {
		// Asked for what was short, or nothing is wanted: no limit
		// holds anything back now.
		p.holds.binding = hold{}
	}
	rank := map[string]int{}
	for i, prof := range cfg.Profiles {
		rank[prof.Name] = i
	}
	slices.SortFunc(resp.Profiles, func(a, b shared.ProfileDemand) int { return rank[a.Profile] - rank[b.Profile] })
	for i, o := range resp.Outcomes {
		if o.Outcome == shared.OutcomeNoFit {
			continue
		}
		a := pass.answers[o.Profile]
		resp.Outcomes[i].Outcome, resp.Outcomes[i].Detail, resp.Outcomes[i].Condition = a.outcome, a.detail, a.cond
	}

	p.startLocked(cfg, pass.batches, pass.cancels)
	return resp, nil
}

// coldFirst orders profiles for a pass: those short of their min_workers
// first, so that a burst of another profile cannot take the room under
// the provisioner's caps that keeps them warm; otherwise as configured.
func coldFirst(profiles []Profile, counts map[string]profileCounts, attached map[string]int) []Profile {
	order := slices.Clone(profiles)
	slices.SortStableFunc(order, func(a, b Profile) int {
		cold := func(p Profile) int {
			c := counts[p.Name]
			if c.pending+c.starting+attached[p.Name] < p.MinWorkers {
				return 0
			}
			return 1
		}
		return cold(a) - cold(b)
	})
	return order
}

// demandAnswer is what Provision says of one profile: the outcome, why,
// and the condition a person or an engine acts on.
type demandAnswer struct {
	outcome shared.ProvisionOutcome
	detail  string
	cond    shared.Condition
}

// provisionPass is what one Provision call carries from profile to
// profile: the answers so far, the machines alive and pending with what
// it has asked for counted in, the submissions and scancels to start, and
// the accounting limit that held a profile back (holdNone when none did).
type provisionPass struct {
	answers        map[string]demandAnswer
	now            time.Time
	alive, pending int
	batches        [][]*request
	cancels        []jobRef
	limited        hold
	// shares is each short profile's part of the provisioner's room
	// when the room is less than they are short together (sharesLocked);
	// nil when it covers them all.
	shares map[string]int
}

// askLocked answers a profile short of short machines, in Provision's
// steps: a hold asks for nothing; a submission in flight is waited for;
// the room under the caps and the site's limits is how many may be asked
// for now; those are reserved in the books, to be submitted once
// Provision returns. pd is the profile's demand, updated with what is
// asked for. p.mu must be held.
func (p *Provisioner) askLocked(cfg *settings, prof Profile, short int, c profileCounts, pd *shared.ProfileDemand, pass *provisionPass) demandAnswer {
	if h := p.holds.holdLocked(cfg, prof.Name, pass.now); h.kind != holdNone {
		return holdAnswer(h, prof.Name, p.holds.backoff[prof.Name])
	}
	if c.inFlight > 0 {
		return demandAnswer{outcome: shared.OutcomeOutstanding,
			detail: fmt.Sprintf("a submission of %d machine(s) is in flight; the other %d are asked for when it ends", c.inFlight, max(0, short-c.inFlight))}
	}
	// Whole allocations: a shortfall of one machine of a two-node profile
	// asks for two.
	short, _ = roundToAllocations(short, max(1, prof.Nodes))
	n, capDetail, byLimit := p.roomLocked(cfg, prof, short, pd.OnTheWay+pd.Attached, c.pending, pass.alive, pass.pending)
	if share, ok := pass.shares[prof.Name]; ok && share < n {
		n, capDetail, byLimit = share, fmt.Sprintf("the provisioner's room under its max_workers and max_pending is shared among the profiles short of machines, by their demand; profile %s's share is %d", prof.Name, share), false
	}
	capCond := shared.ConditionCap
	if byLimit {
		pass.limited, capCond = hold{kind: holdLimitReached, reason: capDetail}, shared.ConditionSiteLimit
	}
	if n == 0 {
		return demandAnswer{shared.OutcomeCapped, capDetail, capCond}
	}
	pass.batches = append(pass.batches, p.reserveLocked(cfg, prof, n, pass.now))
	pass.alive, pass.pending = pass.alive+n, pass.pending+n
	pd.Requested, pd.OnTheWay = n, pd.OnTheWay+n
	pd.Submissions = 1
	if p.known.maxArray <= 1 {
		pd.Submissions = n / max(1, prof.Nodes)
	}
	a := demandAnswer{outcome: shared.OutcomeRequested}
	if n < short {
		a.detail = fmt.Sprintf("asked for %d of the %d missing: %s", n, short, capDetail)
	}
	return a
}

// sharesLocked divides the provisioner's room under its max_workers and
// max_pending among the profiles short of machines (in order, those not
// held and with no submission in flight): first what each lacks of its
// min_workers, as coldFirst keeps it warm; then the rest of the room in
// proportion to what each is still short, each at least one while the
// room lasts, so that a burst of one shape cannot take every machine
// while another's demand waits. It is nil when the room covers every
// shortfall, or only one profile shares it. p.mu must be held.
func (p *Provisioner) sharesLocked(cfg *settings, order []Profile, wanted, attached map[string]int, counts map[string]profileCounts, pass *provisionPass) map[string]int {
	room := min(*cfg.MaxWorkers-pass.alive, *cfg.MaxPending-pass.pending)
	var names []string
	var bases, extras []int
	total := 0
	for _, prof := range order {
		c := counts[prof.Name]
		onTheWay := c.pending + c.starting
		short := max(wanted[prof.Name], prof.MinWorkers) - onTheWay
		if short <= 0 || c.inFlight > 0 || p.holds.holdLocked(cfg, prof.Name, pass.now).kind != holdNone {
			continue
		}
		short, _ = roundToAllocations(short, max(1, prof.Nodes))
		base := min(short, max(0, prof.MinWorkers-onTheWay-attached[prof.Name]))
		names, bases, extras = append(names, prof.Name), append(bases, base), append(extras, short-base)
		total += short
		room -= base
	}
	sharing := 0
	for _, e := range extras {
		if e > 0 {
			sharing++
		}
	}
	if sharing < 2 || room <= 0 || total-sumOf(bases) <= room {
		return nil
	}
	var idx, want []int
	for i, e := range extras {
		if e > 0 {
			idx, want = append(idx, i), append(want, e)
		}
	}
	shares := map[string]int{}
	for i, n := range names {
		shares[n] = bases[i]
	}
	for j, n := range fairShares(room, want) {
		shares[names[idx[j]]] += n
	}
	return shares
}

func sumOf(ns []int) int {
	s := 0
	for _, n := range ns {
		s += n
	}
	return s
}

// fairShares divides room among shortfalls that together exceed it:
// one each, in order, while the room lasts; the rest in proportion to
// what each is still short, the remainders going to the largest
// fractions (the earlier on a tie).
func fairShares(room int, shorts []int) []int {
	out := make([]int, len(shorts))
	if room < len(shorts) {
		for i := range max(0, room) {
			out[i] = 1
		}
		return out
	}
	rest, restShort := room-len(shorts), 0
	for _, s := range shorts {
		restShort += s - 1
	}
	given := 0
	frac := make([]int, len(shorts))
	for i, s := range shorts {
		extra := (s - 1) * rest / max(1, restShort)
		frac[i] = (s - 1) * rest % max(1, restShort)
		out[i] = 1 + extra
		given += extra
	}
	order := make([]int, len(shorts))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return frac[b] - frac[a] })
	for _, i := range order[:rest-given] {
		out[i]++
	}
	return out
}

// holdAnswer is what a profile held by h is answered (b is its backoff):
// a backoff or a misconfiguration backs off; the cluster's, the site's
// and a person's holds cap it, each with its own condition.
func holdAnswer(h hold, profile string, b *backoff) demandAnswer {
	switch h.kind {
	case holdBackoff:
		// Asking again now would fail the same way.
		return demandAnswer{shared.OutcomeBackingOff, backoffDetail(b), shared.ConditionBackingOff}
	case holdMisconfigured:
		return demandAnswer{shared.OutcomeBackingOff, misconfiguredDetail(profile, b), shared.ConditionMisconfigured}
	case holdClusterFull:
		// slurmctld said it would take no job; asking before
		// jobsFullWait waits out submit_timeout again.
		return demandAnswer{shared.OutcomeCapped, h.reason, shared.ConditionClusterFull}
	case holdThrottled:
		// The site's throttle gives a submission back in its own time;
		// asking before that is refused again.
		return demandAnswer{shared.OutcomeCapped, h.reason, shared.ConditionThrottled}
	case holdLoginNeeded:
		// Weather a person clears: nothing is asked for, and nothing
		// backs off (logins.go).
		return demandAnswer{shared.OutcomeCapped, h.reason, shared.ConditionLoginNeeded}
	}
	return demandAnswer{outcome: shared.OutcomeOutstanding}
}

// wantedByProfile sums the demand by the profile each need maps to,
// within maxCap, and fills in each outcome's profile; a need no profile
// fits is answered no_fit in outcomes, which has one entry a need. A
// profile lasts what lt says.
func wantedByProfile(cfg *settings, lt *learnt, demand []shared.Demand, outcomes []shared.DemandOutcome) map[string]int {
	wanted := map[string]int{}
	for i, d := range demand {
		prof, ok := cfg.match(d.Need, lt)
		if !ok {
			outcomes[i] = shared.DemandOutcome{Outcome: shared.OutcomeNoFit, Detail: noFitDetail(d.Need)}
			continue
		}
		wanted[prof.Name] = min(maxCap, wanted[prof.Name]+max(0, d.Count))
		outcomes[i].Profile = prof.Name
	}
	return wanted
}

// startLocked starts a goroutine for each submission of batches and one
// for the scancel of cancels. The reservations are made before the
// goroutines start, so a second Provision sees them even before ssh has
// begun. wg.Add happens under mu while shut is false, so Shutdown's Wait
// cannot race it. p.mu must be held.
func (p *Provisioner) startLocked(cfg *settings, batches [][]*request, cancels []jobRef) {
	host := p.host
	for _, batch := range batches {
		ctx, cancel := context.WithCancel(p.life)
		batch[0].cancel = cancel
		for _, r := range batch[1:] {
			r.cancel = cancel
		}
		p.wg.Add(1)
		go p.sub.submit(ctx, cfg, host, batch)
	}
	if len(cancels) > 0 {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.cancels.cancelJobs(p.life, cfg, host, cancels, "gave up a pending machine the engine no longer wants")
		}()
	}
	if len(batches) > 0 {
		p.poll.wake()
	}
}

// profileCounts is where one profile's machines stand in the books.
type profileCounts struct {
	// pending are in the queue, being submitted or looked for; starting
	// run without their worker attached yet; inFlight are being
	// submitted (a submission goroutine holds them).
	pending, starting, inFlight int
}

// roomLocked is how many of short machines of prof may be asked for now,
// within the profile's and the provisioner's max_workers and max_pending
// and the cluster's array size; detail names the cap that binds, and
// byLimit is set when that is the login user's accounting limit.
func (p *Provisioner) roomLocked(cfg *settings, prof Profile, short, profAlive, profPending, alive, pending int) (n int, detail string, byLimit bool) {
	n = short
	nodes := max(1, prof.Nodes)
	for _, c := range []struct {
		room int
		what string
	}{
		{cfg.maxWorkers(prof) - profAlive, fmt.Sprintf("profile %s has %d of its max_workers %d alive", prof.Name, profAlive, cfg.maxWorkers(prof))},
		{*cfg.MaxWorkers - alive, fmt.Sprintf("the provisioner has %d of its max_workers %d alive", alive, *cfg.MaxWorkers)},
		{cfg.maxPending(prof) - profPending, fmt.Sprintf("profile %s has %d of its max_pending %d in the queue", prof.Name, profPending, cfg.maxPending(prof))},
		{*cfg.MaxPending - pending, fmt.Sprintf("the provisioner has %d of its max_pending %d in the queue", pending, *cfg.MaxPending)},
		{p.known.batchCap() * nodes, p.known.batchCapDetail()},
	} {
		if c.room < n {
			n, detail = max(0, c.room), c.what
		}
	}
	if room, d, ok := p.lim.limitRoomLocked(cfg, p.now()); ok && room*nodes < n {
		// The user's accounting limit, in jobs and array tasks: one per
		// allocation.
		n, detail, byLimit = room*nodes, d, true
	}
	if _, whole := roundToAllocations(n, nodes); whole < n {
		n = whole
		detail = fmt.Sprintf("%s; an allocation of profile %s is %d machines (nodes = %d)", cmp.Or(detail, "room"), prof.Name, nodes, nodes)
	}
	return n, detail, byLimit
}

// maxSerialBatch is how many machines one submission asks for where the
// cluster takes no arrays: one sbatch each, one after another, so a burst
// still costs one session at a time on the login node.
const maxSerialBatch = 16

// reserveLocked makes the requests for n machines of prof (a multiple of
// its nodes), one submission: a single job for one allocation, an array
// for more. Their worker names share a base (<provisioner>-<profile>-<8
// hex digits>), which the job's tag names; an array task's worker is
// <base>-<task>, and a node of a multi-node allocation adds -n<node>
// (machineName).
func (p *Provisioner) reserveLocked(cfg *settings, prof Profile, n int, now time.Time) []*request {
	base := workerName(cfg.name, prof.Name)
	done := make(chan struct{})
	nodes := max(1, prof.Nodes)
	allocs := n / nodes
	batch := make([]*request, n)
	for i := range batch {
		task, node := -1, -1
		if allocs > 1 {
			task = i / nodes
		}
		if nodes > 1 {
			node = i % nodes
		}
		r := &request{profile: prof.Name, worker: machineName(base, task, node), tag: base, task: task, node: node, nodes: nodes,
			batch: n, since: now, done: done, phase: phaseAwaitingAdoption}
		batch[i] = r
		p.outstanding[r.worker] = r
		p.sub.inflight[r] = true
		if p.adoption.adoptPending {
			p.adoption.mine[r.worker] = true
		}
	}
	if p.adoption.adoptPending {
		p.adoption.mine[base] = true
	}
	return batch
}

// cmpNewest orders requests newest first: later submissions, then higher
// array tasks, so that a burst cut short keeps its oldest machines.
func cmpNewest(a, b *request) int {
	if c := b.since.Compare(a.since); c != 0 {
		return c
	}
	if a.tag != b.tag {
		return strings.Compare(b.tag, a.tag)
	}
	return b.task - a.task
}

// arrivedLocked forgets the requests whose worker has attached: asking
// again for them is somebody else's decision now, and a profile whose
// worker arrived is healthy, so its backoff ends.
func (p *Provisioner) arrivedLocked(attached []string) []string {
	var arrived []string
	var reqs []*request
	for _, w := range attached {
		if r := p.outstanding[w]; r != nil {
			r.phase = phaseArrived
			delete(p.outstanding, w)
			delete(p.holds.backoff, r.profile)
			arrived = append(arrived, w)
			reqs = append(reqs, r)
		}
	}
	p.ends.keepAttachedLocked(reqs)
	return arrived
}

// attachedByProfile counts the attached workers of each profile, from
// their names (profileOf).
func (s *settings) attachedByProfile(attached []string) map[string]int {
	out := map[string]int{}
	for _, w := range attached {
		if profile, why := s.profileOf(w); why == "" {
			out[profile]++
		}
	}
	return out
}

func noFitDetail(n shared.Need) string {
	d := fmt.Sprintf("no profile has %d CPUs and %d GPUs", n.CPUs, n.GPUs)
	if n.RAMMB > 0 {
		d += fmt.Sprintf(" and %d MB", n.RAMMB)
	}
	if n.Label != "" {
		d += fmt.Sprintf(" with label %q", n.Label)
	}
	return d
}

// workerName is unique enough that two submissions never share a name,
// and starts with the provisioner's name and a dash, as the host requires
// before it mints a credential.
func workerName(provisioner, profile string) string {
	var b [4]byte
	rand.Read(b[:]) // Never fails; it crashes the program instead.
	return provisioner + "-" + profile + "-" + hex.EncodeToString(b[:])
}

// arrayRefused reports whether sbatch's words say it will not take the
// --array it was given (arrays disabled, or too large for this cluster).
func arrayRefused(said string) bool {
	s := strings.ToLower(said)
	return strings.Contains(s, "array") && (strings.Contains(s, "invalid") || strings.Contains(s, "maxarraysize") ||
		strings.Contains(s, "too large") || strings.Contains(s, "disabled") || strings.Contains(s, "not supported"))
}

// tasksOf lists the array tasks of live, once each: a multi-node
// allocation's machines share one.
func tasksOf(live []*request) []int {
	var out []int
	for _, r := range live {
		if len(out) == 0 || out[len(out)-1] != r.task {
			out = append(out, r.task)
		}
	}
	return out
}

// batchCap is the most machines one submission asks for: the cluster's
// MaxArraySize, or maxSerialBatch jobs one by one where arrays are
// refused, and at most unknownFactsBurst while the cluster's facts are
// unread (facts.go). p.mu must be held.
func (cf *clusterFacts) batchCap() int {
	if cf.maxArray <= 1 {
		return maxSerialBatch
	}
	if cf.facts == factsUnread {
		return min(cf.maxArray, unknownFactsBurst)
	}
	return cf.maxArray
}

// batchCapDetail says what batchCap allows, and why, for Status.
func (cf *clusterFacts) batchCapDetail() string {
	if cf.maxArray <= 1 {
		return fmt.Sprintf("without job arrays, one submission asks for at most %d machines, one job each", maxSerialBatch)
	}
	if cf.facts == factsUnread {
		return fmt.Sprintf("one submission asks for at most %d until the cluster's MaxArraySize is read", cf.batchCap())
	}
	return fmt.Sprintf("one submission asks for at most %d (the cluster's MaxArraySize)", cf.maxArray)
}
