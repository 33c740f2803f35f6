package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

// The attacks on the task surface (issue 47), each against a real
// engine: a worker holding a credential speaks the protocol by hand
// (testWorker) where the attack is the worker's, and the real
// fluksio-worker process runs the task where the attack is another
// local user's.

// startRealWorker runs the fluksio-worker binary against e as worker
// name of one CPU, its provisioner having reported it as job; cleanup
// kills it and logs what it said.
func startRealWorker(t *testing.T, e *Engine, name, job string) *lockedBuffer {
	t.Helper()
	return startSlotWorker(t, e, name, job, "1", "0", nil, nil)
}

// TestTaskInputSwappedForALink: an input in a directory another user
// can write is swapped, after Submit, for a symbolic link to a secret of
// the engine's user. The real worker's fetch gets a refusal (410) and
// none of the secret's bytes: the task fails saying the input is not as
// it was, the command never runs, and no byte of the secret is in the
// task's streams, its directory or the worker's words.
func TestTaskInputSwappedForALink(t *testing.T) {
	t.Parallel()
	e := taskEngine(t, Config{TaskDir: filepath.Join(t.TempDir(), "tasks")})
	secret := []byte("-----BEGIN OPENSSH PRIVATE KEY----- the engine's own, 0600 -----END OPENSSH PRIVATE KEY-----\n")
	private := t.TempDir()
	secretPath := filepath.Join(private, "id_ed25519")
	if err := os.WriteFile(secretPath, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	common := t.TempDir()
	if err := os.Chmod(common, 0o777); err != nil {
		t.Fatal(err)
	}
	in := filepath.Join(common, "in.txt")
	if err := os.WriteFile(in, []byte("the operator's input\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	id, err := e.Submit(TaskSpec{ID: "swapped", Need: shared.Need{CPUs: 1}, Command: []string{"cat", "in.txt"},
		Inputs: []Input{{Name: "in.txt", Path: in}}})
	if err != nil {
		t.Fatal(err)
	}
	// Another user's move, between Submit and the worker's fetch.
	if err := os.Remove(in); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secretPath, in); err != nil {
		t.Fatal(err)
	}
	said := startRealWorker(t, e, "slurm-swap", "401")
	res := waitTask(t, e, id, "the task's end", ended)
	if res.State != worker.StateFailed || !strings.Contains(res.Error, `input "in.txt" (`+in+`) is not as it was when task swapped was submitted`) ||
		!strings.Contains(res.Error, "is a symbolic link") {
		t.Errorf("the task: %s %q; want failed, saying the input is not as it was", res.State, res.Error)
	}
	if res.ExitCode != nil || res.Stdout != "" {
		t.Errorf("the command ran: exit %v, stdout %q", res.ExitCode, res.Stdout)
	}
	needle := secret[:24]
	if bytes.Contains([]byte(res.Error+res.Stdout+res.Stderr), needle) || strings.Contains(said.String(), string(needle)) {
		t.Errorf("the secret reached the task or the worker:\n%+v\n%s", res, said)
	}
	filepath.WalkDir(filepath.Dir(e.TaskDir(id)), func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if b, _ := os.ReadFile(p); bytes.Contains(b, needle) {
				t.Errorf("the secret is in %s", p)
			}
		}
		return nil
	})
}

