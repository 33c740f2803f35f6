package slurm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/fluksio/provision/shared"
	"github.com/hashicorp/go-hclog"
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

	// wg counts submission goroutines, and the adoption and poller that
	// Configure starts. Add happens under mu and only while shut is false,
	// so no Add can race Shutdown's Wait.
	wg sync.WaitGroup
	// slurmCalls counts the commands run on the login node, so that tests
	// can see how many a poll cycle costs.
	slurmCalls atomic.Int64
	// conn is the ssh connection to the login node and its session cap
	// (ssh.go); it has its own lock.
	conn sshConn

	// mu guards every field below, and the fields of each request from job
	// on. It is held only to read or change them: never across ssh, a Host
	// call or a wait, because a login node can take seconds to answer and
	// the engine calls in here from its placer.
	mu sync.Mutex
	// cfg is nil until Configure succeeds; what it points to never changes.
	cfg  *settings
	host shared.Host
	// outstanding holds at most one request per profile, by profile name.
	outstanding map[string]*request
	// inflight holds the requests whose submission goroutine has not yet
	// finished, including any Reconcile has already forgotten.
	inflight map[*request]bool
	lastErr  string
	shut     bool
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
}

// request is one machine asked for and not yet arrived.
type request struct {
	profile string
	worker  string
	since   time.Time
	// cancel kills the submission's ssh; Shutdown uses it on a submission
	// that will not finish by the deadline.
	cancel context.CancelFunc
	// done is closed when the submission goroutine has finished, its event
	// published. Until then the request is still being submitted.
	done chan struct{}
	// job is the scheduler's id, empty while the submission is in flight,
	// if it failed, or if its outcome is unknown. Guarded by
	// Provisioner.mu, like every field below.
	job string
	// state is the job's state as the last poll saw it ("PENDING",
	// "RUNNING"), or stateUnknown for a submission whose answer was lost
	// and whose job has not been found yet.
	state string
	// running is when a poll first saw the job running: attach_timeout
	// counts from here.
	running time.Time
	// adopted is set for a job found in the queue at Configure, left by
	// an earlier run.
	adopted bool
	// arrived is set when Reconcile saw the worker attach, possibly before
	// its submission had finished; such a job is no longer this
	// provisioner's to cancel. Guarded by Provisioner.mu.
	arrived bool
	// waiting is set until the submission begins: it first waits for
	// Configure's look for jobs an earlier run left (adoptTried), and
	// adoption gives the profile such a job instead of letting it submit
	// another. supersededBy is then that job's id.
	waiting      bool
	supersededBy string
}

// unknown reports whether the request's submission ended without an
// answer and its job has not been found.
func (r *request) unknown() bool { return r.job == "" && r.state == stateUnknown }

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
		outstanding: map[string]*request{},
		inflight:    map[*request]bool{},
		adoptTried:  make(chan struct{}),
		backoff:     map[string]*backoff{},
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
	return &shared.InfoResponse{Kind: kind, Version: version, ContractVersion: shared.ContractVersion}, nil
}

// Schema describes the configuration.
func (p *Provisioner) Schema(context.Context, *shared.SchemaRequest) (*shared.SchemaResponse, error) {
	return &shared.SchemaResponse{Schema: schema()}, nil
}

