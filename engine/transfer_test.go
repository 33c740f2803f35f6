package engine

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

// randomBytes is n bytes of a fixed sequence, so that failures
// reproduce.
func randomBytes(n int, seed uint64) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{byte(seed)})
	r.Read(b)
	return b
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestTaskInputsOnlyToHolder: a task's inputs go to the worker that
// holds its attempt, byte for byte, from a Path and from Data, a name
// with "/" and a space path-escaped; another attached worker gets 409,
// a detached worker's credential 401, a copied credential without the
// session 401 and with another 403; an input the task has not 404, an
// attempt that is not the worker's 409.
func TestTaskInputsOnlyToHolder(t *testing.T) {
	t.Parallel()
	logger, logs := testLogger(t)
	e := taskEngine(t, Config{Logger: logger})
	big := randomBytes(3<<20+17, 1)
	p := filepath.Join(t.TempDir(), "big.bin")
	if err := os.WriteFile(p, big, 0o600); err != nil {
		t.Fatal(err)
	}
	small := []byte("hello, inputs\n")
	id, err := e.Submit(TaskSpec{ID: "in-1", Need: shared.Need{CPUs: 1}, Command: []string{"sh", "-c", "cat small.txt"},
		Inputs: []Input{{Name: "data/big file.bin", Path: p}, {Name: "small.txt", Data: small}}})
	if err != nil {
		t.Fatal(err)
	}
	holder := joinWorker(t, e, "slurm-in-holder", worker.FeatureCommand)
	task := holder.take()
	wantFiles := []worker.File{{Name: "data/big file.bin", Size: int64(len(big)), SHA256: sha(big)}, {Name: "small.txt", Size: int64(len(small)), SHA256: sha(small)}}
	if task.Name != id || task.Attempt != 1 || !slices.Equal(task.Requires, []string{worker.FeatureCommand}) ||
		!slices.Equal(task.Inputs, wantFiles) || !strings.HasPrefix(task.ID, "task-") {
		t.Fatalf("the task handed out: %+v; want name %s, attempt 1, requires command, inputs %+v", task, id, wantFiles)
	}
	other := joinWorker(t, e, "slurm-in-other", worker.FeatureCommand)
	gone := joinWorker(t, e, "slurm-in-gone", worker.FeatureCommand)
	gone.detach()
	noSession := *holder
	noSession.session = ""
	otherSession := *holder
	otherSession.session = "not-the-session"

	for name, want := range map[string][]byte{"data/big file.bin": big, "small.txt": small} {
		if status, got := holder.input(task.ID, name); status != http.StatusOK || !bytes.Equal(got, want) {
			t.Errorf("holder: input %q: %d, %d bytes (sha256 %s); want 200 and %d bytes (%s)", name, status, len(got), sha(got), len(want), sha(want))
		}
		for _, tc := range []struct {
			who  *testWorker
			what string
			want int
		}{
			{other, "another attached worker", http.StatusConflict},
			{gone, "a detached worker's credential", http.StatusUnauthorized},
			{&noSession, "the holder's credential without its session", http.StatusUnauthorized},
			{&otherSession, "the holder's credential with another session", http.StatusForbidden},
		} {
			if status, got := tc.who.input(task.ID, name); status != tc.want || bytes.Contains(got, want[:8]) {
				t.Errorf("%s: input %q: %d %.80q; want %d and none of its bytes", tc.what, name, status, got, tc.want)
			}
		}
	}
	if status, _ := holder.input(task.ID, "nope.txt"); status != http.StatusNotFound {
		t.Errorf("an input the task has not: %d; want 404", status)
	}
	if status, _ := holder.input("task-999", "small.txt"); status != http.StatusConflict {
		t.Errorf("an attempt the worker does not hold: %d; want 409", status)
	}
	// The refusals are logged, and no credential or session with them.
	for _, w := range []*testWorker{holder, other, gone} {
		if l := logs.String(); strings.Contains(l, w.token) || strings.Contains(l, w.session) {
			t.Errorf("%s's credential or session is in the log", w.name)
		}
	}
}