// TestTaskOutputInodesBounded: a worker that makes directories with its
// output paths is stopped at TaskLimits.Files (files and directories,
// 10,000 by default): deep paths of 400 directories each, then one new
// directory a PUT, up to 100,000 PUTs, are answered 413 once the task's
// inodes reach the bound, nothing past it is made on the engine's disk,
// and the task fails saying the limit.
func TestTaskOutputInodesBounded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		path func(i int) string
	}{
		{"deep", func(i int) string { return fmt.Sprintf("out/%d/", i) + strings.Repeat("d/", 400) + "f" }},
		{"wide", func(i int) string { return fmt.Sprintf("out/%d/f", i) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := taskEngine(t, Config{TaskDir: filepath.Join(t.TempDir(), "tasks")})
			spec := commandTask("inodes-" + tc.name)
			spec.Outputs = []string{"out"}
			id, err := e.Submit(spec)
			if err != nil {
				t.Fatal(err)
			}
			w := joinWorker(t, e, "slurm-inodes-"+tc.name, worker.FeatureCommand)
			task := w.take()
			puts, refusedAt := 0, 0
			for i := range 100000 {
				puts++
				status, body := w.putOutput(task.ID, tc.path(i), nil)
				if status == http.StatusRequestEntityTooLarge {
					if !strings.Contains(body, "limit of 10000 files and directories") {
						t.Fatalf("PUT %d: 413 %s; want the files limit said", i, body)
					}
					if refusedAt == 0 {
						refusedAt = i
					}
					if i >= refusedAt+100 {
						break
					}
					continue
				}
				if status != http.StatusNoContent || refusedAt != 0 {
					t.Fatalf("PUT %d: %d %s; want 204 until the bound, then 413 only", i, status, body)
				}
			}
			inodes := 0
			filepath.WalkDir(filepath.Join(e.TaskDir(id), "outputs"), func(p string, d fs.DirEntry, err error) error {
				if err == nil {
					inodes++
				}
				return nil
			})
			inodes-- // outputs/ itself is the engine's
			t.Logf("%s: %d PUTs, the first 413 at PUT %d; %d inodes under outputs/ (the bound 10000)", tc.name, puts, refusedAt, inodes)
			if refusedAt == 0 || inodes > 10000 {
				t.Errorf("%d inodes made under outputs/, first 413 at PUT %d; want at most 10000, then 413", inodes, refusedAt)
			}
			if res, _ := e.Task(id); res.State != TaskRunning {
				t.Fatalf("the task: %+v", res)
			}
			w.report(worker.ResultRequest{TaskID: task.ID, State: worker.StateSucceeded})
			res := waitTask(t, e, id, "the task's end", ended)
			if res.State != worker.StateFailed || !strings.Contains(res.Error, "limit of 10000 files and directories") {
				t.Errorf("the task: %s %q; want failed at the files limit", res.State, res.Error)
			}
		})
	}
}

