package slurm

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/sshrun"
)

// dests are the login nodes the calls went to, in order.
func dests(calls []call) []string {
	var out []string
	for _, c := range calls {
		out = append(out, c.Argv[slices.Index(c.Argv, "--")+1])
	}
	return out
}

// TestLoginsInOrder: with two login nodes and the first not answering,
// the submission goes through the second at once, the first is skipped
// until its retry is due, tried first again then, and used again once it
// answers; each change is one log line, and Status says which login is
// in use.
func TestLoginsInOrder(t *testing.T) {
	h := newHarness(t, "", func(c map[string]any) { c["login"] = []string{"alice@l1", "alice@l2"} })
	// The fake lists a job per recorded sbatch, so the record is kept:
	// since(n) is the calls after the first n.
	since := func(n int) []call { return h.fake.calls()[n:] }
	h.fake.write(t, "down", "alice@l1")

	ev := h.provisioned(t)
	h.fake.setSpec(t, "squeue=rows")
	h.fake.setRows(t, ev.Job+"|PENDING|Priority|N/A|"+tagOf(ev.Worker))
	// The first command found l1 silent; everything since went to l2.
	if got := dests(h.fake.calls()); len(got) < 2 || got[0] != "alice@l1" || slices.Contains(got[1:], "alice@l1") {
		t.Fatalf("the submission's commands went to %v, want l1 once, then l2 alone", got)
	}
	st := h.status(t)
	if !slices.ContainsFunc(st.Notes, func(n string) bool { return strings.HasPrefix(n, "login: using alice@l2 (entry 2 of 2)") }) ||
		!slices.ContainsFunc(st.Notes, func(n string) bool {
			return strings.HasPrefix(n, "login: alice@l1 not answering") && strings.Contains(n, "Connection refused")
		}) {
		t.Errorf("Status notes = %q, want l2 in use and l1 not answering in ssh's words", st.Notes)
	}
	for _, ev := range h.host.Events() {
		if ev.Kind != shared.EventWorkerProvisioned {
			t.Errorf("event %+v: a login node that does not answer failed a machine that another login could ask for", ev)
		}
	}

	// Skipped: the next commands go to l2 alone.
	n := len(h.fake.calls())
	h.p.poll.once(context.Background())
	if got := dests(since(n)); len(got) == 0 || slices.Contains(got, "alice@l1") {
		t.Errorf("with l1 skipped, a poll went to %v, want l2 alone", got)
	}
	// Its retry due: l1 is tried first again, and, still down, l2 serves.
	h.clock.Advance(11 * time.Second) // the transport's first retry is due after 10 s
	n = len(h.fake.calls())
	h.p.poll.once(context.Background())
	if got := dests(since(n)); !slices.Equal(got, []string{"alice@l1", "alice@l2"}) {
		t.Errorf("with l1's retry due, a poll went to %v, want l1 then l2", got)
	}
	// Back: l1 is used again.
	h.fake.write(t, "down", "")
	h.clock.Advance(5 * time.Minute) // the longest a retry waits
	n = len(h.fake.calls())
	h.p.poll.once(context.Background())
	if got := dests(since(n)); !slices.Equal(got, []string{"alice@l1"}) {
		t.Errorf("with l1 back, a poll went to %v, want l1", got)
	}
	logs := h.logs.String()
	if n := strings.Count(logs, "a login node does not answer"); n != 1 {
		t.Errorf("%d lines say l1 does not answer, want 1 (one per change, not per attempt):\n%s", n, logs)
	}
	if n := strings.Count(logs, "a login node answers again"); n != 1 {
		t.Errorf("%d lines say l1 answers again, want 1", n)
	}
}

