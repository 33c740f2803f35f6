package slurm_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/shared"
)

// TestE2EMaxJobCount: on a private sandbox whose slurmctld holds at most
// 30 jobs (MaxJobCount = 30), with 20 pending array tasks of root's in
// it (and up.sh's finished smoke job, which counts until MinJobAge), a
// burst of 15 is trimmed to what fits (slurmctld refuses at the ceiling
// itself), squeue lists those, and the rest is answered capped
// naming MaxJobCount. Then, with the controller at 29, a second
// provisioner's burst of one (far below half of the ceiling by the books, so not
// counted) meets sbatch's "temporarily unable to accept job" retries,
// which submit_timeout cuts off: the machine fails as a limit, with
// sbatch's words, and Status says which limit bit.
func TestE2EMaxJobCount(t *testing.T) {
	env := sandboxtest.PrivateWith(t, "jobcount", sandboxtest.Options{MaxJobCount: 30})
	fill := func(n int) {
		t.Helper()
		out, err := slurm(env, "sbatch", "--parsable", "--job-name=fill", "--array=0-"+strconv.Itoa(n-1), "--partition="+env.Partition,
			"--begin=now+1hour", "--time=00:05:00", "--output=/dev/null", "--wrap=true")
		if err != nil {
			t.Fatalf("filling the controller with %d jobs: %v %s", n, err, out)
		}
	}
	t.Cleanup(func() { slurm(env, "scancel", "--name=fill") })
	fill(20)
	// What slurmctld holds: the fill, and whatever up.sh's smoke job
	// left (a finished job counts until MinJobAge).
	out, err := slurm(env, "squeue", "-h", "-r", "-t", "all", "-o", "%i")
	if err != nil {
		t.Fatal(err)
	}
	held := len(strings.Fields(out))
	fit := 30 - 1 - held

	pending := func(r *rig) []string { return r.sbatch("--begin=now+1hour") }
	r := launchRig(t, env, "jobcount", false, func(r *rig) map[string]any {
		c := r.config(profile("small", 1, 0, 100, nil, pending(r)))
		c["submit_timeout"] = "8s"
		c["max_pending"] = 30
		return c
	})
	ctx := context.Background()
	r.wants.Set(shared.Need{CPUs: 1}, 15)
	if _, _, err := r.wants.Ask(ctx, r.prov, shared.Need{CPUs: 1}, 15); err != nil {
		t.Fatal(err)
	}
	r.events.waitN(t, "worker_provisioned", eventTimeout, fit, kindIs(shared.EventWorkerProvisioned, "small"))
	out, err = slurm(env, "squeue", "-h", "-r", "--name=fluksio-"+r.name, "-o", "%i")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(strings.Fields(out)); n != fit {
		t.Errorf("squeue lists %d of the plugin's tasks; want %d (30 - 1 - %d held)", n, fit, held)
	}
	o, _, err := r.wants.Ask(ctx, r.prov, shared.Need{CPUs: 1}, 15)
	if err != nil {
		t.Fatal(err)
	}
	if o.Outcome != shared.OutcomeCapped || !strings.Contains(o.Detail, "MaxJobCount = 30") {
		t.Errorf("the other %d: %+v; want capped, naming MaxJobCount = 30", 15-fit, o)
	}

	// A second provisioner, whose books hold nothing, meets the wall:
	// slurmctld holds 29, and one more reaches the ceiling.
	r2 := launchRig(t, env, "jobcount2", false, func(r *rig) map[string]any {
		c := r.config(profile("small", 1, 0, 100, nil, pending(r)))
		c["submit_timeout"] = "8s"
		return c
	})
	t0 := time.Now()
	r2.provision(t, shared.Need{CPUs: 1}, "small")
	ev := r2.events.wait(t, "worker_provision_failed", eventTimeout, kindIs(shared.EventWorkerProvisionFailed, "small"))
	took := time.Since(t0)
	t.Logf("failed after %s: %s", took.Round(time.Millisecond), ev.Detail)
	if ev.Class != shared.FailureLimitReached || !strings.Contains(ev.Detail, "temporarily unable to accept job") {
		t.Errorf("event = %+v; want a limit failure with sbatch's words", ev)
	}
	if took > time.Minute {
		t.Errorf("the submission took %s: not bounded by submit_timeout (8s) but by sbatch's retries", took)
	}
	st := r2.status(t)
	found := false
	for _, n := range st.Notes {
		found = found || strings.Contains(n, "would not take a job")
	}
	if !found || len(st.BackingOff) != 0 {
		t.Errorf("Status: notes %q, backing off %+v", st.Notes, st.BackingOff)
	}
}