// TestEndedTasksMemoryBounded: 300 tasks whose worker reports each with
// an error of 1 MB (as much as a result may carry) cost the engine's
// live heap less than maxEndedHeap (docs/security.md): an error is kept
// to maxErrorText bytes, the cut said.
func TestEndedTasksMemoryBounded(t *testing.T) {
	const tasks = 300
	const maxEndedHeap = 8 << 20
	// The log goes nowhere: a test's log is kept in memory, where the
	// engine's goes to its stderr.
	e := taskEngine(t, Config{Logger: hclog.NewNullLogger()})
	w := joinWorker(t, e, "slurm-mem", worker.FeatureCommand)
	huge := strings.Repeat("x", worker.MaxResultBody-4096)
	before := liveHeap()
	for i := range tasks {
		id, err := e.Submit(commandTask(fmt.Sprintf("mem-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		task := w.take()
		body := append(fmt.Appendf(nil, `{"task_id": %q, "state": "failed", "error": "`, task.ID), huge...)
		if resp, answer := w.do("POST", "/v1/result", bytes.NewReader(append(body, `"}`...)), nil); resp.StatusCode != http.StatusNoContent {
			t.Fatalf("result %d: %d %s", i, resp.StatusCode, answer)
		}
		waitTask(t, e, id, "the task's end", ended)
	}
	after := liveHeap()
	grew := int64(after) - int64(before)
	t.Logf("%d tasks ended with %d-byte errors: the live heap grew %.1f MB; %s", tasks, len(huge), float64(grew)/(1<<20), processMemory())
	if grew > maxEndedHeap {
		t.Errorf("the live heap grew %d MB; want under %d MB", grew>>20, maxEndedHeap>>20)
	}
	res, _ := e.Task("mem-0")
	if len(res.Error) > maxErrorText+64 || !strings.HasSuffix(res.Error, fmt.Sprintf("… [%d bytes cut]", len(huge)-maxErrorText)) {
		t.Errorf("a kept error: %d bytes ending %q; want %d and the cut said", len(res.Error), res.Error[max(0, len(res.Error)-40):], maxErrorText)
	}
}

// TestResultCannotForgeItsJob: a result whose body names another job,
// host and worker is recorded with the attach's: the provisioner
// verified that job at the attach, the body is the worker's word.
func TestResultCannotForgeItsJob(t *testing.T) {
	t.Parallel()
	var got Result
	results := make(chan Result, 1)
	e := taskEngine(t, Config{Hooks: Hooks{Result: func(r Result) { results <- r }}})
	id, err := e.Submit(commandTask("forged"))
	if err != nil {
		t.Fatal(err)
	}
	w := joinWorker(t, e, "slurm-forge", worker.FeatureCommand)
	task := w.take()
	body := fmt.Appendf(nil, `{"task_id": %q, "worker": "another", "provisioner": "other", "hostname": "elsewhere", "job_id": "999_9", "cpus": 4, "state": "succeeded", "exit_code": 0}`, task.ID)
	if resp, answer := w.do("POST", "/v1/result", bytes.NewReader(body), nil); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("result: %d %s", resp.StatusCode, answer)
	}
	res := waitTask(t, e, id, "the task's end", ended)
	got = <-results
	if len(res.Attempts) != 1 || res.Attempts[0].JobID != "77" || res.Attempts[0].Hostname != "n-slurm-forge" ||
		res.Attempts[0].Worker != "slurm-forge" || res.Attempts[0].Provisioner != testProvisioner ||
		got.JobID != "77" || got.Hostname != "n-slurm-forge" || got.Worker != "slurm-forge" {
		t.Errorf("recorded %+v, hook heard %+v; want job 77 on n-slurm-forge by slurm-forge, as attached", res.Attempts, got)
	}
	b, _ := json.Marshal(res)
	if bytes.Contains(b, []byte("999_9")) || bytes.Contains(b, []byte("elsewhere")) {
		t.Errorf("the result (result.json) holds the body's words: %s", b)
	}
}

// TestOutputFinalAtResult: an upload of an output still open when the
// attempt's result is accepted is cut and refused 409, and one begun
// after is refused too: the output stays as the result recorded it, on
// disk and in the task's sha256.
func TestOutputFinalAtResult(t *testing.T) {
	t.Parallel()
	e := taskEngine(t, Config{TaskDir: filepath.Join(t.TempDir(), "tasks")})
	spec := commandTask("final")
	spec.Outputs = []string{"out"}
	id, err := e.Submit(spec)
	if err != nil {
		t.Fatal(err)
	}
	w := joinWorker(t, e, "slurm-final", worker.FeatureCommand)
	task := w.take()
	recorded := randomBytes(5000, 7)
	if status, body := w.putOutput(task.ID, "out", recorded); status != http.StatusNoContent {
		t.Fatalf("PUT out: %d %s", status, body)
	}
	// A second upload of out, left open.
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("PUT", w.base+"/v1/work/"+task.ID+"/outputs/out", pr)
	req.Header.Set("Authorization", "Bearer "+w.token)
	req.Header.Set(worker.SessionHeader, w.session)
	type answer struct {
		status int
		body   string
		err    error
	}
	answered := make(chan answer, 1)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	go func() {
		resp, err := client.Do(req)
		if err != nil {
			answered <- answer{err: err}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answered <- answer{status: resp.StatusCode, body: string(b)}
	}()
	if _, err := pw.Write(bytes.Repeat([]byte("rewritten "), 100)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the second upload to be under way", func() bool {
		m, _ := filepath.Glob(filepath.Join(e.TaskDir(id), ".partial-*"))
		return len(m) == 1
	})
	zero := 0
	if status := w.report(worker.ResultRequest{TaskID: task.ID, State: worker.StateSucceeded, ExitCode: &zero,
		Outputs: []worker.File{{Name: "out", Size: int64(len(recorded)), SHA256: sha(recorded)}}}); status != http.StatusNoContent {
		t.Fatalf("result: %d", status)
	}
	go func() {
		pw.Write(bytes.Repeat([]byte("rewritten "), 10000))
		pw.Close()
	}()
	a := <-answered
	pr.CloseWithError(io.ErrClosedPipe)
	if a.err == nil && (a.status != http.StatusConflict || !strings.Contains(a.body, "outputs and streams are final")) {
		t.Errorf("the upload open at the result: %d %s; want 409, the outputs final", a.status, a.body)
	}
	if status, body := w.putOutput(task.ID, "out", []byte("after")); status != http.StatusConflict {
		t.Errorf("an upload after the result: %d %s; want 409", status, body)
	}
	res := waitTask(t, e, id, "the task's end", ended)
	got, err := os.ReadFile(filepath.Join(e.TaskDir(id), "outputs", "out"))
	if res.State != worker.StateSucceeded || len(res.Outputs) != 1 || res.Outputs[0].SHA256 != sha(recorded) || err != nil || !bytes.Equal(got, recorded) {
		t.Errorf("the task: %s %q outputs %+v; on disk %d bytes sha256 %s (%v); want succeeded with out as recorded (%s)",
			res.State, res.Error, res.Outputs, len(got), sha(got), err, sha(recorded))
	}
	if m, _ := filepath.Glob(filepath.Join(e.TaskDir(id), ".partial-*")); len(m) != 0 {
		t.Errorf("partial files left: %v", m)
	}
}

// TestTaskDirIsTheEngines: Config.TaskDir owned by another uid, or
// writable by others, is refused at Serve, saying which and the fix;
// and a link put in it as a task's directory while the task runs leads
// none of the worker's bytes out of it: its stream and its output are
// refused, and nothing is written where the link points.
func TestTaskDirIsTheEngines(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("chowns to uid 65534: needs root")
	}
	for _, tc := range []struct {
		name  string
		setup func(dir string)
		want  string
	}{
		{"another uid's", func(dir string) { os.Chown(dir, 65534, 65534) }, "is owned by uid 65534, not the engine's user (uid 0)"},
		{"writable by others", func(dir string) { os.Chmod(dir, 0o777) }, "is writable by group or others (mode 0777)"},
	} {
		dir := filepath.Join(t.TempDir(), "tasks")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		tc.setup(dir)
		e, err := New(Config{Secret: testSecret, ID: "test", Listen: "127.0.0.1:0", TaskDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		err = e.Serve(e.Mux(nil, false))
		e.Stop(t.Context())
		if err == nil || !strings.Contains(err.Error(), "task directory "+dir+" "+tc.want) {
			t.Errorf("%s: Serve: %v; want %q", tc.name, err, tc.want)
		}
	}

	e := taskEngine(t, Config{TaskDir: filepath.Join(t.TempDir(), "tasks")})
	spec := commandTask("linked")
	spec.Outputs = []string{"out"}
	id, err := e.Submit(spec)
	if err != nil {
		t.Fatal(err)
	}
	w := joinWorker(t, e, "slurm-linked", worker.FeatureCommand)
	task := w.take()
	outside := t.TempDir()
	if err := os.Symlink(outside, e.TaskDir(id)); err != nil {
		t.Fatal(err)
	}
	if status, _ := w.appendLog(task.ID, "stdout", 0, []byte("through the link\n")); status/100 == 2 {
		t.Errorf("a stream through the link: %d; want refused", status)
	}
	if status, body := w.putOutput(task.ID, "out", []byte("through the link\n")); status/100 == 2 {
		t.Errorf("an output through the link: %d %s; want refused", status, body)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("written where the link points: %v", entries)
	}
}

// TestOperatorEndpointsRefuseWebPages: what a web page in the
// operator's browser can send is refused 403 on the operator's
// endpoints, from the engine's own uid on loopback: a cross-site form's
// text/plain POST to /v1/tasks/ID/cancel (the task is not cancelled), a
// POST with no Content-Type, one from another Origin even with the
// header, and any request whose Host is another name (DNS rebinding) on
// /status, /v1/tasks/ID, /v1/events and /metrics. The engine's own
// address, 127.0.0.1, localhost and [::1] at its port, a configured
// name, and a POST with the header or application/json are answered.
func TestOperatorEndpointsRefuseWebPages(t *testing.T) {
	t.Parallel()
	e := taskEngine(t, Config{OperatorHosts: []string{"engine.internal"}})
	id, err := e.Submit(commandTask("page-1"))
	if err != nil {
		t.Fatal(err)
	}
	port := e.URL()[strings.LastIndex(e.URL(), ":")+1 : len(e.URL())-1]
	do := func(method, path, host string, header http.Header, body string) (int, string) {
		req, _ := http.NewRequest(method, e.URL()+strings.TrimPrefix(path, "/"), strings.NewReader(body))
		if body == "" {
			req.Body = nil
		}
		if host != "" {
			req.Host = host
		}
		for k, v := range header {
			req.Header[k] = v
		}
		// An event stream answered 200 never ends: the client's timeout
		// cuts it.
		client := &http.Client{Timeout: 2 * time.Second}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return resp.StatusCode, string(b)
	}
	cancel := "/v1/tasks/" + id + "/cancel"
	for _, tc := range []struct {
		name, method, path, host string
		header                   http.Header
		body                     string
		want                     string
	}{
		{"a form's text/plain POST", "POST", cancel, "", http.Header{"Content-Type": {"text/plain"}, "Origin": {"http://evil.example"}, "Sec-Fetch-Site": {"cross-site"}}, "x=y", "Origin"},
		{"a form's POST without Origin", "POST", cancel, "", http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}, "x=y", "needs the header Fluksio-Operator"},
		{"a no-cors POST with no body", "POST", cancel, "", nil, "", "needs the header Fluksio-Operator"},
		{"a cross-site POST with the header", "POST", cancel, "", http.Header{OperatorHeader: {"1"}, "Sec-Fetch-Site": {"cross-site"}}, "", "cross-site"},
		{"another Origin with the header", "POST", cancel, "", http.Header{OperatorHeader: {"1"}, "Origin": {"http://127.0.0.1:1"}}, "", "Origin"},
		{"a foreign Host on /status", "GET", "/status", "evil.example", nil, "", `Host \"evil.example\" is not this engine's address`},
		{"a foreign Host with the port on /status", "GET", "/status", "evil.example:" + port, nil, "", "is not this engine's address"},
		{"a foreign Host on the task", "GET", "/v1/tasks/" + id, "evil.example", nil, "", "is not this engine's address"},
		{"a foreign Host on the events", "GET", "/v1/events", "evil.example", nil, "", "is not this engine's address"},
		{"a foreign Host on the metrics", "GET", "/metrics", "evil.example", nil, "", "is not this engine's address"},
		{"another port", "GET", "/status", "127.0.0.1:1", nil, "", "is not this engine's address"},
		{"a foreign Host on the cancel", "POST", cancel, "evil.example", http.Header{OperatorHeader: {"1"}}, "", "is not this engine's address"},
	} {
		if status, body := do(tc.method, tc.path, tc.host, tc.header, tc.body); status != http.StatusForbidden || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d %.200s; want 403 saying %q", tc.name, status, body, tc.want)
		}
	}
	if res, _ := e.Task(id); res.State != TaskWaiting {
		t.Fatalf("a refused request changed the task: %s", res.State)
	}
	for _, host := range []string{"", "localhost:" + port, "[::1]:" + port, "engine.internal", "engine.internal:" + port} {
		if status, body := do("GET", "/status", host, nil, ""); status != http.StatusOK {
			t.Errorf("GET /status as Host %q: %d %.200s; want 200", host, status, body)
		}
	}
	if status, body := do("POST", cancel, "", http.Header{"Content-Type": {"application/json"}, "Origin": {strings.TrimSuffix(e.URL(), "/")}}, "{}"); status != http.StatusNoContent {
		t.Errorf("a same-origin JSON cancel: %d %s; want 204", status, body)
	}
	if res, _ := e.Task(id); res.State != worker.StateCancelled {
		t.Errorf("after the operator's cancel: %s", res.State)
	}
}

// TestWorkerErrorCutAfterEscaping: a task keeps at most maxErrorText
// bytes of a worker's error as shown, escapes included: 4 KiB of
// control characters, each 6 bytes escaped, are not kept as 24 KiB.
func TestWorkerErrorCutAfterEscaping(t *testing.T) {
	t.Parallel()
	e := taskEngine(t, Config{})
	w := joinWorker(t, e, "slurm-esc", worker.FeatureCommand)
	id, err := e.Submit(commandTask("esc"))
	if err != nil {
		t.Fatal(err)
	}
	task := w.take()
	w.report(worker.ResultRequest{TaskID: task.ID, State: worker.StateFailed, Error: strings.Repeat("\x1b", maxErrorText)})
	waitTask(t, e, id, "the task's end", ended)
	res, _ := e.Task(id)
	if len(res.Error) > maxErrorText+32 || !strings.HasPrefix(res.Error, `\u001b`) || !strings.Contains(res.Error, " bytes cut]") {
		t.Errorf("the kept error is %d bytes (%q…); want at most %d, escaped, the cut said", len(res.Error), res.Error[:min(len(res.Error), 24)], maxErrorText)
	}
}
