package slurm

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/internal/queue"
)

// submitter is the submission pipeline: from the requests Provision
// reserved to an sbatch and its outcome, a job id or a failure, each
// submission on a goroutine of its own. Its field is guarded by p.mu.
type submitter struct {
	// p is the provisioner whose books this reads and changes, under p.mu.
	p *Provisioner

	// inflight holds the requests whose submission goroutine has not yet
	// finished, including any Reconcile has already forgotten.
	inflight map[*request]bool
}

// submit mints the batch's credentials and submits it: one job for one
// machine, one array for more, or one job per machine where the cluster
// refuses arrays. It owns the batch until it returns; done is closed only
// after its events are published, so nothing cancels a job before the
// engine has heard of it.
func (su *submitter) submit(ctx context.Context, cfg *settings, host shared.Host, batch []*request) {
	p := su.p
	defer p.wg.Done()
	defer close(batch[0].done)
	defer func() {
		p.mu.Lock()
		for _, r := range batch {
			delete(su.inflight, r)
		}
		p.mu.Unlock()
		batch[0].cancel()
	}()
	prof, _ := cfg.profile(batch[0].profile)

	// A plugin restarted after a crash is asked for machines at once, and
	// its predecessor's jobs are still in the queue. Until the first look
	// at the queue is over (bounded by submit_timeout), nothing is
	// submitted: an earlier run's machines of the profile take the place
	// of as many of these (superseded) instead of leaving them running
	// beside new ones.
	select {
	case <-p.poll.adoptTried:
	case <-ctx.Done():
	}
	p.mu.Lock()
	// Adoption supersedes machines one for one; an allocation of several
	// nodes that lost any of them is superseded whole, since a job of
	// fewer nodes is not what the profile asks for.
	short := map[int]bool{}
	for _, r := range batch {
		if r.phase != phaseAwaitingAdoption && r.phase != phaseSubmitting {
			short[r.task] = true
		}
	}
	var live []*request
	for _, r := range batch {
		if r.nodes > 1 && short[r.task] && r.phase == phaseAwaitingAdoption {
			r.phase = phaseSuperseded
			delete(p.outstanding, r.worker)
		}
		if r.phase == phaseAwaitingAdoption {
			r.phase = phaseSubmitting
		}
		if r.phase == phaseSubmitting {
			live = append(live, r)
		}
	}
	shut := p.shut
	arrays := p.known.maxArray > 1
	p.mu.Unlock()
	if len(live) == 0 {
		return
	}
	if !shut {
		var release func()
		live, release = p.lim.trimToLimit(ctx, cfg, live)
		defer release()
		if len(live) == 0 {
			return
		}
		if live = p.lim.trimToJobCount(ctx, cfg, live); len(live) == 0 {
			return
		}
	}
	if shut {
		// Shutdown began while this batch waited: submitting now would
		// leave jobs for nobody.
		su.submissionFailed(cfg, host, live, "not submitted: the provisioner is shutting down", shared.ErrShutdown)
		return
	}
	if !arrays || !su.submitOne(ctx, cfg, host, prof, live) {
		su.submitEach(ctx, cfg, host, prof, live)
	}
}

// submitEach submits one plain job per allocation, for a cluster that
// does not take arrays. Each allocation's job is tagged with its own name:
// its one machine's worker, or what its nodes' workers share before
// -n<node>.
func (su *submitter) submitEach(ctx context.Context, cfg *settings, host shared.Host, prof Profile, live []*request) {
	p := su.p
	var allocs [][]*request
	p.mu.Lock()
	for _, r := range live {
		alloc, _ := cutNode(r.worker)
		if r.node < 0 {
			alloc = r.worker
		}
		r.tag, r.task = alloc, -1
		if p.adoption.adoptPending {
			p.adoption.mine[r.worker] = true
			p.adoption.mine[alloc] = true
		}
		if n := len(allocs); n > 0 && allocs[n-1][0].tag == alloc {
			allocs[n-1] = append(allocs[n-1], r)
		} else {
			allocs = append(allocs, []*request{r})
		}
	}
	p.mu.Unlock()
	for _, a := range allocs {
		su.submitOne(ctx, cfg, host, prof, a)
	}
}

