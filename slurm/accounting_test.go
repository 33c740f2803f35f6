package slurm_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/shared"
)

// TestAccountingForgottenJobExplained: a payload that prints a line and
// exits 7 at once, on a private sandbox with accounting and MinJobAge = 2,
// polled only every 25 s so that the controller has purged the job before
// the poll that finds it gone. scontrol no longer knows it; the failure
// event still carries its state and exit code (from sacct) and its last
// line.
func TestAccountingForgottenJobExplained(t *testing.T) {
	env := sandboxtest.PrivateWith(t, "forgot", sandboxtest.Options{Accounting: true, MinJobAge: 2})
	dir, err := os.MkdirTemp("", "fluksio-it-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	failing := filepath.Join(dir, "failing-worker.sh")
	body := "#!/bin/sh\necho 'loading the worker'\necho 'fluksio-worker: cannot start: no such module' >&2\nexit 7\n"
	if err := os.WriteFile(failing, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, failing} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	r := launchRig(t, env, "forgot", true, func(r *rig) map[string]any {
		c := r.config(profile("small", 1, 0, 100, nil, []string{"--partition=" + r.env.Partition, "--time=00:05:00"}))
		c["worker_command"] = []string{failing}
		c["poll_interval"] = "25s"
		return c
	})
	r.provision(t, shared.Need{CPUs: 1}, "small")
	job := r.provisioned(t, "small").Job
	ev := r.events.wait(t, "worker_provision_failed", 2*jobTimeout, kindIs(shared.EventWorkerProvisionFailed, "small"))
	t.Logf("worker_provision_failed: %s", ev.Detail)
	// The controller has forgotten it: the explanation cannot have come
	// from scontrol.
	if out, err := env.Command("scontrol", "show", "job", job).CombinedOutput(); err == nil || !strings.Contains(string(out), "Invalid job id") {
		t.Errorf("scontrol still knows job %s (%v): %s; the test did not reach a forgotten job", job, err, out)
	}
	for _, want := range []string{"job " + job + " left the queue", "state FAILED (from sacct", "exit code 7",
		"its last lines: loading the worker | fluksio-worker: cannot start: no such module"} {
		if !strings.Contains(ev.Detail, want) {
			t.Errorf("the event's detail does not say %q: %q", want, ev.Detail)
		}
	}
}
