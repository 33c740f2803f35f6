package slurm

import (
	"context"
	"sync"
	"time"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/internal/queue"
)

// The poller: the goroutine that reads the queue every poll_interval
// while anything is outstanding and hands what it read to the decisions
// (judge, adopt, endedUnder, goneFromQueue in poll.go and ends.go). Its
// own state is here, apart from the books: how it is woken and stopped,
// whether the queue is down, and how its light polls alternate with full
// ones (lightpoll.go).

// poller is the Provisioner's poll loop and its state.
type poller struct {
	// p is the provisioner whose books each cycle reads and changes,
	// under p.mu.
	p *Provisioner
	// ctx derives from p.life and is cancelled (stop) when Shutdown
	// begins: it stops the poller, the squeue it may be running, and
	// adoption.
	ctx  context.Context
	stop context.CancelFunc
	// poke wakes the poller when something becomes outstanding. It holds
	// one token, so a poke is never lost and never blocks.
	poke chan struct{}
	// adoptTried is closed once the first adoption attempt is over, found
	// something or not; tests wait on it. Made by newPoller and never
	// replaced.
	adoptTried chan struct{}
	// startReads is closed once Configure's other reads at start (the
	// accounting limits and log_dir, beside adoption) are over, done or
	// not; tests wait on it. Made by newPoller, never replaced; never
	// closed when Shutdown comes before them.
	startReads chan struct{}

	// The fields below are guarded by p.mu: tests run cycles (once) of
	// their own beside the poller's goroutine.

	// queueDown is set while reading the queue fails, so that an outage
	// is logged once.
	queueDown bool
	// queueZeroBytes counts the polls in a row whose squeue got "Zero
	// Bytes were transmitted or received": more than one is a client of
	// another release, not a dropped connection (refusal.go).
	queueZeroBytes int
	// queueMismatchTold is set once that has been logged, until the
	// queue can be read again.
	queueMismatchTold bool
	// noLightPoll is set once squeue refused --only-job-state; every poll
	// is full from then on. cyclesSinceFull counts the light polls since
	// the last full one (lightpoll.go).
	noLightPoll     bool
	cyclesSinceFull int
	// idleAdoptFailures counts poll cycles in a row that could not read
	// the queue for adoption, or the start-up facts, while nothing else
	// was outstanding; after maxIdleAdoptFailures the poller rests until
	// there is demand.
	idleAdoptFailures int
}

// newPoller is p's poller, stopped by nothing yet and started by
// Configure (run).
func newPoller(p *Provisioner, life context.Context) poller {
	ctx, stop := context.WithCancel(life)
	return poller{p: p, ctx: ctx, stop: stop, poke: make(chan struct{}, 1),
		adoptTried: make(chan struct{}), startReads: make(chan struct{})}
}

// wake tells an idle poller that something is outstanding.
func (pl *poller) wake() {
	select {
	case pl.poke <- struct{}{}:
	default:
	}
}

// wanted reports whether the poller has anything to do: jobs to
// watch or to cancel, or adoption still to do (within bounds).
func (pl *poller) wanted() bool {
	p := pl.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.shut {
		return false
	}
	if len(p.outstanding) > 0 || len(p.cancels.cancelling) > 0 || len(p.ends.attachedJobs) > 0 || len(p.ends.departed) > 0 || p.now().Before(p.watchUntil) {
		return true
	}
	if p.cfg != nil {
		// A login a person has to open is tried when the transport's
		// backoff lets it (once), so that the provisioner carries on
		// by itself when it is back.
		if needed, _ := p.loginNeeded(p.cfg); needed {
			return true
		}
	}
	return (p.adoption.adoptPending || p.known.facts == factsUnread) && pl.idleAdoptFailures < maxIdleAdoptFailures
}

// run is the poller, started by Configure and stopped when Shutdown
// begins. While anything is outstanding, or adoption has yet to work, it
// runs a cycle every poll_interval; otherwise it sleeps until Provision
// wakes it, and runs nothing on the cluster.
func (pl *poller) run(cfg *settings, host shared.Host) {
	p := pl.p
	defer p.wg.Done()
	ctx := pl.ctx
	actx, cancel := context.WithTimeout(ctx, cfg.submitTimeout)
	if cfg.multiplex {
		p.q.Transport().CleanStale(actx)
	}
	pl.adoptAtStart(actx, cfg, host)
	cancel()
	close(pl.adoptTried)
	for {
		if !pl.wanted() {
			select {
			case <-ctx.Done():
				return
			case <-pl.poke:
			}
			continue
		}
		t := time.NewTimer(jittered(cfg.pollInterval))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		pl.once(ctx)
	}
}

