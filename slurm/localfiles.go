package slurm

import (
	"path/filepath"

	"github.com/fluksio/provision/internal/fileperm"
	"github.com/fluksio/provision/shared"
)

// The worker the plugin ships (worker_command unset) is a file on the
// engine's machine that decides what every job runs, with a worker's
// credential in its environment: beside the plugin, fluksio-worker and
// fluksio-worker-GOOS-GOARCH. Whoever can change it runs their program
// on the cluster as the login user, so it is held to the engine's rule
// for files that decide what runs (internal/fileperm): refused at
// validation, and again when a run or a check reads it to ship
// (planShip). worker_command names a file on the cluster, which the
// plugin cannot see from here.

// shippedWorkerCandidates are the files planShip may ship from dir.
func shippedWorkerCandidates(dir string) []string {
	out := []string{filepath.Join(dir, workerProgram)}
	more, _ := filepath.Glob(filepath.Join(dir, workerProgram+"-*-*"))
	return append(out, more...)
}

// checkShippedWorker refuses, at worker_command, a worker to ship that
// others can change; nothing when worker_command is set or no worker is
// there to ship (the check says that).
func (p *Provisioner) checkShippedWorker(cfg *settings) shared.Diagnostics {
	if cfg == nil || cfg.WorkerCommand != nil {
		return nil
	}
	dir, err := p.binDir()
	if err != nil {
		return nil
	}
	var diags shared.Diagnostics
	for _, f := range shippedWorkerCandidates(dir) {
		if pr := fileperm.Check(f); pr != nil {
			diags = append(diags, shared.Errorf([]string{"worker_command"}, "Worker to ship others can write",
				"worker_command is unset, so the plugin ships %s for every job to run, but %s. Whoever can change it runs their program on the cluster with a worker's credential. Fix: %s.",
				f, pr.Why, pr.Fix))
		}
	}
	return diags
}
