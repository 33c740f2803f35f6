package worker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
)

// asWorkerEnv set to 1 makes the test binary the worker program: see
// TestMain.
const asWorkerEnv = "WORKER_TEST_AS_FLUKSIO_WORKER"

// TestMain runs the test binary as fluksio-worker (Main) when
// asWorkerEnv says so: the tests that need the worker as a process of
// its own (SIGTERM, the environment its commands inherit) start it so.
func TestMain(m *testing.M) {
	if os.Getenv(asWorkerEnv) == "1" {
		os.Exit(Main("fluksio-worker", os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// syncBuffer is a worker's log, written by its goroutines and read by
// the test.
type syncBuffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// testWorker is a worker (Client.Work) run by a test, in this process.
type testWorker struct {
	log    *syncBuffer
	tmp    string // its $TMPDIR, where its task directories go
	exited chan int
	stop   context.CancelFunc
}

// startWorker starts a command worker on e, with its own $TMPDIR, a
// kill grace of 2 s unless tune says otherwise; the test's end stops it
// and waits for it.
func startWorker(t *testing.T, e *testEngine, tune func(*Config)) *testWorker {
	t.Helper()
	tw := &testWorker{log: &syncBuffer{}, tmp: t.TempDir(), exited: make(chan int, 1)}
	env := map[string]string{shared.WorkerTokenEnv: testToken, "TMPDIR": tw.tmp}
	cfg, err := ParseArgs([]string{"--url", e.URL(), "--cpus", "2", "--max-idle", "600"},
		func(k string) string { return env[k] }, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg.KillGrace, cfg.RetryFirst, cfg.GoneAfter = 2*time.Second, 20*time.Millisecond, 2*time.Second
	if tune != nil {
		tune(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tw.stop = cancel
	w := NewClient(cfg, log.New(tw.log, "worker: ", log.Lmicroseconds), &http.Client{})
	go func() { tw.exited <- w.Work(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-tw.exited:
		case <-time.After(30 * time.Second):
			t.Errorf("the worker did not stop within 30 s:\n%s", tw.log)
		}
		if strings.Contains(tw.log.String(), testToken) {
			t.Errorf("the credential is in the worker's log")
		}
	})
	return tw
}

// waitExit waits for the worker to exit, and returns its exit code.
func (tw *testWorker) waitExit(t *testing.T) int {
	t.Helper()
	select {
	case code := <-tw.exited:
		tw.exited <- code // for the cleanup
		return code
	case <-time.After(30 * time.Second):
		t.Fatalf("the worker did not exit within 30 s:\n%s", tw.log)
	}
	return 0
}

// file is an input of content, as a task names it.
func file(name string, content []byte) File {
	return File{Name: name, Size: int64(len(content)), SHA256: sha(content)}
}

func sha(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}
