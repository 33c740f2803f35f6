package slurm

import (
	"os/exec"
	"testing"

	"github.com/fluksio/provision/shared"
)

// A machine that failed is counted by its profile and its class; a
// refused sbatch of a burst counts each of its machines.
func TestMetricsFailures(t *testing.T) {
	var m metrics
	m.failedMachines("cpu", submitFailureClass(&exec.ExitError{}, "sbatch: error: invalid partition specified: nope"), 3)
	m.failed("cpu", shared.FailureTimedOut)
	got := m.counters(nil)
	if len(got.Failures) != 2 || got.Failures[0].Count+got.Failures[1].Count != 4 {
		t.Errorf("failures %+v, want 3 + 1", got.Failures)
	}
}
