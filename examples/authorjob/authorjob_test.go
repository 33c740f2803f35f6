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
	"slices"
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
	reduceRe  = regexp.MustCompile(`^reduce succeeded attempts=1 job=\S+ 30$`)
)

// TestAuthorJob runs an engine author's first real job on the sandbox's
// Slurm through the kit and its own worker: 30 digests of 1 MB inputs in
// a directory the job user cannot enter (20 of 1 CPU, 10 of 2), a reduce
// after them over their 30 outputs, exit 3 and a task after it (never
// run), sleep 300 cancelled, a long task whose job is scancelled under
// it and that runs again elsewhere, a clean stop with nothing left in
// the queue.
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
	// The reduce ran once, after the 30, on their 30 sums.
	if !slices.ContainsFunc(lines, func(l string) bool { return reduceRe.MatchString(l) }) {
		t.Errorf("no line of the reduce's having counted the 30 sums (%s)", reduceRe)
	}
	for _, want := range []string{"exit3 failed attempts=1", "after-exit3 cancelled attempts=0", "sleep cancelled attempts=1", "long succeeded attempts=2"} {
		if !strings.Contains(strings.Join(lines, "\n"), want) {
			t.Errorf("no %q", want)
		}
	}
	if longJob == "" || strings.Contains(strings.Join(lines, "\n"), "long succeeded attempts=2 job="+longJob+" ") {
		t.Errorf("long's job %q was not cancelled, or it ran again in the same job", longJob)
	}
	// The clean stop as a user sees it: none of the run's jobs in the
	// queue 2 s after authorjob exits, each the sums ran in COMPLETED,
	// and long's CANCELLED (the test scancelled it); any other job of the
	// run's arrays COMPLETED, or CANCELLED if the engine withdrew it
	// before it started.
	env.AssertCleanStop(t, "fluksio-"+name, exited, "the clean stop")
	var ids []string
	for _, l := range lines {
		if m := sumRe.FindStringSubmatch(l); m != nil {
			ids = append(ids, m[2])
		}
	}
	sums := map[string]bool{}
	for _, id := range ids {
		sums[id] = true
	}
	if longJob != "" {
		ids = append(ids, longJob)
	}
	for id, rec := range env.JobRecords(t, ids...) {
		want := "COMPLETED or CANCELLED"
		ok := rec.State == "COMPLETED" || rec.State == "CANCELLED"
		switch {
		case id == longJob:
			want, ok = "CANCELLED", rec.State == "CANCELLED"
		case sums[id]:
			want, ok = "COMPLETED", rec.State == "COMPLETED"
		}
		if !ok {
			t.Errorf("job %s ended JobState=%s ExitCode=%s; want %s", id, rec.State, rec.ExitCode, want)
		}
	}
}
