package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/internal/testutil"
	"github.com/fluksio/provision/worker"
)

// TestRunRefusesResultsNotOurs: run -results DIR takes DIR only when it
// is the engine's user's alone. Owned by another uid (65534), writable
// by others (0777), a symbolic link another uid owns, or holding a
// task's directory as a link out of it: each is refused at start (exit 2), saying
// which and the fix, before the plugin is started (no machine is asked
// for), and nothing is written in it or through it.
func TestRunRefusesResultsNotOurs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chowns to uid 65534: needs root")
	}
	bin := testutil.BuildTestPlugin(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "engine.hcl")
	body := fmt.Sprintf("engine {\n  listen = \"127.0.0.1:0\"\n}\nprovisioner \"memory\" \"mem\" {\n  plugin = %q\n  greeting = \"hi\"\n}\n", bin)
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	tasks := filepath.Join(dir, "tasks.jsonl")
	if err := os.WriteFile(tasks, []byte(`{"id": "t1", "command": ["true"]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	for _, tc := range []struct {
		name  string
		setup func(results string)
		want  string
	}{
		{"another uid's", func(results string) {
			os.Mkdir(results, 0o755)
			os.Chown(results, 65534, 65534)
		}, "is owned by uid 65534, not the engine's user (uid 0), who could change what the engine writes there: chown 0 it"},
		{"writable by others", func(results string) {
			os.Mkdir(results, 0o755)
			os.Chmod(results, 0o777)
		}, "is writable by group or others (mode 0777), who could put links where the engine writes: chmod go-w it"},
		{"another uid's link", func(results string) {
			real := filepath.Join(filepath.Dir(results), "real")
			os.Mkdir(real, 0o700)
			os.Symlink(real, results)
			os.Lchown(results, 65534, 65534)
		}, "is a symbolic link owned by uid 65534"},
		{"a task's directory a link out", func(results string) {
			os.Mkdir(results, 0o700)
			os.Symlink(outside, filepath.Join(results, "t1"))
		}, `task "t1": ` + "%s" + ": openat t1: path escapes from parent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			results := filepath.Join(t.TempDir(), "results")
			tc.setup(results)
			before := listTree(t, results)
			started := filepath.Join(t.TempDir(), "env")
			t.Setenv("TESTPLUGIN_ENV_FILE", started)
			var out, errOut bytes.Buffer
			code := runMain([]string{"-config", cfg, "-tasks", tasks, "-results", results, "-timeout", "5s"}, &out, &errOut)
			want := tc.want
			if strings.Contains(want, "%s") {
				want = fmt.Sprintf(want, filepath.Join(results, "t1"))
			}
			if code != 2 || !strings.Contains(errOut.String(), want) {
				t.Errorf("run: exit %d, stderr %q; want 2 and %q", code, errOut.String(), want)
			}
			if _, err := os.Stat(started); err == nil {
				t.Error("the plugin was started: a machine could have been asked for")
			}
			if after := listTree(t, results); after != before {
				t.Errorf("-results changed: %s, then %s", before, after)
			}
			if got := listTree(t, outside); got != "" {
				t.Errorf("written outside -results: %s", got)
			}
		})
	}
}

// listTree names every path under dir (following a link at dir itself),
// for comparing before and after.
func listTree(t *testing.T, dir string) string {
	t.Helper()
	var names []string
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return ""
	}
	filepath.WalkDir(real, func(p string, d os.DirEntry, err error) error {
		if err == nil && p != real {
			names = append(names, strings.TrimPrefix(p, real))
		}
		return nil
	})
	return strings.Join(names, " ")
}

// TestResultsThroughLinksStayInside: links put under -results after the
// start (a task's directory that is a link out, a result.json that is a
// link to a file outside) lead nothing out of it: the first task's
// result is not kept, which its line says; the second's replaces the
// link, and the file outside is unchanged.
func TestResultsThroughLinksStayInside(t *testing.T) {
	results := testResults(t, filepath.Join(t.TempDir(), "results"))
	outside := t.TempDir()
	victim := filepath.Join(outside, "authorized_keys")
	if err := os.WriteFile(victim, []byte("ssh-ed25519 AAAA the owner's key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(results.Name(), "a")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(results.Name(), "b"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(results.Name(), "b", "result.json")); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	run := newTaskRun(results, newStory(&out))
	run.total = 2
	code := 0
	for _, id := range []string{"a", "b"} {
		run.taskEnded(engine.TaskResult{ID: id, State: worker.StateSucceeded, ExitCode: &code, Stdout: "ssh-ed25519 AAAA the attacker's key\n"})
	}
	if got := listTree(t, outside); got != "/authorized_keys" {
		t.Errorf("outside -results: %s; want authorized_keys alone", got)
	}
	if b, _ := os.ReadFile(victim); string(b) != "ssh-ed25519 AAAA the owner's key\n" {
		t.Errorf("the file outside became %q", b)
	}
	if fi, err := os.Lstat(filepath.Join(results.Name(), "b", "result.json")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("b/result.json: %v %v; want the result, a file in place of the link", fi, err)
	}
	if !strings.Contains(out.String(), "could not keep a's result") {
		t.Errorf("the story: %q; want it to say a's result was not kept", out.String())
	}
	if line, ok := run.summary(); ok {
		t.Errorf("summary %q says all is well; a result was not kept", line)
	}
}

// TestFailedTaskLineEscaped: a task whose stderr ends in terminal
// escapes (a title change, a screen clear, a carriage return and a fake
// "succeeded") and whose error holds one too is told in a line where
// each shows escaped and none acts.
func TestFailedTaskLineEscaped(t *testing.T) {
	var out bytes.Buffer
	run := newTaskRun(testResults(t, filepath.Join(t.TempDir(), "results")), newStory(&out))
	run.total = 2
	one := 1
	run.taskEnded(engine.TaskResult{ID: "t1", State: worker.StateFailed, ExitCode: &one,
		Stderr: "working\n\x1b]0;pwned\x07\x1b[2J\x1b[H\rtask t1 succeeded\u202e"})
	run.taskEnded(engine.TaskResult{ID: "t2", State: worker.StateFailed, Error: "oops\x1b[2K\rtask t2 succeeded"})
	got := out.String()
	if strings.ContainsAny(got, "\x1b\x07\r\u202e") {
		t.Errorf("the story holds a raw control or bidi character: %q", got)
	}
	for _, want := range []string{
		`task t1 failed (exit 1); stderr: \u001b]0;pwned\u0007\u001b[2J\u001b[H\u000dtask t1 succeeded\u202e`,
		`task t2 failed: oops\u001b[2K\u000dtask t2 succeeded`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the story %q lacks %q", got, want)
		}
	}
}
