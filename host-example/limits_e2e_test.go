package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/internal/sandboxtest"
)

// TestE2EBurstWithinSubmitLimit is a burst at a site that caps its users,
// as issue 27 found it: a private sandbox with slurmdbd and
// AccountingStorageEnforce=associations,limits,qos, the job user at
// MaxSubmitJobs = 5, and twelve needs of 4 s of work each. Before the plugin
// read limits it got 0 machines in 40 s: the 10-task array was refused
// whole, the profile backed off and the placer failed over to a profile
// behind the same login. Now every need is served, the user never has
// more than 5 jobs or array tasks in the queue (sampled as it runs),
// sbatch never refuses (the limits are read, not learned), nothing backs
// off or fails over, and GET /status names the limit. Before the run,
// validate -check names the limit and warns that max_pending = 64 and
// max_workers are above it. The story has a progress line, and its summary says that 12
// needs were served by at most 5 machines, reused.
func TestE2EBurstWithinSubmitLimit(t *testing.T) {
	env := sandboxtest.PrivateWith(t, "limits", sandboxtest.Options{Accounting: true})
	env.Slurm(t, "sacctmgr", "-i", "modify", "user", "slurmuser", "set", "maxsubmitjobs=5")
	e := newE2EOn(t, "e2e-limit", env)
	e.killPluginsAtEnd(t)
	// The configuration's cpu profile (2 CPUs) behind the same login is
	// where the placer would fail over to, and the same limit refuse.
	cfg := e.relConfig(t, "", `  profile "small" {
    cpus   = 1
    ram_mb = 200
    sbatch = ["--partition=`+env.Partition+`", "--time=00:10:00"]
  }
`, e.host, "worker")

	// The preflight names the limit and warns that the default
	// max_pending, 64, is above it.
	var out, errOut bytes.Buffer
	code := validateMain([]string{"-check", cfg}, &out, &errOut)
	t.Logf("validate -check (exit %d):\n%s%s", code, out.String(), errOut.String())
	report := out.String() + errOut.String()
	if !strings.Contains(report, "limit on jobs in the queue: association proj/slurmuser MaxSubmitJobs = 5") {
		t.Errorf("validate -check does not name the limit")
	}
	if !regexp.MustCompile(`(?s)warning.*max_pending above the site's limit.*max_pending = 64`).MatchString(report) {
		t.Errorf("validate -check does not warn that max_pending = 64 is above the limit")
	}
	// With no MaxJobs, MaxSubmitJobs alone caps the machines alive.
	if !regexp.MustCompile(`(?s)warning: max_workers above the site's limit.*at most 5 jobs running \(association proj/slurmuser MaxSubmitJobs = 5\)`).MatchString(squash(report)) {
		t.Errorf("validate -check does not warn that max_workers can never be reached under MaxSubmitJobs = 5")
	}

	p := e.startEngine(t, "-config", cfg, "-need", "cpus=1,count=12,work=4s", "-timeout", "3m", "-log-level", "debug")

	// Sample the user's queue, every job and array task of slurmuser's
	// (-r: a pending array's tasks one by one), and /status, until the
	// engine exits.
	most, samples := 0, 0
	var limitNote string
	for !p.exited() {
		out := env.Slurm(t, "squeue", "-h", "-r", "-u", "slurmuser", "-o", "%i")
		if n := len(strings.Fields(out)); n > most {
			most = n
		}
		samples++
		if limitNote == "" {
			limitNote = e.limitNote(t)
		}
		time.Sleep(200 * time.Millisecond) // a sampling rate, not a wait for anything
	}
	code = p.wait(t, time.Minute)
	story, log := p.stdout.String(), p.stderr.String()
	t.Logf("story:\n%s", story)
	refusals := strings.Count(log, "sbatch refused for an accounting limit")
	t.Logf("queue samples: %d, most of the user's jobs or tasks queued at once: %d; sbatch refusals for a limit: %d; /status said: %q", samples, most, refusals, limitNote)
	if code != 0 {
		t.Fatalf("exit %d, want 0\nstderr:\n%s", code, log)
	}
	if !strings.Contains(story, "all 12 need(s) served") {
		t.Errorf("the story does not say all 12 needs were served")
	}
	if !regexp.MustCompile(`(?m)\] progress: needs \d+/12 served; machines \d+ alive, \d+ on the way; \d+ of \d+ submission\(s\) reached the scheduler`).MatchString(story) {
		t.Errorf("the story has no progress line")
	}
	if m := regexp.MustCompile(`(?m)\] summary: 12 of 12 need\(s\) served by (\d+) machine\(s\).*; machines were reused \(12 needs, (\d+) machines`).FindStringSubmatch(story); m == nil {
		t.Errorf("the story has no summary line of 12 needs served by machines reused")
	} else if n, _ := strconv.Atoi(m[1]); n > 5 || n < 1 {
		t.Errorf("the summary says %s machines; MaxSubmitJobs is 5", m[1])
	}
	if most > 5 {
		t.Errorf("the user had %d jobs or array tasks in the queue at once; MaxSubmitJobs is 5", most)
	}
	if refusals != 0 {
		t.Errorf("sbatch refused %d submissions for a limit; the limits are readable, so none should pass them", refusals)
	}
	if most == 0 {
		t.Errorf("no sample saw a job of the user's: the sampling did not watch the run")
	}
	for _, bad := range []string{"backing off", "backing_off", "failed over", "misconfigured"} {
		if strings.Contains(log, bad) || strings.Contains(story, bad) {
			t.Errorf("the run says %q; a limit is weather that neither backs off nor fails over", bad)
		}
	}
	if !strings.Contains(limitNote, "limit reached") || !strings.Contains(limitNote, "MaxSubmitJobs = 5") {
		t.Errorf("GET /status never named the limit; its last limit note: %q", limitNote)
	}
	e.assertCleanedUp(t, time.Now())
}

// limitNote is the note of the test's provisioner in GET /status that
// says a limit holds its demand back, "" when there is none (or no
// answer).
func (e *e2e) limitNote(t *testing.T) string {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/status", e.port))
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var st struct {
		Provisioners []struct {
			Name   string `json:"name"`
			Status *struct {
				Notes []string `json:"notes"`
			} `json:"status"`
		} `json:"provisioners"`
	}
	if json.Unmarshal(b, &st) != nil {
		return ""
	}
	for _, p := range st.Provisioners {
		if p.Name != e.name || p.Status == nil {
			continue
		}
		for _, n := range p.Status.Notes {
			if strings.HasPrefix(n, "limit reached") {
				return n
			}
		}
	}
	return ""
}
