package slurm

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/fluksio/provision/slurm/internal/queue"
)

// Accounting limits: what a site allows the login user, and bursts that
// fit it.
//
// Real sites account every job in slurmdbd and cap each user, with
// AccountingStorageEnforce=associations,limits,qos. The cap that bites a
// burst is MaxSubmitJobs (of the user's association, or MaxSubmitJobsPU
// of its QOS): how many jobs the user may have in the queue, pending or
// running, each array task counting as one. Slurm refuses an array whole
// when its tasks would pass it ("AssocMaxSubmitJobLimit", "Job violates
// accounting/QOS policy"), so a provisioner that asks for the whole
// shortfall in one array gets nothing at all where asking for the room
// left would have got that much. Measured before this file: a burst of 10
// under MaxSubmitJobs = 5 got 0 machines in 40 s, the profile backed off
// and the router failed over to another profile behind the same login,
// which the same limit refused.
//
// So the provisioner reads the limits that apply to its user, and never
// asks for more than fits:
//
//   - The limits are read with sacctmgr, as the login user, over the same
//     ssh as everything else: `show assoc where user=U` (MaxSubmitJobs,
//     MaxJobs, GrpSubmitJobs, GrpJobs, GrpTRES cpu) and `show qos` for
//     the QOSes those associations name (MaxSubmitJobsPU, MaxJobsPU,
//     MaxTRESPU cpu). Where several rows apply (accounts, partitions),
//     the smallest wins: a provisioner cannot tell which account a site's
//     defaults put a job in, and asking for too little costs a wait,
//     asking for too much costs the whole burst. They are read at
//     Configure, by every Check (validate -check shows them), and again
//     when older than limitsRefresh, so a site that raises a limit is
//     heard within minutes without a restart.
//   - The room is the submit limit less the user's jobs and array tasks in
//     the queue: all of them, not only this provisioner's, since the limit
//     is the user's. They are counted with one squeue --me just before
//     each submission, while submissions under a limit run one at a time
//     (limitTurn), and in between estimated from the books: the others'
//     jobs as last counted plus this provisioner's as they stand now. A
//     burst is trimmed to the room; the rest of the demand waits, answered
//     "capped" with the limit's name, which the engine's router does not
//     fail over on (a profile behind the same login meets the same
//     limit). Nothing backs off: the room comes back as jobs end.
//   - MaxJobs and cpu limits do not refuse a submission: jobs beyond them
//     pend until others end (AssocMaxJobsLimit and the like, which
//     poll.go knows clear by themselves). They are shown, and validate
//     warns when max_workers is above them, but bursts are not trimmed to
//     them: a pending job is a place in the queue.
//   - A refusal for a limit all the same (an account's group limit shared
//     with other users, a QOS the site changed, a cluster whose limits
//     cannot be read) is "limit reached": weather, without backoff or
//     failover. The provisioner learns a ceiling from it: half the refused
//     burst above what the user had queued, or nothing more than that for
//     a single job, held for limitLearnedFor. A burst of 10 under an
//     unknown limit of 5 is refused once and then asks for 5.
//   - Where accounting is absent or sacctmgr refuses the user, that is
//     said once (a log line and a Status note), and the room is learned
//     from refusals alone.

const (
	// limitsRefresh is how old the limits read may get before they are
	// read again; a read costs one ssh call, made only when a submission
	// or a capped demand needs the room.
	limitsRefresh = 5 * time.Minute
	// limitRecount is how old the user's queue count may get while a
	// limit holds the demand back and nothing is submitted: the other
	// jobs of the user, which the books do not see end, are counted again
	// at most this often.
	limitRecount = 20 * time.Second
	// limitsRetry is how soon limits are asked for again when the login
	// node did not answer (sacctmgr never ran): sooner than
	// limitsRefresh, so that an outage at start does not leave the limits
	// unknown for minutes, and not on every submission, each of which
	// would wait for the same timeout.
	limitsRetry = 30 * time.Second
	// limitLearnedFor is how long a ceiling learned from a refusal holds.
	// Long enough not to be refused again and again, short enough that a
	// limit the site raises is found again.
	limitLearnedFor = 10 * time.Minute
	// limitReached starts every answer and note about a limit that binds,
	// so that an operator (and a test) can find them.
	limitReached = "limit reached"
)

