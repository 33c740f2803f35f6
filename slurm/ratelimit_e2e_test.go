package slurm_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/shared"
)

// The rate limiter's tests run on a private sandbox of the CI's Slurm
// with SANDBOX_RATE_LIMIT=10,1 (sandboxtest.Options.RateLimit), not on
// the shared one: every other test that runs beside them would be
// rationed too, and a test that turned the limiter on with scontrol
// reconfigure and off again would leave it on for everybody if it died
// half way.

// rateLimitedSandbox is a private sandbox whose slurmctld rations each
// user's RPCs: a bucket of 10, 1 back a second. Slurm 22.05 has no
// limiter, so there the test is skipped, saying so.
func rateLimitedSandbox(t *testing.T) sandboxtest.Env {
	t.Helper()
	shared := sandboxtest.Require(t)
	if sandboxtest.Suite() == "bookworm" || strings.HasPrefix(shared.Version, "22.05") {
		t.Skipf("the sandbox runs Slurm %s (%s), which has no RPC rate limiter (SlurmctldParameters=rl_enable is Slurm 23.02 and later); make test-versions runs this on 24.11 and 26.05",
			shared.Version, sandboxtest.Suite())
	}
	return sandboxtest.PrivateWith(t, "rl", sandboxtest.Options{RateLimit: "10,1"})
}

// drain empties the job user's bucket the way another client of the
// same login user does: 8 squeues at once over the sandbox's ssh (3
// RPCs each on 24.11), waited for.
func drain(t *testing.T, env sandboxtest.Env) {
	t.Helper()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			_ = exec.Command("ssh", "-F", env.SSHConfig, "sandbox", "squeue", "-h").Run()
		})
	}
	wg.Wait()
}

// keepDrained runs two loops of squeue as the job user until the
// returned stop is called, which waits for them: another client of the
// same user that keeps the bucket empty, each squeue an ssh of its own,
// as a person's would be. A squeue cut off by stop ends on the login
// node within 3 s (timeout), so that it stops spending the bucket.
func keepDrained(env sandboxtest.Env) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for ctx.Err() == nil {
				_ = exec.CommandContext(ctx, "ssh", "-F", env.SSHConfig, "sandbox", "timeout", "3", "squeue", "-h").Run()
			}
		})
	}
	return func() {
		cancel()
		wg.Wait()
	}
}

// drainers numbers the stop files of keepDrainedBy.
var drainers atomic.Int64

// keepDrainedBy is a harder client than keepDrained: n loops of squeue
// on the login node, each in one ssh session, so that it asks again at
// once (a new ssh a squeue leaves the bucket gaps a 1-RPC sbatch gets
// through); stop makes the
// file the loops look for, and waits for their sessions to end, which
// they do after the squeue under way. timeout bounds them should the
// test die first.
func keepDrainedBy(env sandboxtest.Env, n int) (stop func()) {
	file := filepath.Join(os.TempDir(), fmt.Sprintf("fluksio-drain-%d-%d", os.Getpid(), drainers.Add(1)))
	loop := fmt.Sprintf("timeout 300 sh -c 'while [ ! -e %s ]; do squeue -h >/dev/null 2>&1; done'", file)
	var wg sync.WaitGroup
	for range n {
		cmd := exec.Command("ssh", "-F", env.SSHConfig, "sandbox", loop)
		if cmd.Start() != nil {
			continue
		}
		wg.Go(func() { _ = cmd.Wait() })
	}
	return func() {
		_ = os.WriteFile(file, nil, 0o644)
		wg.Wait()
		os.Remove(file)
	}
}

// waitRationed waits, at most 30 s, until the job user's bucket is empty:
// a squeue over ssh takes a second more than one that is not rationed.
func waitRationed(t *testing.T, env sandboxtest.Env) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); {
		start := time.Now()
		_ = exec.Command("ssh", "-F", env.SSHConfig, "sandbox", "timeout", "5", "squeue", "-h").Run()
		if time.Since(start) > 1500*time.Millisecond {
			return
		}
	}
	t.Fatal("30 s of another client's squeues did not empty the bucket")
}

