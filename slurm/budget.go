package slurm

import (
	"github.com/fluksio/provision/shared"
)

// max_rpc_rate, the login user's RPC budget that the queue keeps
// (slurm/internal/queue/budget.go).

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
