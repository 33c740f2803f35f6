package slurm

// What a read of the queue decides: judge applies a poll cycle's rows to
// the requests it watched. The poller that reads the queue is in
// poller.go, the adoption of jobs the books do not hold in adopt.go, and
// the commands themselves in slurm/internal/queue. Each cycle reads this
// provisioner's jobs with one squeue, whatever their number, because
// every job is named fluksio-<provisioner> and carries its worker in its
// comment.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/internal/queue"
	"github.com/fluksio/provision/slurm/sbatch"
	"github.com/fluksio/provision/slurm/sshrun"
)

const (
	// stateUnknown is the state of a request whose sbatch's answer was
	// lost and whose job has not been found in the queue yet.
	stateUnknown = "UNKNOWN"

	// pollJitter spreads poll cycles by ±10%, so that provisioners started
	// together do not read the queue in step.
	pollJitter = 0.1
)

// endedStates are the states of a job that has ended. squeue -t all lists
// them for MinJobAge (300 s by default); after that the job is gone, which
// means the same.
var endedStates = map[string]bool{
	"BOOT_FAIL": true, "CANCELLED": true, "COMPLETED": true, "DEADLINE": true, "FAILED": true,
	"NODE_FAIL": true, "OUT_OF_MEMORY": true, "PREEMPTED": true, "TIMEOUT": true,
}

// neverClear are the reasons a pending job gives that waiting does not
// change: the job asks for what its partition, account or QOS will never
// give it, or for something that does not exist. Slurm keeps such a job
// PENDING for ever unless EnforcePartLimits rejects it at submission, and
// by default it does not. reasonNeverClears adds the per-job and per-node
// maximums and the minimums of associations and QOSes.
//
// Limits on what a user, an account or a group may have running at once
// (QOSMaxJobsPerUserLimit, AssocGrpCpuLimit and so on) are not here: they
// clear as other jobs end. Neither are PartitionDown, ReqNodeNotAvail or
// holds, which an administrator may lift.
var neverClear = map[string]bool{
	"AccountNotAllowed":        true,
	"BadConstraints":           true,
	"DependencyNeverSatisfied": true,
	"InvalidAccount":           true,
	"InvalidQOS":               true,
	"MaxMemPerLimit":           true,
	"PartitionConfig":          true,
	"PartitionNodeLimit":       true,
	"PartitionTimeLimit":       true,
	"QOSNotAllowed":            true,
	"ReservationDeleted":       true,
}

// reasonNeverClears reports whether a pending job with this reason will
// never start by itself.
func reasonNeverClears(reason string) bool {
	if neverClear[reason] {
		return true
	}
	if strings.HasPrefix(reason, "QOSMax") || strings.HasPrefix(reason, "AssocMax") {
		// QOSMaxWallDurationPerJobLimit, AssocMaxCpuPerNode and the
		// like; not QOSMaxJobsPerUserLimit or AssocMaxJobsLimit.
		return strings.Contains(reason, "PerJob") || strings.Contains(reason, "PerNode")
	}
	return strings.HasPrefix(reason, "QOSMin")
}

var (
	// slurmTimedOut is slurmctld not answering an RPC it may still carry
	// out: the case of sbatch failing and its job existing.
	slurmTimedOut = regexp.MustCompile(`Socket timed out|Zero Bytes were transmitted or received`)
	// sbatchSaid is sbatch answering, which it does with exit status 255
	// for an option it cannot parse.
	sbatchSaid = regexp.MustCompile(`(?m)^sbatch: `)
)

// answerLost reports whether a failed sbatch may have submitted its job
// all the same: ssh ran out of time, the connection dropped (ssh's own
// exit status 255) once the command may have started, or slurmctld timed
// out on a submission it may yet have accepted. It is false when sbatch
// itself said no, and when ssh never got as far as running it.
func answerLost(err error, stderr []byte) bool {
	if errors.Is(err, context.DeadlineExceeded) || slurmTimedOut.Match(stderr) {
		return true
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 255 {
		return false
	}
	return !sbatchSaid.Match(stderr) && !sshrun.NeverRan(stderr)
}

// maxIdleAdoptFailures is how many poll cycles in a row may fail to read
// the queue for adoption alone before the poller rests: a login node that
// is down for the day should not cost an ssh every poll_interval while
// nobody asks for anything. The next Provision wakes it, and adoption is
// tried again before any submission.
const maxIdleAdoptFailures = 5

func jittered(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (1 - pollJitter + 2*pollJitter*rand.Float64()))
}

