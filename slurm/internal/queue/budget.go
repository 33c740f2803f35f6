package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fluksio/provision/slurm/rpcbudget"
)

// One RPC budget for every provisioner of a login user.
//
// slurmctld rations RPCs per user (ratelimit.go), and the provisioner
// blocks of an engine that log in as one user are plugins of their own,
// each polling on its own clock: three blocks polling every 5 s with an
// squeue of 3 RPCs need 1.8 a second, over Slurm's default refill of 2
// once anything else runs. So every command that reaches slurmctld first
// takes what it costs from one budget per login user on this machine
// (slurm/rpcbudget, a token bucket in a file every plugin of the user
// shares), kept at max_rpc_rate, and at three quarters of the site's
// refill once the limiter is read from the configuration. A poll that
// waits for the budget is a slower poll, said in Status; the site's
// limiter then never has to refuse.
//
// What a command costs is what sdiag counted for it on Slurm 24.11 (see
// RPCCost); commands that do not reach slurmctld (sacctmgr talks to
// slurmdbd, mkdir and sh to nobody) cost nothing.

// budgetBurst is the most RPCs the budget lets through at once: a poll
// and a submission back to back. With the limiter read, a third of its
// bucket, if that is less.
const budgetBurst = 10

// budgetSlowed is how long a command must wait for the budget before
// Status says the budget slows the polls.
const budgetSlowed = 500 * time.Millisecond

// rationedRecent is how long a rationed command keeps Status saying
// "rate limited", and a wait for the budget its note.
const rationedRecent = 5 * time.Minute

// budget is where this queue stands with the shared budget. Guarded by
// Queue.mu.
type budget struct {
	// bucket is the login user's budget, opened for rate; nil until the
	// first command, or after an error, when the next command opens it
	// again.
	bucket *rpcbudget.Bucket
	rate   float64
	key    string
	// lastWait is the last wait of budgetSlowed or more, at lastAt, of
	// lastCommand; waits counts them.
	lastWait    time.Duration
	lastAt      time.Time
	lastCommand string
	waits       int64
}

// RPCCost is how many RPCs remote costs slurmctld, as sdiag counted them
// for the job user, one command at a time, the same on 22.05.1 and
// 24.11.5: squeue 2, 3 with --me, -u or -j, 1 with --only-job-state
// (24.05 and later); sbatch 1, 2 with --test-only; scontrol show config
// 2, scontrol show partition 1 (22.05.8), sinfo 2; scancel 1 a job, 2 by filters; sacctmgr none (slurmdbd
// answers it).
func RPCCost(remote []string) float64 {
	if len(remote) == 0 {
		return 0
	}
	switch remote[0] {
	case "squeue":
		cost := 2.0
		for _, a := range remote[1:] {
			switch {
			case a == "--only-job-state":
				return 1
			case a == "--me" || a == "-u" || a == "-j" || strings.HasPrefix(a, "--user=") || strings.HasPrefix(a, "--jobs="):
				cost = 3
			}
		}
		return cost
	case "sbatch":
		if slices.Contains(remote[1:], "--test-only") {
			return 2
		}
		return 1
	case "sinfo":
		return 2
	case "scontrol":
		if len(remote) > 2 && remote[1] == "show" && remote[2] == "config" {
			return 2
		}
		return 1
	case "scancel":
		n := 0
		for _, a := range remote[1:] {
			if len(a) > 0 && a[0] >= '0' && a[0] <= '9' {
				n++
			}
		}
		if n == 0 {
			return 2 // by filters: --me, --name
		}
		return float64(n)
	}
	return 0
}

// budgetRate is the rate the budget keeps: max_rpc_rate, and three
// quarters of the site's refill once the limiter is known.
func budgetRate(maxRate float64, limit RateLimit) (rate, burst float64) {
	rate, burst = maxRate, budgetBurst
	if limit.On {
		rate = min(rate, 0.75*float64(limit.Refill)/float64(limit.Period))
		burst = min(burst, max(1, float64(limit.Bucket)/3))
	}
	return rate, burst
}