// TestIntegrationRateLimitedCheck: validate -check right after another
// client of the login user drained the bucket passes, and says that the
// limiter is on, with its bucket and refill and that it rationed the
// check; never "Slurm not reachable". scontrol show config then ends
// "Slurmctld(primary) at … is DOWN" and exits 1, which the check took for
// an outage before.
func TestIntegrationRateLimitedCheck(t *testing.T) {
	env := rateLimitedSandbox(t)
	var raw json.RawMessage
	r := newPrivateRig(t, env, "rlcheck", func(r *rig) map[string]any {
		c := r.config(profile("cpu", 1, 0, 100, nil, r.sbatch()))
		raw, _ = json.Marshal(c)
		return c
	})
	rationed := false
	for try := 1; try <= 3 && !rationed; try++ {
		drain(t, env)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		resp, err := r.prov.(shared.Checker).Check(ctx, &shared.CheckRequest{Name: r.name, Config: raw})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range resp.Diagnostics {
			if d.Severity == shared.SeverityError {
				t.Errorf("try %d: validate -check failed with the bucket drained: %v %s: %s", try, d.Path, d.Summary, d.Detail)
			}
		}
		fact := ""
		for _, f := range resp.Facts {
			t.Logf("try %d: fact %s: %s", try, f.Name, f.Value)
			if f.Name == "RPC rate limiter" {
				fact = f.Value
			}
		}
		if !strings.Contains(fact, "on (SlurmctldParameters rl_enable)") || !strings.Contains(fact, "10 RPCs at once") || !strings.Contains(fact, "1 back a second") {
			t.Fatalf("try %d: the check's RPC rate limiter fact is %q; want it on, with bucket 10 and 1 back a second", try, fact)
		}
		rationed = strings.HasPrefix(fact, "rate limited:")
	}
	if !rationed {
		t.Error("in 3 tries after draining the bucket, the check never said it was rate limited")
	}
}