// TestTaskInputAsSubmitted: an input is served as Submit read it, its
// Content-Length its size (net/http sends it with sendfile, which is told
// where to stop), and a range of it as asked; once the file has grown
// since Submit, it is refused 410 with none of its bytes, and the task
// fails saying so, whatever the worker reports.
func TestTaskInputAsSubmitted(t *testing.T) {
	t.Parallel()
	e := taskEngine(t, Config{})
	want := randomBytes(1<<20+3, 2)
	p := filepath.Join(t.TempDir(), "grows.bin")
	if err := os.WriteFile(p, want, 0o600); err != nil {
		t.Fatal(err)
	}
	id, err := e.Submit(TaskSpec{ID: "grows", Need: shared.Need{CPUs: 1}, Command: []string{"true"},
		Inputs: []Input{{Name: "in.bin", Path: p}}})
	if err != nil {
		t.Fatal(err)
	}
	w := joinWorker(t, e, "slurm-grows", worker.FeatureCommand)
	task := w.take()
	resp, got := w.do("GET", "/v1/work/"+task.ID+"/inputs/in.bin", nil, nil)
	if resp.StatusCode != http.StatusOK || resp.ContentLength != int64(len(want)) || !bytes.Equal(got, want) {
		t.Errorf("the input: %d, Content-Length %d, %d bytes (sha256 %s); want 200 and the %d bytes Submit read (%s)",
			resp.StatusCode, resp.ContentLength, len(got), sha(got), len(want), sha(want))
	}
	resp, got = w.do("GET", "/v1/work/"+task.ID+"/inputs/in.bin", nil, http.Header{"Range": {"bytes=1000-"}})
	if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(got, want[1000:]) {
		t.Errorf("bytes 1000- of the input: %d, %d bytes; want 206 and %d bytes", resp.StatusCode, len(got), len(want)-1000)
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("written after Submit")); err != nil {
		t.Fatal(err)
	}
	f.Close()
	resp, got = w.do("GET", "/v1/work/"+task.ID+"/inputs/in.bin", nil, nil)
	if resp.StatusCode != http.StatusGone || bytes.Contains(got, want[:64]) ||
		!strings.Contains(string(got), "is 1048599 bytes now, 1048579 when the task was submitted") {
		t.Errorf("the input after it grew: %d %.300s; want 410 saying it grew, none of its bytes", resp.StatusCode, got)
	}
	zero := 0
	w.report(worker.ResultRequest{TaskID: task.ID, State: worker.StateSucceeded, ExitCode: &zero})
	res := waitTask(t, e, id, "the task's end", ended)
	if res.State != worker.StateFailed || !strings.Contains(res.Error, `input "in.bin" (`+p+`) is not as it was when task grows was submitted`) {
		t.Errorf("result: %s %q; want failed, saying the input changed", res.State, res.Error)
	}
}

// TestTaskLogAppends: a stream is appended at its size; a repeat of
// bytes the engine has is answered as if appended, a gap or an overlap
// 409, each with the size now in Fluksio-Offset; a stream beyond
// Limits.Log is refused 413, kept as it was, and the task fails when its
// result comes, saying so, whatever the worker reports.
func TestTaskLogAppends(t *testing.T) {
	t.Parallel()
	e := taskEngine(t, Config{TaskLimits: TaskLimits{Log: 64}})
	id, err := e.Submit(commandTask("log-1"))
	if err != nil {
		t.Fatal(err)
	}
	w := joinWorker(t, e, "slurm-log", worker.FeatureCommand)
	task := w.take()
	if task.Limits.Log != 64 {
		t.Errorf("the task's Limits.Log is %d; want 64, the engine's", task.Limits.Log)
	}
	for _, step := range []struct {
		what   string
		stream string
		offset int64
		data   string
		status int
		size   string
	}{
		{"first chunk", "stdout", 0, "hello ", http.StatusNoContent, "6"},
		{"a repeat", "stdout", 0, "hello ", http.StatusNoContent, "6"},
		{"a repeat of a part", "stdout", 2, "llo", http.StatusNoContent, "6"},
		{"a gap", "stdout", 10, "x", http.StatusConflict, "6"},
		{"an overlap", "stdout", 4, "o world", http.StatusConflict, "6"},
		{"the next chunk", "stdout", 6, "world\n", http.StatusNoContent, "12"},
		{"stderr", "stderr", 0, "warn\n", http.StatusNoContent, "5"},
		{"beyond the limit", "stdout", 12, strings.Repeat("x", 53), http.StatusRequestEntityTooLarge, "12"},
		{"not a stream", "stdlog", 0, "x", http.StatusNotFound, ""},
	} {
		status, size := w.appendLog(task.ID, step.stream, step.offset, []byte(step.data))
		if status != step.status || size != step.size {
			t.Errorf("%s: %d, Fluksio-Offset %q; want %d, %q", step.what, status, size, step.status, step.size)
		}
	}
	if got, err := os.ReadFile(filepath.Join(e.TaskDir(id), "stdout")); err != nil || string(got) != "hello world\n" {
		t.Errorf("stdout kept: %q %v; want %q", got, err, "hello world\n")
	}
	if got, _ := os.ReadFile(filepath.Join(e.TaskDir(id), "stderr")); string(got) != "warn\n" {
		t.Errorf("stderr kept: %q", got)
	}
	zero := 0
	w.report(worker.ResultRequest{TaskID: task.ID, State: worker.StateSucceeded, ExitCode: &zero, Stdout: 12, Stderr: 5})
	res := waitTask(t, e, id, "the task's end", ended)
	if res.State != worker.StateFailed || !strings.Contains(res.Error, "stdout beyond the engine's limit of 64 bytes") ||
		res.Stdout != "hello world\n" || res.Stderr != "warn\n" {
		t.Errorf("result: %+v; want failed, stdout beyond the engine's limit of 64 bytes, the streams' tails", res)
	}
}