// submitOne is one sbatch for live: a single job, or an array of
// len(live) tasks. submit_timeout bounds it all: the wait for an ssh
// session, the mints, sbatch and, if its answer was lost, the look for its
// job. A quarter is kept back for that look; what it cannot finish, the
// poller does. It is false, with nothing submitted and nothing reported,
// when the cluster refused the array as such: the caller submits the
// machines one by one instead.
func (su *submitter) submitOne(ctx context.Context, cfg *settings, host shared.Host, prof Profile, live []*request) bool {
	p := su.p
	c := &sbatchCall{su: su, cfg: cfg, host: host, prof: prof, live: live}
	// The login user's RPC budget is waited for before submit_timeout
	// starts, which bounds ssh and sbatch, not a turn (slurm/internal/queue/budget.go). A
	// context ended meanwhile fails the ask below.
	ctx, cancel := context.WithTimeout(p.q.Prepay(ctx), cfg.submitTimeout)
	defer cancel()
	askCtx, cancelAsk := context.WithTimeout(ctx, cfg.submitTimeout-cfg.submitTimeout/4)
	askDeadline, _ := askCtx.Deadline()
	c.job, c.err = c.ask(askCtx)
	cancelAsk()
	if se := (*submitError)(nil); errors.As(c.err, &se) {
		c.detail, c.lost = se.Said, se.AnswerLost
	}
	if c.err != nil && live[0].task >= 0 && !c.lost && arrayRefused(c.detail) {
		c.arraysRefused()
		return false
	}
	if c.err != nil && c.lost {
		p.mu.Lock()
		p.closing.suspect = true
		p.mu.Unlock()
	}
	if c.err != nil && c.lost && p.life.Err() == nil {
		// The connection went before sbatch's answer came back, so the
		// job may well exist, and asking again would start a second
		// one. Its comment names the batch: look.
		if !c.lookForLost(ctx, su.landBy(cfg, time.Until(askDeadline), live[0].since)) {
			return true
		}
	}
	if c.err != nil && !c.lost && su.withdrawForLogin(cfg, live, c.err) {
		return true
	}
	if c.err != nil {
		su.submissionFailed(cfg, host, live, c.detail, c.err)
		return true
	}
	c.queued()
	return true
}

// sbatchCall is one sbatch of submitOne's, from the ask to its outcome:
// the machines it is for (live, in allocation order), what they are
// asked with, and what came of it.
type sbatchCall struct {
	su   *submitter
	cfg  *settings
	host shared.Host
	prof Profile
	live []*request

	// job is the job id sbatch answered, or the one found for it in the
	// queue; the array's for more than one machine.
	job string
	// err is the submission's failure, a *submitError from ask; detail
	// is what Slurm said of it, and lost is set when its answer was lost
	// and its job may exist.
	err    error
	detail string
	lost   bool
}

// arraysRefused records that the cluster does not take arrays after all:
// it says so, and one job per machine is asked for from now on.
func (c *sbatchCall) arraysRefused() {
	p := c.su.p
	p.mu.Lock()
	p.known.maxArray = 1
	p.known.arrayNote = "job arrays refused by the cluster (" + truncateTo(c.detail, 200) + "); submitting one job per machine"
	p.mu.Unlock()
	c.cfg.log.Warn("the cluster refused a job array; submitting one job per machine from now on", "said", c.detail)
}

// lookForLost looks in the queue for the job of a submission whose
// answer was lost, by the comment that names the batch. Found, it is the
// job; a client of another release, or a controller that took no job,
// is the failure it is. Otherwise the job may land yet, until landBy:
// the machines stay outstanding (outcomeUnknown), and it is false, for
// nothing more to do.
func (c *sbatchCall) lookForLost(ctx context.Context, landBy time.Time) bool {
	p, cfg, live := c.su.p, c.cfg, c.live
	rationed := p.q.WaitingTurn(c.err)
	found, lerr := p.q.Lookup(ctx, cfg.comment(live[0].tag))
	switch {
	case lerr != nil && saidZeroBytes(c.detail) && (saidZeroBytes(lerr.Error()) || releaseMismatch(lerr.Error())):
		// Twice the same words from two commands: not a dropped
		// connection but a client of another release, which
		// submitted nothing (refusal.go).
		c.detail = mismatchDetail(cfg.host(), c.detail)
		c.err = fmt.Errorf("%w: %s", errReleaseMismatch, c.detail)
	case found == "" && jobsFull(c.detail):
		// sbatch was retrying into a controller that would take no
		// job when it was cut off, so it had none; the look used
		// what submit_timeout left. Reported as that limit, and a
		// late landing is still looked for (jobcount.go).
		p.watchLate(cfg)
	case found != "":
		cfg.log.Warn("sbatch's answer was lost, but its job is in the queue", "profile", c.prof.Name, "job", found, "worker", live[0].tag, "error", c.err)
		c.job, c.err = found, nil
	default:
		// Not found, or not looked for: it may land yet (landing.go).
		c.su.outcomeUnknown(cfg, live, c.detail, lerr, landBy, rationed)
		return false
	}
	return true
}