// watch is a request as a poll cycle found it before reading the queue.
type watch struct {
	r   *request
	job string
}

// judge applies one poll to the requests watched when it began, unless
// they have changed since:
//
//   - a lost submission found by its comment gets its job, and the engine
//     hears that it was provisioned; one not found was not submitted;
//   - a job that has ended, or left the queue, before its worker attached
//     is forgotten, so the profile can be asked for again;
//   - a job pending for a reason that never clears is cancelled;
//   - any other job's state is recorded, and the first time it is seen
//     running starts its attach_timeout.
//
// The failures count towards the profile's backoff.
func (p *Provisioner) judge(cfg *settings, host shared.Host, watched []watch, rows []queue.Job) {
	v := &verdict{p: p, cfg: cfg, rows: rows, byID: indexRows(rows), now: p.now()}

	p.mu.Lock()
	if p.shut {
		p.mu.Unlock()
		return
	}
	v.failed, v.neverStarts = map[string]string{}, map[string]string{}
	for _, w := range v.actingLocked(watched) {
		v.judgeLocked(w.r)
	}
	held := p.holdJudgedLocked(v.failed, v.neverStarts)
	p.mu.Unlock()
	for _, h := range held {
		cfg.log.Error("profile misconfigured; its job can never start", "hold", h)
	}

	p.tellJudged(cfg, host, v.reports)
	p.cancels.cancelJobs(p.life, cfg, host, v.cancels, "cancelled a job that can never start")
	p.cancels.cancelJobs(p.life, cfg, host, v.requeues, "cancelled a job Slurm requeued before its worker attached")
}

// verdict is what judge makes of one poll: the rows it read, and what
// follows from them, gathered under p.mu and told after it. Its methods
// run with p.mu held.
type verdict struct {
	p    *Provisioner
	cfg  *settings
	rows []queue.Job
	byID rowIndex
	now  time.Time
	// byComment holds every row of a comment (an array's tasks share
	// one), for a submission whose answer was lost. It is made the first
	// time one is looked for: grouping 10,000 rows every cycle was a
	// third of what a cycle allocated.
	byComment map[string][]queue.Job

	reports           []judged
	cancels, requeues []jobRef
	// A burst whose tasks all fail at once is one failure of its
	// profile, not one per task: failed holds each profile's last detail,
	// counted once at the end.
	failed map[string]string
	// neverStarts holds the profiles with a job pending for a reason
	// that never clears: the same verdict as an sbatch refusal, given
	// later (refusal.go).
	neverStarts map[string]string
}

// actingLocked is the watched requests judge acts on, newest first: those
// still in the books as they were watched, less the ones whose job is
// merely still queued or running, whose state it records. p.mu must be
// held.
func (v *verdict) actingLocked(watched []watch) []watch {
	p := v.p
	// Most watched jobs are still queued or running, and only have their
	// state recorded, which no order changes. The rest are judged newest
	// first, so that the last failure of a profile, the few explained
	// and the events come out the same whatever order the books are
	// kept in; sorting them all cost a tenth of a poll cycle at 10,000.
	acting := watched[:0]
	for _, w := range watched {
		r := w.r
		if p.outstanding[r.worker] != r || r.job != w.job {
			continue
		}
		if r.phase == phaseQueued {
			if row, ok := v.byID.get(r.job); ok && !endedStates[row.State] && !(row.State == "PENDING" && reasonNeverClears(row.Reason)) &&
				!requeued(r, row) {
				recordState(r, row, v.now)
				continue
			}
		}
		acting = append(acting, w)
	}
	slices.SortFunc(acting, func(a, b watch) int { return cmpNewest(a.r, b.r) })
	return acting
}

