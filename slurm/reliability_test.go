package slurm_test

// Reliability tests: the real plugin binary against a cluster that breaks
// while it works. Those that stop a daemon do it on a private sandbox
// (sandboxtest.Private), never on the shared one other tests use at the
// same time. See docs/reliability.md for what each failure should do.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/shared/sharedtest"
	slurmplugin "github.com/fluksio/provision/slurm"
)

// newPrivateRig is newRig against a given sandbox, normally a private
// one. Its cleanup cancels what is left by name but does not wait for the
// queue to drain: the private sandbox's own cleanup (down.sh --purge,
// registered earlier, so run later) cancels every job and stops it all.
func newPrivateRig(t *testing.T, env sandboxtest.Env, tag string, configure func(r *rig) map[string]any) *rig {
	t.Helper()
	return launchRig(t, env, "rel-"+tag, false, configure)
}

// ask calls Provision and returns its answer, failing on an error.
func (r *rig) ask(t *testing.T, need shared.Need) *shared.DemandOutcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, _, err := r.wants.Ask(ctx, r.prov, need, 1)
	if err != nil {
		t.Fatalf("Provision(%+v): %v", need, err)
	}
	return resp
}

// queueByProfile is squeue's view of the rig's jobs that are queued or
// running, by profile (read from the comment): job ids.
func (r *rig) queueByProfile(t *testing.T) map[string][]string {
	t.Helper()
	out, err := slurm(r.env, "squeue", "-h", "--name=fluksio-"+r.name, "-t", "PENDING,RUNNING", "-o", "%i|%k")
	if err != nil {
		t.Fatal(err)
	}
	byProfile := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		id, comment, ok := strings.Cut(strings.TrimSpace(line), "|")
		if !ok {
			continue
		}
		rest, _ := strings.CutPrefix(comment, "fluksio:v2:"+r.name+":0:"+r.name+"-")
		if i := strings.LastIndexByte(rest, '-'); i > 0 {
			rest = rest[:i]
		}
		byProfile[rest] = append(byProfile[rest], id)
	}
	return byProfile
}

// outstandingJobs maps each outstanding profile to its job id.
func outstandingJobs(st *shared.StatusResponse) map[string]string {
	m := map[string]string{}
	for _, o := range st.Outstanding {
		m[o.Profile] = o.Job
	}
	return m
}

// pendingSbatch keeps a job pending for an hour: it cannot start, so it
// stays outstanding whatever the sandbox is doing.
func (r *rig) pendingSbatch() []string {
	return r.sbatch("--begin=now+1hour")
}

