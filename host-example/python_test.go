package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/internal/needspec"
	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/shared/conformance"
)

// The Python reference plugin (examples/python-local) as an engine runs
// it: it needs Debian's python3 with python3-grpcio, python3-protobuf and
// python3-cryptography (.ci/run installs them). Without them it skips,
// except in CI, where it must run.

// pythonPlugin returns the path of provisioner-local.
func pythonPlugin(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("/usr/bin/python3", "-c", "import grpc, google.protobuf, cryptography").CombinedOutput()
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI must have python3-grpcio, python3-protobuf and python3-cryptography: %v\n%s", err, out)
		}
		t.Skipf("Debian's python3 with grpcio, protobuf and cryptography is missing: %v", err)
	}
	return filepath.Join(sandboxtest.ModuleRoot(), "examples", "python-local", "provisioner-local")
}

// TestPythonPluginConforms runs the checker binary against the Python
// plugin: every check must pass, its diagnostics checked from files
// (-invalid) and its backoff with workers that fail at once (-failing).
func TestPythonPluginConforms(t *testing.T) {
	plugin := pythonPlugin(t)
	hostBin := sandboxtest.Binary(t, "host-example", "host-example")
	checker := sandboxtest.Binary(t, "shared/conformance/provisioner-conformance", "provisioner-conformance")
	dir := t.TempDir()
	write := func(name, body string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	config := func(command string, profile string) string {
		return fmt.Sprintf("engine_url     = \"http://127.0.0.1:1\"\nworker_command = [%q, \"worker\"]\nprofile \"small\" {\n%s}\n", command, profile)
	}
	cfg := write("local.hcl", config(hostBin, "  cpus   = 1\n  labels = [\"x86\"]\n"))
	args := []string{"-plugin", plugin, "-config", cfg,
		"-invalid", write("cpus.hcl", "# path: profile.0.cpus\n"+config(hostBin, "  cpus = 0\n")),
		"-invalid", write("label.hcl", "# path: profile.0.labels.1\n"+config(hostBin, "  cpus = 1\n  labels = [\"x86\", \"has space\"]\n")),
		"-failing", write("false.hcl", config("/bin/false", "  cpus = 1\n"))}
	out, err := exec.Command(checker, args...).CombinedOutput()
	t.Logf("checker:\n%s", out)
	if err != nil {
		t.Fatalf("the checker failed the Python plugin: %v", err)
	}
	if n := bytes.Count(out, []byte("\nPASS ")) + 1; n != len(conformance.Checks) || bytes.Contains(out, []byte("FAIL")) {
		t.Errorf("%d checks passed, want %d", n, len(conformance.Checks))
	}
	if bytes.Contains(out, []byte("not run")) {
		t.Errorf("a check was not run:\n%s", out)
	}
}

// TestPythonPluginServesRun runs host-example with the Python plugin: a
// need is served by a worker the plugin started as a local process; the
// plugin, killed with SIGKILL while the work runs, is restarted by the
// engine's supervisor; and the run completes. The engine runs in a Slurm
// job of its own (SLURM_JOB_ID set): a worker that inherited it would
// report that job and be refused, so the plugin must strip SLURM_*.
func TestPythonPluginServesRun(t *testing.T) {
	plugin := pythonPlugin(t)
	t.Setenv("SLURM_JOB_ID", "4242")
	t.Setenv("SLURM_CPUS_ON_NODE", "2")
	e := &e2e{host: sandboxtest.Binary(t, "host-example", "host-example"), name: "py", port: sandboxtest.FreePort(t)}
	e.mark = "FLUKSIO_E2E_MARK=py-" + strconv.Itoa(os.Getpid())
	cfg := filepath.Join(t.TempDir(), "config.hcl")
	body := fmt.Sprintf(`engine {
  listen = "127.0.0.1:%[1]d"
}

provisioner "local" "py" {
  plugin         = %[2]q
  engine_url     = "http://127.0.0.1:%[1]d"
  worker_command = [%[3]q, "worker"]
  max_idle       = "20s"
  profile "small" {
    cpus = 1
  }
}
`, e.port, plugin, e.host)
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}

	p := e.startEngine(t, "-config", cfg, "-need", "cpus=1,work=6s", "-timeout", "90s")
	poll(t, 30*time.Second, "a worker of the Python plugin to attach", func() bool {
		return strings.Contains(p.stdout.String(), " attached from ")
	})
	first := pluginPids(t, e.mark)
	if len(first) != 1 {
		t.Fatalf("want one plugin process, found %v", first)
	}
	if err := syscall.Kill(first[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	poll(t, 30*time.Second, "the supervisor to restart the plugin", func() bool {
		return strings.Contains(p.stderr.String(), "plugin restarted")
	})
	if again := pluginPids(t, e.mark); len(again) != 1 || again[0] == first[0] {
		t.Errorf("after the restart the plugin processes are %v (killed: %d)", again, first[0])
	}
	if code := p.wait(t, 2*time.Minute); code != 0 {
		t.Fatalf("exit %d, want 0\nstdout:\n%s\nstderr:\n%s", code, p.stdout, p.stderr)
	}
	story := p.stdout.String()
	t.Logf("story:\n%s", story)
	if !strings.Contains(story, "all 1 need(s) served") || !strings.Contains(story, "work done by py-small-") {
		t.Errorf("the story does not say the need was served by the plugin's worker")
	}
	poll(t, 10*time.Second, "the plugin to be gone", func() bool { return len(pluginPids(t, e.mark)) == 0 })
	// The worker the killed plugin started outlives it, serving the
	// engine; with the engine gone it leaves too, within the 10 s it
	// tries to reach one.
	poll(t, 20*time.Second, "the workers to be gone", func() bool { return len(processes(e.mark, "worker")) == 0 })
}

// pluginPids lists the live provisioner-local processes whose
// environment carries mark.
func pluginPids(t *testing.T, mark string) []int {
	t.Helper()
	return processes(mark, "provisioner-local")
}

// processes lists the live processes whose command line holds word and
// whose environment carries mark.
func processes(mark, word string) []int {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var pids []int
	for _, d := range dirs {
		cmdline, err := os.ReadFile(d + "/cmdline")
		if err != nil || !bytes.Contains(cmdline, []byte(word)) {
			continue
		}
		env, err := os.ReadFile(d + "/environ")
		if err != nil || !bytes.Contains(env, []byte(mark)) {
			continue
		}
		if stat, err := os.ReadFile(d + "/stat"); err == nil {
			if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
				continue
			}
		}
		pid, _ := strconv.Atoi(filepath.Base(d))
		pids = append(pids, pid)
	}
	return pids
}

// TestPythonPluginStorm runs the engine with the Python plugin and a
// worker command that fails at once (/bin/false), the storm an author
// found: the project's own reference started 1,680 failing workers in
// 6 s. It backs the profile off itself now (and the engine holds it
// besides): at most 15 workers started in the first 10 s, by the
// plugin's own counters.
func TestPythonPluginStorm(t *testing.T) {
	plugin := pythonPlugin(t)
	body := fmt.Sprintf(`engine {
  listen = "127.0.0.1:0"
}

provisioner "local" "py" {
  plugin         = %q
  engine_url     = "http://127.0.0.1:1"
  worker_command = ["/bin/false"]
  profile "small" {
    cpus = 1
  }
}
`, plugin)
	d, runDone, story, _ := runDaemon(t, body, shared.Need{CPUs: 1})
	// The window is the figure, not a wait for anything.
	select {
	case code := <-runDone:
		runDone <- code
		t.Fatalf("run returned %d during the storm\n%s", code, story)
	case <-time.After(10 * time.Second):
	}
	status := d.eng.Status(context.Background())
	st := status.Provisioners[0]
	var n int64
	if st.Status != nil && st.Status.Counters != nil {
		for _, f := range st.Status.Counters.Failures {
			n += f.Count
		}
	}
	t.Logf("workers the Python plugin started in 10 s, all failing at once: %d; its backoff: %+v; the engine's: %+v", n, st.Status.BackingOff, status.HeldBack)
	if n == 0 || n > 15 {
		t.Errorf("the plugin started %d failing workers in 10 s; want 1 to 15", n)
	}
	if len(st.Status.BackingOff) != 1 || st.Status.BackingOff[0].Profile != "small" {
		t.Errorf("the plugin's Status.backing_off = %+v, want profile small", st.Status.BackingOff)
	}
	if st.Status.Counters == nil || len(st.Status.Counters.Failures) != 1 || st.Status.Counters.Failures[0].Class != shared.FailureDiedBeforeAttach {
		t.Errorf("the plugin's counters = %+v, want died_before_attach failures of small", st.Status.Counters)
	}
}

// TestPythonPluginByHand runs the Python plugin as a person would, with no
// cookie: --version and --help answer on stdout with exit 0, as the doc
// asks of every plugin (it exited 1 on both), --version names the
// contract the Go SDK speaks, and no argument says what it is on stderr
// with exit 1.
func TestPythonPluginByHand(t *testing.T) {
	plugin := pythonPlugin(t)
	run := func(args ...string) (stdout, stderr string, code int) {
		cmd := exec.Command(plugin, args...)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		if exit, ok := err.(*exec.ExitError); ok {
			code = exit.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), errOut.String(), code
	}
	// The Python plugin may be of an older minor than this host, and
	// must keep working: the major is what must match.
	major, _, _ := strings.Cut(shared.ContractVersion, ".")
	if out, _, code := run("--version"); code != 0 || !strings.Contains(out, "contract "+major+".") {
		t.Errorf("--version: exit %d, %q; want 0 and a contract %s.x", code, out, major)
	}
	if out, _, code := run("--help"); code != 0 || !strings.Contains(out, "provisioner plugin") {
		t.Errorf("--help: exit %d, %q; want 0 and the usage", code, out)
	}
	if out, errOut, code := run(); code != 1 || out != "" || !strings.Contains(errOut, "An engine runs it") {
		t.Errorf("no argument: exit %d, stdout %q, stderr %q; want 1 and the usage on stderr alone", code, out, errOut)
	}
}

// runDaemon runs host-example's daemon with the configuration body as the
// run command does (newDaemon, start, run) for one need, until the test
// ends. runDone gets run's exit code; a reader must put it back, for the
// cleanup to see.
func runDaemon(t *testing.T, body string, need shared.Need) (d *daemon, runDone chan int, story, logs *lockedBuffer) {
	t.Helper()
	cfgPath := filepath.Join(t.TempDir(), "engine.hcl")
	if err := os.WriteFile(cfgPath, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, diags := engine.LoadConfig(cfgPath)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	logger, logs := testLogger(t)
	story = &lockedBuffer{}
	d, err := newDaemon(cfg, logger, newStory(story), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if diags := d.start(ctx); diags.HasErrors() {
		cancel()
		d.stop()
		t.Fatal(diags)
	}
	runDone = make(chan int, 1)
	go func() { runDone <- d.run(ctx, []needspec.Spec{{Need: need, Count: 1}}, nil, 0) }()
	t.Cleanup(func() {
		cancel()
		<-runDone
		d.stop()
	})
	return d, runDone, story, logs
}