// queued records the job of a submission that reached the queue, and
// tells the engine of every machine it is for; a job submitted with the
// relay's old address is cancelled (relayMoved).
func (c *sbatchCall) queued() {
	p, cfg, live, job := c.su.p, c.cfg, c.live, c.job
	p.mu.Lock()
	for _, r := range live {
		r.job = job
		if r.task >= 0 {
			r.job = job + "_" + strconv.Itoa(r.task)
		}
		if r.phase == phaseSubmitting {
			r.phase = phaseQueued
		}
	}
	p.mu.Unlock()
	msg := "asked for a machine"
	switch {
	case live[0].task >= 0:
		msg = "asked for a burst of machines in one job array"
	case len(live) > 1:
		msg = "asked for the machines of one multi-node allocation"
	}
	cfg.log.Info(msg, "profile", c.prof.Name, "job", job, "machines", len(live), "worker", live[0].tag)
	// Back to back, then every acknowledgement: one round trip for the
	// array, where one each cost a thousand-task burst most of a second.
	evs := make([]shared.Event, len(live))
	for i, r := range live {
		evs[i] = shared.Event{Kind: shared.EventWorkerProvisioned, Profile: c.prof.Name, Job: r.job, Worker: r.worker}
	}
	p.publishAll(p.life, cfg, c.host, evs)
	p.mu.Lock()
	via := live[0].via
	p.mu.Unlock()
	if p.relay != nil && p.relay.left(via) {
		c.relayMoved(via)
	}
}

// relayMoved cancels the job of a submission made while the relay moved
// from via, where its workers dial: a port somebody else holds
// (relaytls.go). Its machines leave the books.
func (c *sbatchCall) relayMoved(via string) {
	p, cfg := c.su.p, c.cfg
	p.mu.Lock()
	var refs []jobRef
	seen := map[string]bool{}
	for _, r := range c.live {
		p.dropLocked(r.worker)
		if !seen[r.job] {
			seen[r.job] = true
			refs = append(refs, jobRef{job: r.job, profile: r.profile, worker: r.worker,
				why: "the relay moved from " + via + ", where this job's workers dial, while it was submitted; it is cancelled and their credentials revoked"})
		} else {
			refs[len(refs)-1].others = append(refs[len(refs)-1].others, r.worker)
		}
	}
	p.mu.Unlock()
	cfg.log.Error("a job was submitted with the relay's old address: cancelling it", "profile", c.prof.Name, "job", c.job, "old", via)
	p.cancels.cancelJobs(p.life, cfg, c.host, refs, "cancelled a job whose workers dial the relay's old address")
}

// ask does the talking for submitOne and returns the job id (the array's
// for more than one machine), or a *submitError.
func (c *sbatchCall) ask(ctx context.Context) (string, error) {
	p, cfg, prof, live := c.su.p, c.cfg, c.prof, c.live
	keep := func(s string) string { return s }
	if c.host == nil {
		err := fmt.Errorf("cannot mint a credential for worker %s: %w", live[0].worker, shared.ErrNoHost)
		return "", failure(err, err.Error(), false, keep)
	}
	url, pin, err := c.reach(ctx)
	if err != nil {
		return "", err
	}
	if _, err := p.files.ensureLogDir(ctx, cfg); err != nil {
		return "", failure(err, err.Error(), false, keep)
	}
	if _, err := p.files.ensureWorker(ctx, cfg); err != nil {
		err = fmt.Errorf("not submitted: %w", err)
		return "", failure(err, err.Error(), false, keep)
	}
	tokens, err := c.mint(ctx)
	if err != nil {
		return "", err
	}
	// Every credential of the script, its siblings' too, for explain to
	// redact from the job's output: a prerun's set -x, or a cat "$0",
	// prints them (issue 24, item 6).
	p.mu.Lock()
	for _, r := range live {
		r.secrets = tokens
	}
	p.mu.Unlock()

	// The machines come in allocation order, an allocation's nodes
	// together (reserveLocked), so the tokens group by task.
	nodes := max(1, live[0].nodes)
	var perAlloc [][]string
	for i := 0; i < len(tokens); i += nodes {
		perAlloc = append(perAlloc, tokens[i:min(i+nodes, len(tokens))])
	}
	var tasks []int
	if live[0].task >= 0 {
		tasks = tasksOf(live)
	}
	script := c.su.script(prof, url, pin, live[0].tag, tasks, perAlloc)
	job, err := p.q.Submit(ctx, script)
	if err != nil {
		return "", c.sbatchFailed(err, tokens)
	}
	return job, nil
}

