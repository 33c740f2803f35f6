package main

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/internal/testutil"
)

// preflightConfig is a configuration against the sandbox, with hooks for
// breaking it one way at a time: the worker command, the key, the known
// hosts, and each profile's sbatch lines.
type preflightConfig struct {
	worker, key, knownHosts string
	cpuSbatch, gpuSbatch    string
	// cpus and gpus are the profiles' figures ("" for 2 and 1); extra
	// is more of the provisioner's attributes.
	cpus, gpus, extra string
	// plugins is plugin_dir; empty is the one the tests build into.
	plugins string
}

func (c preflightConfig) write(t *testing.T, env sandboxtest.Env, dir string) string {
	t.Helper()
	plugins := c.plugins
	if plugins == "" {
		plugins = pluginDir(t)
	}
	// No worker: worker_command unset, and the plugin ships its own.
	worker := ""
	if c.worker != "" {
		worker = fmt.Sprintf("worker_command = [%q, \"worker\"]", c.worker)
	}
	src := fmt.Sprintf(`engine {
  listen     = "127.0.0.1:1"
  plugin_dir = %q
}

provisioner "slurm" "preflight" {
  login          = %q
  ssh_port       = %d
  ssh_key        = %q
  known_hosts    = %q
  engine_url     = "http://127.0.0.1:1"
  %s
%s
  profile "cpu" {
    cpus   = %s
    sbatch = [%s]
  }
  profile "gpu" {
    cpus   = 1
    gpus   = %s
    sbatch = [%s]
  }
}
`, plugins, env.Login, env.Port, c.key, c.knownHosts, worker, c.extra, cmp.Or(c.cpus, "2"), c.cpuSbatch, cmp.Or(c.gpus, "1"), c.gpuSbatch)
	path := filepath.Join(dir, "preflight.hcl")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// lineOf is the 1-based line and column of the first match of text in the
// file at path; a "|" in text marks the column within it ("cpus = |64").
func lineOf(t *testing.T, path, text string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	before, after, marked := strings.Cut(text, "|")
	if marked {
		text = before + after
	}
	for i, l := range strings.Split(string(b), "\n") {
		if j := strings.Index(l, text); j >= 0 {
			if marked {
				j += len(before)
			}
			return fmt.Sprintf("%s:%d:%d", path, i+1, j+1)
		}
	}
	t.Fatalf("%q is not in %s", text, path)
	return ""
}

// TestValidateCheck runs validate -check against the sandbox Slurm: a good
// configuration passes and says what it found; each way of breaking it
// fails at the line that is wrong, in the words of the part that refused
// (Slurm, ssh, or validate's own look at a file ssh would read, which
// comes before ssh: a missing ssh_key is "No such file"); and nothing is
// ever submitted.
func TestValidateCheck(t *testing.T) {
	env := sandboxtest.Require(t)
	worker := sandboxtest.Binary(t, "host-example", "host-example")
	part := fmt.Sprintf("%q, %q", "--partition="+env.Partition, "--time=00:10:00")
	good := preflightConfig{worker: worker, key: env.Key, knownHosts: env.KnownHosts, cpuSbatch: part, gpuSbatch: part}
	// The preflight's jobs, ended ones too: every job the plugin submits
	// carries its provisioner's job name. Not the whole queue, which the
	// tests of other packages, run at the same time, add to (a burst of
	// the Slurm plugin's tests landed between the two reads once).
	queue := func() string {
		return env.Slurm(t, "squeue", "-h", "-t", "all", "--name=fluksio-preflight", "-o", "%i")
	}
	before := queue()

	dir := t.TempDir()
	path := good.write(t, env, dir)
	var stdout, stderr bytes.Buffer
	if code := validateMain([]string{"-check", path}, &stdout, &stderr); code != 0 {
		t.Fatalf("a good configuration: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	t.Logf("validate -check on a good configuration:\n%s", stdout.String())
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^  login: ok, as \S+@\S+`),
		regexp.MustCompile(`(?m)^  slurm version: \d+\.\d+\.\d+$`),
		regexp.MustCompile(`(?m)^  MaxArraySize: \d+`),
		regexp.MustCompile(`(?m)^  worker command: ` + regexp.QuoteMeta(worker) + `$`),
		regexp.MustCompile(`(?m)^  profile cpu: sbatch --test-only: Job \d+ to start at .* in partition ` + env.Partition + `$`),
		regexp.MustCompile(`(?m)^  profile gpu: sbatch --test-only: `),
		regexp.MustCompile(`(?m)valid, and the preflight passed \(1 provisioner\(s\)\)$`),
	} {
		if !want.MatchString(stdout.String()) {
			t.Errorf("the good configuration's report has no line matching %s", want)
		}
	}
	// -json: the same, as data.
	stdout.Reset()
	if code := validateMain([]string{"-check", "-json", path}, &stdout, &stderr); code != 0 {
		t.Fatalf("-check -json: exit %d\n%s", code, stdout.String())
	}
	var got struct {
		Valid     bool
		Preflight []struct {
			Provisioner string
			Facts       []struct{ Name, Value, Path string }
		}
	}
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil || !got.Valid || len(got.Preflight) != 1 || len(got.Preflight[0].Facts) < 6 {
		t.Errorf("-check -json: %v %+v\n%s", err, got, stdout.String())
	}

	// The nodes' size as sinfo gives it, which a profile too large
	// for them is told.
	largest := 0
	for _, f := range strings.Fields(env.Slurm(t, "sinfo", "-h", "-e", "-o", "%c")) {
		n, _ := strconv.Atoi(f)
		largest = max(largest, n)
	}
	emptyKnownHosts := filepath.Join(dir, "known_hosts.empty")
	if err := os.WriteFile(emptyKnownHosts, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		break_ func(*preflightConfig)
		at     string // the text the diagnostic's position starts at
		says   []string
		// once are words the report says exactly once.
		once []string
	}{
		{"unknown partition", func(c *preflightConfig) {
			c.cpuSbatch = `"--partition=nosuchpart", "--time=00:10:00"`
			c.extra = `  poll_interval  = "1s"`
		},
			`"--partition=nosuchpart"`, []string{"Slurm refuses profile cpu", "invalid partition specified: nosuchpart",
				"The partitions the login user sees: " + env.Partition + " (the default)"}, []string{"warning: Frequent polling"}},
		{"more cpus than any node", func(c *preflightConfig) { c.cpus = strconv.Itoa(largest + 14) },
			"cpus   = |" + strconv.Itoa(largest+14), []string{"Profile larger than any node",
				fmt.Sprintf("asks for %d cpus a machine, but the largest node of partition %s has %d. Set cpus = %d or less", largest+14, env.Partition, largest, largest)}, nil},
		{"more gpus than any node", func(c *preflightConfig) { c.gpus = "9" },
			"gpus   = |9", []string{"Profile larger than any node", "asks for 9 gpus a machine, but the largest node of partition " + env.Partition + " has 2"}, nil},
		{"impossible time limit", func(c *preflightConfig) {
			c.gpuSbatch = fmt.Sprintf("%q, %q", "--partition="+env.Partition, "--time=100000-00:00:00")
		},
			`"--time=100000-00:00:00"`, []string{"Slurm refuses profile gpu", "Requested time limit is invalid"}, nil},
		{"missing key file", func(c *preflightConfig) { c.key = filepath.Join(dir, "no-such-key") },
			`"` + filepath.Join(dir, "no-such-key"), []string{"No such file", "no-such-key, which does not exist", "leave ssh_key out"}, nil},
		{"unknown host key", func(c *preflightConfig) { c.knownHosts = emptyKnownHosts },
			`"` + emptyKnownHosts, []string{"host key not trusted", "Host key verification failed"}, nil},
		{"missing worker command", func(c *preflightConfig) { c.worker = "/opt/nowhere/fluksio-worker" },
			`["/opt/nowhere/fluksio-worker"`, []string{"Worker not found", "/opt/nowhere/fluksio-worker"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := good
			c.break_(&cfg)
			path := cfg.write(t, env, t.TempDir())
			var stdout, stderr bytes.Buffer
			code := validateMain([]string{"-check", path}, &stdout, &stderr)
			t.Logf("validate -check (%s): exit %d\n%s%s", c.name, code, stdout.String(), stderr.String())
			if code != 1 {
				t.Errorf("exit %d, want 1", code)
			}
			at := lineOf(t, path, c.at)
			if !strings.Contains(stderr.String(), at+": error: ") {
				t.Errorf("no error at %s", at)
			}
			for _, s := range c.says {
				if !strings.Contains(squash(stderr.String()), s) {
					t.Errorf("the report does not say %q", s)
				}
			}
			for _, s := range c.once {
				if n := strings.Count(stderr.String(), s); n != 1 {
					t.Errorf("the report says %q %d times, want once", s, n)
				}
			}
		})
	}
	if after := queue(); after != before {
		t.Errorf("the preflight changed the queue:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// TestValidateCheckShippedWorker: with worker_command unset, validate
// -check says where the plugin's copy of the worker goes on the login
// node, and that the compute nodes must see that home or worker_command
// be set, and copies nothing; with no worker beside the plugin, it fails
// saying what to build or set.
func TestValidateCheckShippedWorker(t *testing.T) {
	sandboxtest.WorkerCopies(t)
	env := sandboxtest.Require(t)
	w := env.ShippedWorker(t)
	local, sum, shipped := w.Local, w.Sum, w.Path
	os.Remove(shipped)

	part := fmt.Sprintf("%q, %q", "--partition="+env.Partition, "--time=00:10:00")
	good := preflightConfig{key: env.Key, knownHosts: env.KnownHosts, cpuSbatch: part, gpuSbatch: part}
	path := good.write(t, env, t.TempDir())
	var stdout, stderr bytes.Buffer
	if code := validateMain([]string{"-check", path}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	t.Logf("validate -check:\n%s", stdout.String())
	report := squash(stdout.String())
	for _, want := range []string{
		"worker: shipped by the plugin: " + local + " (sha256 " + sum[:16] + "…, " + fmt.Sprint(w.Size) + " bytes) to " + shipped +
			" on the login node, copied there at the first submission.",
		"the compute nodes must see the login user's home directory; where they do not, install a worker where they do and set worker_command",
		"valid, and the preflight passed",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("the report does not say %q", want)
		}
	}
	if _, err := os.Stat(shipped); err == nil {
		t.Errorf("the check copied the worker to %s; it copies nothing", shipped)
	}

	// A plugin directory with the plugin and no worker beside it.
	bare := t.TempDir()
	if b, err := os.ReadFile(filepath.Join(pluginDir(t), "provisioner-slurm")); err != nil || os.WriteFile(filepath.Join(bare, "provisioner-slurm"), b, 0o755) != nil {
		t.Fatal(err)
	}
	cfg := good
	cfg.plugins = bare
	path = cfg.write(t, env, t.TempDir())
	stdout.Reset()
	stderr.Reset()
	code := validateMain([]string{"-check", path}, &stdout, &stderr)
	t.Logf("validate -check without a worker beside the plugin: exit %d\n%s%s", code, stdout.String(), stderr.String())
	for _, want := range []string{"No worker to ship", "looked for " + filepath.Join(bare, "fluksio-worker-linux-"), "set worker_command"} {
		if !strings.Contains(squash(stderr.String()), want) {
			t.Errorf("the report does not say %q", want)
		}
	}
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
}

// TestScriptCommand prints the batch script a profile would submit: it is
// valid bash, carries the placeholder and no credential, asks for the
// profile's numbers, and an unknown profile or provisioner is named with
// what exists.
func TestScriptCommand(t *testing.T) {
	env := sandboxtest.Require(t)
	part := fmt.Sprintf("%q, %q", "--partition="+env.Partition, "--time=00:10:00")
	path := preflightConfig{worker: "fluksio-worker", key: env.Key, knownHosts: env.KnownHosts, cpuSbatch: part, gpuSbatch: part}.write(t, env, t.TempDir())

	var stdout, stderr bytes.Buffer
	if code := scriptMain([]string{"-config", path, "-provisioner", "preflight", "-profile", "gpu"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr.String())
	}
	script := stdout.String()
	t.Logf("script:\n%s", script)
	cmd := exec.Command("bash", "-n")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("bash -n refuses the script: %v\n%s", err, out)
	}
	for _, want := range []string{"#!/bin/bash\n", "#SBATCH --gres=gpu:1\n", "#SBATCH --partition=" + env.Partition + "\n",
		"FLUKSIO_WORKER_TOKEN='<credential: minted by the engine for each worker when it is submitted>' exec fluksio-worker worker --url http://127.0.0.1:1"} {
		if !strings.Contains(script, want) {
			t.Errorf("the script has no %q", want)
		}
	}
	// A credential is three base64url parts; none is in a preview.
	if m := regexp.MustCompile(`[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}`).FindString(script); m != "" {
		t.Errorf("the script carries something like a credential: %q", m)
	}
	// One provisioner in the file: -provisioner may be left out.
	stdout.Reset()
	if code := scriptMain([]string{"-config", path, "-profile", "cpu"}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "#SBATCH --cpus-per-task=2\n") {
		t.Errorf("without -provisioner: exit %d\n%s", code, stdout.String())
	}

	stderr.Reset()
	if code := scriptMain([]string{"-config", path, "-profile", "huge"}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), `no profile "huge"; it has cpu, gpu`) {
		t.Errorf("an unknown profile: exit %d, stderr %q", code, stderr.String())
	}
	stderr.Reset()
	if code := scriptMain([]string{"-config", path, "-provisioner", "other", "-profile", "cpu"}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), `no provisioner "other"; it has [preflight]`) {
		t.Errorf("an unknown provisioner: exit %d, stderr %q", code, stderr.String())
	}
}

// TestCheckWithoutPreflight: a plugin that offers no preflight (the
// testplugin, as any plugin of contract 2.1 or before) is validated as
// before, and validate -check says, at its block, that it has no check,
// as a warning: the configuration is not wrong. script says it cannot
// preview, as an error.
func TestCheckWithoutPreflight(t *testing.T) {
	bin := testutil.BuildTestPlugin(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "memory.hcl")
	src := fmt.Sprintf("engine {\n  listen = \"127.0.0.1:1\"\n}\n\nprovisioner \"memory\" \"mem\" {\n  plugin   = %q\n  greeting = \"hello\"\n}\n", bin)
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := validateMain([]string{"-check", path}, &stdout, &stderr)
	t.Logf("exit %d\n%s%s", code, stdout.String(), stderr.String())
	if code != 0 || !strings.Contains(stderr.String(), path+":5:13: warning: No preflight for this kind") {
		t.Errorf("validate -check on a plugin without Check: exit %d, want 0 and a warning at the kind label", code)
	}
	stderr.Reset()
	if code := scriptMain([]string{"-config", path, "-profile", "any"}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "No preview for this kind") {
		t.Errorf("script on a plugin without Preview: exit %d, stderr %q", code, stderr.String())
	}
}

// TestValidateProbe runs validate -check -probe against the sandbox: with
// an engine_url the nodes reach (validate answers the probe where the
// engine would listen), the probe's job, running the worker the plugin
// ships, says so; with one they cannot
// dial, the check fails at engine_url and says to use the relay. Each
// probe is one job that ends, and leaves neither a job nor its output
// file behind.
func TestValidateProbe(t *testing.T) {
	env := sandboxtest.Require(t)
	worker := sandboxtest.Binary(t, "host-example", "host-example")
	name := fmt.Sprintf("probe-%d", time.Now().UnixNano()%1_000_000)
	port := sandboxtest.FreePort(t)
	// The first probe runs the worker a run ships (no worker_command),
	// the copy another test may swap for a while.
	sandboxtest.WorkerCopies(t)
	sandboxtest.Binary(t, "worker/fluksio-worker", "fluksio-worker")
	write := func(engineURL, workerCommand string) string {
		src := fmt.Sprintf(`engine {
  listen     = "127.0.0.1:%d"
  plugin_dir = %q
}

provisioner "slurm" %q {
  login          = %q
  ssh_port       = %d
  ssh_key        = %q
  known_hosts    = %q
  engine_url     = %q
  %s

  profile "cpu" {
    cpus   = 1
    sbatch = ["--partition=%s", "--time=00:05:00"]
  }
}
`, port, pluginDir(t), name, env.Login, env.Port, env.Key, env.KnownHosts, engineURL, workerCommand, env.Partition)
		path := filepath.Join(t.TempDir(), "probe.hcl")
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	jobs := func() []string {
		return strings.Fields(env.Slurm(t, "squeue", "-h", "-t", "all", "--name=fluksio-"+name, "-o", "%i|%T"))
	}

	good := write(fmt.Sprintf("http://127.0.0.1:%d", port), "")
	var stdout, stderr bytes.Buffer
	code := validateMain([]string{"-check", "-probe", good}, &stdout, &stderr)
	t.Logf("validate -check -probe, nodes reach the engine: exit %d\n%s%s", code, stdout.String(), stderr.String())
	if code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
	if !regexp.MustCompile(`(?m)^  reach probe: reached http://127\.0\.0\.1:\d+ from \S+ in \S+ \(job \d+ of profile cpu, after \d+s in the queue\)$`).MatchString(stdout.String()) {
		t.Error("no reach probe fact saying the nodes reached the engine")
	}
	if !strings.Contains(stdout.String(), fmt.Sprintf("answering the reach probe at 127.0.0.1:%d", port)) {
		t.Error("validate did not say it answers the probe")
	}

	bad := write("http://127.0.0.1:9", fmt.Sprintf("worker_command = [%q, \"worker\"]", worker))
	stdout.Reset()
	stderr.Reset()
	code = validateMain([]string{"-check", "-probe", bad}, &stdout, &stderr)
	t.Logf("validate -check -probe, an engine_url nodes cannot dial: exit %d\n%s%s", code, stdout.String(), stderr.String())
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	at := lineOf(t, bad, `"http://127.0.0.1:9"`)
	if !strings.Contains(stderr.String(), at+": error: Compute nodes cannot reach the engine") {
		t.Errorf("no error at %s saying the nodes cannot reach the engine", at)
	}
	for _, want := range []string{"connection refused", `Set reach = "relay"`} {
		if !strings.Contains(squash(stderr.String()), want) {
			t.Errorf("the report does not say %q", want)
		}
	}

	// Two probes, two jobs, both ended; no output file left in log_dir.
	got := jobs()
	if len(got) != 2 {
		t.Errorf("the probes' jobs: %q, want 2", got)
	}
	for _, j := range got {
		if _, state, _ := strings.Cut(j, "|"); state != "COMPLETED" && state != "FAILED" {
			t.Errorf("probe job %s has not ended", j)
		}
	}
	login, _, _ := strings.Cut(env.Login, "@")
	u, err := user.Lookup(login)
	if err != nil {
		t.Fatal(err)
	}
	logDir := filepath.Join(u.HomeDir, ".local/state/fluksio", name)
	if _, err := os.Stat(logDir); err != nil {
		t.Errorf("log_dir %s: %v", logDir, err)
	}
	if left, _ := filepath.Glob(filepath.Join(logDir, "probe-*")); len(left) > 0 {
		t.Errorf("probe output left in log_dir: %q", left)
	}
}
