package slurm

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/internal/clip"
	"github.com/fluksio/provision/shared"

	relayd "github.com/fluksio/provision/slurm/relay"
)

const (
	kind    = "slurm"
	version = "0.1.0"

	// maxDetail is how much of what sbatch said is kept as last_error and
	// sent with an event: enough for Slurm's two-line rejections, not a
	// page of a login banner.
	maxDetail = 500

	// shutdownReserve caps the part of Shutdown's time kept back, after
	// waiting for submissions, for squeue and scancel. Each is one ssh
	// call, normally well under a second.
	shutdownReserve = 10 * time.Second
)

var _ shared.Provisioner = (*Provisioner)(nil)

// Provisioner is a Slurm cluster, asked for machines over ssh. Submission
// is an sbatch whose payload is a worker dialling back to the engine; the
// engine needs no route to the compute node and no share of its
// filesystem.
type Provisioner struct {
	logger hclog.Logger

	// Testing hooks, set before Configure and never changed: the ssh
	// program to run and the clock that ages requests.
	sshPath string
	now     func() time.Time

	// life is cancelled when Shutdown returns; every submission's context
	// derives from it, so no goroutine outlives the Provisioner's use.
	life context.Context
	stop context.CancelFunc
	// poll is the poller (poller.go): its context is cancelled when
	// Shutdown begins.
	poll poller

	// wg counts submission goroutines, and the adoption and poller that
	// Configure starts. Add happens under mu and only while shut is false,
	// so no Add can race Shutdown's Wait.
	wg sync.WaitGroup
	// metrics counts failures for Status (metrics.go).
	metrics metrics

	// mu guards every field below, and the fields of each request from job
	// on. It is held only to read or change them: never across ssh, a Host
	// call or a wait, because a login node can take seconds to answer and
	// the engine calls in here from its placer.
	// lim is the accounting limits and the job count submissions fit (limits.go).
	lim limiter

	// files is the worker's copy and log_dir on the login node (ship.go).
	files loginFiles

	// ends is the jobs of attached and departed workers, watched for their end (ends.go).
	ends jobEnds

	// cancels is the jobs being cancelled until Slurm confirms them gone (cancel.go).
	cancels canceller

	// closing is Shutdown's work and outcome (shutdown.go).
	closing closing

	// known is the cluster's start-up facts (facts.go).
	known clusterFacts

	// workers is the attached workers, as the engine last said (attached.go).
	workers attachedWorkers

	// sub is the submission pipeline (submit.go).
	sub submitter

	// adoption is the adoption of jobs the books do not hold (adopt.go).
	adoption adopter

	mu sync.Mutex
	// cfg is nil until Configure succeeds; what it points to never changes.
	cfg  *settings
	host shared.Host
	// learnt is what the last Shapes read of the profiles (their
	// lifetimes, partitiontimes.go; exclusive ones' nodes, exclusive.go),
	// which Provision and Covers match needs by, as the engine did by
	// the shapes, and credentials are minted for.
	learnt *learnt
	// relay is set by Configure with reach = "relay" and never changes
	// after; it has its own lock.
	relay *relay
	// q runs every command on the login nodes (slurm/internal/queue),
	// through the ssh transport that knows how each login stands
	// (slurm/sshrun). Configure sets it with cfg and it never changes
	// after, so whoever has read a non-nil cfg under mu may use it
	// without mu (as the poller and submissions do). Its locks may be
	// taken under mu (loginNeeded, Status), never mu under them: the
	// transport calls back (accessChanged) with none held.
	q slurmQueue
	// ledger is the machines asked for and not yet arrived (ledger.go).
	ledger
	lastErr string
	shut    bool
	// watchUntil keeps the poller reading the queue after a submission
	// whose answer was lost was found "not submitted": the sbatch on the
	// login node may still land, and the level-triggered books should
	// find it while somebody is looking, not only at the next demand.
	watchUntil time.Time
	// holds are the cluster's, the site's throttle's and the limits'
	// holds on every profile (hold.go).
	holds holds
}

