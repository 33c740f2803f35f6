package engine

import (
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/shared/sharedtest"
	"github.com/fluksio/provision/worker"
)

// envMap is a worker's environment, so that each test worker has its own
// without touching the process's.
func envMap(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// TestFullLoop runs the whole story in one process: a need nobody can
// serve, a provisioner asked for a machine, a worker (the real workerMain
// code) that attaches with a credential the engine signed, takes the
// task, reports, and leaves when it has been idle long enough.
func TestFullLoop(t *testing.T) {
	t.Parallel()
	e, srv, signer, logs := serveEngine(t, 200*time.Millisecond)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The workers this test starts, and what they exited with. The test
	// owns them: it waits for every one before returning.
	var workers sync.WaitGroup
	defer workers.Wait()
	exited := make(chan int, 1)
	workerLog := &lockedBuffer{}
	var token string

	var mu sync.Mutex // guards started
	started := false
	prov := &sharedtest.Provisioner{
		Name:      "hpc",
		ShapeList: []shared.Shape{{Profile: "gpu", CPUs: 4, GPUs: 1, RAMMB: 16000, Labels: []string{"gpu", "a100"}}},
	}
	prov.OnProvision = func(r *shared.ProvisionRequest) (*shared.ProvisionResponse, error) {
		mu.Lock()
		defer mu.Unlock()
		answer := func(o shared.ProvisionOutcome) *shared.ProvisionResponse {
			resp := &shared.ProvisionResponse{}
			for range r.Demand {
				resp.Outcomes = append(resp.Outcomes, shared.DemandOutcome{Outcome: o, Profile: "gpu"})
			}
			return resp
		}
		if started || len(r.Demand) == 0 {
			return answer(shared.OutcomeOutstanding), nil
		}
		started = true
		// What the Slurm plugin does, minus Slurm: mint a credential for
		// a worker named after itself, and start the payload with it in
		// the environment.
		var err error
		c := host.CredentialClaims{Worker: "hpc-gpu-0001", Provisioner: "hpc", CPUs: 4, GPUs: 1, RAMMB: 16000, Labels: []string{"gpu", "a100"}}
		if token, _, err = signer.Sign(c, time.Hour); err != nil {
			return nil, err
		}
		// And publish worker_provisioned, which the engine hears.
		e.ObserveEvent(shared.Event{Kind: shared.EventWorkerProvisioned, Provisioner: "hpc", Worker: "hpc-gpu-0001", Job: "4242"})
		env := envMap(map[string]string{shared.WorkerTokenEnv: token, "SLURM_JOB_ID": "4242", "SLURM_CPUS_ON_NODE": "8"})
		args := []string{"--url", srv.URL, "--cpus", "4", "--gpus", "1", "--ram-mb", "16000",
			"--labels", "gpu,a100", "--max-idle", "1", "--artifact-url", "http://artifacts.example"}
		workers.Add(1)
		go func() {
			defer workers.Done()
			exited <- worker.Run(ctx, args, env, io.Discard, workerLog)
		}()
		return answer(shared.OutcomeRequested), nil
	}

	p := newRouter(e.logger, e, []target{{Name: "hpc", P: prov, Shapes: prov.ShapeList}})
	p.Add(shared.Need{CPUs: 2, GPUs: 1, Label: "gpu"})

	// The run loop: a pass on every engine change, and on a tick.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(20 * time.Second)
	for p.Pass(ctx); !p.Served(); p.Pass(ctx) {
		select {
		case <-e.changes():
		case <-tick.C:
		case code := <-exited:
			t.Fatalf("worker exited with %d before the need was served:\n%s", code, workerLog)
		case <-deadline:
			t.Fatalf("need not served; unserved %q\nengine:\n%s\nworker:\n%s", p.Unserved(), logs, workerLog)
		}
	}

	res := p.Needs()[0].Result
	if res == nil || res.Worker != "hpc-gpu-0001" || res.JobID != "4242" || res.CPUs != 8 ||
		!strings.Contains(res.Output, "9592 primes below 100000") {
		t.Errorf("result %+v", res)
	}
	if n := prov.ProvisionCalls(); n < 1 {
		t.Errorf("Provision called %d times", n)
	}

	// With nothing more to do, the worker leaves after --max-idle.
	select {
	case code := <-exited:
		if code != 0 {
			t.Errorf("worker exited %d; want 0:\n%s", code, workerLog)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("worker did not leave when idle:\n%s", workerLog)
	}
	if got := e.attached(); len(got) != 0 {
		t.Errorf("Attached() = %q after the worker left", got)
	}
	for _, want := range []string{"worker attached", "work done", "need served", "worker detached"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("engine log lacks %q:\n%s", want, logs)
		}
	}
	if !strings.Contains(workerLog.String(), "no work for 1s; leaving") {
		t.Errorf("worker log:\n%s", workerLog)
	}
	if strings.Contains(logs.String(), token) || strings.Contains(workerLog.String(), token) {
		t.Error("the token appears in a log")
	}
}

func TestWorkerLeavesWhenEngineGoes(t *testing.T) {
	t.Parallel()
	signer := host.NewSigner(testSecret)
	e := newBareBooks(nil, signer, nil)
	e.PollWait = 100 * time.Millisecond
	srv := httptest.NewServer(booksHandler(e))

	token := sign(t, signer, "w", time.Hour)
	provisioned(e, "w", "")
	w, stderr := newTestWorker(t, srv.URL, token, func(c *worker.Config) {
		c.GoneAfter, c.RetryFirst = 300*time.Millisecond, 20*time.Millisecond
	})
	exited := make(chan int, 1)
	go func() { exited <- w.Work(context.Background()) }()

	waitFor(t, "the worker to attach", func() bool { return len(e.attached()) == 1 })
	e.Close()
	srv.Close()
	select {
	case code := <-exited:
		if code != 1 {
			t.Errorf("exit %d; want 1", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("worker still running after its engine went:\n%s", stderr)
	}
	if !strings.Contains(stderr.String(), "engine unreachable") {
		t.Errorf("worker log does not say why it gave up:\n%s", stderr)
	}
	if strings.Contains(stderr.String(), token) {
		t.Error("token in the worker's log")
	}
}

func TestWorkerStopsOnSignal(t *testing.T) {
	t.Parallel()
	logger, logs := testLogger(t)
	signer := host.NewSigner(testSecret)
	e := newBareBooks(logger, signer, nil)
	srv := httptest.NewServer(booksHandler(e))
	defer srv.Close()
	defer e.Close()

	// Cancelling ctx is what SIGTERM does in workerMain.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env := envMap(map[string]string{shared.WorkerTokenEnv: sign(t, signer, "w", time.Hour)})
	provisioned(e, "w", "")
	exited := make(chan int, 1)
	workerLog := &lockedBuffer{}
	go func() {
		exited <- worker.Run(ctx, []string{"--url", srv.URL, "--cpus", "2", "--gpus", "0", "--max-idle", "600"}, env, io.Discard, workerLog)
	}()
	// The worker's own word that it attached, not the engine's: only once
	// it has read the attach's answer does it hold the session its detach
	// must carry (session.go).
	waitFor(t, "the worker to attach", func() bool { return strings.Contains(workerLog.String(), "attached to") })
	cancel()
	select {
	case code := <-exited:
		if code != 0 {
			t.Errorf("exit %d; want 0", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("worker ignored cancellation")
	}
	if len(e.attached()) != 0 || !strings.Contains(logs.String(), "worker detached") {
		t.Errorf("worker did not detach on its way out:\n%s", logs)
	}
}

func TestWorkerArgs(t *testing.T) {
	t.Parallel()
	env := envMap(map[string]string{shared.WorkerTokenEnv: "secret-token-value"})
	tests := []struct {
		args    []string
		env     func(string) string
		wantErr string
	}{
		{[]string{"--url", "http://e:8080", "--cpus", "2", "--gpus", "0", "--max-idle", "300"}, env, ""},
		{[]string{"--url", "http://e:8080", "--cpus", "2", "--gpus", "0", "--max-idle", "300"}, envMap(nil), shared.WorkerTokenEnv},
		{[]string{"--cpus", "2"}, env, "--url is required"},
		{[]string{"--url", "ftp://e", "--cpus", "2"}, env, "not an http(s) URL"},
		{[]string{"--url", "http://e", "--cpus", "0"}, env, "--cpus"},
		{[]string{"--url", "http://e", "--max-idle", "0"}, env, "--max-idle"},
		{[]string{"--url", "http://e", "--token", "x"}, env, "not defined"},
		{[]string{"--url", "http://e", "extra"}, env, "unexpected"},
	}
	for _, tc := range tests {
		stderr := &lockedBuffer{}
		_, err := worker.ParseArgs(tc.args, tc.env, io.Discard, stderr)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%q: %v", tc.args, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error()+stderr.String(), tc.wantErr)):
			t.Errorf("%q: err %v; want one containing %q", tc.args, err, tc.wantErr)
		}
		if strings.Contains(stderr.String(), "secret-token-value") {
			t.Errorf("%q: token printed", tc.args)
		}
	}
}

func TestWorkerWithoutCredential(t *testing.T) {
	t.Parallel()
	stderr := &lockedBuffer{}
	args := []string{"--url", "http://127.0.0.1:1", "--cpus", "1", "--gpus", "0", "--max-idle", "5"}
	if code := worker.Run(context.Background(), args, envMap(nil), io.Discard, stderr); code != 2 {
		t.Errorf("exit %d; want 2", code)
	}
	if !strings.Contains(stderr.String(), "$"+shared.WorkerTokenEnv+" is not set") {
		t.Errorf("message does not name the variable:\n%s", stderr)
	}
}

// TestDismissLetsABusyWorkerGo: a worker in the middle of a long task
// when the engine stops cleanly hears it on its watch, drops the task,
// detaches and exits 0 within Dismiss's wait, rather than after its task
// and its give-up time (its job outlived a clean stop by both before).
func TestDismissLetsABusyWorkerGo(t *testing.T) {
	t.Parallel()
	e, stderr, exited := busyWorker(t, 3600)
	if n := e.dismiss(context.Background(), 10*time.Second); n != 0 {
		t.Fatalf("%d worker(s) still attached 10 s after Dismiss, with a task of an hour under way:\n%s", n, stderr)
	}
	select {
	case code := <-exited:
		if code != 0 {
			t.Errorf("exit %d; want 0 (the engine let it go):\n%s", code, stderr)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("worker detached but still running:\n%s", stderr)
	}
	if !strings.Contains(stderr.String(), "dropping task-1 and leaving") {
		t.Errorf("the worker's log does not say it dropped its task:\n%s", stderr)
	}
}

// busyWorker is a real worker "w" attached over HTTP to bare books,
// running task-1, a task of seconds: the books, the worker's log, and
// the channel its exit code comes on. The books and their server close
// when the test ends.
func busyWorker(t *testing.T, seconds float64) (*books, *lockedBuffer, <-chan int) {
	t.Helper()
	signer := host.NewSigner(testSecret)
	e := newBareBooks(nil, signer, nil)
	srv := httptest.NewServer(booksHandler(e))
	t.Cleanup(srv.Close)
	t.Cleanup(e.Close)
	provisioned(e, "w", "")
	w, stderr := newTestWorker(t, srv.URL, sign(t, signer, "w", time.Hour), nil)
	exited := make(chan int, 1)
	go func() { exited <- w.Work(context.Background()) }()
	waitFor(t, "the worker to attach", func() bool { return len(e.IdleWorkers()) == 1 })
	if err := e.Assign("w", Task{ID: "task-1", WorkSeconds: seconds}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the worker to start its task", func() bool { return strings.Contains(stderr.String(), "running task-1") })
	return e, stderr, exited
}

// newTestWorker is a worker client for the engine at url, with a
// credential for "w", a max-idle of ten minutes and its log in the
// buffer it returns.
func newTestWorker(t *testing.T, url, token string, tune func(*worker.Config)) (*worker.Client, *lockedBuffer) {
	t.Helper()
	stderr := &lockedBuffer{}
	cfg, err := worker.ParseArgs([]string{"--url", url, "--cpus", "1", "--gpus", "0", "--max-idle", "600"},
		envMap(map[string]string{shared.WorkerTokenEnv: token}), io.Discard, stderr)
	if err != nil {
		t.Fatal(err)
	}
	if tune != nil {
		tune(&cfg)
	}
	return worker.NewClient(cfg, log.New(stderr, "worker: ", 0), http.DefaultClient), stderr
}
