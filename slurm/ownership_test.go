package slurm_test

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/shared"
)

// submitAs submits a job the way a person on the login node would, as the
// sandbox's user over ssh, named like the provisioner's jobs, and returns
// its id. held keeps it pending; otherwise it runs a sleep.
func submitAs(t *testing.T, env sandboxtest.Env, name, comment string, held bool) string {
	t.Helper()
	args := []string{"-i", env.Key, "-p", strconv.Itoa(env.Port), "-o", "BatchMode=yes",
		"-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=" + env.KnownHosts, "-o", "ConnectTimeout=10",
		env.Login, "sbatch", "--parsable", "--job-name=fluksio-" + name, "--partition=" + env.Partition,
		"--time=00:05:00", "--output=/dev/null", "-c", "1", "'--comment=" + comment + "'"}
	if held {
		args = append(args, "--hold")
	}
	cmd := exec.Command("ssh", args...)
	cmd.Stdin = strings.NewReader("#!/bin/sh\nsleep 300\n")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sbatch as the user: %v: %s", err, out)
	}
	id := strings.TrimSpace(string(out))
	if i := strings.LastIndexByte(id, '\n'); i >= 0 {
		id = id[i+1:]
	}
	return id
}

// jobState is the job's state as squeue -t all lists it; "" once purged.
func jobState(t *testing.T, env sandboxtest.Env, job string) string {
	t.Helper()
	out, err := slurm(env, "squeue", "-h", "-t", "all", "-j", job, "-o", "%T")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(out)
}

// TestIntegrationTouchesOnlyItsOwnJobs: jobs are the provisioner's only by
// their tag, never by name. Against the sandbox Slurm, with jobs named
// like the provisioner's already queued: a person's job ("my own
// analysis, please keep") and another engine's (staging beside
// production) stay; this engine's job from an earlier secret is
// cancelled though it runs, since its worker can never attach; its
// current-epoch job is adopted; a job that lands late (as an sbatch does
// that went on after its ssh died) is adopted on the next poll, and given
// up when the demand does not want it; and Shutdown cancels what it
// adopted.
// Before, ownership was the job name: the person's job and the other
// engine's pending job were cancelled at start.
func TestIntegrationTouchesOnlyItsOwnJobs(t *testing.T) {
	env := sandboxtest.Require(t)
	var person, staging, oldEpoch, current string
	r := launchRig(t, env, "it-own", true, func(r *rig) map[string]any {
		r.engineID, r.epoch = "prod", "e1"
		person = submitAs(t, env, r.name, "my own analysis, please keep", true)
		staging = submitAs(t, env, r.name, "fluksio:v2:staging:e1:"+r.name+"-cpu-00000001", true)
		oldEpoch = submitAs(t, env, r.name, "fluksio:v2:prod:e0:"+r.name+"-cpu-00000002", false)
		current = submitAs(t, env, r.name, "fluksio:v2:prod:e1:"+r.name+"-cpu-00000003", true)
		cfg := r.config(profile("cpu", 1, 0, 0, nil, r.sbatch()))
		cfg["poll_interval"] = "1s"
		return cfg
	})

	// The earlier secret's job goes; nothing else does.
	r.events.wait(t, "the earlier epoch's job cancelled", eventTimeout, func(ev shared.Event) bool {
		return ev.Kind == shared.EventWorkerCancelled && ev.Job == oldEpoch
	})
	poll(t, "the earlier epoch's job to leave the queue", jobTimeout, func() (bool, string) {
		s := jobState(t, env, oldEpoch)
		return s == "" || s == "CANCELLED", s
	})
	if st := r.status(t); len(st.Outstanding) != 1 || st.Outstanding[0].Job != current {
		t.Fatalf("outstanding %+v; want the current epoch's job %s adopted", st.Outstanding, current)
	}

	// A submission lands late: the next poll finds it and adopts it, and
	// the engine hears of it.
	late := submitAs(t, env, r.name, "fluksio:v2:prod:e1:"+r.name+"-cpu-00000004", true)
	r.events.wait(t, "the late job adopted", eventTimeout, func(ev shared.Event) bool {
		return ev.Kind == shared.EventWorkerProvisioned && ev.Job == late
	})
	// The engine wants one machine: the newer of the two pending, the
	// late one, is given up.
	o, presp, err := r.wants.Ask(context.Background(), r.prov, shared.Need{CPUs: 1}, 1)
	if err != nil || o.Outcome != shared.OutcomeOutstanding || findProfile(presp, "cpu").Cancelled != 1 {
		t.Fatalf("Provision with one wanted: %+v %+v %v", o, presp, err)
	}
	r.events.wait(t, "the late job cancelled", eventTimeout, func(ev shared.Event) bool {
		return ev.Kind == shared.EventWorkerCancelled && ev.Job == late
	})

	resp := r.stop(t)
	if len(resp.Cancelled) != 1 || resp.Cancelled[0] != current {
		t.Errorf("Shutdown cancelled %v; want [%s]", resp.Cancelled, current)
	}
	for _, job := range []string{current, late} {
		poll(t, "job "+job+" to be cancelled", jobTimeout, func() (bool, string) {
			s := jobState(t, env, job)
			return s == "" || s == "CANCELLED", s
		})
	}
	// Read what Slurm recorded for the others, after everything above.
	for job, what := range map[string]string{person: "a person's job", staging: "another engine's job"} {
		if s := jobState(t, env, job); s != "PENDING" {
			t.Errorf("%s (%s) is %q after the provisioner came and went; want PENDING", what, job, s)
		}
	}
}