// request is one machine asked for and not yet arrived. Where it is in
// its life is its phase; the fields beside it are data, not state.
type request struct {
	profile string
	worker  string
	// tag is the worker the job's comment names: the worker itself for a
	// job of one machine, the shared base of an array's workers; task is
	// the machine's array task, -1 for a job of its own.
	tag  string
	task int
	// node is the machine's node in a multi-node allocation of nodes
	// machines; -1 and 1 for a profile of one node (multinode.go).
	node, nodes int
	// batch is how many machines its submission asked for.
	batch int
	since time.Time
	// cancel kills the submission's ssh; Shutdown uses it on a submission
	// that will not finish by the deadline.
	cancel context.CancelFunc
	// done is closed when the submission goroutine has finished, its
	// events published; the machines of one submission share it. It is apart from phase: a worker may attach (arrived)
	// while its submission is still publishing, and nothing is cancelled
	// or reported about a job before the engine has heard of it.
	done chan struct{}

	// Guarded by Provisioner.mu, like every field below.
	phase phase
	// job is the scheduler's id: set in queued, and kept when a queued
	// request arrives or fails.
	job string
	// slurmState is the job's state as the last poll saw it ("PENDING",
	// "RUNNING"); empty until a poll has seen the job. pendingReason is
	// Slurm's reason a pending job waits, in its own word ("Priority",
	// "Resources", "QOSMaxJobsPerUserLimit"); empty when it names none.
	slurmState    string
	pendingReason string
	// running is when a poll first saw the job running: attach_timeout
	// counts from here.
	running time.Time
	// secrets are the credentials its job's script holds, its own and
	// those of the other machines of its submission, never changed once
	// set: what a job's output is redacted of before it is reported
	// (explain). Empty for a job adopted from an earlier run, whose
	// output is redacted by form alone.
	secrets []string
	// via is the relay's address the job's workers were given, in relay
	// mode: if the relay moves from it, the job is cancelled (relaytls.go).
	via string
	// landBy is, once its sbatch's answer was lost, when its job can no
	// longer reach the queue (landing.go): until then a queue without it
	// proves nothing.
	landBy time.Time
	// rationed says its sbatch was cut off waiting its turn at
	// slurmctld's rate limiter: "not submitted" is then weather, not a
	// failure of its profile.
	rationed bool
}

// phase is where a request is in its life:
//
//	awaitingAdoption ─► submitting ─► queued ─────────► (out of the books)
//	        │               │  └─► answerLost ─► queued
//	        ▼               ▼           └────────────────► failed
//	    superseded        failed
//
// and any of them may become arrived when Reconcile sees its worker. A
// request leaves the books (p.outstanding) when it arrives, fails, is
// superseded, or is given up on and cancelled; what a switch on it must
// handle is the phase, not a combination of fields.
type phase int

const (
	// phaseAwaitingAdoption: made by Provision; its submission waits for
	// the first look at the queue (adoptTried), which may give the
	// profile a job an earlier run left instead.
	phaseAwaitingAdoption phase = iota
	// phaseSubmitting: the credential is being minted and sbatch run.
	phaseSubmitting
	// phaseQueued: Slurm has the job (job is set).
	phaseQueued
	// phaseAnswerLost: sbatch may have run but its answer never came
	// back, and its job has not been found; the poller looks for it by
	// its comment until it can no longer land (landBy).
	phaseAnswerLost
	// phaseSuperseded: adoption gave the profile a queued job instead;
	// the submission returns without submitting.
	phaseSuperseded
	// phaseFailed: the submission failed, or the job ended, left the
	// queue or was given up on before its worker attached.
	phaseFailed
	// phaseArrived: its worker attached; the machine is the engine's now,
	// not this provisioner's to cancel.
	phaseArrived
)

// shownState is the request's state for Status: the job's Slurm state,
// or stateUnknown while its sbatch's answer is lost.
func (r *request) shownState() string {
	if r.phase == phaseAnswerLost {
		return stateUnknown
	}
	return r.slurmState
}