// judgeLocked judges one request by its job's row: a lost submission's
// is looked for first (lostLocked). p.mu must be held.
func (v *verdict) judgeLocked(r *request) {
	p := v.p
	row, listed := rowOf(v.byID, r.job, v.cfg.comment(r.tag))
	if r.phase == phaseAnswerLost {
		if row, listed = v.lostLocked(r); !listed {
			return
		}
	}
	if r.phase != phaseQueued {
		return
	}
	switch {
	case !listed:
		v.forgetLocked(r, fmt.Sprintf("job %s left the queue before its worker attached", r.job), true)
	case endedStates[row.State]:
		state := row.State
		if row.Reason != "" && row.Reason != "None" {
			state += " (" + row.Reason + ")"
		}
		// A job cancelled (by us, an administrator, or its
		// deadline) has nothing to say for itself; one that ran
		// and ended may have.
		said := row.State != "CANCELLED" && row.State != "DEADLINE" && row.State != "PREEMPTED"
		v.forgetLocked(r, fmt.Sprintf("job %s ended %s before its worker attached", r.job, state), said)
	case requeued(r, row):
		// Its worker may have attached and left before the engine
		// said so (its credential is then spent): the job is given
		// up, not the profile, which did nothing wrong.
		delete(p.outstanding, r.worker)
		r.phase = phaseFailed
		v.requeues = append(v.requeues, jobRef{job: r.job, profile: r.profile, worker: r.worker, age: v.now.Sub(r.since),
			why: "requeued by Slurm (its node failed, or it was preempted) before its worker attached"})
	case row.State == "PENDING" && reasonNeverClears(row.Reason):
		delete(p.outstanding, r.worker)
		r.phase = phaseFailed
		why := fmt.Sprintf("pending for %s, which waiting does not clear", row.Reason)
		p.metrics.failed(r.profile, shared.FailureMisconfigured)
		p.lastErr = "job " + r.job + " was " + why
		v.neverStarts[r.profile] = p.lastErr
		v.cancels = append(v.cancels, jobRef{job: r.job, profile: r.profile, worker: r.worker, age: v.now.Sub(r.since), why: why})
	default:
		recordState(r, row, v.now)
	}
}

// lostLocked looks for the job of r, a submission whose sbatch's answer
// was lost, among the rows of its comment. Found, it is r's job, and the
// engine hears that it was provisioned; not found once it can no longer
// land, r was not submitted. It returns the job's row, and whether there
// is one. p.mu must be held.
func (v *verdict) lostLocked(r *request) (queue.Job, bool) {
	if v.byComment == nil {
		v.byComment = map[string][]queue.Job{}
		for _, row := range v.rows {
			if row.Comment != "" {
				v.byComment[row.Comment] = append(v.byComment[row.Comment], row)
			}
		}
	}
	row, listed := taskRow(v.byComment[v.cfg.comment(r.tag)], r.task)
	if !listed {
		if v.now.Before(r.landBy) {
			return row, false // It may land yet (landing.go).
		}
		v.forgetLocked(r, fmt.Sprintf("the answer to worker %s's sbatch was lost, and the queue has no job for it now that it can no longer land: it was not submitted", r.worker), false)
		v.p.watchUntil = v.now.Add(v.cfg.provisionTimeout)
		return row, false
	}
	r.job, r.phase = row.ID, phaseQueued
	v.reports = append(v.reports, judged{
		ev: shared.Event{Kind: shared.EventWorkerProvisioned, Profile: r.profile, Job: r.job, Worker: r.worker,
			Detail: "found in the queue after sbatch's answer was lost"},
		msg: "found the job of a submission whose answer was lost",
	})
	return row, true
}

// forgetLocked takes r, a request that failed before its worker
// attached, out of the books and counts the failure towards its profile,
// unless the rate limiter held its submission up. ended is set for a job
// that ended by itself: the cluster is asked why (joblog.go), and the
// worker's copy is checked again (ship.go). p.mu must be held.
func (v *verdict) forgetLocked(r *request, detail string, ended bool) {
	p := v.p
	class := judgedFailureClass(r)
	p.metrics.failed(r.profile, class)
	delete(p.outstanding, r.worker)
	r.phase = phaseFailed
	if !r.rationed {
		// A submission the rate limiter held up is weather.
		p.lastErr = detail
		v.failed[r.profile] = detail
	}
	if ended {
		p.files.recheckWorkerLocked()
	}
	v.reports = append(v.reports, judged{
		ev:      shared.Event{Kind: shared.EventWorkerProvisionFailed, Profile: r.profile, Job: r.job, Worker: r.worker, Detail: detail, Class: class},
		msg:     "a request failed before its worker attached",
		ended:   ended,
		secrets: r.secrets,
	})
}

