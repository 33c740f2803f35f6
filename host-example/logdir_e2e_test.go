package main

import (
	"bytes"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestE2ELogDirLeftAsFound: the login node's log_dir keeps only what
// failed, within log_dir_keep. It holds, before the run, the logs of 48
// failed jobs of earlier runs (a day apart) and a file of the
// operator's; with log_dir_keep = 5, validate -check says what it holds
// and removes nothing; then a run of 3 needs on one-CPU machines: the
// run's own jobs' logs are removed by their workers as they end well,
// the earlier ones are cut to the 5 newest, the operator's file stays,
// and the engine's log says what was removed.
func TestE2ELogDirLeftAsFound(t *testing.T) {
	e := newE2E(t, "e2e-logs")
	cfg := e.taskConfig(t, 1, "  log_dir_keep = 5")
	dir := ".local/state/fluksio/" + e.name
	onLogin := func(script string) string {
		t.Helper()
		out, err := exec.Command("ssh", "-F", e.env.SSHConfig, "sandbox", "sh", "-c", "'"+strings.ReplaceAll(script, "'", `'\''`)+"'").CombinedOutput()
		if err != nil {
			t.Fatalf("on the login node: %v\n%s", err, out)
		}
		return string(out)
	}
	onLogin(`mkdir -p -m 700 ` + dir + ` && cd ` + dir + ` && for i in $(seq 1 48); do echo "fluksio-worker: cannot start" > "$((9000000 + i)).out"; touch -d "@$(( $(date +%s) - (49 - i) * 86400 ))" "$((9000000 + i)).out"; done; echo mine > notes.txt`)
	held := func() []string {
		l := strings.Fields(onLogin(`cd ` + dir + ` && ls -A`))
		slices.Sort(l)
		return l
	}
	if n := len(held()); n != 49 {
		t.Fatalf("log_dir holds %d files before the run; want 49", n)
	}

	var stdout, stderr bytes.Buffer
	if code := validateMain([]string{"-check", cfg}, &stdout, &stderr); code != 0 {
		t.Fatalf("validate -check: exit %d\n%s\n%s", code, stdout.String(), stderr.String())
	}
	said := regexp.MustCompile(`(?m)^  log_dir: /\S+/` + regexp.QuoteMeta(dir) + `: 48 job log\(s\), [0-9.]+ KiB; keeps the newest 5, 64 MiB at most \(log_dir_keep\)$`)
	if !said.MatchString(stdout.String()) {
		t.Errorf("validate -check does not say what log_dir holds (want a line matching %s):\n%s", said, stdout.String())
	}
	if n := len(held()); n != 49 {
		t.Errorf("validate -check changed log_dir: %d files; want 49 still", n)
	}

	p := e.startEngine(t, "-config", cfg, "-need", "cpus=1,count=3,work=1s", "-timeout", "2m", "-log-level", "debug")
	code := p.wait(t, 3*time.Minute)
	exitedAt := time.Now()
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, p.stdout, p.stderr)
	}
	ran := workerAttachedJobRe.FindAllStringSubmatch(p.stdout.String(), -1)
	if len(ran) == 0 {
		t.Fatalf("no worker attached:\n%s", p.stdout)
	}
	// The workers remove their logs as they end, after the engine lets
	// them go: once the queue is empty of the run's jobs they have.
	e.assertCleanedUp(t, exitedAt)
	want := []string{"9000044.out", "9000045.out", "9000046.out", "9000047.out", "9000048.out", "notes.txt"}
	if got := held(); !slices.Equal(got, want) {
		t.Errorf("log_dir after the run of jobs %v holds %v; want %v", ran, got, want)
	}
	if !strings.Contains(p.stderr.String(), "removed job logs from log_dir past what it keeps") || !strings.Contains(p.stderr.String(), "removed=43") {
		t.Errorf("the engine's log does not say 43 logs were removed:\n%s", p.stderr)
	}
}