func (r *request) finished() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// New returns an unconfigured Provisioner that logs to logger (nowhere if
// nil).
func New(logger hclog.Logger) *Provisioner {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	life, stop := context.WithCancel(context.Background())
	p := &Provisioner{
		logger:  logger,
		sshPath: "ssh",
		now:     time.Now,
		life:    life,
		stop:    stop,
		ledger:  ledger{outstanding: map[string]*request{}},
	}
	p.poll = newPoller(p, life)
	p.holds.p, p.holds.backoff = p, map[string]*backoff{}
	p.adoption.p = p
	p.sub.p = p
	p.sub.inflight = map[*request]bool{}
	p.workers.p = p
	p.known.p = p
	p.known.maxArray = defaultMaxArraySize
	p.closing.p = p
	p.cancels.p = p
	p.cancels.cancelling = map[string]*jobRef{}
	p.ends.p = p
	p.files.p = p
	p.files.makingLogDir = make(chan struct{}, 1)
	p.files.shipping = make(chan struct{}, 1)
	p.lim.p = p
	p.lim.limitTurn = make(chan struct{}, 1)
	p.lim.readingLimits = make(chan struct{}, 1)
	return p
}

// settings returns the configuration, nil before Configure.
func (p *Provisioner) settings() *settings {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg
}

// Info says what kind of provisioner this is.
func (p *Provisioner) Info(context.Context, *shared.InfoRequest) (*shared.InfoResponse, error) {
	return &shared.InfoResponse{Kind: kind, Version: version, ContractVersion: shared.ContractVersion,
		// Its jobs run fluksio-worker, which runs as many tasks at once
		// as its job holds (worker.FeatureSlots): the engine asks for
		// machines by what they hold.
		Capabilities: []shared.Capability{shared.CapabilityReconcileDelta, shared.CapabilityReachProbe, shared.CapabilityReconfigure,
			shared.CapabilityWorkerSlots}}, nil
}

// Schema describes the configuration.
func (p *Provisioner) Schema(context.Context, *shared.SchemaRequest) (*shared.SchemaResponse, error) {
	return &shared.SchemaResponse{Schema: schema()}, nil
}

// ValidateConfig checks a configuration. It runs nothing and writes
// nothing.
func (p *Provisioner) ValidateConfig(ctx context.Context, req *shared.ValidateConfigRequest) (*shared.ValidateConfigResponse, error) {
	if req == nil {
		return nil, shared.ErrInvalidArgument
	}
	cfg, diags := parseConfigAt(req.Name, req.Config, p.now())
	if !diags.HasErrors() {
		// ssh -G reads files and connects to nothing.
		diags = append(diags, checkEffectiveSSH(ctx, p.sshPath, cfg)...)
		diags = append(diags, p.checkShippedWorker(cfg)...)
		diags = append(diags, checkReadable(cfg)...)
		diags = append(diags, checkBudgetDir()...)
	}
	return &shared.ValidateConfigResponse{Diagnostics: diags}, nil
}

