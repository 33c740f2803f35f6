package slurm

import (
	"strings"
	"testing"

	"github.com/fluksio/provision/internal/sandboxtest"
)

// TestRefusedForGood: Slurm's words, as Slurm 22.05 prints them, sorted
// into verdicts (the profile is misconfigured) and weather (back off and
// try again). An unknown message is weather.
func TestRefusedForGood(t *testing.T) {
	for _, c := range []struct {
		said string
		good bool
	}{
		{"sbatch: error: invalid partition specified: nope\nsbatch: error: Batch job submission failed: Invalid partition name specified", true},
		{"sbatch: error: Batch job submission failed: Requested time limit is invalid (missing or exceeds some limit)", true},
		{"sbatch: error: Invalid --time specification", true},
		{"sbatch: error: Invalid generic resource (gres) specification", true},
		{"sbatch: unrecognized option '--bogus'\nTry \"sbatch --help\" for more information", true},
		{"sbatch: error: Memory specification can not be satisfied\nsbatch: error: Batch job submission failed: Requested node configuration is not available", true},
		{"sbatch: error: Batch job submission failed: More processors requested than permitted", true},
		{"sbatch: error: Batch job submission failed: Invalid feature specification", true},
		{"sbatch: error: Batch job submission failed: Requested reservation is invalid", true},
		{"sbatch: error: Incompatible begin and deadline time specification", true},
		{"sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified", true},
		{"sbatch: error: Batch job submission failed: Invalid qos specification", true},

		{"sbatch: error: Batch job submission failed: Socket timed out on send/recv operation", false},
		{"sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)", false},
		{"sbatch: error: Batch job submission failed: Resource temporarily unavailable", false},
		{"sbatch: error: Slurm temporarily unable to accept job, sleeping and retrying", false},
		{"sbatch: error: AssocMaxSubmitJobLimit\nsbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)", false},
		{"ssh: connect to host login port 22: Connection refused", false},
		{"sbatch: error: something new in Slurm 27", false},
		{"", false},
	} {
		if got := refusedForGood(c.said); got != c.good {
			t.Errorf("refusedForGood(%q) = %v, want %v", c.said, got, c.good)
		}
	}
}

// TestRefusalsFromSlurm asks the sandbox's own sbatch (--test-only, so
// nothing is queued) for each kind of mistake a profile can make, and
// checks that what it says is read as a verdict: the table above is what
// this Slurm really prints, not what it printed when the table was
// written.
func TestRefusalsFromSlurm(t *testing.T) {
	env := sandboxtest.Require(t)
	for _, args := range [][]string{
		{"--partition=nope"},
		{"--time=100000-00:00:00"},
		{"--time=abc"},
		{"--gres=fpga:1"},
		{"--gres=gpu:99"},
		{"--bogus"},
		{"--mem=99999999"},
		{"--cpus-per-task=9999"},
		{"--constraint=nothere"},
		{"--reservation=nope"},
		{"--begin=now+1hour", "--deadline=now+600seconds"},
	} {
		cmd := env.Command("sbatch", append([]string{"--test-only", "--partition=" + env.Partition, "--time=5"}, args...)...)
		if args[0] == "--partition=nope" {
			cmd.Args = append([]string{"sbatch", "--test-only", "--time=5"}, args...)
		}
		cmd.Stdin = strings.NewReader("#!/bin/bash\ntrue\n")
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Errorf("sbatch %q was accepted (%s); the test needs a mistake this sandbox refuses", args, out)
			continue
		}
		if !refusedForGood(string(out)) {
			t.Errorf("sbatch %q said %q, which is not read as a verdict", args, out)
		}
	}
}