// TestLoginNeeded: a login node that refuses the login (an operator's
// MFA master gone) stops nothing for good: the submission it stopped is
// taken back without a failure, no profile backs off, Provision answers
// "login needed" with what to run and when it tries again, and asks for
// nothing; the poller tries on the transport's backoff (a minute, then
// two), never at the poll's pace, one log line for the whole outage; and
// the first try that gets through ends it.
func TestLoginNeeded(t *testing.T) {
	h := newHarness(t, "", func(c map[string]any) { c["multiplex"] = false })
	ev := h.provisioned(t)
	h.fake.setSpec(t, "squeue=rows")
	h.fake.setRows(t, ev.Job+"|PENDING|Priority|N/A|"+tagOf(ev.Worker))
	h.fake.write(t, "refuse", "alice@login.example.org")
	events := len(h.host.Events())

	o, _ := h.provisionN(t, cpuNeed, 2)
	if o.Outcome != shared.OutcomeRequested {
		t.Fatalf("Provision = %+v, want requested (nothing is known to be wrong yet)", o)
	}
	h.submitted(t)
	if evs := h.host.Events()[events:]; len(evs) != 0 {
		t.Errorf("events after the login was refused: %+v, want none (nothing was asked of the cluster)", evs)
	}
	st := h.status(t)
	if len(st.BackingOff) != 0 {
		t.Errorf("a refused login backs off %+v, want no profile held", st.BackingOff)
	}
	if len(st.Outstanding) != 1 {
		t.Errorf("outstanding = %+v, want the first machine alone (the second taken back)", st.Outstanding)
	}
	note := ""
	for _, n := range st.Notes {
		if strings.HasPrefix(n, loginNeededPrefix+":") {
			note = n
		}
	}
	for _, want := range []string{"Permission denied (publickey)", "ssh -o ControlMaster=yes -o ControlPersist=yes -fN alice@login.example.org"} {
		if !strings.Contains(note, want) {
			t.Errorf("Status note %q does not say %q", note, want)
		}
	}

	sbatches := len(h.fake.callsTo("sbatch"))
	o, _ = h.provisionN(t, cpuNeed, 2)
	if o.Outcome != shared.OutcomeCapped || o.Condition != shared.ConditionLoginNeeded || !strings.HasPrefix(o.Detail, loginNeededPrefix+":") {
		t.Errorf("Provision while the login is needed = %+v, want capped, login needed", o)
	}
	h.submitted(t)
	if n := len(h.fake.callsTo("sbatch")) - sbatches; n != 0 {
		t.Errorf("%d sbatch while the login is needed, want none", n)
	}
	if !h.p.poll.wanted() {
		t.Error("the poller rests while the login is needed: nothing would notice it back")
	}
	// Polls before the try is due knock on nothing: no ssh at all.
	next := h.p.q.Transport().Access().NextTry
	if got := next.Sub(h.clock.Now()); got != time.Minute {
		t.Errorf("the next try is %s away, want a minute", got)
	}
	if !strings.Contains(note, "tried again at "+next.UTC().Format(time.RFC3339)) {
		t.Errorf("Status note %q does not say when the login is tried again (%s)", note, next.UTC().Format(time.RFC3339))
	}
	calls := len(h.fake.calls())
	h.p.poll.once(context.Background())
	h.clock.Advance(next.Sub(h.clock.Now()) - time.Second)
	h.p.poll.once(context.Background())
	if n := len(h.fake.calls()) - calls; n != 0 {
		t.Errorf("%d ssh before the login's try is due, want none", n)
	}
	// Due: one try, refused again; the next a doubled wait away.
	h.clock.Advance(time.Second)
	h.p.poll.once(context.Background())
	if n := len(h.fake.calls()) - calls; n != 1 {
		t.Errorf("%d ssh when the login's try is due, want 1", n)
	}
	if got := h.p.q.Transport().Access().NextTry.Sub(h.clock.Now()); got != 2*time.Minute {
		t.Errorf("after a second refusal the next try is %s away, want 2m", got)
	}

	h.fake.write(t, "refuse", "")
	h.p.poll.once(context.Background())
	if needed, _ := h.p.loginNeeded(h.p.settings()); !needed {
		t.Fatal("a poll before the try was due ended the login needed: it knocked")
	}
	h.clock.Advance(2 * time.Minute)
	h.p.poll.once(context.Background())
	if needed, _ := h.p.loginNeeded(h.p.settings()); needed {
		t.Fatal("a poll that got through left the login needed")
	}
	o, _ = h.provisionN(t, cpuNeed, 2)
	if o.Outcome != shared.OutcomeRequested {
		t.Errorf("Provision after the login is back = %+v, want requested", o)
	}
	h.submitted(t)
	logs := h.logs.String()
	if n := strings.Count(logs, "asking for nothing until a login gets through"); n != 1 {
		t.Errorf("%d lines say the login is needed, want 1 for the whole outage:\n%s", n, logs)
	}
	if n := strings.Count(logs, "logged in again"); n != 1 {
		t.Errorf("%d lines say logged in again, want 1", n)
	}
}