// TestTaskOutputs: outputs are written under TaskDir(ID)/outputs, by
// path, the task's outputs and files under an output directory alike;
// a path that leaves the directory, is absolute or is no output of the
// task's is refused 400 and written nowhere; outputs together beyond
// Limits.Outputs are refused 413, the file removed, and the task fails
// when its result comes.
func TestTaskOutputs(t *testing.T) {
	t.Parallel()
	// 1000 bytes of files, and the two directories the outputs make.
	const limit = 1000 + 2*dirBytes
	e := taskEngine(t, Config{TaskLimits: TaskLimits{Outputs: limit}})
	spec := commandTask("out-1")
	spec.Outputs = []string{"result.txt", "plots"}
	id, err := e.Submit(spec)
	if err != nil {
		t.Fatal(err)
	}
	w := joinWorker(t, e, "slurm-out", worker.FeatureCommand)
	task := w.take()
	result, a, b := randomBytes(200, 2), randomBytes(300, 3), randomBytes(100, 4)
	for _, up := range []struct {
		path string
		data []byte
	}{{"result.txt", result}, {"plots%2Fa.png", a}, {"plots/sub/b.png", b}} {
		if status, body := w.putOutput(task.ID, up.path, up.data); status != http.StatusNoContent {
			t.Fatalf("PUT %s: %d %s", up.path, status, body)
		}
	}
	outputs := filepath.Join(e.TaskDir(id), "outputs")
	for name, want := range map[string][]byte{"result.txt": result, "plots/a.png": a, "plots/sub/b.png": b} {
		if got, err := os.ReadFile(filepath.Join(outputs, name)); err != nil || !bytes.Equal(got, want) {
			t.Errorf("output %s on the engine's side: %d bytes, %v; want %d", name, len(got), err, len(want))
		}
	}
	for _, bad := range []string{"..%2Fescape", "%2E%2E/escape", "plots%2F..%2F..%2Fescape", "%2Fetc%2Fescape", "other.txt", "plots%2F.%2Fa.png"} {
		if status, body := w.putOutput(task.ID, bad, []byte("nope")); status != http.StatusBadRequest {
			t.Errorf("PUT %s: %d %s; want 400", bad, status, body)
		}
	}
	var escaped []string
	filepath.WalkDir(filepath.Dir(e.TaskDir(id)), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.Contains(filepath.Base(p), "escape") {
			escaped = append(escaped, p)
		}
		return nil
	})
	if len(escaped) > 0 {
		t.Errorf("refused paths were written: %v", escaped)
	}
	// 600 bytes and two directories are in; 401 more pass the limit.
	if status, body := w.putOutput(task.ID, "plots/big.bin", randomBytes(401, 5)); status != http.StatusRequestEntityTooLarge ||
		!strings.Contains(body, fmt.Sprintf("beyond the engine's limit of %d bytes", limit)) {
		t.Errorf("an output past the limit: %d %s; want 413 saying the limit", status, body)
	}
	if _, err := os.Stat(filepath.Join(outputs, "plots/big.bin")); !os.IsNotExist(err) {
		t.Errorf("the refused output is on disk: %v", err)
	}
	zero := 0
	w.report(worker.ResultRequest{TaskID: task.ID, State: worker.StateSucceeded, ExitCode: &zero, Outputs: []worker.File{
		{Name: "result.txt", Size: 200, SHA256: sha(result)}, {Name: "plots/a.png", Size: 300, SHA256: sha(a)}, {Name: "plots/sub/b.png", Size: 100, SHA256: sha(b)}}})
	res := waitTask(t, e, id, "the task's end", ended)
	if res.State != worker.StateFailed || !strings.Contains(res.Error, fmt.Sprintf("outputs beyond the engine's limit of %d bytes", limit)) {
		t.Errorf("result: %+v; want failed, outputs beyond the limit", res)
	}
}