// Configure validates and applies a configuration, once, and starts the
// poller, whose first act is to adopt or cancel the jobs an earlier run
// of this provisioner left in the queue (adopt, in poll.go), bounded by
// submit_timeout; if the queue cannot be read then, it tries again on
// each cycle.
func (p *Provisioner) Configure(ctx context.Context, req *shared.ConfigureRequest) (*shared.ConfigureResponse, error) {
	if req == nil {
		return nil, shared.ErrInvalidArgument
	}
	cfg, diags := parseConfigAt(req.Name, req.Config, p.now())
	if !diags.HasErrors() {
		diags = append(diags, checkEffectiveSSH(ctx, p.sshPath, cfg)...)
		diags = append(diags, p.checkShippedWorker(cfg)...)
		diags = append(diags, checkReadable(cfg)...)
		diags = append(diags, openBudget(cfg)...)
	}
	if diags.HasErrors() {
		return &shared.ConfigureResponse{Diagnostics: diags}, nil
	}
	cfg.log = p.logger.With("provisioner", cfg.name)
	if err := cfg.identity(req.EngineID, req.CredentialEpoch); err != nil {
		return nil, err
	}
	var engineNet, engineAddr string
	var relayCert *relayd.Cert
	if cfg.Reach == reachRelay {
		var err error
		if engineNet, engineAddr, err = engineAddress(req.EngineAddress); err != nil {
			diags = append(diags, shared.Errorf([]string{"reach"}, "Relay without an engine address", "%s.", err))
			return &shared.ConfigureResponse{Diagnostics: diags}, nil
		}
		if cfg.relayServesTLS() {
			if relayCert, err = relayd.NewCert(cfg.RelayHost, p.now()); err != nil {
				return nil, err
			}
		}
	}

	ssh := p.newTransport(cfg) // starts nothing until used

	p.mu.Lock()
	switch {
	case p.shut:
		p.mu.Unlock()
		return nil, shared.ErrShutdown
	case p.cfg != nil:
		p.mu.Unlock()
		return p.reconfigure(cfg)
	}
	p.cfg, p.host, p.q = cfg, req.Host, p.newQueue(cfg, ssh)
	p.adoption.adoptPending, p.adoption.mine = true, map[string]bool{}
	// One count for adoption and then the poller, taken while shut is
	// false: Shutdown waits for both, and cancels them first. The relay,
	// if any, has one of its own, and stops when the poller does.
	p.wg.Add(1)
	if engineNet != "" {
		p.relay = newRelay(p, cfg, engineNet, engineAddr, relayCert)
		p.wg.Add(1)
		go p.relay.run(p.poll.ctx)
	}
	p.mu.Unlock()

	names := make([]string, len(cfg.Profiles))
	for i, pr := range cfg.Profiles {
		names[i] = pr.Name
	}
	cfg.log.Info("configured", "login", cfg.Login, "profiles", names)

	// Adoption runs on the poller's goroutine, not here: it costs an ssh
	// connection, and an engine starting a plugin should not wait for a
	// login node. A Provision that comes first is safe: adoption leaves
	// this run's own requests alone and cancels an older pending job for
	// a profile that already has one.
	go p.poll.run(cfg, req.Host)
	return &shared.ConfigureResponse{Diagnostics: diags}, nil
}

// Shapes lists the machines the cluster can be asked for, smallest first.
func (p *Provisioner) Shapes(ctx context.Context, req *shared.ShapesRequest) (*shared.ShapesResponse, error) {
	cfg := p.settings()
	if cfg == nil {
		return nil, shared.ErrNotConfigured
	}
	var label string
	if req != nil {
		//lint:ignore SA1019 honoured for a caller that still sets it; hosts send it empty
		label = req.Label
	}
	lt := lifetimes{}
	if cfg.needsPartitionTimes() {
		parts := p.readPartitionTimes(ctx, cfg)
		for _, prof := range cfg.Profiles {
			if d, from, ok := profileLifetime(prof, parts); ok {
				lt[prof.Name] = lifetime{d, from}
			}
		}
	}
	known := &learnt{lifetimes: lt, nodes: p.readWholeNodes(ctx, cfg)}
	p.mu.Lock()
	if p.cfg == cfg {
		p.learnt = known
	}
	p.mu.Unlock()
	return &shared.ShapesResponse{Shapes: cfg.shapes(label, known)}, nil
}

// Covers says whether some profile would fit the need, and which.
func (p *Provisioner) Covers(_ context.Context, req *shared.CoversRequest) (*shared.CoversResponse, error) {
	if req == nil {
		return nil, shared.ErrInvalidArgument
	}
	cfg := p.settings()
	if cfg == nil {
		return nil, shared.ErrNotConfigured
	}
	p.mu.Lock()
	lt := p.learnt
	p.mu.Unlock()
	prof, ok := cfg.match(req.Need, lt)
	return &shared.CoversResponse{Covered: ok, Profile: prof.Name}, nil
}

// submitError is a submission that failed, carrying what the cluster
// said the way os/exec's ExitError carries Stderr. Every field is
// redacted: it is logged, sent as an event and shown as last_error.
type submitError struct {
	// Said is what to report: sbatch's own words when it spoke, else
	// the error, trimmed to maxDetail.
	Said string
	// AnswerLost says sbatch may have run without its answer coming back
	// (answerLost): its job may exist and must be looked for.
	AnswerLost bool
	msg        string
	err        error
}

func (e *submitError) Error() string { return e.msg }

