package slurm

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/internal/testutil"
	"github.com/fluksio/provision/shared"
)

// runScript runs a login-node script with sh, as ssh's remote shell
// would, with HOME set to home and stdin as its input; it returns its
// exit code and what it said.
func runScript(t *testing.T, home, script string, stdin []byte) (int, string) {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + home}
	cmd.Stdin = bytes.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	}
	t.Fatalf("sh: %v", err)
	return 0, ""
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

// TestWorkerShipScripts runs the login node's scripts for the shipped
// worker with a real sh in a home of its own: the check finds nothing
// and asks for a copy; the upload puts the copy in place, private, and
// removes other versions' copies unused for an hour and nothing else; an
// upload whose bytes do not match leaves nothing; the check then passes
// and marks the copy used, and fails again once the copy is replaced.
func TestWorkerShipScripts(t *testing.T) {
	home := t.TempDir()
	data := []byte("#!/bin/sh\necho the worker\n")
	sum := sha256Hex(data)
	dir := filepath.Join(home, workerShipDir)
	copyPath := filepath.Join(dir, workerFile(sum))

	if code, out := runScript(t, home, workerCheckScript(sum), nil); code != exitNoBinary {
		t.Fatalf("check in an empty home: exit %d (%q), want %d", code, out, exitNoBinary)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Errorf("the check made %s; it must change nothing", dir)
	}

	// What a directory of ours may already hold: another version's
	// copy unused for two hours (goes), one used a minute ago (stays:
	// another engine of the account may run it), an upload cut short
	// two hours ago (goes), and files not of our naming (stay, however
	// old).
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * time.Hour)
	for name, mtime := range map[string]time.Time{
		workerProgram + "-0000000000000000": old,
		workerProgram + "-1111111111111111": time.Now().Add(-time.Minute),
		".upload.4242":                      old,
		workerProgram + "-notours":          old,
		"notes.txt":                         old,
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}

	// Bytes that do not match the sum: refused, nothing left.
	if code, _ := runScript(t, home, workerUploadScript(sum), []byte("garbled")); code == 0 {
		t.Errorf("an upload of bytes that do not match its sha256 succeeded")
	}
	if got := names(t, dir); slices.Contains(got, workerFile(sum)) || slices.ContainsFunc(got, func(n string) bool { return strings.HasPrefix(n, ".upload.") && n != ".upload.4242" }) {
		t.Errorf("a refused upload left %v", got)
	}

	if code, out := runScript(t, home, workerUploadScript(sum), data); code != 0 {
		t.Fatalf("upload: exit %d: %s", code, out)
	}
	got, err := os.ReadFile(copyPath)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the copy holds %q (%v), want the uploaded bytes", got, err)
	}
	for p, want := range map[string]os.FileMode{dir: 0o700, copyPath: 0o700} {
		if st, err := os.Stat(p); err != nil || st.Mode().Perm() != want {
			t.Errorf("%s: mode %v (%v), want %v", p, st.Mode().Perm(), err, want)
		}
	}
	want := []string{"notes.txt", workerProgram + "-1111111111111111", workerFile(sum), workerProgram + "-notours"}
	if got := names(t, dir); !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))) {
		t.Errorf("after the upload the directory holds %v, want %v", got, want)
	}

	// The check passes, and marks the copy used.
	if err := os.Chtimes(copyPath, old, old); err != nil {
		t.Fatal(err)
	}
	if code, out := runScript(t, home, workerCheckScript(sum), nil); code != 0 {
		t.Fatalf("check of a good copy: exit %d: %s", code, out)
	}
	if st, _ := os.Stat(copyPath); time.Since(st.ModTime()) > time.Hour {
		t.Errorf("the check did not mark the copy used: modified %s", st.ModTime())
	}
	// A copy replaced under the same name is asked for again.
	if err := os.WriteFile(copyPath, []byte("#!/bin/sh\necho another\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	if code, _ := runScript(t, home, workerCheckScript(sum), nil); code != exitNoBinary {
		t.Errorf("check of a replaced copy: exit %d, want %d", code, exitNoBinary)
	}
}

