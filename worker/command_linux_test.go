package worker

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/provision/internal/buildinfo"
	"github.com/fluksio/provision/shared"
)

// The command runner, against the test engine (testengine_test.go), with
// real commands as real processes; /proc is where the tests look for
// what is left of them.

// noTaskDirs fails the test if anything is left in a worker's $TMPDIR.
func noTaskDirs(t *testing.T, tmp string) {
	t.Helper()
	entries, err := os.ReadDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("left in $TMPDIR after the result: %s", e.Name())
	}
}

// liveInGroup lists the processes of group pgid that are alive (not
// zombies: this machine's init may never reap a killed orphan).
func liveInGroup(pgid int) []string {
	var live []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(stat, ')')
		f := strings.Fields(string(stat[i+1:]))
		if len(f) >= 3 && f[2] == strconv.Itoa(pgid) && f[0] != "Z" && f[0] != "X" {
			live = append(live, string(stat[:i+1])+" "+f[0])
		}
	}
	return live
}

// alive reports whether process pid is alive (a zombie is not).
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	return f[0] != "Z" && f[0] != "X"
}

// pidsOf waits for task id's stdout to start with a line of two numbers,
// which the tests' commands print: a background child's pid ($!) and
// their own ($$, the group's id, Setpgid).
func pidsOf(t *testing.T, e *testEngine, id string) (child, pgid int) {
	t.Helper()
	e.waitFor(t, "the pids on "+id+"'s stdout", func(e *testEngine) bool {
		return bytes.IndexByte(e.tasks[id].logs[StreamStdout], '\n') >= 0
	})
	line, _, _ := strings.Cut(string(e.task(id).logs[StreamStdout]), "\n")
	if _, err := fmt.Sscan(line, &child, &pgid); err != nil {
		t.Fatalf("stdout %q: %v", line, err)
	}
	// Should the worker fail to, the test kills what it started, by id.
	t.Cleanup(func() {
		syscall.Kill(-pgid, syscall.SIGKILL)
		syscall.Kill(child, syscall.SIGKILL)
	})
	if !alive(child) || len(liveInGroup(pgid)) < 2 {
		t.Fatalf("the command's group %d is not running: child %d alive %v, group %q", pgid, child, alive(child), liveInGroup(pgid))
	}
	return child, pgid
}

// groupGone fails the test if anything of group pgid is alive, the
// backgrounded child included, and then kills what is, by its ids.
func groupGone(t *testing.T, pgid, child int) {
	t.Helper()
	if live := liveInGroup(pgid); len(live) > 0 || alive(child) {
		t.Errorf("the command's group %d outlived its task: %q (child %d alive: %v)", pgid, live, child, alive(child))
		syscall.Kill(-pgid, syscall.SIGKILL)
		syscall.Kill(child, syscall.SIGKILL)
	}
}

// backgrounds is a command that leaves a grandchild running in its group
// and waits for it, having said both pids.
var backgrounds = []string{"sh", "-c", "sleep 600 & echo $! $$; wait"}

// TestCommandInputs: inputs are fetched into the task's directory (one
// in a subdirectory) before the command runs there; one whose bytes do
// not match its digest fails the task, naming it and both digests, and
// the command never runs. The directory is gone once the result is in.
func TestCommandInputs(t *testing.T) {
	t.Parallel()
	e := newTestEngine(t)
	tw := startWorker(t, e, nil)
	a, b := []byte("alpha\n"), []byte("beta, in a directory of its own\n")
	id := e.Add(Task{Requires: []string{FeatureCommand}, Command: []string{"sha256sum", "a.txt", "data/b.txt"},
		Inputs: []File{file("a.txt", a), file("data/b.txt", b)}}, map[string][]byte{"a.txt": a, "data/b.txt": b})
	res := e.Result(t, id)
	want := fmt.Sprintf("%s  a.txt\n%s  data/b.txt\n", sha(a), sha(b))
	if res.State != StateSucceeded || res.ExitCode == nil || *res.ExitCode != 0 || res.Error != "" {
		t.Fatalf("result %+v\n%s", res, tw.log)
	}
	if got := string(e.task(id).logs[StreamStdout]); got != want || res.Stdout != int64(len(want)) {
		t.Errorf("stdout %q (%d bytes said); want %q", got, res.Stdout, want)
	}
	if res.Started.IsZero() || res.Ended.Before(res.Started) {
		t.Errorf("started %s, ended %s", res.Started, res.Ended)
	}
	e.PolledAfter(t, id)
	noTaskDirs(t, tw.tmp)

	ran := filepath.Join(t.TempDir(), "ran")
	tampered := []byte("tampered\n")
	id = e.Add(Task{Requires: []string{FeatureCommand}, Command: []string{"touch", ran}, Inputs: []File{file("a.txt", a)}},
		map[string][]byte{"a.txt": tampered})
	res = e.Result(t, id)
	if res.State != StateFailed || res.ExitCode != nil || !strings.Contains(res.Error, `input "a.txt"`) ||
		!strings.Contains(res.Error, sha(a)) || !strings.Contains(res.Error, sha(tampered)) {
		t.Errorf("a tampered input: %+v", res)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Error("the command ran with a tampered input")
	}
	e.PolledAfter(t, id)
	noTaskDirs(t, tw.tmp)
}