// reach is how the workers reach the engine: engine_url, or the relay,
// whose address each request records (via). Workers dial the relay,
// which must be up for them to; nothing is minted or submitted until it
// is. Its error is a *submitError.
func (c *sbatchCall) reach(ctx context.Context) (url, pin string, err error) {
	p := c.su.p
	if p.relay == nil {
		return c.cfg.EngineURL, "", nil
	}
	d, err := p.relay.dial(ctx)
	if err != nil {
		err = fmt.Errorf("not submitted: %w", err)
		return "", "", failure(err, err.Error(), false, func(s string) string { return s })
	}
	p.mu.Lock()
	for _, r := range c.live {
		r.via = d.addr
	}
	p.mu.Unlock()
	return d.url, d.pin, nil
}

// mint is the credentials of the machines, one each, in their order. One
// credential a task, asked for in one round trip a thousand (contract
// 2.4; a host before it is asked one at a time, which at a thousand
// tasks took longer than the sbatch itself). Its error is a
// *submitError.
func (c *sbatchCall) mint(ctx context.Context) ([]string, error) {
	p, cfg, prof, live := c.su.p, c.cfg, c.prof, c.live
	keep := func(s string) string { return s }
	mreq := &shared.MintCredentialsRequest{Items: make([]*shared.MintCredentialRequest, len(live))}
	ttl := cfg.credentialTTL(prof, p.now())
	// The shape the engine was told, which for an exclusive profile is
	// its node's: the most its worker may offer.
	sh := p.mintShape(prof)
	for i, r := range live {
		mreq.Items[i] = &shared.MintCredentialRequest{
			Worker: r.worker, TTL: ttl, CPUs: sh.CPUs, GPUs: sh.GPUs, RAMMB: sh.RAMMB, Labels: prof.Labels,
		}
	}
	mctx, cancel := context.WithTimeout(ctx, cfg.submitTimeout)
	minted, err := shared.MintCredentials(mctx, c.host, mreq)
	cancel()
	if err != nil {
		err = fmt.Errorf("minting credentials for %d workers from %s: %w", len(live), live[0].worker, err)
		return nil, failure(err, err.Error(), false, keep)
	}
	tokens := make([]string, len(live))
	for i, r := range live {
		cred, err := minted.Items[i].Credential, minted.Items[i].Err
		if err == nil && (cred == nil || cred.Token == "") {
			err = errors.New("the host returned an empty credential")
		}
		if err != nil {
			err = fmt.Errorf("minting a credential for worker %s: %w", r.worker, err)
			return nil, failure(err, err.Error(), false, keep)
		}
		tokens[i] = cred.Token
	}
	return tokens, nil
}

// sbatchFailed is the *submitError of a failed sbatch, with what it said
// and whether its answer was lost. sbatch does not echo the script, but
// a wrapper on the login node might, and no token may reach a log or an
// event (redact.go).
func (c *sbatchCall) sbatchFailed(err error, tokens []string) error {
	redact := newRedactor(tokens).scrub
	if ce := (*queue.CommandError)(nil); errors.As(err, &ce) {
		said := firstNonEmpty(string(ce.Stderr), string(ce.Stdout), ce.Err.Error())
		if releaseMismatch(said) {
			said = mismatchDetail(c.cfg.host(), said)
		}
		said += deadlineHint(c.prof, said) + submitRuleHint(said)
		return failure(ce.Err, said, answerLost(ce.Err, ce.Stderr), redact)
	}
	err = fmt.Errorf("sbatch on %s: %w", c.cfg.host(), err)
	return failure(err, err.Error(), false, redact)
}