// TestWorkerGuard runs the job script's guard and exec with bash, in a
// directory whose name needs quoting: a copy that matches runs, with its
// arguments; a replaced one is refused with the job's line saying so,
// exit exitWorkerMismatch, and does not run; so is a missing one.
func TestWorkerGuard(t *testing.T) {
	dir := filepath.Join(t.TempDir(), `it's $HOME "here"`)
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	real := []byte("#!/bin/sh\necho \"REAL-WORKER-RAN $*\"\n")
	sum := sha256Hex(real)
	c := workerCopy{path: filepath.Join(dir, workerFile(sum)), sum: sum}
	if err := os.WriteFile(c.path, real, 0o700); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/bash\n" + workerGuard(c) + "\nexec " + shellQuote(c.path) + " --url 'http://e:1/?a&b'\n"
	checkScript(t, []byte(script))
	run := func() (int, string) {
		t.Helper()
		cmd := exec.Command("bash", "-c", script)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode(), string(out)
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0, string(out)
	}
	if code, out := run(); code != 0 || strings.TrimSpace(out) != "REAL-WORKER-RAN --url http://e:1/?a&b" {
		t.Errorf("with the copy in place: exit %d, said %q; want the worker to run with its arguments", code, out)
	}

	if err := os.WriteFile(c.path, []byte("#!/bin/sh\necho SWAPPED-RAN\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	code, out := run()
	if code != exitWorkerMismatch || strings.Contains(out, "RAN") ||
		!strings.Contains(out, "fluksio: the worker "+c.path+" does not match its sha256 "+sum) {
		t.Errorf("with the copy replaced: exit %d, said %q; want exit %d, the line saying so, and nothing run", code, out, exitWorkerMismatch)
	}
	os.Remove(c.path)
	if code, out := run(); code != exitWorkerMismatch || !strings.Contains(out, "does not match its sha256") {
		t.Errorf("with the copy missing: exit %d, said %q; want exit %d saying so", code, out, exitWorkerMismatch)
	}
}

// TestWorkerBinary: the worker to ship is fluksio-worker-<os>-<arch>
// for the login node's kind, else fluksio-worker when that kind is the
// plugin host's own; a login node of another kind without its build
// beside the plugin is an error that says what to build, or to set
// worker_command.
func TestWorkerBinary(t *testing.T) {
	dir := t.TempDir()
	own := filepath.Join(dir, workerProgram)
	if err := os.WriteFile(own, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := workerBinary(dir, uname()+"\n"); err != nil || got != own {
		t.Errorf("on the plugin host's own kind: %q, %v; want %s", got, err, own)
	}
	other, otherArch := "Linux aarch64", "arm64"
	if runtime.GOARCH == "arm64" {
		other, otherArch = "Linux x86_64", "amd64"
	}
	_, err := workerBinary(dir, other)
	if err == nil || !strings.Contains(err.Error(), "fluksio-worker-linux-"+otherArch) || !strings.Contains(err.Error(), "worker_command") {
		t.Errorf("on %s without its build: %v; want an error naming fluksio-worker-linux-%s and worker_command", other, err, otherArch)
	}
	cross := filepath.Join(dir, "fluksio-worker-linux-"+otherArch)
	if err := os.WriteFile(cross, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := workerBinary(dir, other); err != nil || got != cross {
		t.Errorf("on %s with its build: %q, %v; want %s", other, got, err, cross)
	}
	if _, err := workerBinary(dir, "Plan9 mips"); err == nil || !strings.Contains(err.Error(), "worker_command") {
		t.Errorf("on an unknown kind: %v; want an error saying to set worker_command", err)
	}
	for _, u := range []string{uname(), "FreeBSD amd64", "Darwin arm64"} {
		goos, goarch, ok := goPlatform(u)
		if !ok || unameOS[goos] != strings.Fields(u)[0] {
			t.Errorf("goPlatform(%q) = %s %s %v", u, goos, goarch, ok)
		}
	}
}

// TestWorkerCommandUnsetShips: worker_command absent is nil, which
// ships the worker, and validates; an empty list is still an error.
func TestWorkerCommandUnsetShips(t *testing.T) {
	cfg := baseConfig()
	delete(cfg, "worker_command")
	s, diags := parseConfig("hpc", mustJSON(t, cfg))
	if diags.HasErrors() || s.WorkerCommand != nil {
		t.Fatalf("worker_command absent: %v, %q; want valid and nil", diags, s.WorkerCommand)
	}
	cfg["worker_command"] = []string{}
	if _, diags := parseConfig("hpc", mustJSON(t, cfg)); !diags.HasErrors() || !strings.Contains(diags.Error(), "leave it out") {
		t.Errorf("worker_command = []: %v; want an error saying to set it or leave it out", diags)
	}
}

// TestIntegrationWorkerRecheck ships a worker over ssh to the sandbox's
// login node and counts the commands each submission's ensureWorker
// costs: the first asks the login node and copies the worker; the next,
// within workerRecheck, asks nothing; one after workerRecheck (a clock
// moved on) checks again and marks the copy used; one after a job ended
// before its worker attached (recheckWorkerLocked) checks again, and
// copies the worker again when its copy has gone.
func TestIntegrationWorkerRecheck(t *testing.T) {
	sandboxtest.WorkerCopies(t)
	env := sandboxtest.Require(t)
	var mu sync.Mutex // guards now
	now := time.Now()
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	p := New(hclog.NewNullLogger())
	p.sshPath = testutil.LookPath(t, "ssh")
	p.now = clock
	// A worker of its own, so that its version is this test's alone.
	p.files.workerDir = t.TempDir()
	data := []byte("#!/bin/sh\n# a worker shipped by TestIntegrationWorkerRecheck " + time.Now().String() + "\n")
	if err := os.WriteFile(filepath.Join(p.files.workerDir, workerProgram), data, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig()
	cfg["login"], cfg["ssh_port"], cfg["ssh_key"], cfg["known_hosts"] = env.Login, env.Port, env.Key, env.KnownHosts
	delete(cfg, "worker_command")
	resp, err := p.Configure(context.Background(), &shared.ConfigureRequest{Name: "hpc", Config: mustJSON(t, cfg), Host: newFakeHost()})
	if err != nil || resp.Diagnostics.HasErrors() {
		t.Fatalf("Configure: %v %v", err, resp.Diagnostics)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		p.Shutdown(ctx, &shared.ShutdownRequest{})
	})
	// Configure's own reads at start go through the same count: they
	// are over first, and nothing is polled while nothing is
	// outstanding.
	for _, ch := range []chan struct{}{p.poll.adoptTried, p.poll.startReads} {
		select {
		case <-ch:
		case <-time.After(time.Minute):
			t.Fatal("Configure's reads at start did not end within a minute")
		}
	}
	ctx := context.Background()
	s := p.settings()
	ensure := func(what string, wantCalls int64) workerCopy {
		t.Helper()
		before := p.q.Calls()
		c, err := p.files.ensureWorker(ctx, s)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got := p.q.Calls() - before; got != wantCalls {
			t.Errorf("%s: %d commands on the login node, want %d", what, got, wantCalls)
		}
		return c
	}
	c := ensure("the first submission", 2)
	t.Cleanup(func() { os.Remove(c.path) })
	if got, err := os.ReadFile(c.path); err != nil || !bytes.Equal(got, data) || c.sum != sha256Hex(data) || filepath.Base(c.path) != workerFile(c.sum) {
		t.Fatalf("the copy %s holds %q (%v); want the worker beside the plugin", c.path, got, err)
	}
	ensure("a submission a moment later", 0)

	old := time.Now().Add(-2 * time.Hour)
	os.Chtimes(c.path, old, old)
	mu.Lock()
	now = now.Add(workerRecheck + time.Minute)
	mu.Unlock()
	ensure("a submission after workerRecheck", 2)
	if st, err := os.Stat(c.path); err != nil || time.Since(st.ModTime()) > time.Hour {
		t.Errorf("the check after workerRecheck did not mark the copy used: %v %v", st.ModTime(), err)
	}
	ensure("a submission after that", 0)

	os.Remove(c.path)
	p.mu.Lock()
	p.files.recheckWorkerLocked()
	p.mu.Unlock()
	ensure("a submission after a job ended before its worker attached", 2)
	if got, err := os.ReadFile(c.path); err != nil || !bytes.Equal(got, data) {
		t.Errorf("the copy was not made again: %q %v", got, err)
	}
}