// TestCommandExitCode: a command that exits 3 fails the task with its
// exit code, and what it wrote to stderr reaches the engine.
func TestCommandExitCode(t *testing.T) {
	t.Parallel()
	e := newTestEngine(t)
	tw := startWorker(t, e, nil)
	id := e.Add(Task{Requires: []string{FeatureCommand}, Command: []string{"sh", "-c", "echo out; echo oops >&2; exit 3"}}, nil)
	res := e.Result(t, id)
	if res.State != StateFailed || res.ExitCode == nil || *res.ExitCode != 3 || res.Signal != "" || res.Error != "the command exited with 3" {
		t.Fatalf("result %+v\n%s", res, tw.log)
	}
	logs := e.task(id).logs
	if string(logs[StreamStderr]) != "oops\n" || res.Stderr != 5 || string(logs[StreamStdout]) != "out\n" || res.Stdout != 4 {
		t.Errorf("stdout %q (%d said), stderr %q (%d said)", logs[StreamStdout], res.Stdout, logs[StreamStderr], res.Stderr)
	}
}

// TestCommandLargeStdout: 2 MB of stdout arrives whole and in order, in
// several requests of at most 1 MiB each.
func TestCommandLargeStdout(t *testing.T) {
	t.Parallel()
	e := newTestEngine(t)
	tw := startWorker(t, e, nil)
	const n = 310000
	var want bytes.Buffer
	for i := 1; i <= n; i++ {
		fmt.Fprintln(&want, i)
	}
	if want.Len() < 2_000_000 {
		t.Fatalf("only %d bytes", want.Len())
	}
	id := e.Add(Task{Requires: []string{FeatureCommand}, Command: []string{"seq", "1", strconv.Itoa(n)}}, nil)
	res := e.Result(t, id)
	if res.State != StateSucceeded {
		t.Fatalf("result %+v\n%s", res, tw.log)
	}
	task := e.task(id)
	if !bytes.Equal(task.logs[StreamStdout], want.Bytes()) || res.Stdout != int64(want.Len()) {
		t.Errorf("stdout: %d bytes (%d said), not the %d written, or not in order", len(task.logs[StreamStdout]), res.Stdout, want.Len())
	}
	chunks := task.chunks[StreamStdout]
	if len(chunks) < 2 || slices.Max(chunks) > logChunk {
		t.Errorf("sent in %d requests of %v bytes; want several of at most %d", len(chunks), chunks, logChunk)
	}
	// The stream's buffer starts at firstChunk and grows as seq fills it.
	if slices.Max(chunks) <= firstChunk {
		t.Errorf("sent in %d requests of at most %d bytes; the buffer never grew past %d", len(chunks), slices.Max(chunks), firstChunk)
	}
}

