package slurm_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/shared"
)

// TestSubmitRuleOnSandbox: a site with require_timelimit and throttle
// (SANDBOX_JOB_SUBMIT). A profile without --time is misconfigured, in
// Slurm's words with the fix, and validate -check says so at the profile;
// submissions past the throttle are limit_reached with the site's words
// and the time of the next try, no profile backs off, and Provision asks
// for nothing until then.
func TestSubmitRuleOnSandbox(t *testing.T) {
	const perHour = 3
	env := sandboxtest.PrivateWith(t, "rules", sandboxtest.Options{JobSubmit: "require_timelimit,throttle", JobsPerHour: perHour})
	var raw json.RawMessage
	names := []string{"a", "b", "c", "d", "e"}
	r := newPrivateRig(t, env, "rules", func(r *rig) map[string]any {
		profiles := []map[string]any{profile("notime", 1, 0, 100, nil, []string{"--partition=" + env.Partition, r.worker.outputOption()})}
		for i, n := range names {
			profiles = append(profiles, profile(n, 1, 0, int64(200+i*50), nil, r.sbatch("--hold")))
		}
		c := r.config(profiles...)
		raw, _ = json.Marshal(c)
		return c
	})

	r.provision(t, shared.Need{Label: "notime"}, "notime")
	ev := r.events.wait(t, "worker_provision_failed for notime", eventTimeout, kindIs(shared.EventWorkerProvisionFailed, "notime"))
	t.Logf("notime: %s: %s", ev.Class, ev.Detail)
	if ev.Class != shared.FailureMisconfigured || !strings.Contains(ev.Detail, "Time limit specification required, but not provided") ||
		!strings.Contains(ev.Detail, "--time=") {
		t.Errorf("notime failed %s: %s; want misconfigured in Slurm's words with the fix", ev.Class, ev.Detail)
	}

	// up.sh's smoke job took one of the hour's submissions, or none:
	// ask profile after profile until the throttle refuses.
	var refused *shared.Event
	accepted := 0
	for _, n := range names {
		r.provision(t, shared.Need{Label: n}, n)
		e := r.events.wait(t, "an event for "+n, eventTimeout, func(e shared.Event) bool { return e.Profile == n })
		if e.Kind == shared.EventWorkerProvisioned {
			accepted++
			continue
		}
		refused = &e
		break
	}
	if refused == nil || accepted > perHour {
		t.Fatalf("%d submissions accepted and none throttled with jobs_per_user_per_hour=%d", accepted, perHour)
	}
	t.Logf("%d accepted, then %s: %s: %s", accepted, refused.Profile, refused.Class, refused.Detail)
	if refused.Class != shared.FailureLimitReached || !strings.Contains(refused.Detail, "Reached jobs per hour limit") ||
		!strings.Contains(refused.Detail, "asking again at") {
		t.Errorf("the throttled machine failed %s: %s; want limit_reached, the site's words and the next try", refused.Class, refused.Detail)
	}
	st := r.status(t)
	for _, b := range st.BackingOff {
		if b.Profile != "notime" {
			t.Errorf("a throttle backs off profile %s: %+v", b.Profile, b)
		}
	}
	if o := r.ask(t, shared.Need{Label: refused.Profile}); o.Outcome != shared.OutcomeCapped || !strings.Contains(o.Detail, "job_submit/throttle") {
		t.Errorf("Provision while throttled = %+v, want capped until the throttle gives one back", o)
	}

	// validate -check: the profile without --time at its own path. (Its
	// --test-only of the other profiles meets the throttle: a warning.)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := r.prov.(shared.Checker).Check(ctx, &shared.CheckRequest{Name: r.name, Config: raw})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, d := range resp.Diagnostics {
		t.Logf("check: %s %v %s: %s", map[shared.Severity]string{shared.SeverityError: "error", shared.SeverityWarning: "warning"}[d.Severity], d.Path, d.Summary, d.Detail)
		if strings.HasPrefix(strings.Join(d.Path, "."), "profile.0") && d.Severity == shared.SeverityError &&
			strings.Contains(d.Detail, "Time limit specification required") && strings.Contains(d.Detail, "--time=") {
			found = true
		}
		if d.Severity == shared.SeverityError && strings.Contains(d.Detail, "jobs per hour") {
			t.Errorf("validate -check makes the throttle an error: %+v", d)
		}
	}
	if !found {
		t.Errorf("validate -check does not refuse profile notime at profile.0 with Slurm's words and the fix: %s", fmt.Sprint(resp.Diagnostics))
	}
}
