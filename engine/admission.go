package engine

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/termsafe"
	"github.com/fluksio/provision/shared"
)

// admission is the rest of the proof a verified credential leaves open:
// a credential proves the engine minted it, not that the machine
// presenting it is the one it was minted for (it can be copied out of a
// job's environment, or presented twice). A worker attaches only as the
// job its provisioner said it started it as (the worker_provisioned
// event, stamped by the host), a credential is good for one job (a name
// that detached, went silent or was cancelled is revoked until its
// credential would have expired), and a worker may not claim more than
// its credential was minted for (allows).
//
// It keeps no lock: it is the books', and every method is called under
// books.mu, so its answers are atomic with who is attached. It acts only
// when called: the books call revoke when a worker detaches or goes
// silent, and sweep to forget what has expired. Why it is here and not
// in engine/host: docs/design/engine-admission.md.
type admission struct {
	now func() time.Time
	// jobs is the provisioners' word on which job each worker was started
	// as, by worker name.
	jobs map[string]jobRecord
	// revoked holds names that may not attach again, until their
	// credential would have expired.
	revoked map[string]revocation
	// budget bounds, per provisioner, the job records its events made
	// (jobsBy counts them) and, apart, the revocations they made
	// (revokedBy), so that revocations piling up never cost a
	// provisioner room for the workers on their way. The engine's own
	// revocations (a worker that detached or went silent) are charged to
	// nobody: they are bounded by the workers that attached.
	budget    int
	jobsBy    map[string]int
	revokedBy map[string]int
}

// recordBudget is how many job records one provisioner's events may keep
// in the admission at once (its workers on their way or attached), and,
// apart, how many revocations (of names whose credentials may still be
// out). A burst of 10,000 array tasks fits three times over. A plugin
// that floods past it has its further events' records refused
// (errOverBudget), which costs only its own workers, never another
// provisioner's; a revocation refused costs nothing while the provisioner
// does not name the worker again, as a name without a job record cannot
// attach. The two budgets bound the memory one provisioner's events hold.
const recordBudget = 32_768

// errOverBudget is observe's answer to an event whose record would take
// its provisioner past recordBudget: the record is not kept, so a worker
// the event names as provisioned cannot attach until the provisioner's
// older records are used up or expire.
var errOverBudget = errors.New("the provisioner's events already hold their budget of records")

// jobRecord is what a provisioner said about one of its workers.
type jobRecord struct {
	provisioner string
	job         string
	// profile is what the worker was started as, which a need may name
	// as its label (shared.Shape.HasLabel).
	profile string
	at      time.Time
}

// revocation is why and until when a worker name is refused, and whose
// budget it is charged to: the provisioner whose event made it, "" for
// the engine's own.
type revocation struct {
	reason string
	until  time.Time
	charge string
}

// newAdmission returns an admission with no records; now is its clock
// (nil means time.Now).
func newAdmission(now func() time.Time) *admission {
	if now == nil {
		now = time.Now
	}
	return &admission{now: now, jobs: map[string]jobRecord{}, revoked: map[string]revocation{},
		budget: recordBudget, jobsBy: map[string]int{}, revokedBy: map[string]int{}}
}

// records is how many job records and revocations provisioner's events
// hold now, each of recordBudget.
func (a *admission) records(provisioner string) (jobs, revoked int) {
	return a.jobsBy[provisioner], a.revokedBy[provisioner]
}

// uncharge takes one record off provisioner's count in by.
func uncharge(by map[string]int, provisioner string) {
	if provisioner == "" {
		return
	}
	if by[provisioner]--; by[provisioner] <= 0 {
		delete(by, provisioner)
	}
}

// errOtherProvisioner is observe's answer to an event about a worker that
// another provisioner recorded: a provisioner speaks only for its own.
var errOtherProvisioner = errors.New("the event names another provisioner's worker")

// observe records what a provisioner's event says about a worker:
// worker_provisioned names the job the worker must attach as;
// worker_cancelled, worker_provision_failed and worker_job_ended revoke
// the name, and revoke is true so that the books drop the worker if ev.Provisioner
// attached it. ev.Provisioner must be the host's stamp, never the
// plugin's claim. An event whose record would take its provisioner past
// recordBudget is not recorded, and the error wraps errOverBudget.
func (a *admission) observe(ev shared.Event) (revoke bool, err error) {
	if ev.Worker == "" || ev.Provisioner == "" {
		return false, nil
	}
	if rec, known := a.jobs[ev.Worker]; known && rec.provisioner != ev.Provisioner {
		return false, fmt.Errorf("%w (%s, recorded by %s)", errOtherProvisioner, ev.Worker, rec.provisioner)
	}
	switch ev.Kind {
	case shared.EventWorkerProvisioned:
		if _, recorded := a.jobs[ev.Worker]; !recorded {
			if a.jobsBy[ev.Provisioner] >= a.budget {
				return false, fmt.Errorf("%w (%d job records): worker %s not recorded, so it cannot attach", errOverBudget, a.budget, ev.Worker)
			}
			a.jobsBy[ev.Provisioner]++
		}
		a.jobs[ev.Worker] = jobRecord{provisioner: ev.Provisioner, job: ev.Job, profile: ev.Profile, at: a.now()}
	case shared.EventWorkerCancelled, shared.EventWorkerProvisionFailed, shared.EventWorkerJobEnded:
		// revoke is true even when the revocation is not kept, so that a
		// worker attached under the name is dropped; its job record goes
		// either way, so the name cannot attach again unless the
		// provisioner names it anew.
		if !a.revokeCharged(ev.Worker, string(ev.Kind), time.Time{}, ev.Provisioner) {
			return true, fmt.Errorf("%w (%d revocations): revocation of worker %s not kept", errOverBudget, a.budget, ev.Worker)
		}
		return true, nil
	}
	return false, nil
}