// TestCommandLogLimit: a command whose stdout passes Limits.Log is
// stopped, group and all, the engine has the stream up to the limit and
// never had to refuse any, and the task fails saying so.
func TestCommandLogLimit(t *testing.T) {
	t.Parallel()
	e := newTestEngine(t)
	tw := startWorker(t, e, nil)
	const limit = 100_000
	id := e.Add(Task{Requires: []string{FeatureCommand}, Command: []string{"sh", "-c", "sleep 600 & echo $! $$; yes"},
		Limits: Limits{Log: limit}}, nil)
	res := e.Result(t, id)
	if res.State != StateFailed || res.Error != fmt.Sprintf("stdout beyond the engine's limit of %d bytes", limit) || res.Signal != "SIGTERM" {
		t.Fatalf("result %+v\n%s", res, tw.log)
	}
	task := e.task(id)
	if len(task.logs[StreamStdout]) != limit || res.Stdout != limit {
		t.Errorf("the engine has %d bytes of stdout (%d said); want the limit, %d", len(task.logs[StreamStdout]), res.Stdout, limit)
	}
	if len(e.refusedSnapshot()) > 0 {
		t.Errorf("the engine refused %q", e.refusedSnapshot())
	}
	var child, pgid int
	line, _, _ := strings.Cut(string(task.logs[StreamStdout]), "\n")
	if _, err := fmt.Sscan(line, &child, &pgid); err != nil {
		t.Fatalf("stdout %q: %v", line, err)
	}
	groupGone(t, pgid, child)
}

// TestCommandOutputs: a file and a directory listed in Outputs are
// uploaded, the directory file by file, and reported with their sizes
// and digests; one not there is skipped and said. An output that is a
// symlink, that resolves outside the task's directory, or a directory
// with a symlink in it fails the task and is not sent; an output name
// with ".." fails the task before its command runs; outputs past
// Limits.Outputs are not sent.
func TestCommandOutputs(t *testing.T) {
	t.Parallel()
	e := newTestEngine(t)
	tw := startWorker(t, e, nil)
	id := e.Add(Task{Requires: []string{FeatureCommand},
		Command: []string{"sh", "-c", "mkdir -p res/sub && printf one > out.txt && printf two > res/a && printf three > res/sub/b"},
		Outputs: []string{"out.txt", "res", "missing.txt"}}, nil)
	res := e.Result(t, id)
	if res.State != StateSucceeded {
		t.Fatalf("result %+v\n%s", res, tw.log)
	}
	want := map[string]string{"out.txt": "one", "res/a": "two", "res/sub/b": "three"}
	got := e.task(id).outputs
	if len(got) != len(want) {
		t.Errorf("outputs uploaded: %q; want %q", got, want)
	}
	for name, content := range want {
		if string(got[name]) != content {
			t.Errorf("output %s: %q; want %q", name, got[name], content)
		}
		i := slices.IndexFunc(res.Outputs, func(f File) bool { return f.Name == name })
		if i < 0 || res.Outputs[i] != file(name, []byte(content)) {
			t.Errorf("the result says %+v of %s", res.Outputs, name)
		}
	}
	if !strings.Contains(res.Output, `output "missing.txt": not there, skipped`) {
		t.Errorf("the result does not say missing.txt was not there: %q", res.Output)
	}

	outside := t.TempDir()
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("not the task's"), 0o600); err != nil {
		t.Fatal(err)
	}
	ran := filepath.Join(t.TempDir(), "ran")
	for _, tc := range []struct {
		what, script string
		outputs      []string
		limits       Limits
		wantErr      string
		runs         bool
	}{
		{"a symlink", "ln -s " + secret + " link", []string{"link"}, Limits{}, `output "link" is a symlink`, true},
		{"a path through a symlinked directory", "ln -s " + outside + " d", []string{"d/secret"}, Limits{},
			`output "d/secret" resolves to ` + secret + `, outside the task's directory`, true},
		{"a symlink in a directory", "mkdir res && printf x > res/a && ln -s " + secret + " res/p", []string{"res"}, Limits{},
			`output "res": res/p is a symlink`, true},
		{"a name with ..", "", []string{"../escape"}, Limits{}, `output "../escape": a ".." element`, false},
		{"an absolute name", "", []string{secret}, Limits{}, "an absolute path", false},
		{"outputs past the limit", "printf 0123456789 > a && printf 0123456789 > b", []string{"a", "b"}, Limits{Outputs: 15},
			"outputs beyond the engine's limit of 15 bytes: they come to 20", true},
		{"outputs past the limit with their directories", "mkdir d && printf 0123456789 > d/a", []string{"d"}, Limits{Outputs: 4100},
			"outputs beyond the engine's limit of 4100 bytes: they come to 4106", true},
		{"outputs past the files limit", "mkdir -p d/e && touch d/e/f d/g", []string{"d"}, Limits{Files: 3},
			"outputs beyond the engine's limit of 3 files and directories: they come to 4", true},
	} {
		id := e.Add(Task{Requires: []string{FeatureCommand}, Command: []string{"sh", "-c", "touch " + ran + "; " + tc.script},
			Outputs: tc.outputs, Limits: tc.limits}, nil)
		res := e.Result(t, id)
		if res.State != StateFailed || !strings.Contains(res.Error, tc.wantErr) {
			t.Errorf("%s: result %+v; want failed, saying %q", tc.what, res, tc.wantErr)
		}
		if n := len(e.task(id).outputs); n > 0 || len(res.Outputs) > 0 {
			t.Errorf("%s: %d output(s) sent, %d reported", tc.what, n, len(res.Outputs))
		}
		if _, err := os.Stat(ran); (err == nil) != tc.runs {
			t.Errorf("%s: the command ran: %v; want %v", tc.what, err == nil, tc.runs)
		}
		os.Remove(ran)
		e.PolledAfter(t, id)
		noTaskDirs(t, tw.tmp)
	}
	if refused := e.refusedSnapshot(); len(refused) > 0 {
		t.Errorf("the engine had to refuse %q: the worker should have refused them first", refused)
	}
}

