package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
)

// TestE2ECredentialWorthOneJob runs the engine, the real Slurm plugin and
// a real worker in a Slurm job, keeps a copy of the credential the job was
// given, and replays it from this machine with the real worker binary:
// claiming another job, while the real worker is attached, claiming GPUs
// its profile does not have, and after the real worker detached. Every
// replay is refused and the worker exits 1 saying why.
func TestE2ECredentialWorthOneJob(t *testing.T) {
	e := newE2E(t, "e2e-cred")

	dir, out := jobUserDir(t, "fluksio-cred-")
	wrapper := filepath.Join(dir, "keep-credential")
	script := fmt.Sprintf("#!/bin/sh\n# Keeps the credential for the test to replay, then runs the worker.\n"+
		"printf '%%s %%s\\n' \"$SLURM_JOB_ID\" \"$%s\" > %s/cred.tmp && mv %s/cred.tmp %s/cred\nexec %s worker \"$@\"\n",
		shared.WorkerTokenEnv, out, out, out, e.host)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}

	cfg := e.config(t, wrapper)
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// A short idle limit, so the real worker detaches within the test.
	b = bytes.Replace(b, []byte(`max_idle       = "30s"`), []byte(`max_idle       = "8s"`), 1)
	if err := os.WriteFile(cfg, b, 0o644); err != nil {
		t.Fatal(err)
	}

	// The cpus=64 need fits no profile: the engine keeps running after
	// the cpus=2 one is served, until the test stops it.
	p := e.startEngine(t, "-config", cfg, "-need", "cpus=2", "-need", "cpus=64", "-timeout", "3m")
	poll(t, 2*time.Minute, "the need to be served", func() bool { return strings.Contains(p.stdout.String(), "work done by") })
	raw, err := os.ReadFile(filepath.Join(out, "cred"))
	if err != nil {
		t.Fatal(err)
	}
	job, token, ok := strings.Cut(strings.TrimSpace(string(raw)), " ")
	if !ok || job == "" || token == "" {
		t.Fatalf("the wrapper kept %q", raw)
	}

	// replay runs the real worker here with the kept credential.
	replay := func(slurmJob string, extra ...string) (int, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		args := append([]string{"worker", "--url", fmt.Sprintf("http://127.0.0.1:%d", e.port), "--cpus", "2", "--max-idle", "5"}, extra...)
		cmd := exec.CommandContext(ctx, e.host, args...)
		cmd.Env = append(os.Environ(), shared.WorkerTokenEnv+"="+token, "SLURM_JOB_ID="+slurmJob)
		outb, err := cmd.CombinedOutput()
		code := 0
		if err != nil {
			code = -1
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			}
		}
		return code, string(outb)
	}
	expect := func(what string, code int, said, want string) {
		t.Helper()
		if code != 1 || !strings.Contains(said, want) {
			t.Errorf("%s: worker exited %d saying:\n%s\nwant exit 1 and %q", what, code, said, want)
		}
		if strings.Contains(said, token) {
			t.Errorf("%s: the worker printed the token", what)
		}
	}

	// While the real worker is attached (it idles for 8 s after its task;
	// a replay takes milliseconds).
	code, said := replay(job + "0")
	expect("another job", code, said, fmt.Sprintf("its provisioner started it as job %q", job))
	code, said = replay(job, "--gpus", "8")
	expect("more GPUs", code, said, "claims 8 gpus; its credential allows 0")
	if !strings.Contains(p.stderr.String(), "worker detached") {
		code, said = replay(job)
		expect("second attach", code, said, "already attached")
	} else {
		t.Log("the real worker left before the concurrent replay; skipped that one")
	}

	poll(t, time.Minute, "the real worker to detach", func() bool { return strings.Contains(p.stderr.String(), "worker detached") })
	code, said = replay(job)
	expect("after detach", code, said, "revoked (detached)")

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.waitDone(t, 2*time.Minute)
	exitedAt := time.Now()
	if strings.Contains(p.stderr.String(), token) || strings.Contains(p.stdout.String(), token) {
		t.Error("the token reached the engine's log or story")
	}
	if n := strings.Count(p.stdout.String(), " attached from "); n != 1 {
		t.Errorf("%d attaches in the story; want the real worker's alone:\n%s", n, p.stdout)
	}
	e.assertCleanedUp(t, exitedAt)
}

