package slurm

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/internal/clip"
	"github.com/fluksio/provision/shared"

	relayd "github.com/fluksio/provision/slurm/relay"
	"github.com/fluksio/provision/slurm/sbatch"
	"github.com/fluksio/provision/slurm/sshrun"
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
	// polling derives from life and is cancelled when Shutdown begins: it
	// stops the poller, the squeue it may be running, and adoption.
	polling     context.Context
	stopPolling context.CancelFunc
	// poke wakes the poller when something becomes outstanding. It holds
	// one token, so a poke is never lost and never blocks.
	poke chan struct{}
	// adoptTried is closed once the first adoption attempt is over, found
	// something or not; tests wait on it. It is made by New and never
	// replaced.
	adoptTried chan struct{}
	// startReads is closed once Configure's other reads at start (the
	// accounting limits and log_dir, beside adoption) are over, done or
	// not; tests wait on it. Made by New, never replaced; never closed
	// when Shutdown comes before them.
	startReads chan struct{}

	// wg counts submission goroutines, and the adoption and poller that
	// Configure starts. Add happens under mu and only while shut is false,
	// so no Add can race Shutdown's Wait.
	wg sync.WaitGroup
	// slurmCalls counts the commands run on the login node, so that tests
	// can see how many a poll cycle costs.
	slurmCalls atomic.Int64
	// metrics counts failures and commands for Status (metrics.go).
	metrics metrics
	// makingLogDir holds one token while log_dir is being made, so that
	// a burst of first submissions makes it once, not once each; it is
	// taken with the caller's context, across that one ssh call.
	makingLogDir chan struct{}
	// shipping holds one token while the worker's copy on the login node
	// is checked or copied (ship.go), so that a burst of submissions
	// copies it once; taken with the caller's context, across those ssh
	// calls.
	shipping chan struct{}
	// workerDir is where the worker binaries to ship are looked for
	// (ship.go); empty means the directory of the plugin's own
	// executable. Tests set it before Configure; it never changes after.
	workerDir string
	// limitTurn holds one token while a submission under an accounting
	// limit counts the user's queue and submits, so that two profiles'
	// bursts do not both take the same room (limits.go).
	limitTurn chan struct{}
	// readingLimits holds one token while sacctmgr is being asked, so
	// that the poller's read at start and a first submission's do not
	// both ask.
	readingLimits chan struct{}

	// mu guards every field below, and the fields of each request from job
	// on. It is held only to read or change them: never across ssh, a Host
	// call or a wait, because a login node can take seconds to answer and
	// the engine calls in here from its placer.
	mu sync.Mutex
	// cfg is nil until Configure succeeds; what it points to never changes.
	cfg  *settings
	host shared.Host
	// relay is set by Configure with reach = "relay" and never changes
	// after; it has its own lock.
	relay *relay
	// ssh runs every command on the login nodes, and knows how each
	// stands (slurm/sshrun). Configure sets it with cfg and it never
	// changes after, so whoever has read a non-nil cfg under mu may use
	// it without mu (as the poller and submissions do). It has its own
	// locks, which may be taken under mu (loginNeeded), never mu under
	// them: it calls back (accessChanged) with none held.
	ssh *sshrun.Transport
	// ledger is the machines asked for and not yet arrived (ledger.go).
	ledger
	// maxArray is the most machines one sbatch asks for: the cluster's
	// MaxArraySize, once facts is factsRead (facts.go); 1 where arrays
	// are refused, which arrayNote then explains for Status.
	maxArray  int
	arrayNote string
	// rationing is what is known of slurmctld's RPC rate limiter: its
	// sizes, read with the facts, and the last command it made wait
	// (ratelimit.go).
	rationing rationing
	// facts is whether maxArray, maxJobs and cluster have been read, and
	// factsErr why the last read failed while they have not.
	facts    factsState
	factsErr string
	// attached counts each profile's attached workers, as the engine
	// last said (Provision, Reconcile).
	attached map[string]int
	// reconciled is the set of attached workers Reconcile last heard of,
	// and reconciledBy its count by profile: a Reconcile by change
	// (contract 2.4) applies its joined and left to them, one carrying the
	// whole list replaces them. Both are nil until the first Reconcile.
	reconciled   map[string]struct{}
	reconciledBy map[string]int
	// attachedJobs holds the job of each attached worker whose request
	// arrived in this process, until Reconcile says it left or a poll
	// cycle finds its job ended under it (ends.go).
	attachedJobs map[string]attachedJob
	// departed holds the jobs of workers that attached in this process
	// and left (Reconcile) or whose job ended under them, while the queue
	// still lists the job: one pending again was requeued, and its
	// worker's name is spent, so it is cancelled, never adopted (ends.go).
	departed map[string]attachedJob
	// inflight holds the requests whose submission goroutine has not yet
	// finished, including any Reconcile has already forgotten.
	inflight map[*request]bool
	lastErr  string
	shut     bool
	// logDirAbs is log_dir as the login node resolved it, empty until
	// the first submission made it (joblog.go).
	logDirAbs string
	// shipped is the worker's copy on the login node when worker_command
	// is unset, zero until a submission has checked it (ship.go), and
	// shippedAt when it was last checked; a zero shippedAt has the next
	// submission check it again.
	shipped   workerCopy
	shippedAt time.Time
	// backoff holds, by profile, the failures since a worker of the
	// profile last attached (backoff.go).
	backoff map[string]*backoff
	// adoptPending is set from Configure until this provisioner's jobs
	// left from an earlier run have been listed and dealt with; each poll
	// cycle tries again until then.
	adoptPending bool
	// mine holds the workers submitted while adoptPending is set, so that
	// a late adoption does not take this run's own jobs for strays.
	mine map[string]bool
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
	// cancelling holds, by job id, the jobs this provisioner has decided
	// to cancel and Slurm has not yet confirmed gone: a scancel that
	// failed (controller down, a timeout) loses nothing. Each poll cycle
	// and Shutdown try again (cancelJobs, retryCancels).
	cancelling map[string]*jobRef
	// suspect is set when a submission may have reached slurmctld without
	// this provisioner learning its job id (ssh killed, answer lost): its
	// job can land later, so Shutdown reads the queue for it even if the
	// books hold nothing.
	suspect bool
	// watchUntil keeps the poller reading the queue after a submission
	// whose answer was lost was found "not submitted": the sbatch on the
	// login node may still land, and the level-triggered books should
	// find it while somebody is looking, not only at the next demand.
	watchUntil time.Time
	// cluster is the cluster's name (ClusterName), read with the facts;
	// the user's associations of other clusters are not its limits.
	cluster string
	// limits are the accounting limits of the login user and the room
	// they leave (limits.go).
	limits limitState
	// maxJobs is the cluster's MaxJobCount, read with the facts; 0
	// until read (jobcount.go).
	maxJobs int
	// holds are the cluster's, the site's throttle's and the limits'
	// holds on every profile (hold.go).
	holds holds
	// budget is the login user's shared RPC budget (budget.go).
	budget budget
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

	// shutdownDone is closed when the one Shutdown has finished;
	// shutdownResp and shutdownErr are its outcome, which every caller
	// gets. Set under mu before shutdownDone is closed.
	shutdownDone chan struct{}
	shutdownResp *shared.ShutdownResponse
	shutdownErr  error
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
	polling, stopPolling := context.WithCancel(life)
	return &Provisioner{
		logger:      logger,
		sshPath:     "ssh",
		now:         time.Now,
		life:        life,
		stop:        stop,
		polling:     polling,
		stopPolling: stopPolling,
		poke:        make(chan struct{}, 1),
		ledger:      ledger{outstanding: map[string]*request{}},
		maxArray:    defaultMaxArraySize,
		inflight:    map[*request]bool{},
		adoptTried:  make(chan struct{}),
		startReads:  make(chan struct{}),
		backoff:     map[string]*backoff{},
		cancelling:  map[string]*jobRef{},

		makingLogDir: make(chan struct{}, 1),
		shipping:     make(chan struct{}, 1),
		limitTurn:    make(chan struct{}, 1),

		readingLimits: make(chan struct{}, 1),
	}
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
		Capabilities: []shared.Capability{shared.CapabilityReconcileDelta, shared.CapabilityReachProbe, shared.CapabilityReconfigure}}, nil
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
	p.cfg, p.host, p.ssh = cfg, req.Host, ssh
	p.adoptPending, p.mine = true, map[string]bool{}
	// One count for adoption and then the poller, taken while shut is
	// false: Shutdown waits for both, and cancels them first. The relay,
	// if any, has one of its own, and stops when the poller does.
	p.wg.Add(1)
	if engineNet != "" {
		p.relay = newRelay(p, cfg, engineNet, engineAddr, relayCert)
		p.wg.Add(1)
		go p.relay.run(p.polling)
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
	go p.pollLoop(cfg, req.Host)
	return &shared.ConfigureResponse{Diagnostics: diags}, nil
}