// submissionFailed is where every failed submission ends: it records the
// error, drops the reservation so the profile can be asked for again,
// logs, and tells the engine. A controller that takes no job, the site's
// throttle and an accounting limit are weather, held without backoff
// (never for a client of another release, errReleaseMismatch, whatever
// its words); anything else counts towards the profile's backoff.
func (su *submitter) submissionFailed(cfg *settings, host shared.Host, live []*request, detail string, err error) {
	weather := !errors.Is(err, errReleaseMismatch)
	_, limited := limitRefusal(detail)
	switch {
	case weather && jobsFull(detail):
		su.failClusterFull(cfg, host, live, detail)
	case weather && throttled(detail):
		su.failThrottled(cfg, host, live, detail)
	case weather && limited:
		su.failLimit(cfg, host, live, detail)
	default:
		su.failProfile(cfg, host, live, detail, err)
	}
}

// withdrawLocked takes the requests of live out of the books, each one
// still there, failed unless its worker arrived. p.mu must be held.
func (su *submitter) withdrawLocked(live []*request) {
	p := su.p
	for _, r := range live {
		if p.outstanding[r.worker] == r {
			delete(p.outstanding, r.worker)
		}
		if r.phase != phaseArrived {
			r.phase = phaseFailed
		}
	}
}

// failClusterFull fails a submission slurmctld would not take a job for
// (MaxJobCount, or busy).
func (su *submitter) failClusterFull(cfg *settings, host shared.Host, live []*request, detail string) {
	p := su.p
	p.mu.Lock()
	p.lastErr = detail
	su.withdrawLocked(live)
	// Weather for the whole cluster: no backoff; held for
	// jobsFullWait, so the next submission does not wait out
	// submit_timeout into the same wall at once (jobcount.go).
	until := p.now().Add(jobsFullWait)
	p.holds.clusterFull = hold{kind: holdClusterFull, until: until, reason: jobsFullDetail(p.known.maxJobs, detail, until)}
	held := p.holds.clusterFull.reason
	p.holds.binding = hold{kind: holdClusterFull, reason: held}
	p.lastErr = truncate(held)
	p.metrics.failedMachines(live[0].profile, shared.FailureLimitReached, len(live))
	p.mu.Unlock()
	cfg.log.Warn("slurmctld would not take the job (MaxJobCount, or busy); asking again as jobs leave", "profile", live[0].profile,
		"machines", len(live), "output", detail)
	evs := make([]shared.Event, len(live))
	for i, r := range live {
		evs[i] = shared.Event{Kind: shared.EventWorkerProvisionFailed, Profile: r.profile, Worker: r.worker, Detail: held, Class: shared.FailureLimitReached}
	}
	p.publishAll(p.life, cfg, host, evs)
}

// failThrottled fails a submission the site's submit rule throttled
// (submitrules.go).
func (su *submitter) failThrottled(cfg *settings, host shared.Host, live []*request, detail string) {
	p := su.p
	p.mu.Lock()
	p.lastErr = detail
	su.withdrawLocked(live)
	// Weather for the whole provisioner, with its wait: no backoff,
	// no limit learnt (submitrules.go).
	now := p.now()
	first := !p.holds.throttled.on(now)
	until := now.Add(throttleWait)
	held := throttleDetail(detail, until)
	p.holds.throttled = hold{kind: holdThrottled, until: until, reason: held}
	p.lastErr = truncate(held)
	p.metrics.failedMachines(live[0].profile, shared.FailureLimitReached, len(live))
	p.mu.Unlock()
	if first {
		cfg.log.Warn("the site's submit rule throttles submissions; asking again when it gives one back", "profile", live[0].profile,
			"machines", len(live), "until", until.UTC().Format(time.RFC3339), "output", detail)
	}
	for _, r := range live {
		p.publish(p.life, cfg, host, shared.Event{Kind: shared.EventWorkerProvisionFailed, Profile: r.profile, Worker: r.worker, Detail: held, Class: shared.FailureLimitReached})
	}
}

