package slurm

import (
	"context"
	"errors"
	"os/exec"
	"slices"
	"sync"
	"time"

	"github.com/fluksio/provision/shared"
)

// metrics counts what only the provisioner sees, for Status's Counters:
// why machines failed, by profile and class, and how each kind of
// command on the login node went and how long it took. The engine turns
// them into Prometheus metrics; the plugin serves no port of its own.
//
// A few integers on a call the engine already makes cost nothing, where a
// registry of its own would link client_golang into every plugin
// (docs/design/slurm-metrics.md).
//
// It has its own lock, held only to add or copy, so it can be called
// under p.mu or not, and never waits on ssh.
type metrics struct {
	mu       sync.Mutex // guards the maps below
	failures map[failureKey]int64
	commands map[string]*commandStats
}

type failureKey struct {
	profile string
	class   shared.FailureClass
}

type commandStats struct {
	calls, errors, sshErrors, timeouts int64
	// rationed counts the calls slurmctld's rate limiter made wait
	// (ratelimit.go).
	rationed int64
	// counts[i] is how many calls took at most commandBuckets[i].
	counts []int64
	sum    time.Duration
}

// commandBuckets are the upper bounds of the command latency histogram,
// in seconds: a multiplexed command takes 20-40 ms, a fresh connection
// 250-300 ms, an sbatch on a busy controller seconds, and submit_timeout
// is 30 s by default.
var commandBuckets = []float64{0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

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

// command records one call of remote[0] that began at start and ended
// with *errp: ssh's exit status 255 (or no ssh at all) is the
// transport's failure, a deadline a timeout, any other error the
// command's own; *rationedp says whether it waited its turn at
// slurmctld's rate limiter. It is deferred, so both are read when the
// call returns.
func (m *metrics) command(remote []string, start time.Time, errp *error, rationedp *bool) {
	took := time.Since(start)
	command, err := "none", *errp
	if len(remote) > 0 {
		command = remote[0]
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.commands == nil {
		m.commands = map[string]*commandStats{}
	}
	cs := m.commands[command]
	if cs == nil {
		cs = &commandStats{counts: make([]int64, len(commandBuckets))}
		m.commands[command] = cs
	}
	cs.calls++
	cs.sum += took
	if *rationedp {
		cs.rationed++
	}
	for i, b := range commandBuckets {
		if took.Seconds() <= b {
			cs.counts[i]++
		}
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.Is(err, context.DeadlineExceeded):
		cs.timeouts++
	case errors.As(err, &ee) && ee.ExitCode() != 255:
		cs.errors++
	default:
		cs.sshErrors++
	}
}

// counters is a copy for Status, in a stable order.
func (m *metrics) counters() *shared.Counters {
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
	for name, cs := range m.commands {
		out.Commands = append(out.Commands, shared.CommandStats{Command: name, Calls: cs.calls, Errors: cs.errors,
			SSHErrors: cs.sshErrors, Timeouts: cs.timeouts, Rationed: cs.rationed, Buckets: slices.Clone(commandBuckets),
			BucketCounts: slices.Clone(cs.counts), DurationSum: cs.sum})
	}
	slices.SortFunc(out.Commands, func(a, b shared.CommandStats) int { return cmpString(a.Command, b.Command) })
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