// limitState is what the provisioner knows of the limits. Guarded by
// Provisioner.mu.
type limitState struct {
	// readAt is when sacctmgr was last asked; lim is what it said,
	// unavailable why it could not say (accounting absent, refused).
	readAt      time.Time
	lim         queue.UserLimits
	unavailable string
	// told is set once unavailable has been logged.
	told bool
	// queued is the user's jobs and array tasks in the queue at
	// countedAt, ours how many of them were this provisioner's.
	queued, ours int
	countedAt    time.Time
	// learned is a ceiling on the user's queue learned from a refusal for
	// a limit, held until learnedUntil; learnedWhat is Slurm's words.
	learned      int
	learnedUntil time.Time
	learnedWhat  string
	// counting is set while a recount runs on a goroutine of its own.
	counting bool
}

// oursLocked is how many jobs and array tasks of this provisioner are in
// the queue or on their way to it: each allocation on its way, and each
// attached worker's (a running job counts against a submit limit until
// it ends). p.mu must be held.
func (p *Provisioner) oursLocked(cfg *settings, queuedOnly bool) int {
	n := 0
	for _, prof := range cfg.Profiles {
		machines := p.workers.attached[prof.Name]
		for _, r := range p.outstanding {
			if r.profile == prof.Name && (!queuedOnly || r.phase == phaseQueued) {
				machines++
			}
		}
		n += ceilDiv(machines, max(1, prof.Nodes))
	}
	return n
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// sacctmgrAnswered reports whether a failed read of the limits got an
// answer from sacctmgr (no accounting, a refusal), which will not change
// soon, rather than from ssh or a timeout.
func sacctmgrAnswered(err error) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee) && ee.ExitCode() != 255 && !errors.Is(err, context.DeadlineExceeded)
}

// limitWords are sbatch's words for a refusal by an accounting limit
// that clears as jobs end, lower case (Slurm 22.05 to 26.05).
var limitWords = []string{
	"job violates accounting/qos policy",
	"assocmaxsubmitjob",
	"qosmaxsubmitjob",
	"assocgrpsubmitjob",
	"qosgrpsubmitjob",
	"assocmaxjobs",
	"qosmaxjobs",
	"assocgrp",
	"qosgrp",
	"job submit limit",
}

// limitRefusal reports whether sbatch refused for a limit that clears as
// jobs end, and names it: the reason word Slurm prints (such as
// AssocMaxSubmitJobLimit) when there is one.
func limitRefusal(said string) (string, bool) {
	s := strings.ToLower(said)
	hit := false
	for _, w := range limitWords {
		hit = hit || strings.Contains(s, w)
	}
	if !hit {
		return "", false
	}
	for _, f := range strings.FieldsFunc(said, func(r rune) bool {
		return r == ' ' || r == '\n' || r == ':' || r == '(' || r == ')' || r == ','
	}) {
		if (strings.HasPrefix(f, "Assoc") || strings.HasPrefix(f, "QOS")) && strings.HasSuffix(f, "Limit") {
			return f, true
		}
	}
	return "Job violates accounting/QOS policy", true
}

// groupAllocations splits live into its allocations, in order: the
// machines of one array task (or of the one job) together.
func groupAllocations(live []*request) [][]*request {
	var out [][]*request
	for i, r := range live {
		if i > 0 && r.task == live[i-1].task {
			out[len(out)-1] = append(out[len(out)-1], r)
			continue
		}
		out = append(out, []*request{r})
	}
	return out
}

func allocationsOf(live []*request) int { return len(groupAllocations(live)) }