// TestIntegrationRateLimitedPoll: a plugin whose start meets a drained
// bucket reads its facts all the same (the note "not yet known" goes, if
// it ever came) and knows the limiter is on (whether its first calls
// were seen rationed depends on who got the bucket's tokens: a first
// call of its kind has nothing to be slower than); while another client
// keeps the bucket empty, its polls wait their turn and are not an
// outage: no "cannot read the queue" in LastError or the log, no profile
// backs off, the machine it asked for stays outstanding with its job,
// Status says it is rate limited, and the command metrics count
// rationed calls.
func TestIntegrationRateLimitedPoll(t *testing.T) {
	env := rateLimitedSandbox(t)
	// Another client keeps the bucket empty while the plugin starts.
	stop := keepDrained(env)
	defer stop()
	r := newPrivateRig(t, env, "rlpoll", func(r *rig) map[string]any {
		c := r.config(profile("cpu", 1, 0, 100, nil, r.sbatch("--begin=now+1hour")))
		// 3 RPCs every 5 s stay under the refill of 1 a second.
		c["poll_interval"], c["submit_timeout"] = "5s", "10s"
		return c
	})
	poll(t, "a Status note saying the limiter is on, the facts read", time.Minute, func() (bool, string) {
		notes := strings.Join(r.status(t).Notes, "; ")
		return (strings.Contains(notes, "rate limited") || strings.Contains(notes, "limiter is on")) && !strings.Contains(notes, "not yet known"), notes
	})
	stop()
	r.provision(t, shared.Need{CPUs: 1}, "cpu")
	ev := r.provisioned(t, "cpu")

	// Now the polls meet an empty bucket.
	stop = keepDrained(env)
	defer stop()
	deadline := time.Now().Add(25 * time.Second)
	for time.Now().Before(deadline) {
		st := r.status(t)
		if strings.Contains(st.LastError, "queue") {
			t.Errorf("a rationed poll is in LastError as an outage: %s", st.LastError)
			break
		}
		if len(st.BackingOff) > 0 {
			t.Errorf("a profile backs off for a rationed poll: %+v", st.BackingOff)
			break
		}
		if len(st.Outstanding) != 1 || st.Outstanding[0].Job != ev.Job {
			t.Errorf("outstanding %+v; want the one machine, job %s", st.Outstanding, ev.Job)
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	stop()
	st := r.status(t)
	note := ""
	for _, n := range st.Notes {
		if strings.HasPrefix(n, "rate limited") {
			note = n
		}
	}
	t.Logf("status note: %s", note)
	if !strings.Contains(note, "squeue") {
		t.Errorf("Status notes %q do not say a squeue was rate limited", st.Notes)
	}
	var rationed int64
	for _, c := range st.Counters.Commands {
		rationed += c.Rationed
	}
	if rationed == 0 {
		t.Errorf("the command metrics count no rationed call: %+v", st.Counters.Commands)
	}
	logs := r.logs.String()
	for _, bad := range []string{"cannot read the queue", "[ERROR]"} {
		if strings.Contains(logs, bad) {
			t.Errorf("the plugin's log says %q for a rationed poll", bad)
		}
	}
}

// TestIntegrationRateLimitedSubmitCut: an sbatch that waits its turn at
// the limiter past submit_timeout (another client of the login user
// keeps the bucket empty) is stopped on the login node when the plugin
// cuts it off: no sbatch of ours is left there. The request stays on the
// way until its job can no longer land; then either the job that landed
// is the worker's (worker_provisioned, its job in the queue under its
// tag) or it did not land and is said so as weather (limit_reached, no
// profile backing off), never both, and no second job for the worker.
func TestIntegrationRateLimitedSubmitCut(t *testing.T) {
	env := rateLimitedSandbox(t)
	var r *rig
	cut := false
	for try := 1; try <= 3 && !cut; try++ {
		r = newPrivateRig(t, env, "rlcut"+strconv.Itoa(try), func(r *rig) map[string]any {
			c := r.config(profile("cpu", 1, 0, 100, nil, r.sbatch("--begin=now+1hour")))
			c["submit_timeout"], c["poll_interval"] = "2s", "2s"
			return c
		})
		// The start-up facts are read first.
		poll(t, "the limiter read from the configuration", time.Minute, func() (bool, string) {
			notes := strings.Join(r.status(t).Notes, "; ")
			return strings.Contains(notes, "limiter is on") || strings.Contains(notes, "rate limited"), notes
		})
		stop := keepDrainedBy(env, 4)
		waitRationed(t, env)
		r.provision(t, shared.Need{CPUs: 1}, "cpu")
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) && !cut && len(r.events.all()) == 0 {
			cut = strings.Contains(r.logs.String(), "sbatch's answer was lost")
			time.Sleep(100 * time.Millisecond) // a poll of the log, not a wait for an event
		}
		if cut {
			// The cut is logged after the look for its job: the
			// sbatch was stopped on the login node by then.
			for _, c := range env.LoginProcesses(t) {
				if strings.Contains(c, "sbatch") {
					t.Errorf("after the cut, still on the login node: %s", c)
				}
			}
		} else {
			t.Logf("try %d: the sbatch got through within submit_timeout: %+v", try, r.events.all())
		}
		stop()
	}
	if !cut {
		t.Fatal("in 3 tries the sbatch was never cut off while rationed")
	}
	ev := r.events.wait(t, "the cut-off submission's outcome", 2*time.Minute, func(ev shared.Event) bool {
		return ev.Kind == shared.EventWorkerProvisioned || ev.Kind == shared.EventWorkerProvisionFailed
	})
	t.Logf("outcome: %s %s job %q: %s", ev.Kind, ev.Class, ev.Job, ev.Detail)
	for _, other := range r.events.all() {
		if other.Worker == ev.Worker && other.Kind != ev.Kind {
			t.Errorf("worker %s was said both %s and %s", ev.Worker, ev.Kind, other.Kind)
		}
	}
	rows := env.Slurm(t, "squeue", "-h", "-r", "-u", "slurmuser", "-o", "%i|%k")
	var jobs []string
	for _, line := range strings.Split(strings.TrimSpace(rows), "\n") {
		if id, comment, ok := strings.Cut(line, "|"); ok && strings.HasSuffix(comment, ":"+ev.Worker) {
			jobs = append(jobs, id)
		}
	}
	switch ev.Kind {
	case shared.EventWorkerProvisioned:
		if len(jobs) != 1 || jobs[0] != ev.Job {
			t.Errorf("the landed job is %s; the queue has %v for its worker", ev.Job, jobs)
		}
	default:
		if ev.Class != shared.FailureLimitReached || !strings.Contains(ev.Detail, "not submitted") {
			t.Errorf("a rationed submission that did not land: %+v; want limit_reached, not submitted", ev)
		}
		if len(jobs) != 0 {
			t.Errorf("said not submitted, and the queue has %v for its worker", jobs)
		}
	}
	if st := r.status(t); len(st.BackingOff) > 0 {
		t.Errorf("a profile backs off for the limiter: %+v", st.BackingOff)
	}
}