// once is one poll cycle: one squeue for all of this provisioner's
// jobs, when there is a job or a lost submission to look at or adoption
// to retry, and whatever follows from what it says. Tests call it to run
// a cycle when they choose.
func (pl *poller) once(ctx context.Context) {
	p := pl.p
	p.mu.Lock()
	c, ok := pl.cycleLocked()
	p.mu.Unlock()
	if !ok {
		return
	}
	cfg, host := c.cfg, c.host
	needLogin, _ := p.loginNeeded(cfg)
	if c.unread && !needLogin && !pl.retryFacts(ctx, c) {
		return
	}
	if !c.adopting && !c.cancelling && !c.watchingLate && len(c.watched) == 0 && len(c.ends) == 0 && !c.departed && !needLogin {
		return
	}
	if needLogin && p.now().Before(p.q.Transport().Access().NextTry) {
		// The login refused, and its next try is not due: squeue would
		// fail at once without ssh, and would say nothing new.
		return
	}
	rows, ok := pl.readQueue(ctx, c)
	if !ok {
		return
	}
	// The books are level-triggered: every full cycle, a job of this
	// engine that they do not hold is adopted or cancelled, so a
	// submission that lands late is found whenever it lands (within
	// fullPollEvery cycles: a light cycle knows no comments).
	if !c.light {
		p.adoption.adopt(p.life, cfg, host, rows)
	}
	p.judge(cfg, host, c.watched, rows)
	p.ends.endedUnder(p.life, cfg, host, c.ends, rows)
	if left := p.cancels.goneFromQueue(p.life, cfg, host, rows); len(left) > 0 {
		p.cancels.retryCancels(p.life, cfg, host, left, rows)
	}
}

// cycle is what a poll cycle found in the books before reading the
// queue: what there is to look at, and how.
type cycle struct {
	cfg  *settings
	host shared.Host
	// adopting is set while adoption is still to do; idle while nothing
	// is outstanding; cancelling while jobs are being cancelled;
	// watchingLate while a late landing is looked for (watchUntil);
	// departed while the queue lists jobs of workers that left
	// (ends.go); unread until the cluster's facts are read (facts.go).
	adopting, idle, cancelling, watchingLate, departed, unread bool
	// watched is the requests whose job or lost submission is looked
	// at, in no order: judge orders the few it acts on.
	watched []watch
	// ends is the jobs watched under attached workers (ends.go).
	ends []endWatch
	// light is set when the cycle reads only the states of lightIDs
	// (lightpoll.go); readQueue clears it when it reads in full instead.
	light    bool
	lightIDs []string
}

// cycleLocked is what this cycle has to look at; false when there is no
// configuration or Shutdown has begun. p.mu must be held.
func (pl *poller) cycleLocked() (*cycle, bool) {
	p := pl.p
	if p.cfg == nil || p.shut {
		return nil, false
	}
	c := &cycle{cfg: p.cfg, host: p.host,
		adopting:     p.adoption.adoptPending,
		idle:         len(p.outstanding) == 0,
		cancelling:   len(p.cancels.cancelling) > 0,
		watchingLate: p.now().Before(p.watchUntil),
		watched:      make([]watch, 0, len(p.outstanding)),
	}
	for _, r := range p.outstanding {
		// A submission still running is left to finish: its own event
		// must reach the engine before any about its job.
		if r.finished() && (r.phase == phaseQueued || r.phase == phaseAnswerLost) {
			c.watched = append(c.watched, watch{r: r, job: r.job})
		}
	}
	c.ends = p.ends.endWatchesLocked()
	c.departed = len(p.ends.departed) > 0
	c.unread = p.known.facts == factsUnread
	c.lightIDs, c.light = pl.lightIDsLocked(c.watched, c.ends)
	c.light = c.light && !c.adopting && !c.watchingLate
	return c, true
}