// limiter fits submissions to the login user's accounting limits and the
// controller's MaxJobCount: what it last read of them, and the turns
// that keep two bursts from taking the same room.
type limiter struct {
	// p is the provisioner whose books this reads and changes, under p.mu.
	p *Provisioner

	// limitTurn holds one token while a submission under an accounting
	// limit counts the user's queue and submits, so that two profiles'
	// bursts do not both take the same room (limits.go).
	limitTurn chan struct{}
	// readingLimits holds one token while sacctmgr is being asked, so
	// that the poller's read at start and a first submission's do not
	// both ask.
	readingLimits chan struct{}
	// limits are the accounting limits of the login user and the room
	// they leave; guarded by p.mu.
	limits limitState
}

// ceilingLocked is the most jobs and array tasks the user may have in the
// queue, and what says so; ok is false when nothing is known to cap it.
// p.mu must be held.
func (lm *limiter) ceilingLocked(now time.Time) (queue.Limit, bool) {
	c := lm.limits.lim.Submit
	if now.Before(lm.limits.learnedUntil) {
		c.Lower(lm.limits.learned, "what Slurm last refused ("+lm.limits.learnedWhat+")")
	}
	return c, c.Set()
}

// limitRoomLocked is how many more jobs and array tasks the user may put
// in the queue by the books, and the words that say why; ok is false when
// no limit is known. p.mu must be held.
func (lm *limiter) limitRoomLocked(cfg *settings, now time.Time) (room int, detail string, ok bool) {
	p := lm.p
	c, ok := lm.ceilingLocked(now)
	if !ok {
		return 0, "", false
	}
	others := max(0, lm.limits.queued-lm.limits.ours)
	ours := p.oursLocked(cfg, false)
	room = max(0, c.N-others-ours)
	detail = fmt.Sprintf("%s: %s; the user has %d jobs or array tasks in the queue or on their way (%d of them this provisioner's); the rest are asked for as they end",
		limitReached, c, others+ours, ours)
	return room, detail, true
}

// refreshLimits reads the limits again when they are older than
// limitsRefresh (or never read), and says once when they cannot be.
func (lm *limiter) refreshLimits(ctx context.Context, cfg *settings) {
	p := lm.p
	select {
	case lm.readingLimits <- struct{}{}:
		defer func() { <-lm.readingLimits }()
	case <-ctx.Done():
		return
	}
	p.mu.Lock()
	due := lm.limits.readAt.IsZero() || p.now().Sub(lm.limits.readAt) >= limitsRefresh
	cluster := p.known.cluster
	p.mu.Unlock()
	if !due {
		return
	}
	lim, err := p.q.Limits(ctx, cluster)
	if ctx.Err() != nil {
		return
	}
	p.mu.Lock()
	lm.limits.readAt = p.now()
	if err != nil && !sacctmgrAnswered(err) {
		lm.limits.readAt = p.now().Add(limitsRetry - limitsRefresh)
	}
	tell := false
	var was queue.UserLimits
	if err != nil {
		lm.limits.unavailable = truncate(err.Error())
		tell = !lm.limits.told
		lm.limits.told = true
		// The limits last read stay: a failed read says nothing new.
	} else {
		was = lm.limits.lim
		lm.limits.lim, lm.limits.unavailable, lm.limits.told = lim, "", false
	}
	p.mu.Unlock()
	switch {
	case tell:
		// Info, not a warning: many clusters run without accounting,
		// and a provisioner that learns from refusals works there.
		cfg.log.Info("cannot read the accounting limits of the login user; the room a limit leaves is learned from sbatch's refusals instead", "error", err)
	case err == nil && (lim.Submit != was.Submit || lim.Jobs != was.Jobs || lim.CPUs != was.CPUs):
		cfg.log.Info("accounting limits of the login user", "submit", lim.Submit.String(), "running", lim.Jobs.String(), "cpus", lim.CPUs.String())
	}
}

// recount counts the user's queue and records it beside this
// provisioner's share of it.
func (lm *limiter) recount(ctx context.Context, cfg *settings) (int, error) {
	p := lm.p
	n, err := p.q.CountQueued(ctx)
	if err != nil {
		return 0, err
	}
	p.mu.Lock()
	lm.limits.queued, lm.limits.ours, lm.limits.countedAt = n, p.oursLocked(cfg, true), p.now()
	p.mu.Unlock()
	return n, nil
}

