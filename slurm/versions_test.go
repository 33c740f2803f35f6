package slurm

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/internal/queue"
	"github.com/fluksio/provision/slurm/sbatch"
)

// The fixtures in testdata/slurm-versions are what each real Slurm
// printed: capture.sh recorded one folder per version from the sandbox
// (SANDBOX_SLURM=bookworm, trixie, sid), and mismatch/ holds what a
// client said to a controller of another release, each pair run by hand
// against two sandboxes. The tests below read them, so that a parser or a
// classifier is held to every version's words, not to one.

// versionDirs are the versions with captured fixtures.
func versionDirs(t *testing.T) []string {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join("testdata", "slurm-versions", "[0-9]*"))
	if len(dirs) < 3 {
		t.Fatalf("fixtures of %d Slurm versions in testdata/slurm-versions; want 22.05, 24.11 and 26.05", len(dirs))
	}
	return dirs
}

func fixture(t *testing.T, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// mismatchFixture is the sbatch and the squeue halves of a mismatch
// fixture; the fake ssh prints them.
func mismatchFixture(name string) (sbatch, squeue string) {
	b, _ := os.ReadFile(filepath.Join("testdata", "slurm-versions", "mismatch", name))
	sbatch, squeue, _ = strings.Cut(string(b), "---\n")
	return sbatch, squeue
}

// TestBareArrayRowStandsForItsTask: after an array of two is submitted
// held, task 1 released and pending task 0 cancelled alone, every version
// must be read as "task 0 ended CANCELLED, task 1 runs". 26.05 prints the
// cancelled task under the bare array id; the row carries the job's
// comment, which is how the plugin knows whose it is.
func TestBareArrayRowStandsForItsTask(t *testing.T) {
	for _, dir := range versionDirs(t) {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			rows := queue.ParseJobs([]byte(fixture(t, dir, "array-one-cancelled.squeue")), "")
			byID := indexRows(rows)
			array := ""
			for _, r := range rows {
				if r.State == "RUNNING" {
					array, _ = sbatch.SplitTask(r.ID)
				}
			}
			if array == "" {
				t.Fatalf("no running task in %+v", rows)
			}
			if row, ok := rowOf(byID, array+"_0", "fx-array-tag"); !ok || row.State != "CANCELLED" {
				t.Errorf("task 0: %+v, %v; want CANCELLED", row, ok)
			}
			if row, ok := rowOf(byID, array+"_1", "fx-array-tag"); !ok || row.State != "RUNNING" {
				t.Errorf("task 1: %+v, %v; want RUNNING", row, ok)
			}
			// Another job's comment does not make the bare row its own.
			if row, ok := rowOf(byID, array+"_0", "someone-else"); ok && row.ID == array {
				t.Errorf("a bare row was taken for a task of another comment: %+v", row)
			}
			// A lost submission found by its comment gets the task's
			// own id, never the bare array's, which would cancel all.
			if row, ok := taskRow(rows, 0); !ok || row.ID != array+"_0" || row.State != "CANCELLED" {
				t.Errorf("taskRow(0) = %+v, %v; want %s_0 CANCELLED", row, ok, array)
			}
		})
	}
}

// TestDeadlineRefusal: the words 24.11 and 26.05 give a --deadline sooner
// than now + --time are a verdict on every version's fixture, and come
// with the hint that names --deadline; 22.05 took the same job.
func TestDeadlineRefusal(t *testing.T) {
	prof := Profile{Name: "p", Sbatch: []string{"--time=10", "--deadline=now+5minutes"}}
	for _, dir := range versionDirs(t) {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			said := fixture(t, dir, "deadline-sbatch.txt")
			refused := !strings.HasSuffix(strings.TrimSpace(said), "exit 0")
			if strings.HasPrefix(filepath.Base(dir), "22.") == refused {
				t.Fatalf("22.05 takes the job, 24.11 and later refuse it; this one said:\n%s", said)
			}
			if !refused {
				return
			}
			if !refusedForGood(said) {
				t.Errorf("not a verdict: %q", said)
			}
			if h := deadlineHint(prof, said); !strings.Contains(h, "--deadline") {
				t.Errorf("hint %q does not name --deadline", h)
			}
			path := sbatchBlame(prof, []string{"profile", "0"}, fixture(t, dir, "deadline-test-only.txt"))
			if strings.Join(path, ".") != "profile.0.sbatch.1" {
				t.Errorf("--test-only's refusal blamed %v, want the --deadline line", path)
			}
		})
	}
	if d := deadlineTooSoon(prof.Sbatch, "now+5minutes"); !strings.Contains(d, "now+600 seconds") {
		t.Errorf("deadlineTooSoon = %q", d)
	}
	for _, ok := range [][]string{{"--time=10", "--deadline=now+10minutes"}, {"--deadline=now+1minute"}, {"--time=10", "--deadline=2027-01-01T00:00:00"}} {
		if d := deadlineTooSoon(ok, strings.TrimPrefix(ok[len(ok)-1], "--deadline=")); d != "" {
			t.Errorf("%q: %s", ok, d)
		}
	}
	if d := deadlineTooSoon([]string{"--time=10", "--begin=now+1hour"}, "now+30minutes"); !strings.Contains(d, "begin") {
		t.Errorf("a deadline before begin + time: %q", d)
	}
}

// TestTestOnlyLines: what --test-only prints of a job that fits, warning
// or not, is shown whole by the preflight on every version (26.05 has a
// stray "a" in it; nothing parses the line beyond its "sbatch: ").
func TestTestOnlyLines(t *testing.T) {
	for _, dir := range versionDirs(t) {
		for _, f := range []string{"test-only.txt", "warning-test-only.txt"} {
			out := fixture(t, dir, f)
			sc := bufio.NewScanner(strings.NewReader(out))
			var last string
			for sc.Scan() {
				if l := sc.Text(); strings.HasPrefix(l, "sbatch: Job ") {
					last = l
				}
			}
			if last == "" || !strings.Contains(last, "to start at") {
				t.Errorf("%s/%s: no job line in %q", dir, f, out)
			}
		}
	}
}

// exitErr is a real *exec.ExitError with code.
func exitErr(t *testing.T, code int) error {
	t.Helper()
	err := exec.Command("sh", "-c", "exit "+string(rune('0'+code))).Run()
	if err == nil {
		t.Fatal("want an exit error")
	}
	return err
}

// TestReleaseMismatchWords: each pair of releases says it in its own
// words; an older client's are a verdict at once, a newer one's ("Zero
// Bytes") stay weather alone, as a dropped connection says the same.
func TestReleaseMismatchWords(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join("testdata", "slurm-versions", "mismatch", "*.txt"))
	if len(files) < 4 {
		t.Fatalf("%d mismatch fixtures; want 4", len(files))
	}
	for _, f := range files {
		sbatch, squeue := mismatchFixture(filepath.Base(f))
		older := strings.HasPrefix(filepath.Base(f), "22.05-client")
		for _, said := range []string{sbatch, squeue} {
			if releaseMismatch(said) != older {
				t.Errorf("%s: releaseMismatch(%q) = %v", f, said, !older)
			}
			if !older && !saidZeroBytes(said) {
				t.Errorf("%s: %q is not the newer client's word", f, said)
			}
		}
		want := shared.FailureTransient
		if older {
			want = shared.FailureMisconfigured
		}
		if got := submitFailureClass(exitErr(t, 1), sbatch); got != want {
			t.Errorf("%s: sbatch's words alone are %s, want %s", f, got, want)
		}
		if !older && !answerLost(exitErr(t, 1), []byte(sbatch)) {
			t.Errorf("%s: a newer client's sbatch is not read as a possibly lost answer", f)
		}
	}
}

// TestNewerClientIsMisconfiguredLogin: a login node whose sbatch and
// squeue both say "Zero Bytes" (a client newer than the controller) is a
// misconfigured profile with words that say which release is wrong,
// after one sbatch and one squeue; a lost answer alone stays weather.
func TestNewerClientIsMisconfiguredLogin(t *testing.T) {
	h := newHarness(t, "sbatch=newclient,squeue=newclient", nil)
	h.provision(t, cpuNeed)
	ev := waitEvents(t, h.host, 1)[0]
	if ev.Kind != shared.EventWorkerProvisionFailed || !strings.Contains(ev.Detail, "another Slurm release than slurmctld") || ev.Class != shared.FailureMisconfigured {
		t.Fatalf("event = %+v", ev)
	}
	st := h.status(t)
	if len(st.Notes) != 1 || !strings.Contains(st.Notes[0], "misconfigured") || !strings.Contains(st.Notes[0], "Zero Bytes") {
		t.Errorf("Notes = %q, want the profile misconfigured with Slurm's words", st.Notes)
	}
	if n, m := len(h.fake.callsTo("sbatch")), len(h.fake.callsTo("squeue")); n != 1 || m != 1 {
		t.Errorf("%d sbatch and %d squeue calls; want 1 and 1", n, m)
	}

	// The same words from sbatch, but a queue that answers: weather.
	h2 := newHarness(t, "sbatch=newclient,squeue=ok", nil)
	h2.provision(t, cpuNeed)
	h2.submitted(t)
	h2.clock.Advance(time.Minute) // past when it could land (landing.go)
	h2.p.poll.once(context.Background())
	ev = waitEvents(t, h2.host, 1)[0]
	if strings.Contains(ev.Detail, "another Slurm release") || ev.Class != shared.FailureTransient {
		t.Errorf("a single Zero Bytes was taken for a release mismatch: %+v", ev)
	}
	if st := h2.status(t); len(st.Notes) != 0 {
		t.Errorf("Notes = %q; want none (weather)", st.Notes)
	}
}

// TestOlderClientIsMisconfiguredLogin: an older client's words are a
// verdict from the one sbatch, explained.
func TestOlderClientIsMisconfiguredLogin(t *testing.T) {
	h := newHarness(t, "sbatch=oldclient", nil)
	h.provision(t, cpuNeed)
	ev := waitEvents(t, h.host, 1)[0]
	if !strings.Contains(ev.Detail, "another Slurm release than slurmctld") || !strings.Contains(ev.Detail, "Invalid Protocol Version") {
		t.Fatalf("event = %+v", ev)
	}
	if st := h.status(t); len(st.Notes) != 1 || !strings.Contains(st.Notes[0], "misconfigured") {
		t.Errorf("Notes = %q", st.Notes)
	}
}

// TestExplainReadsStdOutOnEveryVersion: the failure explanation finds a
// job's output file from `scontrol show job` as each version prints it
// (26.05 leaves StdErr= empty when stderr goes to stdout; StdOut is what
// is read). The script runs in a real sh, with scontrol printing the
// recorded answer.
func TestExplainReadsStdOutOnEveryVersion(t *testing.T) {
	for _, dir := range versionDirs(t) {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			show, err := filepath.Abs(filepath.Join(dir, "scontrol-show-job.txt"))
			if err != nil {
				t.Fatal(err)
			}
			bin := t.TempDir()
			if err := os.WriteFile(filepath.Join(bin, "scontrol"), []byte("#!/bin/sh\ncat "+show+"\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("sh", "-c", explainScript, "sh", "9", "")
			cmd.Env = append(os.Environ(), "PATH="+bin+":/usr/bin:/bin")
			out, err := cmd.Output()
			if err != nil {
				t.Fatal(err)
			}
			_, after, ok := strings.Cut(string(out), "--- fluksio: output\n")
			file, _, _ := strings.Cut(after, "\n")
			if !ok || !strings.HasPrefix(file, "/home/slurmuser/slurm-") || !strings.HasSuffix(file, "_1.out") {
				t.Errorf("output file %q; want the job's StdOut", file)
			}
		})
	}
}