// retryFacts reads the start-up facts again, until read (facts.go); a
// poller with nothing else to do counts the failures towards resting. It
// is false when Shutdown began meanwhile.
func (pl *poller) retryFacts(ctx context.Context, c *cycle) bool {
	p := pl.p
	err := p.known.readFacts(ctx)
	if ctx.Err() != nil {
		return false
	}
	if err == nil {
		c.cfg.log.Info("read the cluster's MaxArraySize, MaxJobCount and name; bursts are sized by them from now on")
		p.mu.Lock()
		pl.idleAdoptFailures = 0
		p.mu.Unlock()
	} else if c.idle && !c.adopting {
		c.cfg.log.Debug("still cannot read the cluster's MaxArraySize, MaxJobCount and name", "error", err)
		p.mu.Lock()
		pl.idleAdoptFailures++
		p.mu.Unlock()
	}
	return true
}

// readQueue reads the queue for a cycle: the states of its jobs when it
// is light, else every job in full. It is false when the queue could not
// be read, which is recorded, or Shutdown began.
func (pl *poller) readQueue(ctx context.Context, c *cycle) ([]queue.Job, bool) {
	p, cfg := pl.p, c.cfg
	var rows []queue.Job
	var err error
	if c.light {
		rows, c.light, err = pl.readStates(ctx, cfg, c.lightIDs, c.watched, c.ends)
	}
	if !c.light {
		rows, err = p.q.Jobs(ctx, true)
	}
	if ctx.Err() != nil {
		return nil, false // Shutdown has begun.
	}
	if err != nil {
		if p.q.WaitingTurn(err) {
			pl.rationed(cfg, err)
			return nil, false
		}
		pl.unreadable(cfg, err)
		if c.adopting && c.idle {
			p.mu.Lock()
			pl.idleAdoptFailures++
			p.mu.Unlock()
		}
		return nil, false
	}
	pl.readable(cfg)
	p.mu.Lock()
	pl.idleAdoptFailures = 0
	pl.cyclesSinceFull++
	if !c.light {
		pl.cyclesSinceFull = 0
	}
	p.mu.Unlock()
	return rows, true
}

// unreadable records a failed poll. Nothing is concluded from it: a
// controller that does not answer says nothing about its jobs. An outage
// is logged once, when it begins.
func (pl *poller) unreadable(cfg *settings, err error) {
	p := pl.p
	msg := err.Error()
	p.mu.Lock()
	first := !pl.queueDown
	pl.queueDown = true
	if saidZeroBytes(msg) {
		pl.queueZeroBytes++
	} else {
		pl.queueZeroBytes = 0
	}
	// A client of another release fails every poll the same way; say what
	// it is once it is clear, and loudly, since waiting will not fix it.
	mismatch := releaseMismatch(msg) || pl.queueZeroBytes > 1
	told := mismatch && !pl.queueMismatchTold
	pl.queueMismatchTold = pl.queueMismatchTold || mismatch
	if mismatch {
		p.lastErr = truncate("reading the queue: " + mismatchDetail(cfg.host(), msg))
	} else {
		p.lastErr = truncate("reading the queue: " + msg)
	}
	p.mu.Unlock()
	switch {
	case told:
		cfg.log.Error("cannot read the queue: the login node's Slurm client is another release than the controller", "login", cfg.host(), "error", err)
	case first:
		cfg.log.Warn("cannot read the queue; keeping every request as it is until it can", "error", err)
	default:
		cfg.log.Debug("still cannot read the queue", "error", err)
	}
}

// rationed records a poll whose squeue waited its turn at
// slurmctld's rate limiter past its deadline: weather, not an outage, so
// it is neither LastError nor "cannot read the queue"; Status's note on
// the limiter says it. Nothing is concluded, as for any unread queue.
func (pl *poller) rationed(cfg *settings, err error) {
	cfg.log.Info("the queue's answer waits its turn at slurmctld's RPC rate limiter; keeping every request as it is and reading it again next poll", "error", err)
}

func (pl *poller) readable(cfg *settings) {
	p := pl.p
	p.mu.Lock()
	was := pl.queueDown
	pl.queueDown = false
	pl.queueZeroBytes = 0
	pl.queueMismatchTold = false
	p.mu.Unlock()
	if was {
		cfg.log.Debug("the queue can be read again")
	}
}