// TestCommandCancel: a cancel on the watch kills the command's whole
// process group (a grandchild it backgrounded included), nothing more
// is uploaded, the task is reported cancelled with the engine's reason,
// and the worker stays for the next task.
func TestCommandCancel(t *testing.T) {
	t.Parallel()
	e := newTestEngine(t)
	tw := startWorker(t, e, nil)
	id := e.Add(Task{Requires: []string{FeatureCommand}, Command: []string{"sh", "-c", "echo data > out.txt; sleep 600 & echo $! $$; wait"},
		Outputs: []string{"out.txt"}}, nil)
	child, pgid := pidsOf(t, e, id)
	e.Cancel(id, "the user asked")
	res := e.Result(t, id)
	if res.State != StateCancelled || res.Error != "cancelled by the engine: the user asked" || res.Signal != "SIGTERM" {
		t.Errorf("result %+v\n%s", res, tw.log)
	}
	groupGone(t, pgid, child)
	if task := e.task(id); len(task.outputs) > 0 || len(res.Outputs) > 0 || task.late > 0 {
		t.Errorf("after the cancel: %d output(s) sent, %d reported, %d transfer(s)", len(task.outputs), len(res.Outputs), task.late)
	}

	next := e.Add(Task{Requires: []string{FeatureCommand}, Command: []string{"true"}}, nil)
	if res := e.Result(t, next); res.State != StateSucceeded {
		t.Errorf("the next task: %+v", res)
	}
	e.PolledAfter(t, next)
	noTaskDirs(t, tw.tmp)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.attaches != 1 || e.detaches != 0 {
		t.Errorf("%d attach(es), %d detach(es); want the worker to stay", e.attaches, e.detaches)
	}
}

// TestCommandTimeout: a command that outlives its timeout is reported
// timed_out; one that ignores SIGTERM (as its grandchild does) is killed
// with SIGKILL after the grace period, group and all.
func TestCommandTimeout(t *testing.T) {
	t.Parallel()
	e := newTestEngine(t)
	const grace = 300 * time.Millisecond
	tw := startWorker(t, e, func(c *Config) { c.KillGrace = grace })
	id := e.Add(Task{Requires: []string{FeatureCommand}, Command: []string{"sleep", "600"}, TimeoutSeconds: 0.2}, nil)
	res := e.Result(t, id)
	if res.State != StateTimedOut || res.Signal != "SIGTERM" || res.Error != "the command outlived its timeout of 200ms" {
		t.Errorf("result %+v\n%s", res, tw.log)
	}

	id = e.Add(Task{Requires: []string{FeatureCommand}, Command: []string{"sh", "-c", "trap '' TERM; sleep 600 & echo $! $$; wait"},
		TimeoutSeconds: 3}, nil) // time for its pids to reach the engine (within 1 s) and be read
	child, pgid := pidsOf(t, e, id)
	res = e.Result(t, id)
	if res.State != StateTimedOut || res.Signal != "SIGKILL" {
		t.Errorf("a command that ignores SIGTERM: %+v\n%s", res, tw.log)
	}
	if took := res.Ended.Sub(res.Started); took < 3*time.Second+grace {
		t.Errorf("killed after %s; the timeout and the grace are %s", took, 3*time.Second+grace)
	}
	groupGone(t, pgid, child)
}