// revoke refuses name from now on. until is when its credential expires;
// zero means not known, so the longest a credential can live.
func (a *admission) revoke(name, reason string, until time.Time) {
	a.revokeCharged(name, reason, until, "")
}

// revokeCharged is revoke, a revocation new to the name charged to
// charge ("": nobody) and kept only while charge is within its budget;
// it reports whether it was kept. The name's job record goes either way.
func (a *admission) revokeCharged(name, reason string, until time.Time, charge string) bool {
	if until.IsZero() {
		until = a.now().Add(host.DefaultMaxCredentialTTL)
	}
	if rec, ok := a.jobs[name]; ok {
		delete(a.jobs, name)
		uncharge(a.jobsBy, rec.provisioner)
	}
	if old, ok := a.revoked[name]; ok {
		// Charged once, to whoever revoked it first.
		charge = old.charge
		if old.until.After(until) {
			until = old.until
		}
	} else if charge != "" {
		if a.revokedBy[charge] >= a.budget {
			return false
		}
		a.revokedBy[charge]++
	}
	a.revoked[name] = revocation{reason: reason, until: until, charge: charge}
	return true
}

// admit says whether the holder of cred, reporting that it runs as job,
// may attach: allowed, or the denial (nameRevoked, jobNotYet or
// jobMismatch, each answered in its own way: 401, 503, 403) and why,
// naming the worker and the reason, never the token, so that it may be
// logged and sent to the worker. Whether a worker of that name is
// attached already is the books' to check.
func (a *admission) admit(cred host.Credential, job string) (denial, string) {
	name := cred.Worker
	if err := a.isRevoked(name); err != nil {
		return nameRevoked, err.Error()
	}
	rec, ok := a.jobs[name]
	switch {
	case !ok:
		return jobNotYet, fmt.Sprintf("no job is recorded for worker %s yet; try again shortly", name)
	case rec.provisioner != cred.Provisioner:
		return jobMismatch, fmt.Sprintf("worker %s was recorded by provisioner %s, not %s", name, rec.provisioner, cred.Provisioner)
	case rec.job != job:
		return jobMismatch, fmt.Sprintf("worker %s reports job %q; its provisioner started it as job %q", name, job, rec.job)
	}
	return allowed, ""
}

// isRevoked refuses a credential for name once name is revoked; nil if
// it is not. The books ask it before they do anything else for a
// request, attach or not: a revoked credential is refused first.
func (a *admission) isRevoked(name string) error {
	if rv, ok := a.revoked[name]; ok {
		return fmt.Errorf("credential for worker %s is revoked (%s): a credential is good for one job", name, rv.reason)
	}
	return nil
}

// profileOf is the profile the provisioner said name was started as
// (worker_provisioned), "" if it did not say or is not known.
func (a *admission) profileOf(name string) string { return a.jobs[name].profile }

// ownedBy reports whether provisioner may speak for name: name is
// unknown, or no other provisioner recorded a job for it. A credential
// of another provisioner for the same name revokes nothing of the
// owner's.
func (a *admission) ownedBy(name, provisioner string) bool {
	rec, known := a.jobs[name]
	return !known || rec.provisioner == provisioner
}

// sweep forgets revocations whose credential has expired and job records
// older than any credential can live.
func (a *admission) sweep() {
	now := a.now()
	for name, r := range a.revoked {
		if now.After(r.until) {
			delete(a.revoked, name)
			uncharge(a.revokedBy, r.charge)
		}
	}
	for name, j := range a.jobs {
		if now.Sub(j.at) > host.DefaultMaxCredentialTTL {
			delete(a.jobs, name)
			uncharge(a.jobsBy, j.provisioner)
		}
	}
}

// allows refuses a worker that claims more than its credential was minted
// for. It refuses rather than clamps: a worker that says it has more than
// its job was given is misconfigured or lying, and either way should be
// told, not quietly trusted with less.
func allows(c host.CredentialClaims, cpus, gpus int, ramMB int64, labels []string) error {
	switch {
	case cpus > c.CPUs:
		return fmt.Errorf("worker claims %d cpus; its credential allows %d", cpus, c.CPUs)
	case gpus > c.GPUs:
		return fmt.Errorf("worker claims %d gpus; its credential allows %d", gpus, c.GPUs)
	case ramMB > c.RAMMB:
		return fmt.Errorf("worker claims %d MB of memory; its credential allows %d", ramMB, c.RAMMB)
	}
	for _, l := range labels {
		if !slices.Contains(c.Labels, l) {
			return fmt.Errorf("worker claims label %s; its credential allows %v", termsafe.EscapeLine(l), c.Labels)
		}
	}
	return nil
}
