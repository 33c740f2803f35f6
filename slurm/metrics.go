package slurm

import (
	"slices"
	"sync"

	"github.com/fluksio/provision/shared"
)

// metrics counts what only the provisioner sees, for Status's Counters:
// why machines failed, by profile and class; how each kind of command on
// the login node went and how long it took is the queue's
// (slurm/internal/queue). The engine turns them into Prometheus metrics;
// the plugin serves no port of its own.
//
// A few integers on a call the engine already makes cost nothing, where a
// registry of its own would link client_golang into every plugin
// (docs/design/slurm-metrics.md).
//
// It has its own lock, held only to add or copy, so it can be called
// under p.mu or not, and never waits on ssh.
type metrics struct {
	mu       sync.Mutex // guards failures
	failures map[failureKey]int64
}

type failureKey struct {
	profile string
	class   shared.FailureClass
}

// failed counts one machine of profile that ended without a worker.
func (m *metrics) failed(profile string, class shared.FailureClass) {
	m.failedMachines(profile, class, 1)
}

// failedMachines counts n machines of profile that ended without a
// worker: a refused sbatch of a burst fails each of its machines.
func (m *metrics) failedMachines(profile string, class shared.FailureClass, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failures == nil {
		m.failures = map[failureKey]int64{}
	}
	m.failures[failureKey{profile, class}] += int64(n)
}

// judgedFailureClass is why the poller forgot r: a submission whose
// answer was lost and whose job is not in the queue never reached the
// cluster; any other job left the queue before its worker attached.
func judgedFailureClass(r *request) shared.FailureClass {
	if r.rationed {
		// Cut off waiting its turn at slurmctld's rate limiter: weather
		// that clears by itself, which no profile is held for.
		return shared.FailureLimitReached
	}
	if r.phase == phaseAnswerLost {
		return shared.FailureTransient
	}
	return shared.FailureDiedBeforeAttach
}

// counters is a copy for Status, in a stable order, with the commands q
// ran (none while q is nil, before Configure).
func (m *metrics) counters(q slurmQueue) *shared.Counters {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := &shared.Counters{}
	for k, n := range m.failures {
		out.Failures = append(out.Failures, shared.FailureCount{Profile: k.profile, Class: k.class, Count: n})
	}
	slices.SortFunc(out.Failures, func(a, b shared.FailureCount) int {
		if a.Profile != b.Profile {
			return cmpString(a.Profile, b.Profile)
		}
		return cmpString(string(a.Class), string(b.Class))
	})
	if q != nil {
		out.Commands = q.Commands()
	}
	return out
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