// recountLaterLocked counts the user's queue again on a goroutine of its own,
// when a limit holds the demand back and the count is older than
// limitRecount: jobs of the user's that are not this provisioner's end
// without the books seeing it. p.mu must be held.
func (lm *limiter) recountLaterLocked(cfg *settings, now time.Time) {
	p := lm.p
	if lm.limits.counting || p.shut || now.Sub(lm.limits.countedAt) < limitRecount {
		return
	}
	lm.limits.counting = true
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		ctx, cancel := context.WithTimeout(p.life, cfg.submitTimeout)
		defer cancel()
		lm.refreshLimits(ctx, cfg)
		if _, err := lm.recount(ctx, cfg); err != nil {
			cfg.log.Debug("could not count the user's jobs for a limit", "error", err)
		}
		p.mu.Lock()
		lm.limits.counting = false
		p.mu.Unlock()
	}()
}

// fitToLimit is called by a submission before its sbatch, holding
// limitTurn when a limit is known: it counts the user's queue and returns
// how many of its allocs allocations fit, all of them when no limit is
// known, with the count (-1 when it failed) and the ceiling.
func (lm *limiter) fitToLimit(ctx context.Context, cfg *settings, allocs int) (fit, queued int, c queue.Limit) {
	p := lm.p
	p.mu.Lock()
	c, ok := lm.ceilingLocked(p.now())
	p.mu.Unlock()
	if !ok {
		return allocs, -1, c
	}
	n, err := lm.recount(ctx, cfg)
	if err != nil {
		// Without a count the books' estimate stands; sbatch refuses
		// what does not fit, and that is learned from.
		cfg.log.Debug("could not count the user's jobs before a submission", "error", err)
		p.mu.Lock()
		room, _, _ := lm.limitRoomLocked(cfg, p.now())
		p.mu.Unlock()
		// The books count this submission's own machines already.
		return min(allocs, room+allocs), -1, c
	}
	return min(allocs, max(0, c.N-n)), n, c
}

// learnFromRefusalLocked lowers the ceiling after sbatch refused allocs
// allocations for a limit while the user had queued in the queue (-1:
// not counted, then the books' estimate). p.mu must be held.
func (lm *limiter) learnFromRefusalLocked(cfg *settings, allocs, queued int, which string, now time.Time) {
	p := lm.p
	if queued < 0 {
		queued = max(0, lm.limits.queued-lm.limits.ours) + p.oursLocked(cfg, true)
	}
	learned := queued + allocs/2
	if allocs <= 1 {
		learned = queued
	}
	if now.Before(lm.limits.learnedUntil) && lm.limits.learned < learned {
		learned = lm.limits.learned
	}
	lm.limits.learned, lm.limits.learnedUntil, lm.limits.learnedWhat = learned, now.Add(limitLearnedFor), which
	lm.limits.queued, lm.limits.ours, lm.limits.countedAt = queued, p.oursLocked(cfg, true), now
}

// limitNotesLocked are Status's notes about limits. p.mu must be held.
func (lm *limiter) limitNotesLocked(now time.Time) []string {
	p := lm.p
	var notes []string
	l := lm.limits
	switch {
	case l.unavailable != "":
		notes = append(notes, "accounting limits unknown ("+l.unavailable+"); the room a limit leaves is learned from sbatch's refusals")
	case l.lim.Submit.Set() || l.lim.Jobs.Set() || l.lim.CPUs.Set():
		notes = append(notes, fmt.Sprintf("accounting limits of the login user: in the queue %s; running %s; cpus %s", l.lim.Submit, l.lim.Jobs, l.lim.CPUs))
	}
	if b := p.holds.binding; b.kind != holdNone {
		notes = append(notes, b.reason)
	} else if now.Before(l.learnedUntil) {
		notes = append(notes, fmt.Sprintf("%s: Slurm refused a submission (%s); at most %d of the user's jobs or array tasks in the queue until %s",
			limitReached, l.learnedWhat, l.learned, l.learnedUntil.UTC().Format(time.RFC3339)))
	}
	return notes
}

