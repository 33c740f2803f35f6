package slurm

import (
	"errors"
	"io"
	"io/fs"
	"os"
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
	dir, err := p.files.binDir()
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

// checkReadable says, at the attribute, when ssh_key or known_hosts
// names a file that does not exist or that this user cannot read: ssh
// would fail on it at the first login, with words about the login node,
// not the file. validate (without -check) says it before anything runs.
func checkReadable(cfg *settings) shared.Diagnostics {
	var diags shared.Diagnostics
	for _, f := range []struct{ name, path string }{{"ssh_key", cfg.SSHKey}, {"known_hosts", cfg.KnownHosts}} {
		if f.path == "" {
			continue
		}
		path, _ := expandHome(f.path)
		err := readOne(path)
		switch {
		case err == nil:
			continue
		case errors.Is(err, fs.ErrNotExist):
			diags = append(diags, shared.Errorf([]string{f.name}, "No such file",
				"%s names %s, which does not exist. Give the path of the file, or leave %s out.", f.name, f.path, f.name))
		default:
			diags = append(diags, shared.Errorf([]string{f.name}, "File not readable",
				"%s names %s, which cannot be read: %v. The engine's user (uid %d) must read it: fix its mode or owner, or give another file.", f.name, f.path, err, os.Getuid()))
		}
	}
	return diags
}

// readOne reads a byte of the file at path, as ssh will: a directory or
// a file without read permission fails here.
func readOne(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.Read(b[:]); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}