// TestCommandLeave: the engine's leave on the watch kills the command's
// group; the worker reports nothing, removes the task's directory,
// detaches and exits 0.
func TestCommandLeave(t *testing.T) {
	t.Parallel()
	e := newTestEngine(t)
	tw := startWorker(t, e, nil)
	id := e.Add(Task{Requires: []string{FeatureCommand}, Command: backgrounds}, nil)
	child, pgid := pidsOf(t, e, id)
	e.Leave()
	if code := tw.waitExit(t); code != 0 {
		t.Errorf("exit %d; want 0\n%s", code, tw.log)
	}
	groupGone(t, pgid, child)
	noTaskDirs(t, tw.tmp)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.detaches != 1 || e.tasks[id].result != nil {
		t.Errorf("%d detach(es), result %+v; want a detach and no result", e.detaches, e.tasks[id].result)
	}
	if !strings.Contains(tw.log.String(), "attempt_id "+id+") and leaving") {
		t.Errorf("the worker's log does not say it dropped %s:\n%s", id, tw.log)
	}
}

// TestCommandProcess runs the worker as a process of its own (the test
// binary as fluksio-worker, TestMain), with its credential, another
// node's and a Slurm variable in its environment. Its command's
// environment, read from /proc, has neither credential and has the
// task's variables and the Slurm one; SIGTERM to the worker kills the
// command's group, and the worker detaches and exits 0 without a result.
func TestCommandProcess(t *testing.T) {
	t.Parallel()
	e := newTestEngine(t)
	tmp := t.TempDir()
	other := "another-node-credential-9876"
	cmd := exec.Command(os.Args[0], "--url", e.URL(), "--cpus", "2", "--max-idle", "600")
	cmd.Env = append(os.Environ(), asWorkerEnv+"=1", "TMPDIR="+tmp, "SLURM_CPUS_PER_TASK=2",
		shared.WorkerTokenEnv+"="+testToken, shared.WorkerTokenEnv+"_1="+other, "COPY_OF_IT="+testToken)
	var stderr syncBuffer
	// The worker's stdin is a pipe; its command's must be /dev/null.
	cmd.Stdin, cmd.Stderr = strings.NewReader("the worker's, not the command's"), &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Kill()
		<-exited
	}()

	id := e.Add(Task{Name: "render-7", Requires: []string{FeatureCommand}, Command: backgrounds, Env: map[string]string{"GREETING": "hello"}}, nil)
	child, pgid := pidsOf(t, e, id)
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pgid))
	if err != nil {
		t.Fatal(err)
	}
	env := strings.Split(string(environ), "\x00")
	for _, kv := range env {
		if strings.HasPrefix(kv, shared.WorkerTokenEnv) || strings.Contains(kv, testToken) || strings.Contains(kv, other) {
			t.Errorf("the command's environment has %s", kv)
		}
	}
	var dir string
	for _, want := range []string{TaskIDEnv + "=render-7", TaskDirEnv + "=", "SLURM_CPUS_PER_TASK=2", "GREETING=hello", "PATH="} {
		i := slices.IndexFunc(env, func(kv string) bool { return strings.HasPrefix(kv, want) })
		if i < 0 {
			t.Errorf("the command's environment lacks %s", want)
		} else if want == TaskDirEnv+"=" {
			dir = strings.TrimPrefix(env[i], want)
		}
	}
	if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pgid)); err != nil || cwd != dir || filepath.Dir(dir) != tmp {
		t.Errorf("the command runs in %s (%v); %s is %s, under $TMPDIR %s", cwd, err, TaskDirEnv, dir, tmp)
	}
	if stdin, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/0", pgid)); err != nil || stdin != os.DevNull {
		t.Errorf("the command's stdin is %s (%v); want %s", stdin, err, os.DevNull)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Errorf("the worker exited: %v; want 0\n%s", err, &stderr)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the worker did not exit on SIGTERM:\n%s", &stderr)
	}
	groupGone(t, pgid, child)
	noTaskDirs(t, tmp)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.detaches != 1 || e.tasks[id].result != nil {
		t.Errorf("%d detach(es), result %+v; want a detach and no result", e.detaches, e.tasks[id].result)
	}
	if s := stderr.String(); strings.Contains(s, testToken) || strings.Contains(s, other) {
		t.Errorf("a credential is in the worker's log:\n%s", s)
	}
}

