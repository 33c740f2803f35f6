package main

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/internal/sandboxtest"
)

func TestMain(m *testing.M) {
	os.Exit(sandboxtest.Run(m))
}

var (
	sumRe     = regexp.MustCompile(`^(sum-\d\d) succeeded attempts=1 job=(\S+) ([0-9a-f]{64})  in\.bin$`)
	runningRe = regexp.MustCompile(`^(sleep|long) running on job (\S+)$`)
)

// TestAuthorJob runs an engine author's first real job on the sandbox's
// Slurm through the kit and its own worker: 30 digests of 1 MB inputs in
// a directory the job user cannot enter (20 of 1 CPU, 10 of 2), exit 3,
// sleep 300 cancelled, a long task whose job is scancelled under it and
// that runs again elsewhere, a clean stop with nothing left in the queue.
func TestAuthorJob(t *testing.T) {
	env := sandboxtest.Require(t)
	bin := sandboxtest.Binary(t, "examples/authorjob", "authorjob")
	plugin := sandboxtest.Binary(t, "plugin", "provisioner-slurm")
	wbin := sandboxtest.Binary(t, "worker/fluksio-worker", "fluksio-worker")
	var b [4]byte
	rand.Read(b[:])
	name := "author-" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		if q := strings.TrimSpace(env.Slurm(t, "squeue", "-h", "--name=fluksio-"+name)); q != "" {
			t.Logf("cancelling what the test left:\n%s", q)
			env.Slurm(t, "scancel", "--name=fluksio-"+name)
		}
	})
	inputs := t.TempDir()
	os.Chmod(inputs, 0o700)
	digests := map[string]string{}
	for i := range 30 {
		data := make([]byte, 1<<20)
		rand.Read(data)
		if err := os.WriteFile(filepath.Join(inputs, fmt.Sprintf("in-%02d.bin", i)), data, 0o600); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		digests[fmt.Sprintf("sum-%02d", i)] = hex.EncodeToString(sum[:])
	}
	profiles := ""
	for _, cpus := range []int{1, 2} {
		profiles += fmt.Sprintf("  profile \"c%d\" {\n    cpus   = %d\n    ram_mb = 200\n    sbatch = [\"--partition=%s\", \"--time=00:10:00\"]\n  }\n", cpus, cpus, env.Partition)
	}
	cfg := filepath.Join(t.TempDir(), "config.hcl")
	if err := os.WriteFile(cfg, []byte(env.EngineConfig(sandboxtest.FreePort(t), filepath.Dir(plugin), name, []string{wbin}, profiles)), 0o644); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(bin, "-config", cfg, "-inputs", inputs)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errOut strings.Builder
	cmd.Stderr = &errOut
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var lines []string
	longJob := ""
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		lines = append(lines, line)
		if m := runningRe.FindStringSubmatch(line); m != nil && m[1] == "long" {
			longJob = m[2]
			env.Slurm(t, "scancel", longJob)
		}
	}
	err = cmd.Wait()
	exited := time.Now()
	t.Logf("authorjob said:\n%s", strings.Join(lines, "\n"))
	if err != nil {
		t.Fatalf("authorjob: %v\n%s", err, &errOut)
	}
	seen := 0
	for _, l := range lines {
		if m := sumRe.FindStringSubmatch(l); m != nil {
			seen++
			if digests[m[1]] != m[3] {
				t.Errorf("%s: digest %s, want %s", m[1], m[3], digests[m[1]])
			}
		}
	}
	if seen != 30 {
		t.Errorf("%d of 30 digests told", seen)
	}
	for _, want := range []string{"exit3 failed attempts=1", "sleep cancelled attempts=1", "long succeeded attempts=2"} {
		if !strings.Contains(strings.Join(lines, "\n"), want) {
			t.Errorf("no %q", want)
		}
	}
	if longJob == "" || strings.Contains(strings.Join(lines, "\n"), "long succeeded attempts=2 job="+longJob+" ") {
		t.Errorf("long's job %q was not cancelled, or it ran again in the same job", longJob)
	}
	// Every job's batch script has ended within 30 s of the clean stop:
	// COMPLETED, or CANCELLED for long's job. Slurm 24.11 keeps a job
	// COMPLETING for 15 s more when its controller drops the reply to the
	// job's completion (slurmstepd's "Retrying job complete RPC"), which
	// it does when many jobs end at once, so COMPLETING counts as ended
	// here and the queue has another minute to let it go.
	var left string
	for {
		left = ""
		for _, l := range strings.Split(strings.TrimSpace(env.Slurm(t, "squeue", "-h", "-t", "all", "-o", "%i %T", "--name=fluksio-"+name)), "\n") {
			if id, state, ok := strings.Cut(strings.TrimSpace(l), " "); ok && state != "COMPLETED" && state != "COMPLETING" && state != "CANCELLED" {
				left += id + " " + state + "\n"
			}
		}
		if left == "" || time.Since(exited) > 30*time.Second {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if left != "" {
		t.Errorf("30 s after the clean stop, jobs not ended:\n%s", left)
	}
	for time.Since(exited) < 90*time.Second {
		if strings.TrimSpace(env.Slurm(t, "squeue", "-h", "--name=fluksio-"+name)) == "" {
			t.Logf("the queue is empty of the run's jobs %.1f s after the clean stop", time.Since(exited).Seconds())
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Errorf("90 s after the clean stop the queue still has:\n%s", env.Slurm(t, "squeue", "--name=fluksio-"+name))
}