// TestLoginNeededWords: with the plugin's own connections a refused login
// is about the key; through an operator's master (multiplex off) it says
// how to open the master again.
func TestLoginNeededWords(t *testing.T) {
	since := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	auth := sshrun.Access{Phase: sshrun.AccessRefused, Since: since, Said: "Permission denied (publickey).", Refusal: sshrun.RefusedAuth, NextTry: since.Add(time.Minute)}
	own := &settings{Config: Config{SSHPort: 2222}, multiplex: true, logins: []sshrun.Login{{Dest: "u@h"}}}
	if d := loginNeededDetail(own, auth); !strings.Contains(d, "ssh_key") || strings.Contains(d, "ControlMaster") || !strings.Contains(d, "tried again at 2026-12-02T10:01:00Z") {
		t.Errorf("own connections: %s", d)
	}
	master := &settings{Config: Config{SSHConfig: "/c"}, logins: []sshrun.Login{{Dest: "u@h", Port: 2200}}}
	if d := loginNeededDetail(master, auth); !strings.Contains(d, "`ssh -F /c -p 2200 -o ControlMaster=yes -o ControlPersist=yes -fN u@h`") {
		t.Errorf("operator's master: %s", d)
	}
	hostKey := auth
	hostKey.Said, hostKey.Refusal = "Host key verification failed.", sshrun.RefusedHostKey
	if d := loginNeededDetail(own, hostKey); !strings.Contains(d, "Check known_hosts") || strings.Contains(d, "ssh_key") || !strings.Contains(d, "Host key verification failed") {
		t.Errorf("a host key: %s", d)
	}
	if _, _, fix := sshBlame(master, "u@h: Permission denied (publickey)."); !strings.Contains(fix, "-fN u@h") {
		t.Errorf("validate -check's fix through a master: %s", fix)
	}
}

// TestShutdownLoginNeeded: a provisioner whose login was refused from the
// start never read the queue and submitted nothing; its shutdown says so
// in the log, runs no ssh (the login's try is not due) and is not a
// failure. One with a job in its books that it cannot cancel still fails,
// naming the job.
func TestShutdownLoginNeeded(t *testing.T) {
	t.Run("nothing submitted", func(t *testing.T) {
		h := newUnconfigured(t, "")
		h.fake.write(t, "refuse", "alice@login.example.org")
		h.configure(t, nil)
		o, _ := h.provisionN(t, cpuNeed, 1)
		if o.Outcome != shared.OutcomeCapped || o.Condition != shared.ConditionLoginNeeded {
			t.Fatalf("Provision = %+v, want capped, login needed", o)
		}
		calls := len(h.fake.calls())
		resp, err := h.p.Shutdown(context.Background(), &shared.ShutdownRequest{})
		if err != nil || resp == nil || len(resp.Cancelled) != 0 {
			t.Fatalf("Shutdown = %+v, %v; want nothing cancelled and no error", resp, err)
		}
		if n := len(h.fake.calls()) - calls; n != 0 {
			t.Errorf("the shutdown ran ssh %d times before the login's try was due, want none", n)
		}
		if !strings.Contains(h.logs.String(), "this run left nothing there that it knows of") {
			t.Errorf("the log does not say the run left nothing:\n%s", h.logs.String())
		}
	})
	t.Run("a job left", func(t *testing.T) {
		h := newHarness(t, "", nil)
		ev := h.provisioned(t)
		h.fake.write(t, "refuse", "alice@login.example.org")
		h.fake.setSpec(t, "squeue=rows")
		h.fake.setRows(t, ev.Job+"|PENDING|Priority|N/A|"+tagOf(ev.Worker))
		h.p.poll.once(context.Background())
		_, err := h.p.Shutdown(context.Background(), &shared.ShutdownRequest{})
		if err == nil || !strings.Contains(err.Error(), "may be left in the queue") || !strings.Contains(err.Error(), ev.Job) {
			t.Errorf("Shutdown with job %s it could not cancel: %v, want it named as may be left", ev.Job, err)
		}
	})
}
