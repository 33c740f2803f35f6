package slurm

// The relay's port is the one thing on the login node that another user
// can take: when the relay restarts (its ssh session dropped), anybody
// who loops bind() on its port may get it first, and the workers already
// submitted dial whoever holds it. So the relay's traffic is TLS, and
// each job's script pins the certificate its workers must find there.
//
// With an engine that does not serve TLS, the plugin makes a certificate
// per relay, hands it over the relay's ssh standard input, and each job's
// script pins it; otherwise the engine's TLS runs end to end. A relay that
// cannot get its port back moves, and the jobs that dial the old address
// are cancelled (docs/design/slurm-relay-tls.md).

import (
	"context"
	"errors"
	"fmt"

	"github.com/fluksio/provision/shared"
)

// errRelayPortTaken is a relay that could not bind the port it was asked
// for: somebody else holds it.
var errRelayPortTaken = errors.New("the relay's port is taken on the login node")

// relayServesTLS reports whether the relay terminates TLS itself: in relay
// mode, for an engine that does not serve TLS (engine_url not https).
func (s *settings) relayServesTLS() bool {
	return s.Reach == reachRelay && !hasHTTPS(s.EngineURL)
}

func hasHTTPS(url string) bool { return len(url) >= 6 && url[:6] == "https:" }

// moved cancels the jobs whose workers dial old, where the relay no
// longer listens: every job of this provisioner in the queue, since none
// has been given the new address yet (the relay is not up until this
// returns). Their requests leave the books; cancelJobs tells the engine
// worker_cancelled for each machine, which revokes its credential. If the
// queue cannot be read, the books' own jobs with the old address are
// cancelled, and the rest meet their attach_timeout.
func (r *relay) moved(ctx context.Context, old, now string) {
	p, cfg := r.p, r.cfg
	why := fmt.Sprintf("the relay's port at %s was taken by somebody else while the relay restarted, and the relay now listens at %s; "+
		"this job's workers dial %s, so it is cancelled and their credentials revoked", old, now, old)
	// All, ended too: a worker that found the squatter's certificate
	// wrong has exited, and its job with it, but its credential is
	// still to be revoked.
	rows, err := p.q.Jobs(ctx, true)
	if err != nil {
		cfg.log.Error("could not read the queue for the jobs that dial the relay's old address; cancelling those the books hold", "old", old, "error", err)
	}
	var refs, ended []jobRef
	seen := map[string]bool{}
	p.mu.Lock()
	host := p.host
	for _, row := range rows {
		tag, mine := cfg.ours(row.Comment)
		if !mine || seen[row.ID] {
			continue
		}
		seen[row.ID] = true
		worker := machineWorker(tag.Worker, row.ID)
		profile, _ := cfg.profileOf(tag.Worker)
		machines := cfg.machinesOf(profile, worker)
		for _, m := range machines {
			p.dropLocked(m)
		}
		ref := jobRef{job: row.ID, profile: profile, worker: machines[0], others: machines[1:], why: why}
		if endedStates[row.State] {
			ended = append(ended, ref)
		} else {
			refs = append(refs, ref)
		}
	}
	for _, rq := range p.sortedLocked() {
		if rq.via == old && rq.job != "" && !seen[rq.job] && rq.finished() {
			seen[rq.job] = true
			p.dropLocked(rq.worker)
			refs = append(refs, jobRef{job: rq.job, profile: rq.profile, worker: rq.worker, why: why})
		}
	}
	p.mu.Unlock()
	cfg.log.Error("the relay could not get its port back: cancelling the jobs whose workers dial the old address and revoking their credentials",
		"old", old, "new", now, "jobs", jobIDs(refs), "ended", jobIDs(ended))
	for _, j := range ended {
		for _, w := range j.workers() {
			p.publish(ctx, cfg, host, shared.Event{Kind: shared.EventWorkerCancelled, Profile: j.profile, Job: j.job, Worker: w, Detail: j.why})
		}
	}
	p.cancels.cancelJobs(ctx, cfg, host, refs, "cancelled a job whose workers dial the relay's old address")
}
