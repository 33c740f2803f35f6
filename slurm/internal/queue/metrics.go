package queue

import (
	"context"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/fluksio/provision/shared"
)

// How each kind of command went and how long it took, for Status's
// Counters; the engine turns them into Prometheus metrics
// (docs/design/slurm-metrics.md).

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

// count records one call of remote[0] that began at start and ended with
// err: ssh's exit status 255 (or no ssh at all) is the transport's
// failure, a deadline a timeout, any other error the command's own;
// rationed says whether it waited its turn at slurmctld's rate limiter.
func (q *Queue) count(remote []string, start time.Time, err error, rationed bool) {
	took := time.Since(start)
	command := "none"
	if len(remote) > 0 {
		command = remote[0]
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.commands == nil {
		q.commands = map[string]*commandStats{}
	}
	cs := q.commands[command]
	if cs == nil {
		cs = &commandStats{counts: make([]int64, len(commandBuckets))}
		q.commands[command] = cs
	}
	cs.calls++
	cs.sum += took
	if rationed {
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

// Commands is a copy of the commands' counts for Status, by command.
func (q *Queue) Commands() []shared.CommandStats {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []shared.CommandStats
	for name, cs := range q.commands {
		out = append(out, shared.CommandStats{Command: name, Calls: cs.calls, Errors: cs.errors,
			SSHErrors: cs.sshErrors, Timeouts: cs.timeouts, Rationed: cs.rationed, Buckets: slices.Clone(commandBuckets),
			BucketCounts: slices.Clone(cs.counts), DurationSum: cs.sum})
	}
	slices.SortFunc(out, func(a, b shared.CommandStats) int { return strings.Compare(a.Command, b.Command) })
	return out
}
