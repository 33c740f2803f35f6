package slurm_test

// Login paths against the sandbox, with real sshd and the real ssh
// client: several login nodes, an operator's ControlMaster (the way
// through MFA), and a bastion (ProxyJump).

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/shared"
)

// served waits for the profile's worker_provisioned event and for its job
// to start the worker: the need is served.
func (r *rig) served(t *testing.T, profile string) string {
	t.Helper()
	job := r.provisioned(t, profile).Job
	r.worker.recording(t, job)
	return job
}

// jobsByComment is the rig's jobs in the queue (any state squeue still
// shows), each comment with how many jobs carry it.
func jobsByComment(t *testing.T, r *rig) map[string]int {
	t.Helper()
	out, err := slurm(r.env, "squeue", "-h", "-t", "all", "--name=fluksio-"+r.name, "-o", "%i|%k")
	if err != nil {
		t.Fatalf("squeue: %v %s", err, out)
	}
	m := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if _, c, ok := strings.Cut(l, "|"); ok {
			m[c]++
		}
	}
	return m
}

// noteWith is the first Status note that starts with prefix, "" if none.
// squeueSSHErrors is how many squeue calls ssh could not run, from the
// counters Status carries.
func squeueSSHErrors(st *shared.StatusResponse) int64 {
	if st.Counters == nil {
		return 0
	}
	for _, c := range st.Counters.Commands {
		if c.Command == "squeue" {
			return c.SSHErrors
		}
	}
	return 0
}

func noteWith(st *shared.StatusResponse, prefix string) string {
	for _, n := range st.Notes {
		if strings.HasPrefix(n, prefix) {
			return n
		}
	}
	return ""
}

// TestLoginPathTwoNodes: two login nodes of one cluster, the first
// stopped mid-run (its sshd and every connection it had): the machine
// asked for before is kept, the next needs are served through the
// second, and no job is submitted twice.
func TestLoginPathTwoNodes(t *testing.T) {
	env := sandboxtest.Private(t, "logins")
	second := env.ExtraSSHD(t)
	first := fmt.Sprintf("%s:%d", env.Login, env.Port)
	var cfg map[string]any
	r := newPrivateRig(t, env, "logins", func(r *rig) map[string]any {
		c := r.config(
			profile("a", 1, 0, 100, nil, r.sbatch()),
			profile("b", 1, 0, 150, nil, r.sbatch()),
			profile("c", 1, 0, 200, nil, r.sbatch()),
		)
		c["login"] = []string{first, fmt.Sprintf("%s:%d", env.Login, second.Port)}
		c["ssh_port"] = 0
		c["known_hosts"] = second.KnownHosts
		c["poll_interval"] = "2s"
		c["submit_timeout"] = "10s"
		cfg = c
		return c
	})
	r.provision(t, shared.Need{Label: "a"}, "a")
	jobA := r.served(t, "a")
	if n := noteWith(r.status(t), "login: using "+first+" (entry 1 of 2)"); n == "" {
		t.Errorf("with the first login answering, Status notes %q do not say it is in use", r.status(t).Notes)
	}

	env.StopDaemon(t, "sshd")
	down := time.Now()
	r.provision(t, shared.Need{Label: "b"}, "b")
	jobB := r.served(t, "b")
	t.Logf("with the first login node down, b was served %.1fs later, through the second", time.Since(down).Seconds())
	asked := time.Now()
	r.provision(t, shared.Need{Label: "c"}, "c")
	r.provisioned(t, "c")
	t.Logf("c (first login still skipped) was asked for in %.2fs", time.Since(asked).Seconds())

	st := r.status(t)
	using := noteWith(st, "login: using "+env.Login+":"+fmt.Sprint(second.Port))
	silent := noteWith(st, "login: "+first+" not answering")
	if using == "" || silent == "" {
		t.Errorf("Status notes %q: want the second login in use and the first not answering", st.Notes)
	}
	t.Logf("Status: %q; %q", using, silent)
	if got := outstandingJobs(st); got["a"] != jobA || got["b"] != jobB {
		t.Errorf("outstanding %+v: want a's job %s kept and b's %s", st.Outstanding, jobA, jobB)
	}
	for _, ev := range r.events.all() {
		if ev.Kind == shared.EventWorkerProvisionFailed {
			t.Errorf("a machine failed although the second login answered: %+v", ev)
		}
	}
	byComment := jobsByComment(t, r)
	for c, n := range byComment {
		if n != 1 {
			t.Errorf("%d jobs carry the comment %s: submitted twice", n, c)
		}
	}
	if len(byComment) != 3 {
		t.Errorf("%d jobs in the queue, want 3 (a, b, c): %v", len(byComment), byComment)
	}
	logs := r.logs.String()
	if n := strings.Count(logs, "a login node does not answer"); n != 1 {
		t.Errorf("%d log lines say the first login does not answer, want 1", n)
	}

	// validate -check tries every login, not only the first that
	// answers: the one down is a warning with ssh's words, the check
	// goes on through the other.
	resp := r.check(t, cfg)
	facts := map[string]string{}
	for _, f := range resp.Facts {
		facts[f.Name] = f.Value
	}
	t.Logf("check: login 1 of 2: %s; login 2 of 2: %s", facts["login 1 of 2"], facts["login 2 of 2"])
	if !strings.HasPrefix(facts["login 1 of 2"], "failed (ssh "+first+"): ") || !strings.HasPrefix(facts["login 2 of 2"], "ok, as ") {
		t.Errorf("check facts %+v: want login 1 failed and login 2 ok", resp.Facts)
	}
	warned := false
	for _, d := range resp.Diagnostics {
		if d.Severity == shared.SeverityError {
			t.Errorf("check with one login of two down: error %+v", d)
		}
		if d.Severity == shared.SeverityWarning && strings.Join(d.Path, ".") == "login" && strings.Contains(d.Summary, "(login 1 of 2)") && strings.Contains(d.Detail, "Connection refused") {
			warned = true
		}
	}
	if !warned {
		t.Errorf("check does not warn that login 1 of 2 refuses connections: %v", resp.Diagnostics)
	}
	if _, ok := facts["slurm version"]; !ok {
		t.Errorf("check did not go on through the second login: facts %+v", resp.Facts)
	}
}

