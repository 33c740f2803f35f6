package main

import (
	"bytes"
	"crypto/rand"
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

var doneRe = regexp.MustCompile(`(?m)^\S+: succeeded by \S+ \(job (\S+)\): hello from job (\d+) with (\d+) cpus?$`)

// TestEmbedRunsCommands runs the one-page engine against the sandbox's
// real Slurm: a command run twice, each a task the project's worker
// (fluksio-worker) ran in a Slurm job the Slurm plugin submitted, its
// stdout saying which job it ran in; then the clean stop: no job of ours
// in squeue, and each job COMPLETED with exit code 0, as Slurm recorded
// it.
func TestEmbedRunsCommands(t *testing.T) {
	env := sandboxtest.Require(t)
	embed := sandboxtest.Binary(t, "examples/embed", "embed")
	plugin := sandboxtest.Binary(t, "plugin", "provisioner-slurm")
	worker := sandboxtest.Binary(t, "worker/fluksio-worker", "fluksio-worker")
	var b [4]byte
	rand.Read(b[:])
	name := "embed-" + hex.EncodeToString(b[:])
	jobName := "fluksio-" + name
	t.Cleanup(func() {
		if q := strings.TrimSpace(env.Slurm(t, "squeue", "-h", "--name="+jobName)); q != "" {
			t.Logf("cancelling what the test left:\n%s", q)
			env.Slurm(t, "scancel", "--name="+jobName)
		}
	})
	cfg := env.EngineConfig(sandboxtest.FreePort(t), filepath.Dir(plugin), name, []string{worker}, fmt.Sprintf(`  profile "cpu" {
    cpus   = 1
    ram_mb = 200
    sbatch = ["--partition=%s", "--time=00:10:00"]
  }
`, env.Partition))
	path := filepath.Join(t.TempDir(), "config.hcl")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(embed, "-config", path, "-n", "2", "-timeout", "2m", "--",
		"sh", "-c", `echo "hello from job $SLURM_JOB_ID with $SLURM_CPUS_ON_NODE cpu"`)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		t.Fatalf("embed: %v\nstdout:\n%s\nstderr:\n%s", err, &out, &errOut)
	}
	exited := time.Now()
	t.Logf("embed said:\n%s", &out)
	var jobs []string
	for _, m := range doneRe.FindAllStringSubmatch(out.String(), -1) {
		jobs = append(jobs, m[1])
	}
	if len(jobs) != 2 {
		t.Fatalf("want 2 tasks succeeded in Slurm jobs, saying so on stdout; got %q:\n%s\n%s", jobs, &out, &errOut)
	}

	// The queue empties as the workers leave: they were let go.
	deadline := exited.Add(10 * time.Second)
	for strings.TrimSpace(env.Slurm(t, "squeue", "-h", "--name="+jobName)) != "" {
		if time.Now().After(deadline) {
			t.Fatalf("10 s after embed exited squeue still has:\n%s", env.Slurm(t, "squeue", "--name="+jobName))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("queue empty %.1fs after embed exited", time.Since(exited).Seconds())
	for _, job := range jobs {
		show := env.Slurm(t, "scontrol", "show", "job", job)
		if !strings.Contains(show, "JobState=COMPLETED") || !strings.Contains(show, "ExitCode=0:0") {
			t.Errorf("job %s did not end COMPLETED with exit code 0:\n%s", job, show)
		}
	}
}