// TestTaskResultRecorded: a result within the limits whose counts match
// what the engine received ends the task as the worker says, with its
// exit code, the streams' tails (the last tailBytes), the outputs as the
// engine received them, and the attempt (worker, provisioner, job,
// host, times, state).
func TestTaskResultRecorded(t *testing.T) {
	t.Parallel()
	e := taskEngine(t, Config{})
	spec := commandTask("res-1")
	spec.Outputs = []string{"out"}
	id, err := e.Submit(spec)
	if err != nil {
		t.Fatal(err)
	}
	w := joinWorker(t, e, "slurm-res", worker.FeatureCommand)
	task := w.take()
	stdout := bytes.Repeat([]byte("0123456789abcdef"), 1000) // 16,000 bytes, in 4 chunks
	for off := 0; off < len(stdout); off += 4000 {
		if status, _ := w.appendLog(task.ID, "stdout", int64(off), stdout[off:off+4000]); status != http.StatusNoContent {
			t.Fatalf("stdout at %d: %d", off, status)
		}
	}
	out := randomBytes(5000, 6)
	if status, body := w.putOutput(task.ID, "out%2Fx.bin", out); status != http.StatusNoContent {
		t.Fatalf("PUT out/x.bin: %d %s", status, body)
	}
	if res, _ := e.Task(id); res.State != TaskRunning || len(res.Attempts) != 1 || res.Attempts[0].State != TaskRunning {
		t.Errorf("while it runs: %+v; want running, one attempt running", res)
	}
	three := 3
	w.report(worker.ResultRequest{TaskID: task.ID, State: worker.StateFailed, ExitCode: &three, Error: "exit status 3",
		Stdout: int64(len(stdout)), Outputs: []worker.File{{Name: "out/x.bin", Size: 5000, SHA256: sha(out)}}})
	res := waitTask(t, e, id, "the task's end", ended)
	a := Attempt{}
	if len(res.Attempts) == 1 {
		a = res.Attempts[0]
	}
	if res.State != worker.StateFailed || res.ExitCode == nil || *res.ExitCode != 3 || res.Error != "exit status 3" ||
		res.Stdout != string(stdout[len(stdout)-tailBytes:]) || res.Stderr != "" ||
		!slices.Equal(res.Outputs, []worker.File{{Name: "out/x.bin", Size: 5000, SHA256: sha(out)}}) ||
		a.Worker != "slurm-res" || a.Provisioner != testProvisioner || a.JobID != "77" || a.Hostname != "n-slurm-res" ||
		a.State != worker.StateFailed || a.Started.IsZero() || a.Ended.IsZero() {
		t.Errorf("result: %s, exit %v, error %q, %d bytes of stdout tail, stderr %q, outputs %+v, attempts %+v; want failed with exit 3, the last %d bytes of stdout, the output, one attempt on slurm-res",
			res.State, res.ExitCode, res.Error, len(res.Stdout), res.Stderr, res.Outputs, res.Attempts, tailBytes)
	}
	if status := w.report(worker.ResultRequest{TaskID: task.ID, State: worker.StateSucceeded}); status != http.StatusConflict {
		t.Errorf("a second result for the attempt: %d; want 409", status)
	}
	if status, _ := w.appendLog(task.ID, "stdout", int64(len(stdout)), []byte("late")); status != http.StatusConflict {
		t.Errorf("a log append after the result: %d; want 409", status)
	}
}