// ValidateConfig checks a configuration. It runs nothing and writes
// nothing.
func (p *Provisioner) ValidateConfig(_ context.Context, req *shared.ValidateConfigRequest) (*shared.ValidateConfigResponse, error) {
	if req == nil {
		return nil, shared.ErrInvalidArgument
	}
	_, diags := parseConfig(req.Name, req.Config)
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
	cfg, diags := parseConfig(req.Name, req.Config)
	if diags.HasErrors() {
		return &shared.ConfigureResponse{Diagnostics: diags}, nil
	}
	cfg.log = p.logger.With("provisioner", cfg.name)

	p.mu.Lock()
	switch {
	case p.shut:
		p.mu.Unlock()
		return nil, shared.ErrShutdown
	case p.cfg != nil:
		p.mu.Unlock()
		// Outstanding requests belong to the old configuration, and
		// swapping it under them would orphan their jobs.
		return nil, fmt.Errorf("%w: already configured", shared.ErrInvalidArgument)
	}
	p.cfg, p.host = cfg, req.Host
	p.adoptPending, p.mine = true, map[string]bool{}
	// One count for adoption and then the poller, taken while shut is
	// false: Shutdown waits for both, and cancels them first.
	p.wg.Add(1)
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

// Provision asks for the smallest machine that fits. It returns at once;
// the submission runs on a goroutine, and the machine arrives by its
// worker attaching.
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
	prof, ok := cfg.match(req.Need)
	if !ok {
		return &shared.ProvisionResponse{Outcome: shared.OutcomeNoFit, Detail: noFitDetail(req.Need)}, nil
	}
	if r := p.outstanding[prof.Name]; r != nil {
		// One at a time per profile. The placer asks on every pass of its
		// wait, and a queue full of jobs nobody needed is worse than a
		// node waiting a little longer.
		detail := fmt.Sprintf("worker %s is still being submitted", r.worker)
		switch {
		case r.job != "":
			detail = fmt.Sprintf("job %s (worker %s) was asked for %s ago and has not attached", r.job, r.worker, p.now().Sub(r.since).Round(time.Second))
		case r.unknown():
			detail = fmt.Sprintf("the answer to worker %s's sbatch was lost; its job is being looked for in the queue", r.worker)
		}
		return &shared.ProvisionResponse{Outcome: shared.OutcomeOutstanding, Profile: prof.Name, Detail: detail}, nil
	}
	if b := p.backoff[prof.Name]; b != nil && p.now().Before(b.until) {
		// Asking again now would fail the same way, and the placer asks
		// on every pass.
		return &shared.ProvisionResponse{Outcome: shared.OutcomeBackingOff, Profile: prof.Name,
			Detail: fmt.Sprintf("%s in a row; not asking again until %s. Last: %s", failures(b.failures), b.until.Format(time.RFC3339), b.lastErr)}, nil
	}

	// The reservation is made before the goroutine starts, so a second
	// Provision for the profile sees it even before ssh has begun.
	ctx, cancel := context.WithCancel(p.life)
	r := &request{
		profile: prof.Name,
		worker:  workerName(cfg.name, prof.Name),
		since:   p.now(),
		cancel:  cancel,
		done:    make(chan struct{}),
		waiting: true,
	}
	p.outstanding[prof.Name] = r
	p.inflight[r] = true
	if p.adoptPending {
		p.mine[r.worker] = true
	}
	p.wg.Add(1)
	go p.submit(ctx, cfg, p.host, prof, r)
	p.wakePoller()
	return &shared.ProvisionResponse{Outcome: shared.OutcomeRequested, Profile: prof.Name}, nil
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

// workerName is unique enough that two requests never share a name, and
// starts with the provisioner's name and a dash, as the host requires
// before it mints a credential.
func workerName(provisioner, profile string) string {
	var b [4]byte
	rand.Read(b[:]) // Never fails; it crashes the program instead.
	return provisioner + "-" + profile + "-" + hex.EncodeToString(b[:])
}

// submit mints a credential and submits the script. It owns the request
// until it returns; done is closed only after its event is published, so
// nothing cancels a job before the engine has heard of it.
func (p *Provisioner) submit(ctx context.Context, cfg *settings, host shared.Host, prof Profile, r *request) {
	defer p.wg.Done()
	defer close(r.done)
	defer func() {
		p.mu.Lock()
		delete(p.inflight, r)
		p.mu.Unlock()
		r.cancel()
	}()

	// A plugin restarted after a crash is asked for machines at once, and
	// its predecessor's jobs are still in the queue. Until the first look
	// at the queue is over (bounded by submit_timeout), nothing is
	// submitted: an earlier run's job for the profile is adopted instead
	// of asking for a second machine and leaving the first running.
	select {
	case <-p.adoptTried:
	case <-ctx.Done():
	}
	p.mu.Lock()
	r.waiting = false
	adopted, adoptedWorker := r.supersededBy, ""
	if o := p.outstanding[r.profile]; adopted != "" && o != nil && o.job == adopted {
		adoptedWorker = o.worker
	}
	p.mu.Unlock()
	if adopted != "" {
		// The engine hears of the machine it asked for all the same.
		cfg.log.Info("adopted an earlier run's job instead of asking for another machine", "profile", prof.Name, "job", adopted, "instead_of", r.worker)
		if adoptedWorker != "" {
			p.publish(p.life, cfg, host, shared.Event{Kind: shared.EventWorkerProvisioned, Profile: prof.Name, Job: adopted, Worker: adoptedWorker,
				Detail: "left in the queue by an earlier run of this provisioner, and adopted"})
		}
		return
	}

	job, detail, lost, err := p.ask(ctx, cfg, host, prof, r.worker)
	if err != nil && lost && ctx.Err() == nil {
		// The connection went before sbatch's answer came back, so the
		// job may well exist, and asking again would start a second
		// one. Its comment names the worker: look.
		found, lerr := p.lookup(ctx, cfg, r.worker)
		switch {
		case lerr != nil:
			p.outcomeUnknown(cfg, r, detail, lerr)
			return
		case found != "":
			cfg.log.Warn("sbatch's answer was lost, but its job is in the queue", "profile", prof.Name, "job", found, "worker", r.worker, "error", err)
			job, err = found, nil
		default:
			detail = truncate(detail + " (the queue has no job for worker " + r.worker + ")")
		}
	}
	if err != nil {
		p.failed(cfg, host, r, detail, err)
		return
	}
	p.mu.Lock()
	r.job = job
	p.mu.Unlock()
	cfg.log.Info("asked for a machine", "profile", prof.Name, "job", job, "worker", r.worker)
	p.publish(p.life, cfg, host, shared.Event{Kind: shared.EventWorkerProvisioned, Profile: prof.Name, Job: job, Worker: r.worker})
}

// ask does the talking for submit and returns the job id, or the text to
// report as last_error and the error behind it. lost says that sbatch may
// have run without its answer coming back (answerLost).
func (p *Provisioner) ask(ctx context.Context, cfg *settings, host shared.Host, prof Profile, worker string) (job, detail string, lost bool, err error) {
	if host == nil {
		err := fmt.Errorf("cannot mint a credential for worker %s: %w", worker, shared.ErrNoHost)
		return "", err.Error(), false, err
	}
	mctx, cancel := context.WithTimeout(ctx, cfg.submitTimeout)
	cred, err := host.MintCredential(mctx, &shared.MintCredentialRequest{
		Worker: worker, TTL: cfg.tokenTTL, CPUs: prof.CPUs, GPUs: prof.GPUs, RAMMB: prof.RAMMB, Labels: prof.Labels,
	})
	cancel()
	if err == nil && (cred == nil || cred.Token == "") {
		err = errors.New("the host returned an empty credential")
	}
	if err != nil {
		err = fmt.Errorf("minting a credential for worker %s: %w", worker, err)
		return "", err.Error(), false, err
	}

	stdout, stderr, err := p.call(ctx, p.payload(prof, worker, cred.Token), "sbatch", "--parsable")
	// sbatch does not echo the script, but a wrapper on the login node
	// might, and the token must not reach a log or an event.
	redact := func(s string) string { return strings.ReplaceAll(s, cred.Token, "[redacted]") }
	if err != nil {
		said := firstNonEmpty(string(stderr), string(stdout), err.Error())
		return "", truncate(redact(said)), answerLost(err, stderr), err
	}
	job, err = parseJobID(string(stdout))
	if err != nil {
		err = fmt.Errorf("sbatch on %s: %w", cfg.host(), err)
		return "", truncate(redact(err.Error())), false, err
	}
	return job, "", false, nil
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
	if !isJobID(id) {
		return "", fmt.Errorf("sbatch printed %q, not a job id", truncate(strings.TrimSpace(stdout)))
	}
	return id, nil
}

// isJobID reports whether s is a Slurm job id: digits, and not so many
// that it is something else.
func isJobID(s string) bool {
	if s == "" || len(s) > 20 {
		return false
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// failed is where every failed submission ends: it records the error,
// drops the reservation so the profile can be asked for again, logs, and
// tells the engine.
func (p *Provisioner) failed(cfg *settings, host shared.Host, r *request, detail string, err error) {
	p.mu.Lock()
	p.lastErr = detail
	if p.outstanding[r.profile] == r {
		delete(p.outstanding, r.profile)
	}
	p.failedLocked(r.profile, detail)
	p.mu.Unlock()
	args := []any{"profile", r.profile, "worker", r.worker, "error", err}
	if detail != err.Error() {
		args = append(args, "output", detail)
	}
	cfg.log.Error("could not ask for a machine", args...)
	p.publish(p.life, cfg, host, shared.Event{Kind: shared.EventWorkerProvisionFailed, Profile: r.profile, Worker: r.worker, Detail: detail})
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

// Reconcile forgets requests whose worker has attached and cancels those
// that have waited too long: longer than provision_timeout since they were
// asked for, or longer than attach_timeout since their job was first seen
// running. A request still being submitted is never expired: its job id
// is not known yet. One whose submission's answer was lost and whose job
// was never found is forgotten after provision_timeout.
func (p *Provisioner) Reconcile(ctx context.Context, req *shared.ReconcileRequest) (*shared.ReconcileResponse, error) {
	attached := map[string]bool{}
	if req != nil {
		for _, w := range req.Attached {
			attached[w] = true
		}
	}
	now := p.now()

	p.mu.Lock()
	cfg, host := p.cfg, p.host
	if cfg == nil {
		p.mu.Unlock()
		return nil, shared.ErrNotConfigured
	}
	resp := &shared.ReconcileResponse{}
	var expired []jobRef
	var gaveUp []shared.Event
	for _, prof := range cfg.Profiles {
		r := p.outstanding[prof.Name]
		switch {
		case r == nil:
		case attached[r.worker]:
			// It arrived. Asking again is somebody else's decision.
			r.arrived = true
			delete(p.outstanding, prof.Name)
			delete(p.backoff, prof.Name)
			resp.Arrived = append(resp.Arrived, r.worker)
		case !r.finished():
		case r.job != "" && now.Sub(r.since) > cfg.provisionTimeout:
			delete(p.outstanding, prof.Name)
			expired = append(expired, jobRef{job: r.job, profile: r.profile, worker: r.worker, age: now.Sub(r.since),
				why: fmt.Sprintf("did not attach within %s", cfg.provisionTimeout)})
		case r.job != "" && !r.running.IsZero() && now.Sub(r.running) > cfg.attachTimeout:
			// It got a machine and its worker never dialled in: the
			// next one from this profile would likely do the same.
			delete(p.outstanding, prof.Name)
			why := fmt.Sprintf("ran for %s without its worker attaching (attach_timeout %s)", now.Sub(r.running).Round(time.Second), cfg.attachTimeout)
			p.failedLocked(r.profile, "job "+r.job+" "+why)
			expired = append(expired, jobRef{job: r.job, profile: r.profile, worker: r.worker, age: now.Sub(r.since), why: why})
		case r.unknown() && now.Sub(r.since) > cfg.provisionTimeout:
			delete(p.outstanding, prof.Name)
			detail := fmt.Sprintf("the answer to worker %s's sbatch was lost, and no job for it was found within %s", r.worker, cfg.provisionTimeout)
			p.lastErr = detail
			p.failedLocked(r.profile, detail)
			gaveUp = append(gaveUp, shared.Event{Kind: shared.EventWorkerProvisionFailed, Profile: r.profile, Worker: r.worker, Detail: detail})
		}
	}
	p.mu.Unlock()

	for _, ev := range gaveUp {
		cfg.log.Error("gave up looking for the job of a submission whose answer was lost", "profile", ev.Profile, "worker", ev.Worker)
		p.publish(ctx, cfg, host, ev)
	}
	p.cancelJobs(ctx, cfg, host, expired, "gave up on a machine that never attached")
	for _, j := range expired {
		resp.Expired = append(resp.Expired, j.job)
	}
	return resp, nil
}

// jobRef is a job on its way to being cancelled, with what the event for
// it needs: why says why, as the event's detail.
type jobRef struct {
	job, profile, worker string
	age                  time.Duration
	why                  string
}

func jobIDs(refs []jobRef) []string {
	ids := make([]string, len(refs))
	for i, r := range refs {
		ids[i] = r.job
	}
	return ids
}

// cancelJobs cancels jobs already forgotten, with one scancel, and tells
// the engine about each: worker_cancelled with its why, or
// worker_provision_failed if scancel failed, since the job may then still
// be in the queue. msg is the log line for a cancelled job.
func (p *Provisioner) cancelJobs(ctx context.Context, cfg *settings, host shared.Host, refs []jobRef, msg string) {
	if len(refs) == 0 {
		return
	}
	err := p.scancel(ctx, jobIDs(refs))
	if err != nil {
		p.setLastErr(err.Error())
		cfg.log.Error("could not cancel jobs", "jobs", jobIDs(refs), "error", err)
	}
	for _, j := range refs {
		if err != nil {
			p.publish(ctx, cfg, host, shared.Event{Kind: shared.EventWorkerProvisionFailed, Profile: j.profile, Job: j.job, Worker: j.worker,
				Detail: truncate(fmt.Sprintf("%s and could not be cancelled: %v", j.why, err))})
			continue
		}
		cfg.log.Warn(msg, "profile", j.profile, "job", j.job, "worker", j.worker, "waited", j.age.Round(time.Second), "why", j.why)
		p.publish(ctx, cfg, host, shared.Event{Kind: shared.EventWorkerCancelled, Profile: j.profile, Job: j.job, Worker: j.worker, Detail: j.why})
	}
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
		if !isJobID(id) {
			return fmt.Errorf("refusing to cancel %q: not a job id: %w", id, shared.ErrInvalidArgument)
		}
	}
	var errs []error
	for batch := range slices.Chunk(ids, scancelBatch) {
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
	p.mu.Lock()
	defer p.mu.Unlock()
	resp := &shared.StatusResponse{Kind: kind, LastError: p.lastErr}
	if p.cfg == nil {
		return resp, nil
	}
	resp.Name = p.cfg.name
	for _, prof := range p.cfg.Profiles {
		resp.Profiles = append(resp.Profiles, prof.Name)
		if r := p.outstanding[prof.Name]; r != nil {
			resp.Outstanding = append(resp.Outstanding, shared.Outstanding{Profile: r.profile, Job: r.job, Worker: r.worker, Age: now.Sub(r.since), State: r.state})
		}
		if b := p.backoff[prof.Name]; b != nil && now.Before(b.until) {
			resp.BackingOff = append(resp.BackingOff, shared.Backoff{Profile: prof.Name, Failures: b.failures, Until: b.until, LastError: b.lastErr})
		}
	}
	return resp, nil
}

// Shutdown cancels every job this provisioner asked for that has not
// attached, with one scancel, and returns the ids cancelled.
//
// A submission in flight when Shutdown begins may already have reached
// slurmctld, so it is not simply abandoned. It is given until shortly
// before the deadline to finish and report its job id. If it has not by
// then, its ssh is killed and its job, if sbatch got that far, is looked
// for by the worker's name in the job comment, as are the jobs of earlier
// submissions whose answer was lost. Jobs adopted at Configure are
// cancelled like any other.
func (p *Provisioner) Shutdown(ctx context.Context, req *shared.ShutdownRequest) (*shared.ShutdownResponse, error) {
	p.mu.Lock()
	if p.shut {
		p.mu.Unlock()
		return &shared.ShutdownResponse{}, nil
	}
	p.shut = true
	cfg, host := p.cfg, p.host
	var inflight []*request
	for r := range p.inflight {
		inflight = append(inflight, r)
	}
	p.mu.Unlock()
	// The poller, and adoption if Configure is still at it, stop now: the
	// queue is about to be emptied of this provisioner's jobs.
	p.stopPolling()
	defer p.stop()
	defer p.closeSSH(ctx) // last of all, after squeue and scancel
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
	if len(stragglers) > 0 {
		cfg.log.Warn("submissions still in flight at shutdown; stopping them", "count", len(stragglers))
		// Killing ssh returns within sshWaitDelay; then each goroutine
		// publishes its failure and finishes.
		select {
		case <-allDone:
		case <-ctx.Done():
		}
	}

	p.mu.Lock()
	var jobs []jobRef
	var lost []*request
	for _, prof := range cfg.Profiles {
		r := p.outstanding[prof.Name]
		switch {
		case r == nil:
		case r.job != "":
			jobs = append(jobs, jobRef{job: r.job, profile: r.profile, worker: r.worker})
		case r.unknown():
			lost = append(lost, r)
		}
	}
	clear(p.outstanding)
	for _, r := range stragglers {
		if r.job == "" && !r.arrived && !slices.Contains(lost, r) {
			lost = append(lost, r)
		}
	}
	p.mu.Unlock()

	if len(lost) > 0 {
		found, err := p.findLost(ctx, cfg, lost)
		if err != nil {
			p.setLastErr(err.Error())
			cfg.log.Error("could not look for jobs of interrupted submissions", "error", err)
		}
		jobs = append(jobs, found...)
	}
	if len(jobs) == 0 {
		return &shared.ShutdownResponse{}, nil
	}
	if err := p.scancel(ctx, jobIDs(jobs)); err != nil {
		p.setLastErr(err.Error())
		cfg.log.Error("could not cancel jobs at shutdown", "jobs", jobIDs(jobs), "error", err)
		return nil, fmt.Errorf("cancelling jobs %s: %w", strings.Join(jobIDs(jobs), " "), err)
	}
	resp := &shared.ShutdownResponse{Cancelled: jobIDs(jobs)}
	for _, j := range jobs {
		cfg.log.Info("cancelled a job at shutdown", "profile", j.profile, "job", j.job, "worker", j.worker)
		p.publish(ctx, cfg, host, shared.Event{Kind: shared.EventWorkerCancelled, Profile: j.profile, Job: j.job, Worker: j.worker, Detail: "provisioner shut down"})
	}
	return resp, nil
}

// findLost looks for the jobs of submissions whose answer never came
// back. Every job this provisioner submits is named after it and carries
// its worker in the comment, so one squeue finds them all.
func (p *Provisioner) findLost(ctx context.Context, cfg *settings, lost []*request) ([]jobRef, error) {
	byComment, err := p.jobsByComment(ctx, cfg)
	if err != nil {
		return nil, err
	}
	var found []jobRef
	for _, r := range lost {
		if id := byComment[jobComment(r.worker)]; id != "" {
			found = append(found, jobRef{job: id, profile: r.profile, worker: r.worker})
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

// truncate trims s and keeps at most maxDetail characters of it.
func truncate(s string) string {
	s = strings.TrimSpace(s)
	if utf8.RuneCountInString(s) <= maxDetail {
		return s
	}
	// Keep both ends: a tool's first line says what it was doing and its
	// last says what went wrong (ssh's host-key banner runs for 700
	// characters before "Host key verification failed.").
	const gap = " … "
	r := []rune(s)
	head := (maxDetail - len([]rune(gap))) / 3
	tail := maxDetail - len([]rune(gap)) - head
	return string(r[:head]) + gap + string(r[len(r)-tail:])
}