// TestE2EBurstOf40: 40 needs of one profile are one sbatch, a job array
// of 40 tasks; all 40 workers attach at once, each with a credential of
// its own, and the credential of task 3 is refused when it claims to be
// task 4. The sandbox has 100 CPUs (two nodes of 50), so the whole burst
// runs together; each task works 20 s so that no worker serves two.
func TestE2EBurstOf40(t *testing.T) {
	const burst = 40
	e := newE2E(t, "e2e-b40")
	if slots := e.env.Nodes * e.env.CPUs; slots < burst {
		t.Fatalf("the sandbox has %d CPUs in all; this test needs %d (SANDBOX_CPUS=50 and SANDBOX_NODES=2, the defaults)", slots, burst)
	}
	e.killPluginsAtEnd(t)
	dir, out := jobUserDir(t, "fluksio-b40-")
	// Each task keeps its credential under its own <array>_<task>.
	wrapper := filepath.Join(dir, "keep-credential")
	script := fmt.Sprintf("#!/bin/sh\n# Keeps the task's credential for the test, then runs the worker.\n"+
		"id=${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}\n"+
		"printf '%%s\\n' \"$%s\" > %s/$id.tmp && mv %s/$id.tmp %s/$id\nexec %s worker \"$@\"\n",
		shared.WorkerTokenEnv, out, out, out, e.host)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := e.relConfig(t, "", `  profile "small" {
    cpus   = 1
    ram_mb = 100
    sbatch = ["--partition=`+e.env.Partition+`", "--time=00:10:00"]
  }
`, wrapper)
	// The cpus=64 need fits no profile: the engine keeps running after
	// the burst is served, for the replay, until the test stops it.
	p := e.startEngine(t, "-config", cfg, "-need", fmt.Sprintf("cpus=1,count=%d,work=20s", burst), "-need", "cpus=64", "-timeout", "4m")
	attachRE := regexp.MustCompile(`worker (\S+) attached from \S+ \(job (\S+),`)
	poll(t, 3*time.Minute, fmt.Sprintf("%d workers attached", burst), func() bool {
		if p.exited() {
			t.Fatalf("the engine exited early\nstdout:\n%s\nstderr:\n%s", p.stdout, p.stderr)
		}
		return len(attachRE.FindAllString(p.stdout.String(), -1)) >= burst
	})
	story := p.stdout.String()
	if !strings.Contains(story, fmt.Sprintf(`asked for %d "small" machine(s) in 1 submission(s)`, burst)) {
		t.Errorf("the story does not say %d machines were asked for in one submission:\n%s", burst, story)
	}
	attached := map[string]string{} // job -> worker
	arrays := map[string]bool{}
	for _, m := range attachRE.FindAllStringSubmatch(story, -1) {
		array, task, ok := strings.Cut(m[2], "_")
		if !ok || !strings.HasSuffix(m[1], "-"+task) {
			t.Errorf("worker %s attached as job %s; want an array task matching its name", m[1], m[2])
		}
		attached[m[2]] = m[1]
		arrays[array] = true
	}
	if len(attached) != burst || len(arrays) != 1 {
		t.Fatalf("%d workers attached from %d arrays, want %d from 1", len(attached), len(arrays), burst)
	}
	var array string
	for a := range arrays {
		array = a
	}
	tokens := map[string]bool{}
	for job := range attached {
		b, err := os.ReadFile(filepath.Join(out, job))
		if err != nil {
			t.Fatal(err)
		}
		tokens[strings.TrimSpace(string(b))] = true
	}
	if len(tokens) != burst {
		t.Errorf("%d distinct credentials among %d tasks", len(tokens), burst)
	}

	// Task 3's credential, claiming to be task 4.
	b, err := os.ReadFile(filepath.Join(out, array+"_3"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.host, "worker", "--url", fmt.Sprintf("http://127.0.0.1:%d", e.port), "--cpus", "1", "--max-idle", "5")
	cmd.Env = append(os.Environ(), shared.WorkerTokenEnv+"="+strings.TrimSpace(string(b)), "SLURM_JOB_ID=9999", "SLURM_ARRAY_JOB_ID="+array, "SLURM_ARRAY_TASK_ID=4")
	said, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(said), fmt.Sprintf("its provisioner started it as job %q", array+"_3")) {
		t.Errorf("task 3's credential as task 4: %v, said:\n%s\nwant exit 1, refused as not its job", err, said)
	}

	poll(t, 2*time.Minute, fmt.Sprintf("%d tasks done", burst), func() bool {
		return strings.Count(p.stdout.String(), "(simulated work)") >= burst
	})
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.waitDone(t, 2*time.Minute)
	e.assertCleanedUp(t, time.Now())
}

// jobUserDir makes a directory the Slurm job's user can read (for a
// wrapper script) with a subdirectory out it can write to. Not
// t.TempDir: its parents are 0700.
func jobUserDir(t *testing.T, prefix string) (dir, out string) {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	out = filepath.Join(dir, "out")
	if err := os.Mkdir(out, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(out, 0o777); err != nil {
		t.Fatal(err)
	}
	return dir, out
}