// TestTaskResultCountsChecked: a worker whose result's byte counts or
// outputs do not match what the engine received fails its task, saying
// what differs.
func TestTaskResultCountsChecked(t *testing.T) {
	t.Parallel()
	out := []byte("the output")
	for _, tc := range []struct {
		name string
		req  worker.ResultRequest
		want string
	}{
		{"stdout", worker.ResultRequest{Stdout: 5, Outputs: []worker.File{{Name: "o", Size: 10, SHA256: sha(out)}}},
			"the worker says it sent 5 bytes of stdout; the engine received 6"},
		{"digest", worker.ResultRequest{Stdout: 6, Outputs: []worker.File{{Name: "o", Size: 10, SHA256: sha([]byte("another..."))}}},
			`output "o": the worker says 10 bytes, sha256 ` + sha([]byte("another...")) + "; the engine received 10 bytes, sha256 " + sha(out)},
		{"not sent", worker.ResultRequest{Stdout: 6, Outputs: []worker.File{{Name: "o", Size: 10, SHA256: sha(out)}, {Name: "p", Size: 1, SHA256: sha([]byte("p"))}}},
			`the worker lists output "p", which the engine never received`},
		{"not listed", worker.ResultRequest{Stdout: 6},
			`output "o" was received but the worker's result does not list it`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := taskEngine(t, Config{})
			spec := commandTask("count-" + strings.ReplaceAll(tc.name, " ", "-"))
			spec.Outputs = []string{"o", "p"}
			id, err := e.Submit(spec)
			if err != nil {
				t.Fatal(err)
			}
			w := joinWorker(t, e, "slurm-count", worker.FeatureCommand)
			task := w.take()
			w.appendLog(task.ID, "stdout", 0, []byte("hello\n"))
			w.putOutput(task.ID, "o", out)
			req := tc.req
			req.TaskID, req.State = task.ID, worker.StateSucceeded
			w.report(req)
			res := waitTask(t, e, id, "the task's end", ended)
			if res.State != worker.StateFailed || res.Error != tc.want {
				t.Errorf("result: %s %q; want failed %q", res.State, res.Error, tc.want)
			}
		})
	}
}

// TestTaskTransfersLarge: a 100 MB input and a 100 MB output cross
// loopback whole, within the server's timeouts.
func TestTaskTransfersLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 200 MB")
	}
	t.Parallel()
	e := taskEngine(t, Config{})
	data := randomBytes(100<<20, 7)
	p := filepath.Join(t.TempDir(), "in.bin")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	spec := commandTask("large-1")
	spec.Inputs, spec.Outputs = []Input{{Name: "in.bin", Path: p}}, []string{"out.bin"}
	id, err := e.Submit(spec)
	if err != nil {
		t.Fatal(err)
	}
	w := joinWorker(t, e, "slurm-large", worker.FeatureCommand)
	task := w.take()
	status, got := w.input(task.ID, "in.bin")
	if status != http.StatusOK || !bytes.Equal(got, data) {
		t.Fatalf("input: %d, %d bytes; want 200, %d bytes", status, len(got), len(data))
	}
	if status, body := w.putOutput(task.ID, "out.bin", got); status != http.StatusNoContent {
		t.Fatalf("output: %d %s", status, body)
	}
	fi, err := os.Stat(filepath.Join(e.TaskDir(id), "outputs", "out.bin"))
	if err != nil || fi.Size() != int64(len(data)) {
		t.Errorf("output on the engine's side: %v %v; want %d bytes", fi, err, len(data))
	}
}

// slowReader yields n bytes of b, chunk bytes every pause: a worker on a
// slow link.
type slowReader struct {
	b     []byte
	chunk int
	pause time.Duration
	timer func(time.Duration) <-chan time.Time
}

func (r *slowReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	<-r.timer(r.pause)
	n := copy(p[:min(len(p), r.chunk)], r.b)
	r.b = r.b[n:]
	return n, nil
}