// TestReliabilitySlurmctldDown stops the controller while requests are
// outstanding. A controller that does not answer says nothing about its
// jobs: every request must be kept through failed polls, a profile that
// is outstanding must not be asked for twice, the outage must show in
// LastError, and once the controller is back the requests must still be
// there with their job ids and nothing duplicated in the queue.
func TestReliabilitySlurmctldDown(t *testing.T) {
	env := sandboxtest.Private(t, "ctld")
	r := newPrivateRig(t, env, "ctld", func(r *rig) map[string]any {
		c := r.config(
			profile("a", 1, 0, 100, nil, r.pendingSbatch()),
			profile("b", 1, 0, 150, nil, r.pendingSbatch()),
			profile("c", 1, 0, 200, nil, r.pendingSbatch()),
		)
		c["poll_interval"] = "2s"
		// squeue takes ~18 s and sbatch ~9 s to fail with slurmctld down;
		// calls give up sooner.
		c["submit_timeout"] = "5s"
		// --begin=now+1hour must come before the --deadline that
		// provision_timeout and --time make.
		c["provision_timeout"] = "2h"
		return c
	})

	r.provision(t, shared.Need{Label: "a"}, "a")
	r.provision(t, shared.Need{Label: "b"}, "b")
	jobs := map[string]string{"a": r.provisioned(t, "a").Job, "b": r.provisioned(t, "b").Job}
	if got := outstandingJobs(r.status(t)); got["a"] != jobs["a"] || got["b"] != jobs["b"] || len(got) != 2 {
		t.Fatalf("outstanding = %v, want %v", got, jobs)
	}
	// A poll has seen both jobs pending before the controller goes.
	poll(t, "a poll to see a and b PENDING", 30*time.Second, func() (bool, string) {
		st := r.status(t)
		n := 0
		for _, o := range st.Outstanding {
			if o.State == "PENDING" {
				n++
			}
		}
		return n == 2, fmt.Sprintf("%+v", st.Outstanding)
	})

	env.StopDaemon(t, "slurmctld")
	down := time.Now()

	// A free profile asked for while the controller is down: sbatch
	// outlives submit_timeout, so its answer is lost, and the queue
	// cannot be read to look for its job. The request must stay
	// outstanding (state UNKNOWN) so that c is not asked for twice.
	if resp := r.ask(t, shared.Need{Label: "c"}); resp.Outcome != shared.OutcomeRequested {
		t.Fatalf("Provision(c) with slurmctld down = %+v, want requested", resp)
	}

	// Several poll cycles fail. Through all of them, nothing is
	// forgotten.
	var st *shared.StatusResponse
	poll(t, "three failed poll cycles and c's outcome to be UNKNOWN", 90*time.Second, func() (bool, string) {
		st = r.status(t)
		got := outstandingJobs(st)
		if got["a"] != jobs["a"] || got["b"] != jobs["b"] {
			t.Fatalf("a request was forgotten while slurmctld was down: outstanding %+v, want a=%s b=%s", st.Outstanding, jobs["a"], jobs["b"])
		}
		for _, ev := range r.events.all() {
			if ev.Kind != shared.EventWorkerProvisioned {
				t.Fatalf("event %+v while slurmctld was down; nothing may be concluded from a controller that does not answer", ev)
			}
		}
		failed := 1 + strings.Count(r.logs.String(), "still cannot read the queue")
		if !strings.Contains(r.logs.String(), "cannot read the queue; keeping every request") {
			failed = 0
		}
		var c shared.Outstanding
		for _, o := range st.Outstanding {
			if o.Profile == "c" {
				c = o
			}
		}
		return failed >= 3 && c.State == "UNKNOWN", fmt.Sprintf("%d failed polls, c=%+v", failed, c)
	})
	t.Logf("after %.1fs with slurmctld down: outstanding %+v; LastError %q", time.Since(down).Seconds(), st.Outstanding, st.LastError)
	if !strings.Contains(st.LastError, "reading the queue") && !strings.Contains(st.LastError, "could not look for its job") {
		t.Errorf("LastError = %q, want the failure to read the queue", st.LastError)
	}
	if len(st.Outstanding) != 3 {
		t.Errorf("outstanding = %+v, want a, b and c", st.Outstanding)
	}
	for _, p := range []string{"a", "b", "c"} {
		if resp := r.ask(t, shared.Need{Label: p}); resp.Outcome != shared.OutcomeOutstanding {
			t.Errorf("Provision(%s) with slurmctld down = %+v, want outstanding", p, resp)
		}
	}

	restart := time.Now()
	env.Restart(t)
	t.Logf("slurmctld was down for %.1fs", time.Since(down).Seconds())

	// The first poll that reads the queue again settles c: its job was
	// found (sbatch got through after all) or it was not submitted.
	cEvent := r.events.wait(t, "c's lost submission to be settled", 60*time.Second, func(ev shared.Event) bool {
		return ev.Profile == "c" && (ev.Kind == shared.EventWorkerProvisioned || ev.Kind == shared.EventWorkerProvisionFailed)
	})
	t.Logf("c settled %.1fs after the restart began (up.sh waits for the controller, the node and a smoke job): %s %s %s",
		cEvent.Time.Sub(restart).Seconds(), cEvent.Kind, cEvent.Job, cEvent.Detail)
	st = r.status(t)
	got := outstandingJobs(st)
	if got["a"] != jobs["a"] || got["b"] != jobs["b"] {
		t.Errorf("after recovery outstanding = %+v, want a=%s b=%s", st.Outstanding, jobs["a"], jobs["b"])
	}
	for _, o := range st.Outstanding {
		if (o.Profile == "a" || o.Profile == "b") && o.State != "PENDING" {
			t.Errorf("after recovery %s is %q, want PENDING", o.Profile, o.State)
		}
	}
	queue := r.queueByProfile(t)
	for p, ids := range queue {
		if len(ids) > 1 {
			t.Errorf("profile %s has %d jobs in the queue after recovery: %v", p, len(ids), ids)
		}
	}
	if !slices.Equal(queue["a"], []string{jobs["a"]}) || !slices.Equal(queue["b"], []string{jobs["b"]}) {
		t.Errorf("queue after recovery = %v, want a=[%s] b=[%s]", queue, jobs["a"], jobs["b"])
	}
	want := []string{jobs["a"], jobs["b"]}
	if cEvent.Kind == shared.EventWorkerProvisioned {
		want = append(want, cEvent.Job)
		if !slices.Equal(queue["c"], []string{cEvent.Job}) {
			t.Errorf("c was found as job %s, but the queue has %v", cEvent.Job, queue["c"])
		}
	} else if len(queue["c"]) != 0 {
		t.Errorf("c was reported not submitted, but the queue has %v", queue["c"])
	}

	resp := r.stop(t)
	if !sameSet(resp.Cancelled, want) {
		t.Errorf("Shutdown cancelled %v, want %v", resp.Cancelled, want)
	}
	waitQueueEmpty(t, env, r.name)
}