// operatorSSH is the operator's side of an MFA site: an ssh_config whose
// ControlPath the plugin shares, and the master the operator opens after
// answering the site's prompts (here: with the key the plugin does not
// have, since the plugin's own logins offer no key at all).
type operatorSSH struct {
	env    sandboxtest.Env
	config string
	host   string
}

func newOperatorSSH(t *testing.T, env sandboxtest.Env) *operatorSSH {
	t.Helper()
	// Short: the socket's path must stay under 108 bytes.
	dir, err := os.MkdirTemp("/tmp", "mfa")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	o := &operatorSSH{env: env, config: filepath.Join(dir, "ssh_config"), host: "login-mfa"}
	user, _, _ := strings.Cut(env.Login, "@")
	conf := fmt.Sprintf(`# The recipe of docs/operators.md's "Real sites": the plugin's logins use the
# operator's master; without it they offer nothing the site accepts.
Host %s
  HostName 127.0.0.1
  Port %d
  User %s
  UserKnownHostsFile %s
  StrictHostKeyChecking yes
  PubkeyAuthentication no
  ControlMaster no
  ControlPath %s/cm-%%C
`, o.host, env.Port, user, env.KnownHosts, dir)
	if err := os.WriteFile(o.config, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.ssh("-O", "exit", o.host) })
	return o
}