// judged is what judge tells of one request: its event and log line.
type judged struct {
	ev  shared.Event
	msg string
	// ended is set for a job that ended before its worker attached: the
	// cluster is asked why (joblog.go).
	ended bool
	// secrets are the credentials the job's script held, to be redacted
	// from what its output says.
	secrets []string
}

// holdJudgedLocked counts a cycle's failures towards their profiles'
// backoff, once a profile, and holds the profiles whose job can never
// start as misconfigured; it returns those holds' words. p.mu must be
// held.
func (p *Provisioner) holdJudgedLocked(failed, neverStarts map[string]string) []string {
	for profile, detail := range failed {
		if neverStarts[profile] == "" {
			p.holds.countFailureLocked(profile, detail)
		}
	}
	var held []string
	for profile, detail := range neverStarts {
		p.holds.markMisconfiguredLocked(profile, detail)
		held = append(held, misconfiguredDetail(profile, p.holds.backoff[profile]))
	}
	return held
}

// tellJudged tells what judge decided: the jobs that ended before their
// worker attached are explained (the first explainPerPoll from their
// output, the rest by where it is), then every event is logged and
// published.
func (p *Provisioner) tellJudged(cfg *settings, host shared.Host, reports []judged) {
	explained := 0
	for i := range reports {
		rep := &reports[i]
		if !rep.ended {
			continue
		}
		prof, _ := cfg.profile(rep.ev.Profile)
		var why string
		if explained < explainPerPoll {
			explained++
			why = p.files.explain(p.poll.ctx, prof, rep.ev.Job, rep.secrets)
		} else if out := p.files.outputOf(prof, rep.ev.Job); out != "" {
			why = "output " + out
		}
		if why != "" {
			rep.ev.Detail = truncateTo(rep.ev.Detail+": "+why, maxDetail*2)
			p.setLastErr(rep.ev.Detail)
		}
	}
	for _, rep := range reports {
		ev := rep.ev
		if ev.Kind == shared.EventWorkerProvisioned {
			cfg.log.Info(rep.msg, "profile", ev.Profile, "job", ev.Job, "worker", ev.Worker)
		} else {
			cfg.log.Warn(rep.msg, "profile", ev.Profile, "job", ev.Job, "worker", ev.Worker, "detail", ev.Detail)
		}
		p.publish(p.life, cfg, host, ev)
	}
}

// requeued reports whether a queued request's job, seen running, is
// pending again: Slurm requeues a batch job whose node fails
// (JobRequeue=1, the default) or that is preempted. Its worker may have
// attached and left meanwhile, spending its credential, and nothing in
// the queue tells whether it did. A job requeued before any poll saw it
// running looks like one never started (its reason, BeginTime, is also
// what --begin or a site's submit rule gives), and is kept.
func requeued(r *request, row queue.Job) bool {
	return row.State == "PENDING" && !r.running.IsZero()
}

// recordState keeps what squeue says of a queued request's job, row, and
// starts its attach_timeout the first time it is seen running.
func recordState(r *request, row queue.Job, now time.Time) {
	switch {
	case row.Partial && row.State == "PENDING":
		// A light poll knows no reason: the last one stands.
	case row.State == "PENDING" && row.Reason != "None":
		r.pendingReason = row.Reason
	default:
		r.pendingReason = ""
	}
	r.slurmState = row.State
	if row.State == "RUNNING" && r.running.IsZero() {
		r.running = now
	}
}