// spend takes what remote costs from the login user's budget, waiting for
// it as long as ctx lets it. A budget that cannot be kept (its directory
// or file is not this user's alone) is an error: the command does not
// run unpaced, the error says the path and the fix, and the next command
// tries the budget again.
func (q *Queue) spend(ctx context.Context, remote []string) error {
	cost := RPCCost(remote)
	if cost == 0 || (remote[0] == "sbatch" && ctx.Value(prepaidKey{}) != nil) {
		return nil
	}
	q.mu.Lock()
	rate, burst := budgetRate(q.maxRate, q.rationing.limit)
	b := &q.budget
	key := q.cfg.BudgetKey
	if b.bucket == nil || b.rate != rate || b.key != key {
		bucket, err := rpcbudget.Open(rpcbudget.DefaultDir(), key, rate, burst)
		if err != nil {
			q.mu.Unlock()
			return q.budgetError(remote[0], err)
		}
		b.bucket, b.rate, b.key = bucket, rate, key
	}
	bucket := b.bucket
	q.mu.Unlock()
	waited, err := bucket.Take(ctx, cost)
	if waited >= budgetSlowed {
		q.mu.Lock()
		b.lastWait, b.lastAt, b.lastCommand = waited, q.cfg.Now(), remote[0]
		b.waits++
		q.mu.Unlock()
	}
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%s: waited %s for the login user's RPC budget (%g RPCs a second): %w: %w", remote[0], waited.Round(100*time.Millisecond), rate, ErrBudget, err)
	}
	if err != nil {
		q.mu.Lock()
		b.bucket = nil
		q.mu.Unlock()
		return q.budgetError(remote[0], err)
	}
	return nil
}

// budgetError is a command not run because the budget cannot be kept,
// logged as an error each time, since each is a command lost.
func (q *Queue) budgetError(command string, err error) error {
	q.cfg.Log.Error("the login user's RPC budget cannot be kept; the command is not run", "command", command, "error", err)
	return fmt.Errorf("%s not run: %w", command, err)
}

// OpenBudget opens the login user's budget, kept for key at maxRate, as
// a configuration starts: an error is a budget no command could keep
// (rpcbudget.CheckDir), said before anything runs.
func OpenBudget(key string, maxRate float64) error {
	rate, burst := budgetRate(maxRate, RateLimit{})
	_, err := rpcbudget.Open(rpcbudget.DefaultDir(), key, rate, burst)
	return err
}

// Prepay takes an sbatch's cost from the budget before its submission's
// own deadline starts, and returns ctx marked so that the sbatch run
// under it does not pay again: waiting for the budget is not the
// submission's time. A context ended meanwhile is marked too, and fails
// the sbatch; a budget that cannot be kept is not paid, and the sbatch
// run under ctx fails with its error.
func (q *Queue) Prepay(ctx context.Context) context.Context {
	if err := q.spend(ctx, []string{"sbatch"}); err != nil && !errors.Is(err, ErrBudget) {
		return ctx
	}
	return context.WithValue(ctx, prepaidKey{}, true)
}

// prepaidKey marks a context whose sbatch has taken its cost from the
// budget already (Prepay).
type prepaidKey struct{}

// BudgetNote is Status's note on the budget: "" unless a command waited
// for it lately.
func (q *Queue) BudgetNote(now time.Time) string {
	q.mu.Lock()
	b := q.budget
	q.mu.Unlock()
	if b.lastAt.IsZero() || now.Sub(b.lastAt) >= rationedRecent {
		return ""
	}
	return fmt.Sprintf("polling slower than poll_interval: the RPC budget of %s, shared by every provisioner that logs in as this user from this machine, allows %g RPCs a second (max_rpc_rate, or three quarters of slurmctld's refill), and demand is above it: %s waited %.1fs for it at %s (%d waits of %s or more)",
		b.key, b.rate, b.lastCommand, b.lastWait.Seconds(), b.lastAt.UTC().Format(time.TimeOnly), b.waits, budgetSlowed)
}

// ErrBudget is a command that never ran: its context ended while it
// waited for the budget, which is waiting, not failing.
var ErrBudget = errors.New("waiting for the RPC budget")