// failLimit fails a submission sbatch refused for the login user's
// accounting limits (limits.go).
func (su *submitter) failLimit(cfg *settings, host shared.Host, live []*request, detail string) {
	p := su.p
	which, _ := limitRefusal(detail)
	p.mu.Lock()
	p.lastErr = detail
	su.withdrawLocked(live)
	// Weather that clears as jobs end: no backoff, and a smaller
	// burst next time (limits.go).
	now := p.now()
	p.lim.learnFromRefusalLocked(cfg, allocationsOf(live), -1, which, now)
	p.holds.binding = hold{kind: holdLimitReached, reason: fmt.Sprintf("%s: Slurm refused a submission of %d machine(s) (%s); at most %d of the user's jobs or array tasks in the queue until %s",
		limitReached, len(live), which, p.lim.limits.learned, p.lim.limits.learnedUntil.UTC().Format(time.RFC3339))}
	p.metrics.failedMachines(live[0].profile, shared.FailureLimitReached, len(live))
	p.mu.Unlock()
	cfg.log.Warn("sbatch refused for an accounting limit; asking for fewer machines as the user's jobs end", "profile", live[0].profile,
		"worker", live[0].tag, "machines", len(live), "limit", which, "output", detail)
	for _, r := range live {
		p.publish(p.life, cfg, host, shared.Event{Kind: shared.EventWorkerProvisionFailed, Profile: r.profile, Worker: r.worker, Detail: limitReached + ": " + detail})
	}
	p.poll.wake()
}

// failProfile fails a submission for its profile: the failure counts
// towards its backoff, and a refusal that waiting will not change holds
// it as misconfigured.
func (su *submitter) failProfile(cfg *settings, host shared.Host, live []*request, detail string, err error) {
	p := su.p
	p.mu.Lock()
	p.lastErr = detail
	su.withdrawLocked(live)
	// One failed sbatch is one failure, however many machines it was for.
	class := submitFailureClass(err, detail)
	var held string
	if class == shared.FailureMisconfigured {
		p.holds.markMisconfiguredLocked(live[0].profile, detail)
		held = misconfiguredDetail(live[0].profile, p.holds.backoff[live[0].profile])
	} else {
		p.holds.countFailureLocked(live[0].profile, detail)
	}
	p.metrics.failedMachines(live[0].profile, class, len(live))
	p.mu.Unlock()
	args := []any{"profile", live[0].profile, "worker", live[0].tag, "machines", len(live), "error", err}
	if detail != err.Error() {
		args = append(args, "output", detail)
	}
	if held != "" {
		// The one loud line: the profile is not asked for again, so
		// this is said once, not once a retry.
		cfg.log.Error("profile misconfigured; Slurm refused it for good", append(args, "hold", held)...)
	} else {
		cfg.log.Error("could not ask for a machine", args...)
	}
	for _, r := range live {
		p.publish(p.life, cfg, host, shared.Event{Kind: shared.EventWorkerProvisionFailed, Profile: r.profile, Worker: r.worker, Detail: detail, Class: class})
	}
}

// outcomeUnknown keeps a request whose sbatch's answer was lost and whose
// job was not found, or could not be looked for: it stays outstanding, so
// that the profile is not asked for twice, until the poller finds its job
// or it can no longer land (landBy, landing.go).
func (su *submitter) outcomeUnknown(cfg *settings, live []*request, detail string, lookupErr error, landBy time.Time, rationed bool) {
	p := su.p
	p.mu.Lock()
	for _, r := range live {
		if r.phase == phaseSubmitting {
			r.phase, r.landBy, r.rationed = phaseAnswerLost, landBy, rationed
		}
	}
	switch {
	case rationed:
		// A rationed sbatch is waiting, not failing (slurm/internal/queue/ratelimit.go).
	case lookupErr != nil:
		p.lastErr = truncate(detail + "; then could not look for its job: " + lookupErr.Error())
	default:
		p.lastErr = truncate(detail + "; its job is not in the queue yet, and is looked for until it can no longer land")
	}
	p.mu.Unlock()
	args := []any{"profile", live[0].profile, "worker", live[0].tag, "machines", len(live), "error", detail,
		"until", landBy.UTC().Format(time.RFC3339)}
	if lookupErr != nil {
		args = append(args, "lookup_error", lookupErr)
	}
	cfg.log.Warn("sbatch's answer was lost and its job is not in the queue yet; looking for it each poll until it can no longer land", args...)
	p.poll.wake()
}