func (o *operatorSSH) ssh(args ...string) (string, error) {
	cmd := exec.Command("ssh", append([]string{"-F", o.config}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// open is the operator logging in: the master, in the background.
func (o *operatorSSH) open(t *testing.T) {
	t.Helper()
	if out, err := o.ssh("-o", "PubkeyAuthentication=yes", "-o", "IdentitiesOnly=yes", "-i", o.env.Key,
		"-o", "ControlMaster=yes", "-o", "ControlPersist=yes", "-fN", o.host); err != nil {
		t.Fatalf("opening the operator's master: %v %s", err, out)
	}
	if out, err := o.ssh("-O", "check", o.host); err != nil {
		t.Fatalf("the operator's master is not up: %v %s", err, out)
	}
}

func (o *operatorSSH) close(t *testing.T) {
	t.Helper()
	if out, err := o.ssh("-O", "exit", o.host); err != nil {
		t.Fatalf("closing the operator's master: %v %s", err, out)
	}
}

// TestLoginPathMFAMaster: an MFA site, where the plugin reuses the
// operator's ControlMaster (multiplex = false). With the master gone the
// provisioner is "login needed", asks for nothing, fails no machine and
// backs off no profile, says so in one log line, and tries the login
// again a minute later, not once a poll; the master back, the need
// waiting is served within one poll of that try.
func TestLoginPathMFAMaster(t *testing.T) {
	const pollInterval = 2 * time.Second
	env := sandboxtest.Private(t, "mfa")
	op := newOperatorSSH(t, env)
	op.open(t)
	r := newPrivateRig(t, env, "mfa", func(r *rig) map[string]any {
		c := r.config(
			profile("a", 1, 0, 100, nil, r.sbatch()),
			profile("b", 1, 0, 150, nil, r.sbatch()),
		)
		c["login"] = op.host
		c["ssh_port"], c["ssh_key"], c["known_hosts"] = 0, "", ""
		c["ssh_config"] = op.config
		c["multiplex"] = false
		c["poll_interval"] = pollInterval.String()
		c["submit_timeout"] = "10s"
		return c
	})
	r.provision(t, shared.Need{Label: "a"}, "a")
	r.served(t, "a")

	op.close(t)
	closed := time.Now()
	need := shared.Need{Label: "b"}
	r.ask(t, need)
	var detail string
	poll(t, "Provision to answer login needed", 30*time.Second, func() (bool, string) {
		o := r.ask(t, need)
		detail = o.Detail
		return o.Outcome == shared.OutcomeCapped && strings.HasPrefix(o.Detail, "login needed:"), fmt.Sprintf("%+v", o)
	})
	t.Logf("login needed %.1fs after the master closed: %s", time.Since(closed).Seconds(), detail)
	for _, want := range []string{"Permission denied (publickey)", "ssh -F " + op.config + " -o ControlMaster=yes -o ControlPersist=yes -fN " + op.host} {
		if !strings.Contains(detail, want) {
			t.Errorf("the answer does not say %q: %s", want, detail)
		}
	}
	// The login is tried again a minute after the refusal, not once a
	// poll: the answer says when.
	m := regexp.MustCompile(`tried again at (\S+) `).FindStringSubmatch(detail)
	if m == nil {
		t.Fatalf("the answer does not say when the login is tried again: %s", detail)
	}
	next, err := time.Parse(time.RFC3339, m[1])
	if err != nil {
		t.Fatal(err)
	}
	if d := next.Sub(closed); d < 50*time.Second || d > time.Minute+10*time.Second {
		t.Errorf("the next try is %s after the master closed, want about a minute", d.Round(time.Second))
	}
	tried := squeueSSHErrors(r.status(t))
	st := r.status(t)
	if len(st.BackingOff) != 0 {
		t.Errorf("the master gone backs off %+v, want no profile held", st.BackingOff)
	}
	if noteWith(st, "login needed:") == "" {
		t.Errorf("Status notes %q do not say login needed", st.Notes)
	}

	op.open(t)
	back := time.Now()
	poll(t, "Provision to ask for b again", time.Until(next)+3*pollInterval+10*time.Second, func() (bool, string) {
		o := r.ask(t, need)
		return o.Outcome != shared.OutcomeCapped, fmt.Sprintf("%+v", o)
	})
	asked := time.Now()
	r.served(t, "b")
	t.Logf("the master back: b asked for %.1fs later, %.1fs after the try was due (poll_interval %s), served %.1fs later",
		asked.Sub(back).Seconds(), asked.Sub(next).Seconds(), pollInterval, time.Since(back).Seconds())
	if late := asked.Sub(next); late > pollInterval+pollInterval/10+5*time.Second {
		t.Errorf("b was asked for %s after the login's try was due, more than one poll (%s) and a margin", late, pollInterval)
	}
	if n := squeueSSHErrors(r.status(t)) - tried; n != 0 {
		t.Errorf("%d squeue failed on ssh while the login waited for its try, want none (no knocking once a poll)", n)
	}
	for _, ev := range r.events.all() {
		if ev.Kind == shared.EventWorkerProvisionFailed {
			t.Errorf("a machine failed for the master being gone: %+v", ev)
		}
	}
	logs := r.logs.String()
	if n := strings.Count(logs, "asking for nothing until a login gets through"); n != 1 {
		t.Errorf("%d log lines say the login is needed, want 1", n)
	}
	if n := strings.Count(logs, "logged in again"); n != 1 {
		t.Errorf("%d log lines say logged in again, want 1", n)
	}
}

// TestLoginPathBastion: the login node reached through a jump host, the
// sandbox's own (SANDBOX_BASTION_PORT), with the ssh_config up.sh writes,
// the recipe of docs/operators.md's "Real sites" (ProxyJump): a need is served, and
// the bastion's sshd saw the logins.
func TestLoginPathBastion(t *testing.T) {
	env := sandboxtest.PrivateWith(t, "bastion", sandboxtest.Options{Bastion: true})
	if env.BastionPort == 0 {
		t.Fatal("the sandbox has no bastion: env.sh has no SANDBOX_BASTION_PORT")
	}
	user, _, _ := strings.Cut(env.Login, "@")
	bastionLog := filepath.Join(env.Dir, "log", "sshd-bastion.log")
	logins := func() int {
		b, err := os.ReadFile(bastionLog)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(string(b), "Accepted publickey for "+user)
	}
	before := logins()
	r := newPrivateRig(t, env, "bastion", func(r *rig) map[string]any {
		c := r.config(profile("a", 1, 0, 100, nil, r.sbatch()))
		c["login"] = "sandbox-via-bastion"
		c["ssh_port"], c["ssh_key"], c["known_hosts"] = 0, "", ""
		c["ssh_config"] = env.SSHConfig
		return c
	})
	start := time.Now()
	r.provision(t, shared.Need{Label: "a"}, "a")
	r.served(t, "a")
	t.Logf("served through the bastion in %.1fs; %d login(s) through it", time.Since(start).Seconds(), logins()-before)
	if logins() == before {
		b, _ := os.ReadFile(bastionLog)
		t.Errorf("the bastion's sshd saw no login of the plugin's; its log:\n%s", b)
	}
}

// TestLoginPathBastionAttribute: the login node reached through the
// sandbox's jump host with the bastion attribute alone: no ssh_config,
// the provisioner's own ssh_key, and one known_hosts with both hosts'
// keys, made from the sandbox's. A need is served and the bastion's sshd
// saw the plugin log in. Then, with the bastion's key left out of
// known_hosts, validate -check's Check fails with ssh's own words, "Host
// key verification failed.", ahead of the outer ssh's last line, and
// the provisioner reads it as a refused login ("login needed"), as it
// would one at the login node.
func TestLoginPathBastionAttribute(t *testing.T) {
	env := sandboxtest.PrivateWith(t, "bastattr", sandboxtest.Options{Bastion: true})
	if env.BastionPort == 0 {
		t.Fatal("the sandbox has no bastion: env.sh has no SANDBOX_BASTION_PORT")
	}
	user, host, _ := strings.Cut(env.Login, "@")
	bastion := fmt.Sprintf("%s@%s:%d", user, host, env.BastionPort)
	bastionLog := filepath.Join(env.Dir, "log", "sshd-bastion.log")
	logins := func() int {
		b, err := os.ReadFile(bastionLog)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(string(b), "Accepted publickey for "+user)
	}

	// One known_hosts with both keys, and one with the login node's
	// alone, from the sandbox's lines.
	kh, err := os.ReadFile(env.KnownHosts)
	if err != nil {
		t.Fatal(err)
	}
	loginKey := fmt.Sprintf("[%s]:%d ", host, env.Port)
	bastionKey := fmt.Sprintf("[%s]:%d ", host, env.BastionPort)
	var both, loginOnly []string
	for _, l := range strings.Split(strings.TrimSpace(string(kh)), "\n") {
		switch {
		case strings.HasPrefix(l, loginKey):
			both, loginOnly = append(both, l), append(loginOnly, l)
		case strings.HasPrefix(l, bastionKey):
			both = append(both, l)
		}
	}
	if len(both) != 2 || len(loginOnly) != 1 {
		t.Fatalf("the sandbox's known_hosts %s has not one key for the login node (%s) and one for the bastion (%s):\n%s", env.KnownHosts, loginKey, bastionKey, kh)
	}
	dir := t.TempDir()
	write := func(name string, lines []string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	bothFile, loginOnlyFile := write("known_hosts", both), write("known_hosts_login_only", loginOnly)
	through := func(knownHosts string) func(r *rig) map[string]any {
		return func(r *rig) map[string]any {
			c := r.config(profile("a", 1, 0, 100, nil, r.sbatch()))
			c["bastion"] = bastion
			c["known_hosts"] = knownHosts
			return c
		}
	}

	t.Run("served", func(t *testing.T) {
		before := logins()
		r := newPrivateRig(t, env, "bastattr", through(bothFile))
		start := time.Now()
		r.provision(t, shared.Need{Label: "a"}, "a")
		r.served(t, "a")
		t.Logf("served through bastion = %q in %.1fs; %d login(s) through it", bastion, time.Since(start).Seconds(), logins()-before)
		if logins() == before {
			b, _ := os.ReadFile(bastionLog)
			t.Errorf("the bastion's sshd saw no login of the plugin's; its log:\n%s", b)
		}
	})

	// validate -check's Check names the path it took: the login fact
	// says "via bastion USER@HOST:PORT".
	t.Run("check names the bastion", func(t *testing.T) {
		configure := through(bothFile)
		r := newPrivateRig(t, env, "bastcheck", configure)
		resp := r.check(t, configure(r))
		var login string
		for _, f := range resp.Facts {
			if f.Name == "login" {
				login = f.Value
			}
		}
		t.Logf("login fact: %q", login)
		if want := " via bastion " + bastion + ")"; !strings.HasPrefix(login, "ok, as ") || !strings.HasSuffix(login, want) {
			t.Errorf("the login fact %q does not end %q", login, want)
		}
	})

	t.Run("bastion key unknown", func(t *testing.T) {
		configure := through(loginOnlyFile)
		r := newPrivateRig(t, env, "bastkey", configure)
		resp := r.check(t, configure(r))
		var words string
		for _, d := range resp.Diagnostics {
			if d.Severity == shared.SeverityError {
				words = d.Detail
				t.Logf("check: %s: %s: %s", strings.Join(d.Path, "."), d.Summary, d.Detail)
				if strings.Join(d.Path, ".") != "known_hosts" {
					t.Errorf("the check blames %q, want known_hosts", strings.Join(d.Path, "."))
				}
				break
			}
		}
		const decisive = "Host key verification failed."
		i, kex := strings.Index(words, decisive), strings.Index(words, "kex_exchange_identification")
		switch {
		case words == "":
			t.Fatalf("the check did not fail: %+v", resp)
		case i < 0:
			t.Errorf("the check's words do not say %q", decisive)
		case kex >= 0 && kex < i:
			t.Errorf("the check's words lead with the outer ssh's last line, not %q", decisive)
		}
		if !strings.Contains(words, bastionKey[:len(bastionKey)-1]) {
			t.Errorf("the check's words do not name the bastion (%s) as the host whose key is unknown", bastionKey)
		}

		// The plugin's own calls: a refused login, "login needed".
		need := shared.Need{Label: "a"}
		var o *shared.DemandOutcome
		poll(t, "Provision to answer login needed", 30*time.Second, func() (bool, string) {
			o = r.ask(t, need)
			return o.Outcome == shared.OutcomeCapped && o.Condition == shared.ConditionLoginNeeded, fmt.Sprintf("%+v", o)
		})
		t.Logf("Provision: %s", o.Detail)
		if !strings.HasPrefix(o.Detail, "login needed:") || !strings.Contains(o.Detail, decisive) {
			t.Errorf("the answer does not say login needed with %q: %s", decisive, o.Detail)
		}
		if n := noteWith(r.status(t), "login needed:"); !strings.Contains(n, decisive) {
			t.Errorf("Status's login-needed note does not say %q: %q", decisive, n)
		}
		for _, ev := range r.events.all() {
			if ev.Kind == shared.EventWorkerProvisionFailed {
				t.Errorf("a machine failed for the bastion's key: %+v", ev)
			}
		}
	})
}

// check is validate -check's Check of cfg on r's provisioner, within a
// minute.
func (r *rig) check(t *testing.T, cfg map[string]any) *shared.CheckResponse {
	t.Helper()
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := r.prov.(shared.Checker).Check(ctx, &shared.CheckRequest{Name: r.name, Config: raw})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}
