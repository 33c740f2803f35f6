package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/internal/testutil"
	"github.com/fluksio/provision/shared/plugin"
)

// relayCase writes the engine's configuration for the relay tests: the
// engine listens only on a unix socket in a directory of the test's own
// (0700, root's), which the Slurm job's user cannot even look into, and
// the provisioner reaches it directly (engine_url, where nothing listens)
// or through the relay.
func (e *e2e) relayCase(t *testing.T, relay bool, extraProfiles string) (config, socket string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "fxe-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	socket = filepath.Join(dir, "engine.sock")
	path := e.relConfig(t, "", extraProfiles, e.host, "worker")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(string(b), fmt.Sprintf(`listen     = "127.0.0.1:%d"`, e.port), fmt.Sprintf(`listen     = "unix:%s"`, socket), 1)
	if relay {
		s = strings.Replace(s, fmt.Sprintf(`engine_url     = "http://127.0.0.1:%d"`, e.port), `reach          = "relay"
  relay_host     = "127.0.0.1"`, 1)
	}
	if !strings.Contains(s, socket) || relay != strings.Contains(s, "reach") {
		t.Fatalf("could not rewrite the configuration:\n%s", s)
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, socket
}

// TestE2ERelay proves the point of reach = "relay": the engine listens
// only on a unix socket that the Slurm job's user cannot open. In direct
// mode a worker cannot attach, and says why; in relay mode the same needs,
// a CPU one and a GPU one, are served through the relay on the login node.
// Afterwards no relay process is left, and nothing of ours on the login
// node but the cached binary.
func TestE2ERelay(t *testing.T) {
	sandboxtest.RelayCache(t)
	e := newE2E(t, "e2e-relay")
	e.killPluginsAtEnd(t)
	home := "/home/slurmuser"
	cache := filepath.Join(home, ".cache", "fluksio")
	os.RemoveAll(cache)

	t.Run("direct", func(t *testing.T) {
		cfg, socket := e.relayCase(t, false, "")
		p := e.startEngine(t, "-config", cfg, "-need", "cpus=1", "-timeout", "25s")
		code := p.wait(t, 2*time.Minute)
		if fi, err := os.Stat(socket); err == nil || fi != nil {
			t.Errorf("the engine left its socket %s behind", socket)
		}
		if code != 1 || strings.Contains(p.stdout.String(), " attached from ") {
			t.Fatalf("direct mode: exit %d, want 1 with nothing attached\nstory:\n%s", code, p.stdout)
		}
		// Why: the worker itself said it, in its job's output.
		out := e.jobOutputs(t)
		if !strings.Contains(out, "connection refused") {
			t.Errorf("no worker output says the engine is unreachable:\n%s", out)
		}
	})

	t.Run("relay", func(t *testing.T) {
		cfg, _ := e.relayCase(t, true, "")
		p := e.startEngine(t, "-config", cfg, "-need", "cpus=1", "-need", "gpus=1,label=cuda", "-timeout", "3m")
		code := p.wait(t, 4*time.Minute)
		exitedAt := time.Now()
		t.Logf("story:\n%s", p.stdout)
		if code != 0 {
			t.Fatalf("relay mode: exit %d, want 0\nstderr:\n%s", code, p.stderr)
		}
		if !strings.Contains(p.stdout.String(), "all 2 need(s) served") {
			t.Errorf("the story does not say both needs were served")
		}
		if !strings.Contains(p.stderr.String(), "the relay is up") {
			t.Errorf("the plugin never said the relay was up")
		}
		e.assertCleanedUp(t, exitedAt)
		poll(t, 30*time.Second, "no relay process left on the login node", func() bool { return len(relayProcesses(t)) == 0 })
		entries, err := os.ReadDir(cache)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, en := range entries {
			names = append(names, en.Name())
		}
		// The plugin's cached binary, and no private copy: a binary of
		// another version may stand beside it (the slurm package's
		// tests start relays of their own binary at the same time, and
		// a version used within the hour is left alone).
		if len(names) == 0 || slices.ContainsFunc(names, func(n string) bool { return !strings.HasPrefix(n, "provisioner-slurm-") }) {
			t.Errorf("left in %s: %v; want the cached binary, and no private copy", cache, names)
		}
	})
}

// TestE2ERelayCommand: a relay the site installed (relay_command) is run
// as it is, and nothing is copied to the login node.
func TestE2ERelayCommand(t *testing.T) {
	sandboxtest.RelayCache(t)
	e := newE2E(t, "e2e-relay-cmd")
	e.killPluginsAtEnd(t)
	cfg, _ := e.relayCase(t, true, "")
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b = []byte(strings.Replace(string(b), `reach          = "relay"`, fmt.Sprintf("reach          = \"relay\"\n  relay_command  = [%q]", e.plugin), 1))
	if err := os.WriteFile(cfg, b, 0o644); err != nil {
		t.Fatal(err)
	}
	p := e.startEngine(t, "-config", cfg, "-need", "cpus=1", "-timeout", "2m")
	code := p.wait(t, 3*time.Minute)
	exitedAt := time.Now()
	if code != 0 || !strings.Contains(p.stdout.String(), "all 1 need(s) served") {
		t.Fatalf("exit %d, want 0 with the need served\nstory:\n%s\nstderr:\n%s", code, p.stdout, p.stderr)
	}
	if strings.Contains(p.stderr.String(), "copying the relay") {
		t.Errorf("with relay_command the plugin copied its binary anyway")
	}
	e.assertCleanedUp(t, exitedAt)
	poll(t, 30*time.Second, "no relay process left on the login node", func() bool { return len(relayProcesses(t)) == 0 })
}

// TestE2ERelayTLS: with TLS on the engine, workers reach it through the
// relay with https and verify its certificate by its pin: the relay and
// the plugin carry the TLS stream, which neither can read (neither holds
// the key), and the need is served.
func TestE2ERelayTLS(t *testing.T) {
	sandboxtest.RelayCache(t)
	e := newE2E(t, "e2e-relay-tls")
	e.killPluginsAtEnd(t)
	path := e.relConfig(t, "", "", e.host, "worker")
	certFile, keyFile, pin := testutil.SelfSigned(t, filepath.Dir(path))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(string(b), "engine {\n", fmt.Sprintf("engine {\n  tls_cert = %q\n  tls_key = %q\n", certFile, keyFile), 1)
	s = strings.Replace(s, fmt.Sprintf(`engine_url     = "http://127.0.0.1:%d"`, e.port), `engine_url     = "https://engine.invalid"
  reach          = "relay"
  relay_host     = "127.0.0.1"`, 1)
	s = strings.Replace(s, fmt.Sprintf(`worker_command = [%q, "worker"]`, e.host), fmt.Sprintf(`worker_command = [%q, "worker", "--engine-cert-sha256", %q]`, e.host, pin), 1)
	if !strings.Contains(s, pin) || !strings.Contains(s, "tls_cert") {
		t.Fatalf("could not rewrite the configuration:\n%s", s)
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	p := e.startEngine(t, "-config", path, "-need", "cpus=1", "-timeout", "2m")
	code := p.wait(t, 3*time.Minute)
	exitedAt := time.Now()
	if code != 0 || !strings.Contains(p.stdout.String(), "all 1 need(s) served") {
		t.Fatalf("exit %d, want 0 with the need served\nstory:\n%s\nstderr:\n%s", code, p.stdout, p.stderr)
	}
	if !strings.Contains(p.stderr.String(), "tls=true") {
		t.Errorf("the engine did not say it listens with TLS")
	}
	e.assertCleanedUp(t, exitedAt)
}

// relayProcesses lists the pids of relay processes running on this
// machine (the login node of the sandbox).
func relayProcesses(*testing.T) []int { return sandboxtest.RelayPIDs() }

// jobOutputs is what this test's jobs wrote to their output files, which
// Slurm puts in the job user's home by default.
func (e *e2e) jobOutputs(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	out := e.env.Slurm(t, "squeue", "-h", "-t", "all", "--name="+e.jobName(), "-o", "%i")
	for _, id := range strings.Fields(out) {
		// The plugin's default log_dir, under the job user's home.
		data, err := os.ReadFile(filepath.Join("/home/slurmuser/.local/state/fluksio", e.name, id+".out"))
		if err == nil {
			b.Write(data)
		}
	}
	return b.String()
}

// TestE2ERelayRecovers kills the relay on the login node while two
// workers work through it, and then the plugin's ssh master, which
// carries the relay's session. Each time the plugin starts the relay
// again, on the same port, and the workers' reports reach the engine
// through the new one: both needs are served.
func TestE2ERelayRecovers(t *testing.T) {
	sandboxtest.RelayCache(t)
	e := newE2E(t, "e2e-relay-kill")
	e.killPluginsAtEnd(t)
	// The engine on TCP here, so that the test can read /status; the
	// workers still go through the relay, which is what is killed.
	path := e.relayConfigOnTCP(t)
	t.Setenv(plugin.LogLevelEnv, "debug")
	p := e.startEngine(t, "-config", path, "-log-level", "debug", "-need", "cpus=1,count=2,work=25s", "-timeout", "3m")
	reapMasters(t, p)
	ups := func() int { return strings.Count(p.stderr.String(), "the relay is up") }
	poll(t, 2*time.Minute, "two workers attached through the relay", func() bool {
		if p.exited() {
			t.Fatalf("the engine exited early\nstdout:\n%s\nstderr:\n%s", p.stdout, p.stderr)
		}
		return strings.Count(p.stdout.String(), " attached from ") == 2
	})
	// The plugin's fields reach the engine's log in any order.
	addrRE := regexp.MustCompile(`the relay is up:.*workers_dial=(\S+)`)
	first := addrRE.FindStringSubmatch(p.stderr.String())
	if first == nil {
		t.Fatalf("the log does not say where the relay listens:\n%s", p.stderr)
	}

	relays := relayProcesses(t)
	if len(relays) != 1 {
		t.Fatalf("relay processes %v, want one", relays)
	}
	if err := syscall.Kill(relays[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	poll(t, 30*time.Second, "the relay up again after it was killed", func() bool { return ups() >= 2 })

	var master int
	for _, m := range mastersOf(p.controlDirs()) {
		if strings.Contains(m, "[mux]") {
			fmt.Sscan(m, &master)
		}
	}
	if master == 0 {
		t.Fatalf("no ssh master among %v", mastersOf(p.controlDirs()))
	}
	if err := syscall.Kill(master, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	poll(t, 30*time.Second, "the relay up again after its ssh master was killed", func() bool { return ups() >= 3 })
	all := addrRE.FindAllStringSubmatch(p.stderr.String(), -1)
	for _, m := range all {
		if m[1] != first[1] {
			t.Errorf("the relay came back on %s, not on %s where the workers dial", m[1], first[1])
		}
	}

	code := p.wait(t, 3*time.Minute)
	exitedAt := time.Now()
	t.Logf("story:\n%s", p.stdout)
	if code != 0 || !strings.Contains(p.stdout.String(), "all 2 need(s) served") {
		t.Fatalf("exit %d, want 0 with both needs served\nstderr:\n%s", code, p.stderr)
	}
	e.assertCleanedUp(t, exitedAt)
	poll(t, 30*time.Second, "no relay process left on the login node", func() bool { return len(relayProcesses(t)) == 0 })
}

// TestE2ERelayHundred: 100 workers attached through one relay at once,
// each working 30 s so that all are attached together, and every result
// arrives intact: one per worker, saying what its worker did.
func TestE2ERelayHundred(t *testing.T) {
	sandboxtest.RelayCache(t)
	const n = 100
	e := newE2E(t, "e2e-relay-100")
	if slots := e.env.Nodes * e.env.CPUs; slots < n {
		t.Fatalf("the sandbox has %d CPUs in all; this test needs %d (SANDBOX_CPUS=50 and SANDBOX_NODES=2, the defaults)", slots, n)
	}
	e.killPluginsAtEnd(t)
	cfg, _ := e.relayCase(t, true, `  profile "small" {
    cpus   = 1
    ram_mb = 100
    sbatch = ["--partition=`+e.env.Partition+`", "--time=00:10:00"]
  }
`)
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The whole burst in the queue at once.
	b = []byte(strings.Replace(string(b), `reach          = "relay"`, "reach          = \"relay\"\n  max_pending    = 100", 1))
	if err := os.WriteFile(cfg, b, 0o644); err != nil {
		t.Fatal(err)
	}
	p := e.startEngine(t, "-config", cfg, "-need", fmt.Sprintf("cpus=1,count=%d,work=30s", n), "-timeout", "5m")
	code := p.wait(t, 6*time.Minute)
	exitedAt := time.Now()
	story := p.stdout.String()
	if code != 0 {
		t.Fatalf("exit %d, want 0\nstory:\n%s\nstderr:\n%s", code, story, p.stderr)
	}
	attached := regexp.MustCompile(`worker (\S+) attached from `).FindAllStringSubmatch(story, -1)
	results := regexp.MustCompile(`work done by (\S+): host \S+, job (\S+), cpus 1: slept 30s \(simulated work\) on \S+ with 1 cpus\n`).FindAllStringSubmatch(story, -1)
	workers := map[string]bool{}
	for _, m := range results {
		workers[m[1]] = true
	}
	if len(attached) != n || len(results) != n || len(workers) != n {
		t.Errorf("%d attached, %d intact results from %d workers; want %d of each", len(attached), len(results), len(workers), n)
	}
	// At once: the last attach came before the first result.
	lines := p.stdout.Lines()
	var lastAttach, firstResult time.Time
	for _, l := range lines {
		switch {
		case strings.Contains(l.text, " attached from "):
			lastAttach = l.at
		case strings.Contains(l.text, "work done by") && firstResult.IsZero():
			firstResult = l.at
		}
	}
	if !lastAttach.Before(firstResult) {
		t.Errorf("the last worker attached %s after the first result: not all %d were attached at once", lastAttach.Sub(firstResult), n)
	}
	if !strings.Contains(p.stderr.String(), "the relay is up") || strings.Count(p.stderr.String(), "the relay is up") != 1 {
		t.Errorf("want one relay, up once, for all %d workers", n)
	}
	e.assertCleanedUp(t, exitedAt)
}

// relayConfigOnTCP is a configuration with one small profile whose workers
// reach the engine through the relay while the engine itself listens on
// TCP, so that a test can read /status or try a credential on it.
func (e *e2e) relayConfigOnTCP(t *testing.T) string {
	t.Helper()
	path := e.relConfig(t, "", `  profile "small" {
    cpus   = 1
    ram_mb = 100
    sbatch = ["--partition=`+e.env.Partition+`", "--time=00:10:00"]
  }
`, e.host, "worker")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(string(b), fmt.Sprintf(`engine_url     = "http://127.0.0.1:%d"`, e.port), `reach          = "relay"
  relay_host     = "127.0.0.1"`, 1)
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestE2ERelayTwoLogins: with two login nodes, the relay runs on the
// first; when that login node goes down (its sshd and every connection
// it had, the relay's with them) the relay comes back on the second, the
// workers dial it there, and every need is served. Nothing is left on
// either login node.
func TestE2ERelayTwoLogins(t *testing.T) {
	sandboxtest.RelayCache(t)
	env := sandboxtest.Private(t, "relay2")
	second := env.ExtraSSHD(t)
	e := newE2EOn(t, "e2e-relay-2", env)
	e.killPluginsAtEnd(t)
	path := e.relayConfigOnTCP(t)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	first := fmt.Sprintf("%s:%d", env.Login, env.Port)
	secondLogin := fmt.Sprintf("%s:%d", env.Login, second.Port)
	s := string(b)
	for _, r := range [][2]string{
		{fmt.Sprintf("login          = %q", env.Login), fmt.Sprintf("login          = [%q, %q]", first, secondLogin)},
		{fmt.Sprintf("ssh_port       = %d", env.Port), "ssh_port       = 0"},
		{fmt.Sprintf("known_hosts    = %q", env.KnownHosts), fmt.Sprintf("known_hosts    = %q\n  poll_interval  = \"2s\"", second.KnownHosts)},
	} {
		if !strings.Contains(s, r[0]) {
			t.Fatalf("the configuration has no %q to rewrite:\n%s", r[0], s)
		}
		s = strings.Replace(s, r[0], r[1], 1)
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(plugin.LogLevelEnv, "debug")
	p := e.startEngine(t, "-config", path, "-log-level", "debug", "-need", "cpus=1,count=2,work=20s", "-timeout", "3m")
	reapMasters(t, p)
	upRE := regexp.MustCompile(`the relay is up:.*login=(\S+)`)
	ups := func() [][]string { return upRE.FindAllStringSubmatch(p.stderr.String(), -1) }
	poll(t, 2*time.Minute, "two workers attached through the relay on the first login", func() bool {
		if p.exited() {
			t.Fatalf("the engine exited early\nstdout:\n%s\nstderr:\n%s", p.stdout, p.stderr)
		}
		return strings.Count(p.stdout.String(), " attached from ") == 2
	})
	if u := ups(); len(u) != 1 || u[0][1] != first {
		t.Fatalf("relay up lines %v; want one, on %s", u, first)
	}

	env.StopDaemon(t, "sshd")
	down := time.Now()
	poll(t, time.Minute, "the relay up again on the second login", func() bool {
		u := ups()
		return len(u) >= 2 && u[len(u)-1][1] == secondLogin
	})
	t.Logf("the relay was up on the second login %.1fs after the first went down", time.Since(down).Seconds())

	code := p.wait(t, 3*time.Minute)
	exitedAt := time.Now()
	t.Logf("story:\n%s", p.stdout)
	if code != 0 || !strings.Contains(p.stdout.String(), "all 2 need(s) served") {
		t.Fatalf("exit %d, want 0 with both needs served\nstderr:\n%s", code, p.stderr)
	}
	for _, u := range ups()[1:] {
		if u[1] != secondLogin {
			t.Errorf("the relay came up on %s with the first login down", u[1])
		}
	}
	e.assertCleanedUp(t, exitedAt)
	poll(t, 30*time.Second, "no relay process left on either login node", func() bool { return len(relayProcesses(t)) == 0 })
}