// TestRefusesFeature: a command worker attaches with the command
// feature, and refuses a task requiring one it lacks, in the protocol's
// words, without running its command; a task setting the credential's
// variable is refused too.
func TestRefusesFeature(t *testing.T) {
	t.Parallel()
	e := newTestEngine(t)
	startWorker(t, e, nil)
	ran := filepath.Join(t.TempDir(), "ran")
	id := e.Add(Task{Requires: []string{FeaturePayload}, Command: []string{"touch", ran}, Payload: []byte("x")}, nil)
	res := e.Result(t, id)
	want := fmt.Sprintf("this worker cannot run payload tasks (fluksio-worker %s)", buildinfo.Read().Version)
	if res.State != StateFailed || res.Error != want {
		t.Errorf("result %+v; want failed, saying %q", res, want)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Error("the worker ran a task it cannot run")
	}
	e.mu.Lock()
	features := e.features
	e.mu.Unlock()
	if !slices.Equal(features, []string{FeatureCommand, FeatureSlots}) {
		t.Errorf("attached with features %q; want [command slots]", features)
	}

	id = e.Add(Task{Requires: []string{FeatureCommand}, Command: []string{"touch", ran}, Env: map[string]string{shared.WorkerTokenEnv: "x"}}, nil)
	if res := e.Result(t, id); res.State != StateFailed || !strings.Contains(res.Error, "the worker's credential variable is not the task's to set") {
		t.Errorf("a task setting the credential's variable: %+v", res)
	}
	if _, err := os.Stat(ran); err == nil {
		t.Error("the worker ran a task that sets its credential's variable")
	}
}

// TestCommandEscapee: a process that leaves the command's group
// (setsid) and holds its stdout open does not hold the task: once the
// group is gone and the pipe has been idle a grace period, the worker
// closes it and reports what it had.
func TestCommandEscapee(t *testing.T) {
	t.Parallel()
	e := newTestEngine(t)
	tw := startWorker(t, e, func(c *Config) { c.KillGrace = 300 * time.Millisecond })
	// The command ends once the escapee, in a session of its own, has
	// said its pid through the fifo.
	id := e.Add(Task{Requires: []string{FeatureCommand},
		Command: []string{"sh", "-c", `mkfifo f; setsid sh -c 'echo $$ > f; exec sleep 600' & cat f`}}, nil)
	e.waitFor(t, "the escapee's pid", func(e *testEngine) bool {
		return bytes.IndexByte(e.tasks[id].logs[StreamStdout], '\n') >= 0
	})
	var pid int
	if _, err := fmt.Sscan(string(e.task(id).logs[StreamStdout]), &pid); err != nil || pid <= 0 {
		t.Fatalf("stdout %q: %v", e.task(id).logs[StreamStdout], err)
	}
	// Not the worker's to kill: it left the group. The test's, then.
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	res := e.Result(t, id)
	if !alive(pid) {
		t.Fatalf("the escapee %d was not running when the result came", pid)
	}
	if res.State != StateSucceeded || res.Stdout != int64(len(e.task(id).logs[StreamStdout])) {
		t.Errorf("result %+v\n%s", res, tw.log)
	}
	if !strings.Contains(tw.log.String(), "a process outside the command's group holds its stdout") {
		t.Errorf("the worker's log does not say why it closed stdout:\n%s", tw.log)
	}
}

// TestCommandLeftovers: what a command leaves running in its group when
// it exits is stopped before the result is sent: nothing of a task
// outlives it on the node.
func TestCommandLeftovers(t *testing.T) {
	t.Parallel()
	e := newTestEngine(t)
	tw := startWorker(t, e, nil)
	id := e.Add(Task{Requires: []string{FeatureCommand}, Command: []string{"sh", "-c", "sleep 600 & echo $! $$"}}, nil)
	res := e.Result(t, id)
	if res.State != StateSucceeded {
		t.Errorf("result %+v\n%s", res, tw.log)
	}
	var child, pgid int
	if _, err := fmt.Sscan(string(e.task(id).logs[StreamStdout]), &child, &pgid); err != nil {
		t.Fatalf("stdout %q: %v", e.task(id).logs[StreamStdout], err)
	}
	groupGone(t, pgid, child)
}