// Unwrap gives errors.Is the original, for timeouts and sentinels; its
// text is not redacted, so nothing may print what it unwraps to.
func (e *submitError) Unwrap() error { return e.err }

// failure makes a submitError of err, with said as what to report and
// redact applied to everything that could hold the credential.
func failure(err error, said string, lost bool, redact func(string) string) *submitError {
	return &submitError{Said: truncate(redact(said)), AnswerLost: lost, msg: redact(err.Error()), err: err}
}

// publish tells the engine about an event, bounded by submit_timeout so a
// stuck host cannot hold a submission open. A lost event is logged, not
// fatal: the engine also learns from workers attaching.
func (p *Provisioner) publish(ctx context.Context, cfg *settings, host shared.Host, ev shared.Event) {
	if host == nil {
		return
	}
	ev.Provisioner = cfg.name
	ev.Time = p.now()
	ctx, cancel := context.WithTimeout(ctx, cfg.submitTimeout)
	defer cancel()
	if err := host.Publish(ctx, ev); err != nil {
		cfg.log.Warn("could not publish an event", "event", string(ev.Kind), "worker", ev.Worker, "error", err)
	}
}

// publishAll is publish for many events, pipelined (shared.PublishAll).
func (p *Provisioner) publishAll(ctx context.Context, cfg *settings, host shared.Host, evs []shared.Event) {
	if host == nil || len(evs) == 0 {
		return
	}
	now := p.now()
	for i := range evs {
		evs[i].Provisioner, evs[i].Time = cfg.name, now
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.submitTimeout)
	defer cancel()
	if err := shared.PublishAll(ctx, host, evs); err != nil {
		cfg.log.Warn("could not publish every event", "event", string(evs[0].Kind), "events", len(evs), "first_worker", evs[0].Worker, "error", err)
	}
}

// Reconcile forgets requests whose worker has attached and cancels those
// that have waited too long: longer than provision_timeout since they were
// asked for, or longer than attach_timeout since their job was first seen
// running. A request still being submitted is never expired: its job id
// is not known yet. One whose submission's answer was lost and whose job
// was never found is forgotten after provision_timeout.
func (p *Provisioner) Reconcile(ctx context.Context, req *shared.ReconcileRequest) (*shared.ReconcileResponse, error) {
	if req == nil {
		req = &shared.ReconcileRequest{}
	}
	now := p.now()

	p.mu.Lock()
	cfg, host := p.cfg, p.host
	if cfg == nil {
		p.mu.Unlock()
		return nil, shared.ErrNotConfigured
	}
	resp := &shared.ReconcileResponse{Arrived: p.workers.reconcileAttachedLocked(cfg, req)}
	if len(resp.Arrived) > 0 {
		// The poller may be resting with nothing outstanding: it reads
		// the queue while workers are attached (ends.go).
		defer p.poll.wake()
	}
	var expired []jobRef
	var gaveUp []shared.Event
	for _, r := range p.sortedLocked() {
		switch {
		case !r.finished():
		case r.phase == phaseQueued && now.Sub(r.since) > cfg.provisionTimeout+cfg.beginDelayOf(r.profile, r.since):
			// provision_timeout counts from when the job may first
			// start: after its --begin, if the profile sets one.
			delete(p.outstanding, r.worker)
			r.phase = phaseFailed
			expired = append(expired, jobRef{job: r.job, profile: r.profile, worker: r.worker, age: now.Sub(r.since),
				why: fmt.Sprintf("did not attach within %s", cfg.provisionTimeout+cfg.beginDelayOf(r.profile, r.since))})
			p.metrics.failed(r.profile, shared.FailureTimedOut)
		case r.phase == phaseQueued && !r.running.IsZero() && now.Sub(r.running) > cfg.attachTimeout:
			// It got a machine and its worker never dialled in: the
			// next one from this profile would likely do the same.
			delete(p.outstanding, r.worker)
			r.phase = phaseFailed
			why := fmt.Sprintf("ran for %s without its worker attaching (attach_timeout %s)", now.Sub(r.running).Round(time.Second), cfg.attachTimeout)
			p.holds.countFailureLocked(r.profile, "job "+r.job+" "+why)
			p.metrics.failed(r.profile, shared.FailureTimedOut)
			expired = append(expired, jobRef{job: r.job, profile: r.profile, worker: r.worker, age: now.Sub(r.since), why: why})
		case r.phase == phaseAnswerLost && now.Sub(r.since) > cfg.provisionTimeout:
			delete(p.outstanding, r.worker)
			r.phase = phaseFailed
			detail := fmt.Sprintf("the answer to worker %s's sbatch was lost, and no job for it was found within %s", r.worker, cfg.provisionTimeout)
			class := shared.FailureTransient
			if r.rationed {
				class = shared.FailureLimitReached
			} else {
				p.lastErr = detail
				p.holds.countFailureLocked(r.profile, detail)
			}
			p.metrics.failed(r.profile, class)
			gaveUp = append(gaveUp, shared.Event{Kind: shared.EventWorkerProvisionFailed, Profile: r.profile, Worker: r.worker, Detail: detail, Class: class})
		}
	}
	p.mu.Unlock()

	for _, ev := range gaveUp {
		cfg.log.Error("gave up looking for the job of a submission whose answer was lost", "profile", ev.Profile, "worker", ev.Worker)
		p.publish(ctx, cfg, host, ev)
	}
	// Only what Slurm agreed to cancel is expired; the rest is kept and
	// tried again.
	resp.Expired = p.cancels.cancelJobs(ctx, cfg, host, expired, "gave up on a machine that never attached")
	return resp, nil
}