// Shapes lists the machines the cluster can be asked for, smallest first.
func (p *Provisioner) Shapes(_ context.Context, req *shared.ShapesRequest) (*shared.ShapesResponse, error) {
	cfg := p.settings()
	if cfg == nil {
		return nil, shared.ErrNotConfigured
	}
	var label string
	if req != nil {
		//lint:ignore SA1019 honoured for a caller that still sets it; hosts send it empty
		label = req.Label
	}
	return &shared.ShapesResponse{Shapes: cfg.shapes(label)}, nil
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
	prof, ok := cfg.match(req.Need)
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

// parseJobID reads the job id from what sbatch --parsable printed: the id,
// or "id;cluster" with --clusters. Only the last non-empty line counts,
// since a login shell may print a banner first and Slurm has printed
// warnings before the id.
func parseJobID(stdout string) (string, error) {
	var last string
	sc := bufio.NewScanner(strings.NewReader(stdout))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			last = l
		}
	}
	id, _, _ := strings.Cut(last, ";")
	if !sbatch.IsJobID(id) {
		return "", fmt.Errorf("sbatch printed %q, not a job id", truncate(strings.TrimSpace(stdout)))
	}
	return id, nil
}

// submissionFailed is where every failed submission ends: it records the
// error, drops the reservation so the profile can be asked for again,
// logs, and tells the engine.
func (p *Provisioner) submissionFailed(cfg *settings, host shared.Host, live []*request, detail string, err error) {
	p.mu.Lock()
	p.lastErr = detail
	for _, r := range live {
		if p.outstanding[r.worker] == r {
			delete(p.outstanding, r.worker)
		}
		if r.phase != phaseArrived {
			r.phase = phaseFailed
		}
	}
	if jobsFull(detail) && !errors.Is(err, errReleaseMismatch) {
		// Weather for the whole cluster: no backoff; held for
		// jobsFullWait, so the next submission does not wait out
		// submit_timeout into the same wall at once (jobcount.go).
		until := p.now().Add(jobsFullWait)
		p.holds.clusterFull = hold{kind: holdClusterFull, until: until, reason: jobsFullDetail(p.maxJobs, detail, until)}
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
		return
	}
	if throttled(detail) && !errors.Is(err, errReleaseMismatch) {
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
		return
	}
	if which, ok := limitRefusal(detail); ok && !errors.Is(err, errReleaseMismatch) {
		// Weather that clears as jobs end: no backoff, and a smaller
		// burst next time (limits.go).
		now := p.now()
		p.learnFromRefusalLocked(cfg, allocationsOf(live), -1, which, now)
		p.holds.binding = hold{kind: holdLimitReached, reason: fmt.Sprintf("%s: Slurm refused a submission of %d machine(s) (%s); at most %d of the user's jobs or array tasks in the queue until %s",
			limitReached, len(live), which, p.limits.learned, p.limits.learnedUntil.UTC().Format(time.RFC3339))}
		p.metrics.failedMachines(live[0].profile, shared.FailureLimitReached, len(live))
		p.mu.Unlock()
		cfg.log.Warn("sbatch refused for an accounting limit; asking for fewer machines as the user's jobs end", "profile", live[0].profile,
			"worker", live[0].tag, "machines", len(live), "limit", which, "output", detail)
		for _, r := range live {
			p.publish(p.life, cfg, host, shared.Event{Kind: shared.EventWorkerProvisionFailed, Profile: r.profile, Worker: r.worker, Detail: limitReached + ": " + detail})
		}
		p.wakePoller()
		return
	}
	// One failed sbatch is one failure, however many machines it was for.
	class := submitFailureClass(err, detail)
	var held string
	if class == shared.FailureMisconfigured {
		p.markMisconfiguredLocked(live[0].profile, detail)
		held = misconfiguredDetail(live[0].profile, p.backoff[live[0].profile])
	} else {
		p.countFailureLocked(live[0].profile, detail)
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
	resp := &shared.ReconcileResponse{Arrived: p.reconcileAttachedLocked(cfg, req)}
	if len(resp.Arrived) > 0 {
		// The poller may be resting with nothing outstanding: it reads
		// the queue while workers are attached (ends.go).
		defer p.wakePoller()
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
			p.countFailureLocked(r.profile, "job "+r.job+" "+why)
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
				p.countFailureLocked(r.profile, detail)
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
	resp.Expired = p.cancelJobs(ctx, cfg, host, expired, "gave up on a machine that never attached")
	return resp, nil
}

// reconcileAttachedLocked takes in what a Reconcile says is attached,
// the whole list or the change since the last call (contract 2.4), and
// forgets the requests whose worker arrived. Arrivals in a change are
// among those that joined: a request's worker cannot have attached
// before the last call without being in it.
func (p *Provisioner) reconcileAttachedLocked(cfg *settings, req *shared.ReconcileRequest) []string {
	if !req.Delta || p.reconciled == nil {
		// A change with nothing to apply it to cannot come from an engine
		// that keeps the contract; taken as the whole list, it is the
		// best this process knows.
		names := req.Attached
		if req.Delta {
			names = req.Joined
		}
		p.reconciled = make(map[string]struct{}, len(names))
		for _, w := range names {
			p.reconciled[w] = struct{}{}
		}
		p.reconciledBy = cfg.attachedByProfile(names)
		p.attached = maps.Clone(p.reconciledBy)
		for w := range p.attachedJobs {
			if _, ok := p.reconciled[w]; !ok {
				p.departLocked(w)
			}
		}
		return p.arrivedLocked(names)
	}
	for _, w := range req.Left {
		p.departLocked(w)
		if _, ok := p.reconciled[w]; !ok {
			continue
		}
		delete(p.reconciled, w)
		if profile, why := cfg.profileOf(w); why == "" {
			p.reconciledBy[profile]--
		}
	}
	for _, w := range req.Joined {
		if _, ok := p.reconciled[w]; ok {
			continue
		}
		p.reconciled[w] = struct{}{}
		if profile, why := cfg.profileOf(w); why == "" {
			p.reconciledBy[profile]++
		}
	}
	p.attached = maps.Clone(p.reconciledBy)
	return p.arrivedLocked(req.Joined)
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

// cancelJobs cancels jobs already forgotten, with one scancel, and tells
// the engine about each: worker_cancelled with its why once Slurm has
// agreed. What scancel could not cancel stays in p.cancelling and is
// tried again on every poll cycle and at Shutdown; the engine hears of
// the first failure as worker_provision_failed, so that it stops trusting
// the worker's credential at once. msg is the log line for a cancelled
// job. It returns the ids cancelled now.
func (p *Provisioner) cancelJobs(ctx context.Context, cfg *settings, host shared.Host, refs []jobRef, msg string) []string {
	if len(refs) == 0 {
		return nil
	}
	p.mu.Lock()
	for i := range refs {
		j := refs[i]
		j.msg = msg
		if old := p.cancelling[j.job]; old != nil {
			j.failures = old.failures
			// The machines of one multi-node allocation share its job:
			// the engine hears of each.
			for _, w := range append([]string{old.worker}, old.others...) {
				if w != j.worker && !slices.Contains(j.others, w) {
					j.others = append(j.others, w)
				}
			}
		}
		p.cancelling[j.job] = &j
	}
	p.mu.Unlock()
	return p.retryCancels(ctx, cfg, host, jobIDs(refs), nil)
}

// retryCancels runs one scancel for the given ids of p.cancelling (all
// of them when ids is nil) and settles the outcome.
func (p *Provisioner) retryCancels(ctx context.Context, cfg *settings, host shared.Host, ids []string, rows []jobRow) []string {
	p.mu.Lock()
	if ids == nil {
		for id := range p.cancelling {
			ids = append(ids, id)
		}
		slices.Sort(ids)
	}
	p.mu.Unlock()
	if len(ids) == 0 {
		return nil
	}
	// Jobs given up for falling demand are cancelled only if the queue
	// says they still pend (see pendingOnly).
	var any, pendingOnly []string
	p.mu.Lock()
	for _, id := range ids {
		if j := p.cancelling[id]; j != nil && j.pendingOnly {
			pendingOnly = append(pendingOnly, id)
		} else {
			any = append(any, id)
		}
	}
	p.mu.Unlock()
	var done []string
	if len(any) > 0 {
		done = p.settleCancels(ctx, cfg, host, any, p.scancel(ctx, any))
	}
	if len(pendingOnly) > 0 {
		done = append(done, p.cancelPending(ctx, cfg, host, pendingOnly, rows)...)
	}
	return done
}

// cancelPending cancels those of ids (jobs given up for falling demand)
// that the queue, read now unless rows are this moment's, shows still
// pending. One that started since the books last looked is kept
// (goneFromQueue), since its worker is about to attach.
//
// It cancels by id, not with scancel --state=PENDING: Slurm filters job
// records, and an array's pending tasks share one, so that would cancel
// them all. A task that starts between the squeue and the scancel is
// cancelled anyway (docs/design/slurm-cancel-pending.md).
func (p *Provisioner) cancelPending(ctx context.Context, cfg *settings, host shared.Host, ids []string, rows []jobRow) []string {
	if rows == nil {
		var err error
		if rows, err = p.listJobs(ctx, cfg, true); err != nil {
			// Nothing was cancelled; the next poll tries again.
			p.settleCancels(ctx, cfg, host, ids, err)
			return nil
		}
		p.goneFromQueue(ctx, cfg, host, rows)
	}
	pending := map[string]bool{}
	for _, row := range rows {
		if row.state == "PENDING" {
			pending[row.id] = true
		}
	}
	var still []string
	p.mu.Lock()
	for _, id := range ids {
		if j := p.cancelling[id]; j != nil && pending[id] {
			still = append(still, id)
		}
	}
	p.mu.Unlock()
	if len(still) == 0 {
		return nil
	}
	return p.settleCancels(ctx, cfg, host, still, p.scancel(ctx, still))
}

// settleCancels records the outcome of a scancel of ids: err nil means
// Slurm agreed, so they leave p.cancelling and the engine hears
// worker_cancelled. Otherwise they stay, and a first failure is reported.
func (p *Provisioner) settleCancels(ctx context.Context, cfg *settings, host shared.Host, ids []string, err error) []string {
	var done, firstFail []jobRef
	p.mu.Lock()
	for _, id := range ids {
		j := p.cancelling[id]
		if j == nil {
			continue
		}
		if err == nil {
			delete(p.cancelling, id)
			done = append(done, *j)
			continue
		}
		j.failures++
		if j.failures == 1 {
			firstFail = append(firstFail, *j)
		}
	}
	if err != nil {
		p.lastErr = truncate("cancelling jobs " + strings.Join(ids, " ") + ": " + err.Error())
	}
	p.mu.Unlock()
	if err != nil {
		cfg.log.Error("could not cancel jobs; will try again on the next poll and at shutdown", "jobs", ids, "error", err)
	}
	for _, j := range firstFail {
		for _, w := range j.workers() {
			p.publish(ctx, cfg, host, shared.Event{Kind: shared.EventWorkerProvisionFailed, Profile: j.profile, Job: j.job, Worker: w,
				Detail: truncate(fmt.Sprintf("%s, and could not be cancelled yet (will keep trying): %v", j.why, err))})
		}
	}
	for _, j := range done {
		msg := j.msg
		if msg == "" {
			msg = "cancelled a job"
		}
		cfg.log.Warn(msg, "profile", j.profile, "job", j.job, "worker", j.worker, "waited", j.age.Round(time.Second), "why", j.why, "failed_tries", j.failures)
		for _, w := range j.workers() {
			p.publish(ctx, cfg, host, shared.Event{Kind: shared.EventWorkerCancelled, Profile: j.profile, Job: j.job, Worker: w, Detail: j.why})
		}
	}
	return jobIDs(done)
}

// goneFromQueue settles the jobs of p.cancelling that a poll found ended
// or no longer listed: Slurm has let them go, whether or not a scancel
// said so (scancel fails on an id it has already forgotten). It returns
// the ids still to cancel.
func (p *Provisioner) goneFromQueue(ctx context.Context, cfg *settings, host shared.Host, rows []jobRow) []string {
	p.mu.Lock()
	none := len(p.cancelling) == 0
	p.mu.Unlock()
	if none {
		return nil // Nothing being cancelled: no index of the queue to make.
	}
	active := map[string]string{}
	for _, row := range rows {
		if !endedStates[row.state] {
			active[row.id] = row.state
		}
	}
	var gone, left []string
	var kept []jobRef
	now := p.now()
	p.mu.Lock()
	for id, j := range p.cancelling {
		state, listed := active[id]
		switch {
		case !listed:
			gone = append(gone, id)
		case j.pendingOnly && state != "PENDING":
			// It started before scancel --state=PENDING reached it: a
			// machine about to attach, which falling demand never
			// cancels. Back into the books it goes.
			delete(p.cancelling, id)
			p.keepStartedLocked(*j, state, now)
			kept = append(kept, *j)
		default:
			left = append(left, id)
		}
	}
	p.mu.Unlock()
	for _, j := range kept {
		cfg.log.Info("a machine given up for falling demand started first; kept", "profile", j.profile, "job", j.job, "workers", j.workers())
	}
	slices.Sort(gone)
	slices.Sort(left)
	p.settleCancels(ctx, cfg, host, gone, nil)
	return left
}

// scancelBatch is the most ids one scancel is given. The command line and
// slurmctld both cope with more, but one call with thousands of ids is what
// times out at shutdown on busy clusters.
const scancelBatch = 100

// scancel cancels jobs with one call per scancelBatch ids: one ssh
// connection however many there are, within reason. scancel is silent
// about jobs that have already ended, so cancelling one twice is harmless.
// (scancel --name cannot stand in: it takes the name literally, and would
// cancel workers that have attached.)
func (p *Provisioner) scancel(ctx context.Context, ids []string) error {
	for _, id := range ids {
		if !sbatch.IsJobRef(id) {
			return fmt.Errorf("refusing to cancel %q: not a job id: %w", id, shared.ErrInvalidArgument)
		}
	}
	var errs []error
	// An array's tasks go as ranges ("123_[5-9]"): a burst given up is
	// a short command line.
	for batch := range slices.Chunk(sbatch.CompactIDs(ids), scancelBatch) {
		_, stderr, err := p.call(ctx, nil, append([]string{"scancel"}, batch...)...)
		if err != nil && len(bytes.TrimSpace(stderr)) > 0 {
			err = fmt.Errorf("%w: %s", err, truncate(string(stderr)))
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
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
	rt := shared.ReadRuntime()
	p.mu.Lock()
	defer p.mu.Unlock()
	resp := &shared.StatusResponse{Kind: kind, LastError: p.lastErr, Counters: p.metrics.counters(), Runtime: rt}
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
		if b := p.backoff[prof.Name]; b != nil && b.hold.on(now) {
			resp.BackingOff = append(resp.BackingOff, shared.Backoff{Profile: prof.Name, Failures: b.failures, Until: b.hold.until, LastError: b.hold.reason})
			if b.hold.kind == holdMisconfigured {
				resp.Notes = append(resp.Notes, misconfiguredDetail(prof.Name, b))
			}
		}
		c := counts[prof.Name]
		pc := shared.ProfileCounts{Profile: prof.Name, Pending: c.pending, Starting: c.starting, Attached: p.attached[prof.Name]}
		pc.Submissions = p.submissionsLocked(prof.Name, now)
		resp.Counts = append(resp.Counts, pc)
	}
	if p.arrayNote != "" {
		resp.Notes = append(resp.Notes, p.arrayNote)
	}
	if note := p.factsNoteLocked(); note != "" {
		resp.Notes = append(resp.Notes, note)
	}
	if note := p.rateNoteLocked(now); note != "" {
		resp.Notes = append(resp.Notes, note)
	}
	if note := p.budgetNoteLocked(now); note != "" {
		resp.Notes = append(resp.Notes, note)
	}
	resp.Notes = append(resp.Notes, p.limitNotesLocked(now)...)
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
	if done := p.shutdownDone; done != nil {
		p.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the shutdown in progress: %w", ctx.Err())
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.shutdownResp, p.shutdownErr
	}
	p.shut = true
	p.shutdownDone = make(chan struct{})
	p.mu.Unlock()

	resp, err := p.shutdown(ctx, req)

	p.mu.Lock()
	p.shutdownResp, p.shutdownErr = resp, err
	close(p.shutdownDone)
	p.mu.Unlock()
	return resp, err
}

// shutdown is the one Shutdown's work.
func (p *Provisioner) shutdown(ctx context.Context, req *shared.ShutdownRequest) (*shared.ShutdownResponse, error) {
	p.mu.Lock()
	cfg, host, ssh := p.cfg, p.host, p.ssh
	var inflight []*request
	for r := range p.inflight {
		inflight = append(inflight, r)
	}
	p.mu.Unlock()
	// The poller, and adoption if Configure is still at it, stop now: the
	// queue is about to be emptied of this provisioner's jobs.
	p.stopPolling()
	defer p.stop()
	if ssh != nil {
		defer ssh.Close(ctx) // last of all, after squeue and scancel
	}
	if cfg == nil {
		return &shared.ShutdownResponse{}, nil
	}

	deadline, hasDeadline := ctx.Deadline()
	if req != nil && !req.Deadline.IsZero() && (!hasDeadline || req.Deadline.Before(deadline)) {
		deadline, hasDeadline = req.Deadline, true
	}
	if hasDeadline {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}

	// Wait for the submissions and the poller, keeping back some time for
	// squeue and scancel. Without a deadline, each is bounded by
	// submit_timeout anyway.
	allDone := make(chan struct{})
	go func() {
		p.wg.Wait()
		close(allDone)
	}()
	var cutoff <-chan time.Time
	if hasDeadline {
		reserve := max(0, min(time.Until(deadline)/2, shutdownReserve))
		t := time.NewTimer(time.Until(deadline.Add(-reserve)))
		defer t.Stop()
		cutoff = t.C
	}
	var stragglers []*request
	select {
	case <-allDone:
	case <-cutoff:
	case <-ctx.Done():
	}
	for _, r := range inflight {
		if !r.finished() {
			stragglers = append(stragglers, r)
			r.cancel()
		}
	}
	// left names what may be in the queue and could not be cancelled.
	var left []string
	if len(stragglers) > 0 {
		cfg.log.Warn("submissions still in flight at shutdown; stopping them", "count", len(stragglers))
		p.mu.Lock()
		p.suspect = true
		p.mu.Unlock()
		// Killing ssh returns within sshrun.WaitDelay; then each goroutine
		// publishes its failure and finishes.
		select {
		case <-allDone:
		case <-ctx.Done():
			for _, r := range stragglers {
				if !r.finished() {
					left = append(left, "the job of worker "+r.worker+" (its submission did not stop in time)")
				}
			}
		}
	}

	p.mu.Lock()
	var jobs []jobRef
	var lost []*request
	for _, r := range p.sortedLocked() {
		switch {
		case r.phase == phaseQueued:
			jobs = append(jobs, jobRef{job: r.job, profile: r.profile, worker: r.worker})
		case r.phase == phaseAnswerLost:
			lost = append(lost, r)
		}
	}
	clear(p.outstanding)
	for _, r := range stragglers {
		if r.job == "" && r.phase != phaseArrived && !slices.Contains(lost, r) {
			lost = append(lost, r)
		}
	}
	for _, j := range p.cancelling {
		jobs = append(jobs, *j)
	}
	// Workers that attached while their submission was still going are
	// not to be cancelled, whatever state the queue shows their job in.
	arrived := map[string]bool{}
	for _, r := range inflight {
		if r.phase == phaseArrived {
			arrived[r.worker] = true
		}
	}
	neverLooked, suspect := p.adoptPending, p.suspect
	sweep := suspect || neverLooked || len(lost) > 0
	p.mu.Unlock()

	if sweep {
		found, err := p.sweepQueue(ctx, cfg, lost, arrived, neverLooked)
		switch {
		case err != nil && !suspect && len(lost) == 0:
			// Only a look for what an earlier run may have left, and the
			// queue could never be read: this run put nothing there
			// that is not in the books, and changed nothing of what it
			// found, so the next run adopts it as this one would have.
			// Not this shutdown's failure.
			p.setLastErr(err.Error())
			cfg.log.Warn("could not read the queue at shutdown, as at every look before; this run left nothing there that it knows of, and jobs an earlier run may have left are the next run's to adopt",
				"error", err, "check", "squeue --me --name="+jobName(cfg.name))
		case err != nil:
			p.setLastErr(err.Error())
			cfg.log.Error("could not read the queue for jobs whose submission was cut short", "error", err)
			what := "any job of this engine that reached the queue after its submission was cut short"
			if len(lost) > 0 {
				var ws []string
				for _, r := range lost {
					ws = append(ws, r.worker)
				}
				what = "the jobs of workers " + strings.Join(ws, ", ") + ", if they reached the queue"
			}
			left = append(left, what+" (reading the queue: "+err.Error()+")")
		}
		for _, j := range found {
			if !slices.ContainsFunc(jobs, func(k jobRef) bool { return k.job == j.job }) {
				jobs = append(jobs, j)
			}
		}
	}
	slices.SortFunc(jobs, func(a, b jobRef) int {
		return cmp.Or(cmp.Compare(len(a.job), len(b.job)), strings.Compare(a.job, b.job))
	})

	resp := &shared.ShutdownResponse{}
	if len(jobs) > 0 {
		if err := p.scancel(ctx, jobIDs(jobs)); err != nil {
			p.setLastErr(err.Error())
			cfg.log.Error("could not cancel jobs at shutdown", "jobs", jobIDs(jobs), "error", err)
			left = append(left, "jobs "+strings.Join(jobIDs(jobs), " ")+" (scancel: "+err.Error()+")")
		} else {
			resp.Cancelled = jobIDs(jobs)
			for _, j := range jobs {
				cfg.log.Info("cancelled a job at shutdown", "profile", j.profile, "job", j.job, "worker", j.worker)
				for _, w := range j.workers() {
					p.publish(ctx, cfg, host, shared.Event{Kind: shared.EventWorkerCancelled, Profile: j.profile, Job: j.job, Worker: w, Detail: "provisioner shut down"})
				}
			}
		}
	}
	if len(left) > 0 {
		return nil, fmt.Errorf("shutdown incomplete: may be left in the queue: %s; cancelled: %s",
			strings.Join(left, "; "), orNone(resp.Cancelled))
	}
	return resp, nil
}

func orNone(ids []string) string {
	if len(ids) == 0 {
		return "none"
	}
	return strings.Join(ids, " ")
}

// sweepQueue reads the queue once for Shutdown: it returns every pending
// job of this engine and provisioner, any epoch, and the job of each lost
// request, pending or running (its worker has not attached, or it would
// not be lost). Other running jobs are left alone, since their worker may
// be attached and busy, unless running is set: a plugin that never got
// to look at the queue (restarted to shut down, say) cannot tell, and
// would have adopted and cancelled them like its own.
func (p *Provisioner) sweepQueue(ctx context.Context, cfg *settings, lost []*request, arrived map[string]bool, running bool) ([]jobRef, error) {
	rows, err := p.listJobs(ctx, cfg, false)
	if err != nil {
		return nil, err
	}
	lostBy := map[string]*request{}
	for _, r := range lost {
		lostBy[r.worker] = r
	}
	var found []jobRef
	for _, row := range rows {
		tag, mine := cfg.ours(row.comment)
		if !mine {
			continue
		}
		worker := machineWorker(tag.Worker, row.id)
		profile, _ := cfg.profileOf(tag.Worker)
		machines := cfg.machinesOf(profile, worker)
		if endedStates[row.state] || slices.ContainsFunc(machines, func(m string) bool { return arrived[m] }) {
			continue
		}
		if i := slices.IndexFunc(machines, func(m string) bool { return lostBy[m] != nil }); i >= 0 && tag.Epoch == cfg.epoch {
			r := lostBy[machines[i]]
			found = append(found, jobRef{job: row.id, profile: r.profile, worker: r.worker})
			continue
		}
		if row.state == "PENDING" || running {
			found = append(found, jobRef{job: row.id, profile: profile, worker: worker})
		}
	}
	return found, nil
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
	p.wakePoller()
}