// trimToLimit fits a submission to the room an accounting limit leaves:
// with a limit known, it takes limitTurn (release gives it back, once
// the submission is over), counts the user's queue, and takes the
// allocations that do not fit out of the books, unsubmitted and
// unannounced, so that the demand asks for them again as room comes
// back. Without a limit it changes nothing.
func (lm *limiter) trimToLimit(ctx context.Context, cfg *settings, live []*request) (kept []*request, release func()) {
	p := lm.p
	lm.refreshLimits(ctx, cfg)
	p.mu.Lock()
	_, limited := lm.ceilingLocked(p.now())
	p.mu.Unlock()
	if !limited {
		return live, func() {}
	}
	select {
	case lm.limitTurn <- struct{}{}:
	case <-ctx.Done():
		// The submission fails on its context anyway.
		return live, func() {}
	}
	release = func() { <-lm.limitTurn }
	allocs := groupAllocations(live)
	fit, queued, c := lm.fitToLimit(ctx, cfg, len(allocs))
	if fit >= len(allocs) {
		return live, release
	}
	p.mu.Lock()
	kept = p.keepAllocationsLocked(allocs, fit)
	detail := fmt.Sprintf("%s: %s; the user had %d jobs or array tasks in the queue, so %d of %d machines were asked for; the rest are asked for as jobs end",
		limitReached, c, queued, len(kept), len(live))
	p.holds.binding = hold{kind: holdLimitReached, reason: detail}
	p.mu.Unlock()
	cfg.log.Info("trimmed a burst to the room the user's accounting limit leaves; the rest is asked for as jobs end",
		"profile", live[0].profile, "machines", len(live), "submitting", len(kept), "queued", queued, "limit", detail)
	return kept, release
}

// trimToJobCount fits a submission under the cluster's MaxJobCount: when
// the books bring it within half of the ceiling, it counts the
// controller's jobs and takes the allocations that do not fit out of the
// books, unsubmitted and unannounced, so that the demand asks for them
// again as jobs leave.
func (lm *limiter) trimToJobCount(ctx context.Context, cfg *settings, live []*request) []*request {
	p := lm.p
	p.mu.Lock()
	ceiling := p.known.maxJobs
	ours := p.oursLocked(cfg, false)
	p.mu.Unlock()
	allocs := groupAllocations(live)
	if ceiling <= 0 || 2*ours < ceiling {
		return live
	}
	n, err := p.q.CountAll(ctx)
	if err != nil {
		// Without a count, sbatch says, within submit_timeout.
		cfg.log.Debug("could not count the controller's jobs before a submission", "error", err)
		return live
	}
	// slurmctld refuses when its jobs and the new ones would reach the
	// ceiling.
	fit := max(0, ceiling-1-n)
	if fit >= len(allocs) {
		return live
	}
	p.mu.Lock()
	kept := p.keepAllocationsLocked(allocs, fit)
	detail := fmt.Sprintf("%s: the cluster's MaxJobCount = %d; slurmctld holds %d jobs and array tasks (every user's, finished ones until MinJobAge), so %d of %d machines were asked for; the rest are asked for as jobs leave",
		limitReached, ceiling, n, len(kept), len(live))
	p.holds.binding = hold{kind: holdClusterFull, reason: detail}
	// The rest would be asked for at once, counted again and trimmed
	// again: held for jobsFullWait instead, as after sbatch's own words.
	p.holds.clusterFull = hold{kind: holdClusterFull, until: p.now().Add(jobsFullWait), reason: detail}
	p.mu.Unlock()
	cfg.log.Info("trimmed a burst to the room the cluster's MaxJobCount leaves; the rest is asked for as jobs leave",
		"profile", live[0].profile, "machines", len(live), "submitting", len(kept), "jobs", n, "max_job_count", ceiling)
	return kept
}
