package slurm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fluksio/provision/shared"
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
// rpcCost); commands that do not reach slurmctld (sacctmgr talks to
// slurmdbd, mkdir and sh to nobody) cost nothing.

// defaultMaxRPCRate is max_rpc_rate's default: under Slurm's default
// refill of 2 RPCs a second, with room for the user's own commands.
const defaultMaxRPCRate = 1.5

// maxMaxRPCRate bounds max_rpc_rate: a budget past it is no budget.
const maxMaxRPCRate = 1000

// budgetBurst is the most RPCs the budget lets through at once: a poll
// and a submission back to back. With the limiter read, a third of its
// bucket, if that is less.
const budgetBurst = 10

// budgetSlowed is how long a command must wait for the budget before
// Status says the budget slows the polls.
const budgetSlowed = 500 * time.Millisecond

// budget is where this provisioner stands with the shared budget.
// Guarded by Provisioner.mu.
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

// rpcCost is how many RPCs remote costs slurmctld, as sdiag counted them
// for the job user, one command at a time, the same on 22.05.1 and
// 24.11.5: squeue 2, 3 with --me, -u or -j, 1 with --only-job-state
// (24.05 and later); sbatch 1, 2 with --test-only; scontrol show config
// 2, sinfo 2; scancel 1 a job, 2 by filters; sacctmgr none (slurmdbd
// answers it).
func rpcCost(remote []string) float64 {
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
func budgetRate(maxRate float64, limit rateLimit) (rate, burst float64) {
	rate, burst = maxRate, budgetBurst
	if limit.on {
		rate = min(rate, 0.75*float64(limit.refill)/float64(limit.period))
		burst = min(burst, max(1, float64(limit.bucket)/3))
	}
	return rate, burst
}

// spend takes what remote costs from the login user's budget, waiting for
// it as long as ctx lets it. A budget that cannot be kept (its directory
// or file is not this user's alone) is an error: the command does not
// run unpaced, the error says the path and the fix, and the next command
// tries the budget again.
func (p *Provisioner) spend(ctx context.Context, remote []string) error {
	cost := rpcCost(remote)
	cfg := p.settings()
	if cost == 0 || cfg == nil || (remote[0] == "sbatch" && ctx.Value(prepaidKey{}) != nil) {
		return nil
	}
	p.mu.Lock()
	rate, burst := budgetRate(cfg.maxRPCRate, p.rationing.limit)
	b := &p.budget
	key := budgetKey(cfg)
	if b.bucket == nil || b.rate != rate || b.key != key {
		bucket, err := rpcbudget.Open(rpcbudget.DefaultDir(), key, rate, burst)
		if err != nil {
			p.mu.Unlock()
			return budgetError(cfg, remote[0], err)
		}
		b.bucket, b.rate, b.key = bucket, rate, key
	}
	bucket := b.bucket
	p.mu.Unlock()
	waited, err := bucket.Take(ctx, cost)
	if waited >= budgetSlowed {
		p.mu.Lock()
		b.lastWait, b.lastAt, b.lastCommand = waited, p.now(), remote[0]
		b.waits++
		p.mu.Unlock()
	}
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%s: waited %s for the login user's RPC budget (%g RPCs a second): %w: %w", remote[0], waited.Round(100*time.Millisecond), rate, errBudget, err)
	}
	if err != nil {
		p.mu.Lock()
		b.bucket = nil
		p.mu.Unlock()
		return budgetError(cfg, remote[0], err)
	}
	return nil
}

// budgetKey is the login the budget is kept for: user@host, and :port
// when one is set.
func budgetKey(cfg *settings) string {
	key := cfg.firstLogin().Dest
	if port := cfg.firstLogin().Port; port != 0 {
		key = fmt.Sprintf("%s:%d", key, port)
	}
	return key
}

// budgetError is a command not run because the budget cannot be kept,
// logged as an error each time, since each is a command lost.
func budgetError(cfg *settings, command string, err error) error {
	cfg.log.Error("the login user's RPC budget cannot be kept; the command is not run", "command", command, "error", err)
	return fmt.Errorf("%s not run: %w", command, err)
}

// openBudget opens the login user's budget as Configure starts, so that
// a directory another user made first (rpcbudget.CheckDir) refuses the
// configuration at max_rpc_rate, with the fix, before anything runs.
func openBudget(cfg *settings) shared.Diagnostics {
	rate, burst := budgetRate(cfg.maxRPCRate, rateLimit{})
	if _, err := rpcbudget.Open(rpcbudget.DefaultDir(), budgetKey(cfg), rate, burst); err != nil {
		return shared.Diagnostics{budgetDiagnostic(err)}
	}
	return nil
}

// checkBudgetDir is validation's word on the budget's directory: it
// makes nothing, and says what Configure would refuse.
func checkBudgetDir() shared.Diagnostics {
	if err := rpcbudget.CheckDir(rpcbudget.DefaultDir()); err != nil {
		return shared.Diagnostics{budgetDiagnostic(err)}
	}
	return nil
}

func budgetDiagnostic(err error) shared.Diagnostic {
	return shared.Errorf([]string{"max_rpc_rate"}, "RPC budget cannot be kept",
		"Every provisioner of this login user on this machine paces its Slurm commands with one budget kept in a file, which must be this user's alone: %v.", err)
}

// prepaidKey marks a context whose sbatch has taken its cost from the
// budget already (submitOne).
type prepaidKey struct{}

// prepaid is ctx with its sbatch paid for.
func prepaid(ctx context.Context) context.Context {
	return context.WithValue(ctx, prepaidKey{}, true)
}

// budgetNoteLocked is Status's note on the budget: "" unless a command
// waited for it lately. p.mu must be held.
func (p *Provisioner) budgetNoteLocked(now time.Time) string {
	b := p.budget
	if b.lastAt.IsZero() || now.Sub(b.lastAt) >= rationedRecent {
		return ""
	}
	return fmt.Sprintf("polling slower than poll_interval: the RPC budget of %s, shared by every provisioner that logs in as this user from this machine, allows %g RPCs a second (max_rpc_rate, or three quarters of slurmctld's refill), and demand is above it: %s waited %.1fs for it at %s (%d waits of %s or more)",
		b.key, b.rate, b.lastCommand, b.lastWait.Seconds(), b.lastAt.UTC().Format(time.TimeOnly), b.waits, budgetSlowed)
}

// validateBudget reads max_rpc_rate.
func validateBudget(s *settings) shared.Diagnostics {
	s.maxRPCRate = defaultMaxRPCRate
	if s.MaxRPCRate == nil {
		return nil
	}
	if r := *s.MaxRPCRate; !(r > 0 && r <= maxMaxRPCRate) {
		return shared.Diagnostics{shared.Errorf([]string{"max_rpc_rate"}, "Invalid max_rpc_rate",
			"max_rpc_rate is how many RPCs a second this login user's provisioners may send slurmctld together, more than 0 and at most %d; got %g. Slurm's rate limiter refills 2 a second by default: stay under the site's.", maxMaxRPCRate, r)}
	}
	s.maxRPCRate = *s.MaxRPCRate
	return nil
}

// errBudget is a command that never ran: its context ended while it
// waited for the budget, which is waiting, not failing.
var errBudget = errors.New("waiting for the RPC budget")
