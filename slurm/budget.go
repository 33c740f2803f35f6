package slurm

import (
	"fmt"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/internal/queue"
	"github.com/fluksio/provision/slurm/rpcbudget"
)

// max_rpc_rate, the login user's RPC budget that the queue keeps
// (slurm/internal/queue/budget.go), and the settings' word on whether it
// can be kept at all: validation checks its directory, Configure opens it.

// defaultMaxRPCRate is max_rpc_rate's default: under Slurm's default
// refill of 2 RPCs a second, with room for the user's own commands.
const defaultMaxRPCRate = 1.5

// maxMaxRPCRate bounds max_rpc_rate: a budget past it is no budget.
const maxMaxRPCRate = 1000

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

// budgetKey is the login the budget is kept for: user@host, and :port
// when one is set.
func budgetKey(cfg *settings) string {
	key := cfg.firstLogin().Dest
	if port := cfg.firstLogin().Port; port != 0 {
		key = fmt.Sprintf("%s:%d", key, port)
	}
	return key
}

// openBudget opens the login user's budget as Configure starts, so that
// a directory another user made first (rpcbudget.CheckDir) refuses the
// configuration at max_rpc_rate, with the fix, before anything runs.
func openBudget(cfg *settings) shared.Diagnostics {
	if err := queue.OpenBudget(budgetKey(cfg), cfg.maxRPCRate); err != nil {
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