// TestCommandCannotReadTheWorker: a command runs as its worker's user,
// and the worker's /proc/PID/environ holds the credential; the worker
// makes itself undumpable, so the command cannot read it. Root reads
// every process's environ, so when the test runs as root the worker
// runs as nobody, as a job's worker runs as its job's user.
func TestCommandCannotReadTheWorker(t *testing.T) {
	t.Parallel()
	e := newTestEngine(t)
	dir, err := os.MkdirTemp("", "worker-as-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin, tmp := filepath.Join(dir, "worker"), filepath.Join(dir, "tmp")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--url", e.URL(), "--cpus", "1", "--max-idle", "600")
	cmd.Env = []string{asWorkerEnv + "=1", "PATH=" + os.Getenv("PATH"), "TMPDIR=" + tmp, shared.WorkerTokenEnv + "=" + testToken}
	if os.Geteuid() == 0 {
		const nobody = 65534
		for _, p := range []string{dir, bin, tmp} {
			if err := os.Chown(p, nobody, nobody); err != nil {
				t.Fatal(err)
			}
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Errorf("the worker did not exit on SIGTERM:\n%s", &stderr)
		}
	}()

	id := e.Add(Task{Requires: []string{FeatureCommand},
		Command: []string{"sh", "-c", "id -u; cat /proc/$PPID/environ >/dev/null 2>&1 && echo read || echo denied"}}, nil)
	res := e.Result(t, id)
	out := string(e.task(id).logs[StreamStdout])
	if res.State != StateSucceeded || !strings.HasSuffix(out, "\ndenied\n") || strings.HasPrefix(out, "0\n") {
		t.Errorf("the command (uid, then whether it read its worker's environ): %q; result %+v\n%s", out, res, &stderr)
	}
}

// TestCommandKilledWithItsJob: Slurm ends a job (scancel, the walltime)
// by signalling every process of it at once, the command sometimes
// before the worker. A command killed by a signal the worker did not
// send, with the worker's own stop right after, is the job's loss: the
// task is dropped unreported, for the engine to run again, not reported
// failed. Without the worker's stop it is a failure, with the signal.
func TestCommandKilledWithItsJob(t *testing.T) {
	t.Parallel()
	t.Run("the worker stopped too", func(t *testing.T) {
		t.Parallel()
		e := newTestEngine(t)
		tw := startWorker(t, e, nil)
		id := e.Add(Task{Requires: []string{FeatureCommand}, Command: backgrounds}, nil)
		child, pgid := pidsOf(t, e, id)
		syscall.Kill(-pgid, syscall.SIGTERM)
		// The worker's own signal, half a second later: the pause
		// stands for Slurm's order of signals (shorter than
		// outsideSignalWait); it synchronises nothing.
		waitGroupGone(t, pgid, child)
		time.Sleep(500 * time.Millisecond)
		tw.stop()
		if code := tw.waitExit(t); code != 0 {
			t.Errorf("exit %d\n%s", code, tw.log)
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.tasks[id].result != nil || e.detaches != 1 {
			t.Errorf("result %+v, %d detach(es); want no result and a detach\n%s", e.tasks[id].result, e.detaches, tw.log)
		}
	})
	t.Run("the command alone", func(t *testing.T) {
		t.Parallel()
		e := newTestEngine(t)
		tw := startWorker(t, e, nil)
		id := e.Add(Task{Requires: []string{FeatureCommand}, Command: backgrounds}, nil)
		_, pgid := pidsOf(t, e, id)
		syscall.Kill(-pgid, syscall.SIGTERM)
		res := e.Result(t, id)
		if res.State != StateFailed || res.Signal != "SIGTERM" {
			t.Errorf("result %+v; want failed by SIGTERM\n%s", res, tw.log)
		}
	})
}

// waitGroupGone waits until the command's processes are gone.
func waitGroupGone(t *testing.T, pids ...int) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		alive := false
		for _, p := range pids {
			if syscall.Kill(p, 0) == nil {
				if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p)); err == nil && !strings.Contains(string(b), ") Z ") {
					alive = true
				}
			}
		}
		if !alive {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("processes %v still alive", pids)
		}
	}
}