// TestTaskTransferOutlivesServerTimeouts: a transfer's deadlines are its
// own, moved out for its size, not the server's, which are for small
// requests: on a server whose ReadTimeout and WriteTimeout are 300 ms,
// an output sent over a second and more and a 16 MiB input read as
// slowly both go through whole.
func TestTaskTransferOutlivesServerTimeouts(t *testing.T) {
	t.Parallel()
	e, err := New(Config{Secret: testSecret, ID: "test", Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.tasks.makeRoot(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	srv := newHTTPServer(e.Mux(nil, false), nil, time.Second)
	srv.ReadTimeout, srv.WriteTimeout = 300*time.Millisecond, 300*time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var served sync.WaitGroup
	served.Add(1)
	go func() {
		defer served.Done()
		srv.Serve(ln)
	}()
	ctx, cancel := context.WithCancel(context.Background())
	var run sync.WaitGroup
	run.Add(1)
	go func() {
		defer run.Done()
		e.Run(ctx, nil)
	}()
	t.Cleanup(func() {
		cancel()
		run.Wait()
		e.Stop(context.Background())
		srv.Close()
		served.Wait()
	})

	input := randomBytes(16<<20, 8)
	spec := commandTask("slow-1")
	spec.Inputs, spec.Outputs = []Input{{Name: "in", Data: input}}, []string{"out"}
	id, err := e.Submit(spec)
	if err != nil {
		t.Fatal(err)
	}
	w := joinWorkerAt(t, e, "http://"+ln.Addr().String(), "slurm-slow", worker.FeatureCommand)
	task := w.take()

	out := randomBytes(10<<16, 9)
	start := time.Now()
	req, _ := http.NewRequest("PUT", w.base+"/v1/work/"+task.ID+"/outputs/out", &slowReader{b: out, chunk: 1 << 16, pause: 100 * time.Millisecond, timer: time.After})
	req.ContentLength = int64(len(out))
	req.Header.Set("Authorization", "Bearer "+w.token)
	req.Header.Set(worker.SessionHeader, w.session)
	resp, err := w.client.Do(req)
	if err != nil {
		t.Fatalf("a slow output after %s: %v", time.Since(start), err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("a slow output: %d after %s", resp.StatusCode, time.Since(start))
	}
	if got, err := os.ReadFile(filepath.Join(e.TaskDir(id), "outputs", "out")); err != nil || !bytes.Equal(got, out) {
		t.Errorf("the slow output on the engine's side: %d bytes, %v; want %d", len(got), err, len(out))
	}
	t.Logf("an output of %d bytes sent over %s", len(out), time.Since(start).Round(time.Millisecond))

	// The input is larger than loopback's buffers: the server's write
	// waits on this slow reader.
	start = time.Now()
	req, _ = http.NewRequest("GET", w.base+"/v1/work/"+task.ID+"/inputs/in", nil)
	req.Header.Set("Authorization", "Bearer "+w.token)
	req.Header.Set(worker.SessionHeader, w.session)
	resp, err = w.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got bytes.Buffer
	buf := make([]byte, 1<<20)
	for {
		n, err := resp.Body.Read(buf)
		got.Write(buf[:n])
		if err != nil {
			break
		}
		time.Sleep(20 * time.Millisecond) // a slow reader's pace, not synchronisation
	}
	if !bytes.Equal(got.Bytes(), input) {
		t.Errorf("a slowly read input: %d bytes of %d after %s", got.Len(), len(input), time.Since(start))
	}
	t.Logf("an input of %d bytes read over %s", len(input), time.Since(start).Round(time.Millisecond))
}

// TestTaskInputRewrittenInPlace: an input rewritten after Submit to the
// same size, its modification time set back as it was, is refused 410,
// none of its bytes sent: the change time (which no caller can set
// back) says it was written.
func TestTaskInputRewrittenInPlace(t *testing.T) {
	t.Parallel()
	e := taskEngine(t, Config{})
	want := randomBytes(4096, 3)
	p := filepath.Join(t.TempDir(), "same.bin")
	if err := os.WriteFile(p, want, 0o600); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	id, err := e.Submit(TaskSpec{ID: "same", Need: shared.Need{CPUs: 1}, Command: []string{"true"},
		Inputs: []Input{{Name: "in.bin", Path: p}}})
	if err != nil {
		t.Fatal(err)
	}
	w := joinWorker(t, e, "slurm-same", worker.FeatureCommand)
	task := w.take()
	other := randomBytes(4096, 4)
	if err := os.WriteFile(p, other, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p, before.ModTime(), before.ModTime()); err != nil {
		t.Fatal(err)
	}
	resp, got := w.do("GET", "/v1/work/"+task.ID+"/inputs/in.bin", nil, nil)
	if resp.StatusCode != http.StatusGone || bytes.Contains(got, other[:64]) || !strings.Contains(string(got), "written or changed since the task was submitted") {
		t.Errorf("the input rewritten in place, its mtime set back: %d %.200s; want 410, none of its bytes", resp.StatusCode, got)
	}
	zero := 0
	w.report(worker.ResultRequest{TaskID: task.ID, State: worker.StateSucceeded, ExitCode: &zero})
	if res := waitTask(t, e, id, "the task's end", ended); res.State != worker.StateFailed {
		t.Errorf("the task %s; want failed, its input changed", res.State)
	}
}