// adoptAtStart is Configure's adoption: one squeue for the jobs still
// queued or running. If the queue cannot be read, the poller tries again
// on each cycle until it can.
func (pl *poller) adoptAtStart(ctx context.Context, cfg *settings, host shared.Host) {
	p := pl.p
	// How large a burst one sbatch may be is read before any submission
	// begins: submissions wait for this first look. It is also the first
	// call, which makes the ssh master the others share. When it fails,
	// bursts are small until a poll cycle reads it (facts.go).
	if err := p.known.readFacts(ctx); err != nil && pl.ctx.Err() == nil {
		cfg.log.Warn("cannot read the cluster's MaxArraySize, MaxJobCount and name; bursts are small until they are read, which each poll tries again",
			"max_burst", unknownFactsBurst, "error", err)
	}
	// What every first submission needs besides the queue, read beside
	// it rather than after: the accounting limits (limits.go) and log_dir
	// made on the login node (joblog.go). A submission that starts before
	// they are done waits for these reads (readingLimits, makingLogDir)
	// instead of making its own, so the first burst pays one round trip
	// for all three, not three in a row and then its sbatch.
	pl.startSide(cfg, func(ctx context.Context) {
		defer close(pl.startReads)
		var both sync.WaitGroup
		both.Add(1)
		go func() {
			defer both.Done()
			p.lim.refreshLimits(ctx, cfg)
		}()
		if _, err := p.files.ensureLogDir(ctx, cfg); err != nil && ctx.Err() == nil {
			// The first submission tries again and reports it.
			cfg.log.Debug("could not make log_dir at start", "error", err)
		}
		both.Wait()
	})
	rows, err := p.q.Jobs(ctx, false)
	if err != nil {
		if pl.ctx.Err() != nil {
			return // Shutdown has begun.
		}
		if p.q.WaitingTurn(err) {
			cfg.log.Info("the queue's answer waits its turn at slurmctld's RPC rate limiter; the jobs an earlier run left are looked for again each poll", "error", err)
			return
		}
		p.setLastErr("listing jobs left by an earlier run: " + err.Error())
		cfg.log.Error("could not list jobs left by an earlier run; will try again on each poll", "error", err)
		return
	}
	p.adoption.adopt(ctx, cfg, host, rows)
}

// startSide runs f on a goroutine of its own, counted by p.wg so that
// Shutdown waits for it, with a context of submit_timeout that Shutdown's
// start cancels; nothing is started once Shutdown has begun.
func (pl *poller) startSide(cfg *settings, f func(ctx context.Context)) {
	p := pl.p
	p.mu.Lock()
	if p.shut {
		p.mu.Unlock()
		return
	}
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		ctx, cancel := context.WithTimeout(pl.ctx, cfg.submitTimeout)
		defer cancel()
		f(ctx)
	}()
}

// lightIDsLocked is the job ids a light poll of this cycle asks for, and
// whether the cycle may be light at all. p.mu must be held.
func (pl *poller) lightIDsLocked(watched []watch, ends []endWatch) ([]string, bool) {
	p := pl.p
	if pl.noLightPoll || pl.cyclesSinceFull+1 >= fullPollEvery {
		return nil, false
	}
	seen := map[string]bool{}
	var ids []string
	add := func(id string) {
		if id != "" && !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	if len(p.cancels.cancelling) > 0 || len(p.ends.departed) > 0 {
		return nil, false
	}
	for _, w := range watched {
		if w.r.phase != phaseQueued || w.job == "" || w.r.slurmState != "RUNNING" {
			return nil, false // pending, found by comment, or never seen yet
		}
		add(w.job)
	}
	for _, e := range ends {
		add(e.job)
	}
	if len(ids) == 0 || len(ids) > lightPollMax {
		return nil, false
	}
	return ids, true
}

// readStates is a light poll of ids: its rows, and whether they stand
// for the cycle; false when squeue has no --only-job-state (remembered)
// or a watched job is no longer running, whose words the cycle's full
// poll then reads.
func (pl *poller) readStates(ctx context.Context, cfg *settings, ids []string, watched []watch, ends []endWatch) ([]queue.Job, bool, error) {
	p := pl.p
	rows, err := p.q.States(ctx, ids)
	switch {
	case err != nil && noStateOnly(err):
		cfg.log.Debug("squeue has no --only-job-state (Slurm before 24.05): every poll reads the queue in full", "error", err)
		p.mu.Lock()
		pl.noLightPoll = true
		p.mu.Unlock()
		return nil, false, err
	case err != nil:
		return nil, true, err
	case lightChanged(cfg, rows, watched, ends):
		return nil, false, nil
	}
	return rows, true, nil
}