// jobRef is a job on its way to being cancelled, with what the event for
// it needs: why says why, as the event's detail.
type jobRef struct {
	job, profile, worker string
	age                  time.Duration
	why                  string
	// msg is the log line once cancelled; failures counts scancels that
	// failed, and the engine hears of the first.
	msg      string
	failures int
	// others are the other machines of the job, when it is a multi-node
	// allocation: each is cancelled with it and reported.
	others []string
	// pendingOnly is a job given up because the demand fell: it is
	// cancelled only if the queue shows it still pending at the moment
	// (cancelPending); one that started since the books last looked is
	// kept (goneFromQueue).
	pendingOnly bool
}

// workers are the machines the job ends: its worker and any others.
func (j jobRef) workers() []string { return append([]string{j.worker}, j.others...) }

// jobIDs lists the jobs of refs once each, in order: the machines of a
// multi-node allocation share one.
func jobIDs(refs []jobRef) []string {
	var ids []string
	seen := map[string]bool{}
	for _, r := range refs {
		if !seen[r.job] {
			seen[r.job] = true
			ids = append(ids, r.job)
		}
	}
	return ids
}

func (p *Provisioner) setLastErr(s string) {
	p.mu.Lock()
	p.lastErr = truncate(s)
	p.mu.Unlock()
}