// rowOf is job's row among byID: its own, or, for an array task that has
// none, its array's bare id when that row carries the task's comment.
// Slurm prints the bare id for a pending record cancelled while it still
// held several tasks, and 26.05 does it for a pending task cancelled
// alone too ("J CANCELLED" where 22.05 and 24.11 print "J_0 CANCELLED";
// testdata/slurm-versions): the row then stands for every task it held,
// and its state is theirs.
func rowOf(byID rowIndex, job, comment string) (queue.Job, bool) {
	if row, ok := byID.get(job); ok {
		return row, true
	}
	array, task := sbatch.SplitTask(job)
	if task < 0 {
		return queue.Job{}, false
	}
	if row, ok := byID.get(array); ok && (row.Comment == comment || row.Partial) {
		// A light poll's rows are of the ids it asked for alone.
		return row, true
	}
	return queue.Job{}, false
}

// rowIndex finds a poll's rows by job id. It maps an id to the row's
// place rather than to a copy of the row: a quarter of the memory, made
// anew every poll cycle.
type rowIndex struct {
	rows []queue.Job
	at   map[string]int32
}

func indexRows(rows []queue.Job) rowIndex {
	at := make(map[string]int32, len(rows))
	for i, row := range rows {
		at[row.ID] = int32(i)
	}
	return rowIndex{rows, at}
}

func (x rowIndex) get(id string) (queue.Job, bool) {
	i, ok := x.at[id]
	if !ok {
		return queue.Job{}, false
	}
	return x.rows[i], true
}

// taskRow is the row among rows (the rows of one comment) for array task
// task, or for the job itself when task is -1.
//
// An array task with no row of its own is stood for by its array's bare
// row, as in rowOf; the row returned then carries the task's own id, so
// that nothing later takes the whole array for the task.
func taskRow(rows []queue.Job, task int) (queue.Job, bool) {
	var bare queue.Job
	hasBare := false
	for _, row := range rows {
		_, t := sbatch.SplitTask(row.ID)
		if t == task {
			return row, true
		}
		if t < 0 && task >= 0 && !hasBare {
			bare, hasBare = row, true
		}
	}
	if hasBare {
		bare.ID += "_" + strconv.Itoa(task)
	}
	return bare, hasBare
}

// closedDone is the done channel of an adopted request, which has no
// submission to wait for.
var closedDone = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// profileOf reads the profile from the name of a worker of this
// provisioner: <provisioner>-<profile>-<8 hex digits>, taken from a job's
// tag, or an array task's <provisioner>-<profile>-<8 hex digits>-<task>,
// either followed by -n<node> for a node of a multi-node allocation.
// why says what is wrong when it does not name a worker of a configured
// profile.
func (s *settings) profileOf(worker string) (profile, why string) {
	worker, _ = cutNode(worker)
	rest, ok := strings.CutPrefix(worker, s.name+"-")
	var candidates []string
	if ok {
		candidates = append(candidates, rest)
		// An array task's name ends in -<task>; a profile's name may too,
		// so both readings are tried, a configured profile first.
		if i := strings.LastIndexByte(rest, '-'); i > 0 && isDigits(rest[i+1:], 7) {
			candidates = append(candidates, rest[:i])
		}
	}
	var first string
	for _, c := range candidates {
		n := len(c)
		if n < 10 || c[n-9] != '-' || !isLowerHex(c[n-8:]) || !shared.ValidName(c[:n-9]) {
			continue
		}
		name := c[:n-9]
		if _, configured := s.profile(name); configured {
			return name, ""
		}
		if first == "" {
			first = name
		}
	}
	if first == "" {
		return "", fmt.Sprintf("its tag names worker %s, which is not a worker of provisioner %s", strconv.Quote(truncateTo(worker, 80)), s.name)
	}
	return first, fmt.Sprintf("profile %s is not configured", first)
}

// machineWorker is the worker of the machine a queue row stands for: the
// worker its tag names for a job of its own, <tag>-<task> for an array
// task.
func machineWorker(tagWorker, rowID string) string {
	if _, task := sbatch.SplitTask(rowID); task >= 0 {
		return tagWorker + "-" + strconv.Itoa(task)
	}
	return tagWorker
}

// isDigits reports whether s is 1 to n decimal digits.
func isDigits(s string, n int) bool {
	if s == "" || len(s) > n {
		return false
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func isLowerHex(s string) bool {
	for _, c := range []byte(s) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// truncateTo keeps at most n bytes of s, on a rune boundary.
func truncateTo(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }
