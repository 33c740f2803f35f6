package slurm

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/shared"
)

// TestRedactSecrets: what a job's output may say about its credentials,
// as set -x, cat "$0", an echo, a curl -v or a tail -c cut prints them,
// comes out of explain's quote as [redacted], and the rest as it was.
func TestRedactSecrets(t *testing.T) {
	signer := host.NewSigner([]byte(strings.Repeat("k", host.MinSecretLen)))
	real, _, err := signer.Sign(host.CredentialClaims{Worker: "hpc-cpu-1", Provisioner: "hpc", CPUs: 1}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	known := "tok-0123456789abcdef"
	for _, c := range []struct {
		in      string
		secrets []string
		want    string
	}{
		{"+ FLUKSIO_WORKER_TOKEN=" + known, nil, "+ FLUKSIO_WORKER_TOKEN=[redacted]"},
		{"+ FLUKSIO_WORKER_TOKEN='" + real + "'", nil, "+ FLUKSIO_WORKER_TOKEN='[redacted]'"},
		{"+ export FLUKSIO_WORKER_TOKEN_0=a1 FLUKSIO_WORKER_TOKEN_1=b2", nil, "+ export FLUKSIO_WORKER_TOKEN_0=[redacted] FLUKSIO_WORKER_TOKEN_1=[redacted]"},
		{"> Authorization: Bearer " + known, nil, "> Authorization: Bearer [redacted]"},
		{"my token is " + known + ", see", []string{known}, "my token is [redacted], see"},
		{"worker said " + real + " twice: " + real, nil, "worker said [redacted] twice: [redacted]"},
		{real[20:] + " cut by tail -c", nil, "[redacted] cut by tail -c"},
		{"1) FLUKSIO_WORKER_TOKEN=" + real + " exec fluksio-worker --url http://e:1 ;;", nil,
			"1) FLUKSIO_WORKER_TOKEN=[redacted] exec fluksio-worker --url http://e:1 ;;"},
		{"/usr/bin/env: 'fluksio-worker': No such file or directory", []string{known}, "/usr/bin/env: 'fluksio-worker': No such file or directory"},
		{"module load python/3.11.4 and numpy.linalg", nil, "module load python/3.11.4 and numpy.linalg"},
	} {
		if got := newRedactor(c.secrets).scrub(c.in); got != c.want {
			t.Errorf("scrub(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestQuoteTailDropsACutLine: tail -c 2048 may begin inside a credential,
// whose last bytes match no pattern; a full tail's first line is left
// out, a shorter one (the whole file) is quoted from its start.
func TestQuoteTailDropsACutLine(t *testing.T) {
	cut := "Xk3_9fQ2-LmZ8pR4tYw1" // the end of a signature, cut by tail -c
	rest := "\n+ exec fluksio-worker --url http://e:1\nfluksio-worker: cannot start\n"
	full := cut + strings.Repeat("y", tailBytes-len(cut)-len(rest)) + rest
	if len(full) != tailBytes {
		t.Fatalf("the test's tail is %d bytes", len(full))
	}
	if got := quoteTail(full, nil); strings.Contains(got, cut) || !strings.HasPrefix(got, "+ exec fluksio-worker") {
		t.Errorf("a full tail quoted as %q; want its cut first line left out", got)
	}
	if got := quoteTail(cut+rest, nil); !strings.HasPrefix(got, cut) {
		t.Errorf("a whole file quoted as %q; want it from its first line", got)
	}
}

// TestJobLogNamedToTheWorker: the script names the job's own log to its
// worker, in log_dir as the login node resolved it, for a job and for an
// array task as a real bash expands Slurm's variables; a log_dir bash
// would read ($) is quoted. Nothing is named for a profile that sets
// --output, for a job of several nodes, or before log_dir is resolved.
func TestJobLogNamedToTheWorker(t *testing.T) {
	p := New(hclog.NewNullLogger())
	cfg := &settings{name: "hpc"}
	dir := "/home/alice/$HOME/logs"
	p.files.logDirAbs = dir
	expand := func(assign string) string {
		t.Helper()
		// As the script does: the assignment before the command that
		// becomes the worker, which finds it in its environment.
		cmd := exec.Command("bash", "-c", assign+"exec printenv "+shared.JobLogEnv)
		cmd.Env = []string{"SLURM_JOB_ID=4242", "SLURM_ARRAY_JOB_ID=77", "SLURM_ARRAY_TASK_ID=3"}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("bash on %q: %v", assign, err)
		}
		return strings.TrimSuffix(string(out), "\n")
	}
	plain := Profile{Name: "cpu", CPUs: 1}
	if got := expand(p.files.jobLogEnv(cfg, plain.options(), 1, false)); got != dir+"/4242.out" {
		t.Errorf("a job's log: %q; want %q", got, dir+"/4242.out")
	}
	if got := expand(p.files.jobLogEnv(cfg, plain.options(), 1, true)); got != dir+"/77_3.out" {
		t.Errorf("an array task's log: %q; want %q", got, dir+"/77_3.out")
	}
	own := Profile{Name: "own", CPUs: 1, Sbatch: []string{"--output=/scratch/%j.log"}}
	for _, c := range []struct {
		what  string
		got   string
		unset bool
	}{
		{"a profile with its own --output", p.files.jobLogEnv(cfg, own.options(), 1, false), true},
		{"a job of two nodes", p.files.jobLogEnv(cfg, plain.options(), 2, false), true},
	} {
		if c.got != "" {
			t.Errorf("%s: %q; want nothing named", c.what, c.got)
		}
	}
	p.files.logDirAbs = ""
	if got := p.files.jobLogEnv(cfg, plain.options(), 1, false); got != "" {
		t.Errorf("log_dir not resolved yet: %q; want nothing named", got)
	}
}

// TestLogsScriptKeepsTheNewest runs logsScript in a real sh (with GNU
// find, as on a login node) over a directory of 8 job logs, a day apart
// and of 100 bytes each, beside files that are not job logs: "prune 3"
// keeps the 3 newest; a byte bound of 250 keeps 2; "look" removes
// nothing. Other names, a link named like a log (and its target) and a
// directory stay, and the counts are what it found and kept.
func TestLogsScriptKeepsTheNewest(t *testing.T) {
	if _, err := exec.LookPath("find"); err != nil {
		t.Skip("no find")
	}
	logs := []string{"100.out", "101.out", "102_0.out", "102_1.out", "103.out", "104.out", "105_7.out", "106.out"}
	others := []string{"notes.txt", "abc.out", "12a.out", "subdir.out", "99.out"}
	setup := func(t *testing.T) string {
		dir := t.TempDir()
		now := time.Now()
		for i, n := range logs {
			f := filepath.Join(dir, n)
			os.WriteFile(f, []byte(strings.Repeat("x", 100)), 0o600)
			at := now.Add(-time.Duration(len(logs)-i) * 24 * time.Hour)
			os.Chtimes(f, at, at)
		}
		for _, n := range others[:3] {
			os.WriteFile(filepath.Join(dir, n), []byte("mine"), 0o600)
		}
		os.Mkdir(filepath.Join(dir, "subdir.out"), 0o700)
		target := filepath.Join(t.TempDir(), "target")
		os.WriteFile(target, []byte("not a log"), 0o600)
		os.Symlink(target, filepath.Join(dir, "99.out"))
		return dir
	}
	run := func(t *testing.T, dir string, args ...string) (logCount, []string) {
		t.Helper()
		cmd := exec.Command("sh", append([]string{"-c", "cd -- \"$1\" || exit 1\n" + logsScript, "sh", dir}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("logsScript %v: %v\n%s", args, err, out)
		}
		c, ok := readLogCount(string(out))
		if !ok {
			t.Fatalf("logsScript %v printed no count:\n%s", args, out)
		}
		var left []string
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			left = append(left, e.Name())
		}
		slices.Sort(left)
		return c, left
	}
	want := func(kept ...string) []string {
		w := append(slices.Clone(others), kept...)
		slices.Sort(w)
		return w
	}
	for _, c := range []struct {
		name  string
		args  []string
		count logCount
		left  []string
	}{
		{"prune 3", []string{"prune", "3", fmt.Sprint(logKeepBytes)}, logCount{found: 8, foundBytes: 800, kept: 3, keptBytes: 300}, want("104.out", "105_7.out", "106.out")},
		{"250 bytes", []string{"prune", "100", "250"}, logCount{found: 8, foundBytes: 800, kept: 2, keptBytes: 200}, want("105_7.out", "106.out")},
		{"prune 0", []string{"prune", "0", fmt.Sprint(logKeepBytes)}, logCount{found: 8, foundBytes: 800}, want()},
		{"look", []string{"look", "0", "0"}, logCount{found: 8, foundBytes: 800, kept: 8, keptBytes: 800}, want(logs...)},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := setup(t)
			count, left := run(t, dir, c.args...)
			if count != c.count {
				t.Errorf("counted %+v; want %+v", count, c.count)
			}
			if !slices.Equal(left, c.left) {
				t.Errorf("left %v; want %v", left, c.left)
			}
		})
	}
}