// TestReliabilityLoginNodeDown stops the login node's sshd, and the
// connection processes it forked, while a request is outstanding. A
// submission must fail within submit_timeout, its profile back off
// without touching the login node again, and everything work again once
// sshd is back and the backoff has passed.
func TestReliabilityLoginNodeDown(t *testing.T) {
	const submitTimeout = 5 * time.Second
	env := sandboxtest.Private(t, "sshd")
	r := newPrivateRig(t, env, "sshd", func(r *rig) map[string]any {
		c := r.config(
			profile("a", 1, 0, 100, nil, r.pendingSbatch()),
			profile("b", 1, 0, 150, nil, r.pendingSbatch()),
		)
		c["poll_interval"] = "2s"
		c["submit_timeout"] = submitTimeout.String()
		c["provision_timeout"] = "2h"
		return c
	})
	// The shared connection to the login node is up and in use.
	r.provision(t, shared.Need{Label: "a"}, "a")
	jobA := r.provisioned(t, "a").Job

	env.StopDaemon(t, "sshd")
	down := time.Now()

	asked := time.Now()
	r.provision(t, shared.Need{Label: "b"}, "b")
	ev := r.events.wait(t, "worker_provision_failed for b", submitTimeout+10*time.Second, kindIs(shared.EventWorkerProvisionFailed, "b"))
	took := time.Since(asked)
	t.Logf("with sshd down, b failed %.2fs after Provision: %s", took.Seconds(), ev.Detail)
	if took > submitTimeout+5*time.Second {
		t.Errorf("the failure took %s, more than submit_timeout %s and a margin", took, submitTimeout)
	}
	st := r.status(t)
	var backoff *shared.Backoff
	for i := range st.BackingOff {
		if st.BackingOff[i].Profile == "b" {
			backoff = &st.BackingOff[i]
		}
	}
	if backoff == nil {
		t.Fatalf("b is not backing off after a failed submission: %+v", st)
	}
	t.Logf("b backs off until %s (%d failure(s)): %s", backoff.Until.Format(time.RFC3339Nano), backoff.Failures, backoff.LastError)
	// Weather, not a verdict: a short backoff, and no profile marked
	// misconfigured.
	if wait := time.Until(backoff.Until); wait > 5*time.Minute {
		t.Errorf("a login node that is down holds b back for %s, longer than the backoff's cap of 5 minutes: taken for a verdict", wait)
	}
	for _, n := range st.Notes {
		if strings.Contains(n, "misconfigured") {
			t.Errorf("a login node that is down marked a profile misconfigured: %s", n)
		}
	}
	if got := outstandingJobs(st); got["a"] != jobA {
		t.Errorf("a's request was forgotten while the login node was down: %+v", st.Outstanding)
	}
	// Backing off answers at once, without another submission: no second
	// event for b follows.
	start := time.Now()
	if resp := r.ask(t, shared.Need{Label: "b"}); resp.Outcome != shared.OutcomeBackingOff {
		t.Errorf("Provision(b) while backing off = %+v, want backing_off", resp)
	} else {
		t.Logf("Provision(b) while backing off answered in %s: %s", time.Since(start).Round(time.Millisecond), resp.Detail)
	}

	env.Restart(t)
	t.Logf("sshd was down for %.1fs", time.Since(down).Seconds())
	var forB []shared.Event
	for _, e := range r.events.all() {
		if e.Profile == "b" {
			forB = append(forB, e)
		}
	}
	if len(forB) != 1 {
		t.Errorf("events for b while backing off = %+v, want its one failure", forB)
	}

	// Once the backoff has passed, b is asked for again and gets a job.
	poll(t, "Provision(b) to be accepted after the backoff", time.Until(backoff.Until)+30*time.Second, func() (bool, string) {
		resp := r.ask(t, shared.Need{Label: "b"})
		return resp.Outcome == shared.OutcomeRequested, fmt.Sprintf("%+v", resp)
	})
	recovered := r.events.wait(t, "worker_provisioned for b", eventTimeout, kindIs(shared.EventWorkerProvisioned, "b"))
	t.Logf("b provisioned as job %s %.1fs after sshd was stopped", recovered.Job, time.Since(down).Seconds())
	if got := outstandingJobs(r.status(t)); got["a"] != jobA || got["b"] != recovered.Job {
		t.Errorf("outstanding = %v, want a=%s b=%s", got, jobA, recovered.Job)
	}
	queue := r.queueByProfile(t)
	if !slices.Equal(queue["a"], []string{jobA}) || !slices.Equal(queue["b"], []string{recovered.Job}) || len(queue) != 2 {
		t.Errorf("queue = %v, want a=[%s] b=[%s]", queue, jobA, recovered.Job)
	}
	resp := r.stop(t)
	if !sameSet(resp.Cancelled, []string{jobA, recovered.Job}) {
		t.Errorf("Shutdown cancelled %v, want %s and %s", resp.Cancelled, jobA, recovered.Job)
	}
	waitQueueEmpty(t, env, r.name)
}