// Status reports the configuration's name and profiles, what is
// outstanding and what last went wrong. It never talks to the cluster.
func (p *Provisioner) Status(context.Context, *shared.StatusRequest) (*shared.StatusResponse, error) {
	now := p.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	resp := &shared.StatusResponse{Kind: kind, LastError: p.lastErr, Counters: p.metrics.counters(p.q)}
	if p.cfg == nil {
		return resp, nil
	}
	resp.Name = p.cfg.name
	for _, r := range p.sortedLocked() {
		resp.Outstanding = append(resp.Outstanding, shared.Outstanding{Profile: r.profile, Job: r.job, Worker: r.worker, Age: now.Sub(r.since), State: r.shownState(),
			Reason: r.pendingReason})
	}
	counts := p.countsLocked()
	for _, prof := range p.cfg.Profiles {
		resp.Profiles = append(resp.Profiles, prof.Name)
		if b := p.holds.backoff[prof.Name]; b != nil && b.hold.on(now) {
			resp.BackingOff = append(resp.BackingOff, shared.Backoff{Profile: prof.Name, Failures: b.failures, Until: b.hold.until, LastError: b.hold.reason})
			if b.hold.kind == holdMisconfigured {
				resp.Notes = append(resp.Notes, misconfiguredDetail(prof.Name, b))
			}
		}
		c := counts[prof.Name]
		pc := shared.ProfileCounts{Profile: prof.Name, Pending: c.pending, Starting: c.starting, Attached: p.workers.attached[prof.Name]}
		pc.Submissions = p.submissionsLocked(prof.Name, now)
		resp.Counts = append(resp.Counts, pc)
	}
	if p.known.arrayNote != "" {
		resp.Notes = append(resp.Notes, p.known.arrayNote)
	}
	if note := p.known.factsNoteLocked(); note != "" {
		resp.Notes = append(resp.Notes, note)
	}
	if note := p.q.RateNote(now); note != "" {
		resp.Notes = append(resp.Notes, note)
	}
	if note := p.q.BudgetNote(now); note != "" {
		resp.Notes = append(resp.Notes, note)
	}
	resp.Notes = append(resp.Notes, p.lim.limitNotesLocked(now)...)
	resp.Notes = append(resp.Notes, p.loginNotes(p.cfg)...)
	if p.holds.throttled.on(now) {
		resp.Notes = append(resp.Notes, p.holds.throttled.reason)
	}
	// The cluster's hold is a note of its own unless it is the binding
	// one, which the limits' notes already say.
	if p.holds.clusterFull.on(now) && p.holds.binding.kind != holdClusterFull {
		resp.Notes = append(resp.Notes, p.holds.clusterFull.reason)
	}
	if p.relay != nil {
		resp.Notes = append(resp.Notes, p.relay.note())
	}
	return resp, nil
}

// Shutdown cancels every job this provisioner asked for that has not
// attached, with one scancel, and returns the ids cancelled.
//
// It happens once. A second call, made while the first is still working
// (a second Ctrl-C), waits for the first and gets the same outcome: it
// must not return early and let the plugin exit under the first. An
// incomplete shutdown is an error that names what may be left in the
// queue.
//
// A submission in flight when Shutdown begins may already have reached
// slurmctld, so it is not simply abandoned. It is given until shortly
// before the deadline to finish and report its job id. If it has not by
// then, its ssh is killed. Then, if any submission's outcome is unknown
// (its ssh killed, its answer lost) or the first look at the queue never
// happened, Shutdown reads the queue once more and cancels every pending
// job of this engine, whatever the books say: an sbatch that went on on
// the login node after its ssh died lands as a job nobody holds. Jobs
// adopted at Configure, and jobs whose earlier scancel failed, are
// cancelled like any other. When that look is only for what an earlier
// run may have left (the queue could never be read, a login refused
// throughout, say) and nothing of this run's is in doubt, a queue that
// cannot be read then either is said in the log and is not a failure:
// this run left the queue as it found it, and the next run adopts what
// is there. A shutdown with nothing outstanding cancels nothing and
// succeeds.
func (p *Provisioner) Shutdown(ctx context.Context, req *shared.ShutdownRequest) (*shared.ShutdownResponse, error) {
	p.mu.Lock()
	if done := p.closing.shutdownDone; done != nil {
		p.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the shutdown in progress: %w", ctx.Err())
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.closing.shutdownResp, p.closing.shutdownErr
	}
	p.shut = true
	p.closing.shutdownDone = make(chan struct{})
	p.mu.Unlock()

	resp, err := p.closing.shutdown(ctx, req)

	p.mu.Lock()
	p.closing.shutdownResp, p.closing.shutdownErr = resp, err
	close(p.closing.shutdownDone)
	p.mu.Unlock()
	return resp, err
}

func orNone(ids []string) string {
	if len(ids) == 0 {
		return "none"
	}
	return strings.Join(ids, " ")
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s = strings.TrimSpace(s); s != "" {
			return s
		}
	}
	return ""
}

// truncate keeps at most maxDetail runes of s, both ends (clip.Ends).
func truncate(s string) string { return clip.Ends(s, maxDetail) }

// watchLate keeps the poller going for provision_timeout, for a
// submission that may still land.
func (p *Provisioner) watchLate(cfg *settings) {
	p.mu.Lock()
	p.watchUntil = p.now().Add(cfg.provisionTimeout)
	p.mu.Unlock()
	p.poll.wake()
}