// silentNode accepts TCP connections and never says a word: a login node
// whose sshd is wedged, or a host that is half gone. It holds every
// connection until closed, without a goroutine per connection, so that
// the test's goroutine count is not disturbed.
type silentNode struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	done  chan struct{}
}

func newSilentNode(t *testing.T) *silentNode {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &silentNode{ln: ln, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
		}
	}()
	t.Cleanup(s.close)
	return s
}

func (s *silentNode) port() int { return s.ln.Addr().(*net.TCPAddr).Port }

func (s *silentNode) accepted() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

func (s *silentNode) close() {
	s.ln.Close()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.Close()
	}
	s.conns = nil
}

// sshProcsTo lists the ssh processes whose command line names the port.
func sshProcsTo(port int) []string {
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var out []string
	for _, f := range cmdlines {
		b, err := os.ReadFile(f)
		if err != nil || len(b) == 0 {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if filepath.Base(argv[0]) != "ssh" {
			continue
		}
		for i := 0; i+1 < len(argv); i++ {
			if argv[i] == "-p" && argv[i+1] == strconv.Itoa(port) {
				out = append(out, filepath.Base(filepath.Dir(f))+": "+strings.Join(argv, " "))
				break
			}
		}
	}
	return out
}

// TestReliabilitySilentLoginNode points the plugin at a login node that
// accepts connections and never answers. The submission must fail within
// submit_timeout (not hang), the profile back off, and Stop must leave
// nothing behind: no goroutine in the host, no plugin process, no ssh.
func TestReliabilitySilentLoginNode(t *testing.T) {
	const submitTimeout = 3 * time.Second
	sandboxtest.Require(t)
	sandboxtest.Binary(t, "plugin", "provisioner-slurm") // built before counting
	node := newSilentNode(t)
	baseline := runtime.NumGoroutine()

	r := newRig(t, "silent", func(r *rig) map[string]any {
		c := r.config(profile("small", 1, 0, 100, nil, r.sbatch()))
		c["ssh_port"] = node.port()
		c["submit_timeout"] = submitTimeout.String()
		c["poll_interval"] = "2s"
		return c
	})
	pid := r.plugin.Pid()
	// Configure's look for jobs an earlier run left is the first call to
	// hang on the node; the submission is timed once it has given up.
	poll(t, "the plugin to give up listing jobs left by an earlier run", 4*submitTimeout, func() (bool, string) {
		return strings.Contains(r.logs.String(), "could not list jobs left by an earlier run"), ""
	})

	asked := time.Now()
	r.provision(t, shared.Need{CPUs: 1}, "small")
	ev := r.events.wait(t, "worker_provision_failed", 2*submitTimeout+10*time.Second, kindIs(shared.EventWorkerProvisionFailed, "small"))
	took := time.Since(asked)
	t.Logf("against a silent login node, the submission failed %.2fs after Provision (submit_timeout %s): %s", took.Seconds(), submitTimeout, ev.Detail)
	if took > submitTimeout+3*time.Second {
		t.Errorf("the failure took %s, more than submit_timeout %s and a margin", took, submitTimeout)
	}
	if node.accepted() == 0 {
		t.Errorf("the silent node accepted no connection; the test proves nothing")
	}
	st := r.status(t)
	if len(st.BackingOff) != 1 || st.BackingOff[0].Profile != "small" {
		t.Errorf("BackingOff = %+v, want small", st.BackingOff)
	}
	if len(st.Outstanding) != 0 {
		t.Errorf("outstanding after the failure = %+v, want none", st.Outstanding)
	}
	if resp := r.ask(t, shared.Need{CPUs: 1}); resp.Outcome != shared.OutcomeBackingOff {
		t.Errorf("Provision while backing off = %+v, want backing_off", resp)
	}

	// The queue could never be read, so the plugin cannot know whether an
	// earlier run left jobs in it; but this run submitted nothing, so its
	// shutdown is not a failure (issue 43): it says so in the log, names
	// what it could not look for, and stops promptly. A job of this run
	// it could not cancel would still fail it (TestShutdownLoginNeeded).
	stopped := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	_, err := r.plugin.Stop(ctx)
	cancel()
	if err != nil {
		t.Errorf("Stop = %v; want no failure from a run that submitted nothing", err)
	}
	if log := r.logs.String(); !strings.Contains(log, "could not read the queue at shutdown") || !strings.Contains(log, "an earlier run may have left") {
		t.Errorf("the plugin's log does not say what it could not look for at shutdown")
	}
	t.Logf("Stop returned after %.2fs: %v", time.Since(stopped).Seconds(), err)
	select {
	case <-r.plugin.Exited():
	default:
		t.Errorf("the plugin process %d has not exited after Stop", pid)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d/exe", pid)); err == nil {
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); !strings.Contains(string(b), ") Z ") {
			t.Errorf("the plugin process %d is still running after Stop", pid)
		}
	}
	var left []string
	var n int
	end := time.Now().Add(10 * time.Second)
	for {
		left, n = sshProcsTo(node.port()), runtime.NumGoroutine()
		if (len(left) == 0 && n <= baseline) || time.Now().After(end) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(left) > 0 {
		t.Errorf("ssh processes to the silent node outlived the plugin:\n%s", strings.Join(left, "\n"))
	}
	if n > baseline {
		var b strings.Builder
		pprof.Lookup("goroutine").WriteTo(&b, 1)
		t.Errorf("%d goroutines in the host after Stop, %d before the plugin was launched:\n%s", n, baseline, b.String())
	} else {
		t.Logf("goroutines in the host: %d before launch, %d after Stop", baseline, n)
	}

	// The plugin's side, which the process boundary hides: the same
	// provisioner in this process, against the same silent node. Its
	// goroutines (poller, submissions, ssh waits) must all end with
	// Shutdown.
	inProcessLeaves(t, r, node.port(), submitTimeout)
}

// inProcessLeaves runs a Provisioner in the test process against the
// silent node at port: Configure, a Provision that fails, Shutdown; and
// checks that it leaves no goroutine and no ssh process behind.
func inProcessLeaves(t *testing.T, r *rig, port int, submitTimeout time.Duration) {
	t.Helper()
	base := runtime.NumGoroutine()
	p := slurmplugin.New(nil)
	schema, err := p.Schema(context.Background(), &shared.SchemaRequest{})
	if err != nil {
		t.Fatal(err)
	}
	c := r.config(profile("small", 1, 0, 100, nil, r.sbatch()))
	c["ssh_port"] = port
	c["submit_timeout"] = submitTimeout.String()
	c["poll_interval"] = "1s"
	completeConfig(t, c, schema.Schema)
	raw, _ := json.Marshal(c)
	host := &sharedtest.Host{}
	if resp, err := p.Configure(context.Background(), &shared.ConfigureRequest{Name: r.name + "-inproc", Config: raw, Host: host}); err != nil || resp.Diagnostics.HasErrors() {
		t.Fatalf("Configure: %v %v", err, resp)
	}
	if resp, err := p.Provision(context.Background(), &shared.ProvisionRequest{Demand: []shared.Demand{{Need: shared.Need{CPUs: 1}, Count: 1}}}); err != nil || resp.Outcomes[0].Outcome != shared.OutcomeRequested {
		t.Fatalf("Provision = %+v, %v", resp, err)
	}
	failed := kindIs(shared.EventWorkerProvisionFailed, "small")
	poll(t, "the in-process submission to fail", 4*submitTimeout+10*time.Second, func() (bool, string) {
		return slices.ContainsFunc(host.Events(), failed), ""
	})
	during := runtime.NumGoroutine()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	p.Shutdown(ctx, &shared.ShutdownRequest{})
	cancel()
	var n int
	var left []string
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		n, left = runtime.NumGoroutine(), sshProcsTo(port)
		if (n <= base && len(left) == 0) || time.Now().After(end) {
			break
		}
	}
	if n > base || len(left) > 0 {
		var b strings.Builder
		pprof.Lookup("goroutine").WriteTo(&b, 1)
		t.Errorf("the provisioner left %d goroutines (%d before, %d while idle after the failure) and ssh processes %q:\n%s", n-base, base, during, left, b.String())
	} else {
		t.Logf("goroutines of the provisioner: %d before Configure, %d after the failure, %d after Shutdown", base, during, n)
	}
}
