package engine

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/testutil"
	"github.com/fluksio/provision/shared"
)

// lockedBuffer is a buffer goroutines write while the test reads it.
type lockedBuffer = testutil.Buffer

// testLogger returns a logger that writes to the returned buffer, so a
// test can check what was (and was not) logged.
func testLogger(t *testing.T) (hclog.Logger, *lockedBuffer) { return testutil.Logger(t) }

// testSecret is a fixed secret, so that failures reproduce.
var testSecret = bytes.Repeat([]byte("0123456789abcdef"), 2)

// testProvisioner is the provisioner the tests' credentials name.
const testProvisioner = "slurm"

// claims are what a test credential for worker binds: the test
// provisioner and a shape roomy enough for attachBody.
func claims(worker string) host.CredentialClaims {
	return host.CredentialClaims{Worker: worker, Provisioner: testProvisioner, CPUs: 4, GPUs: 1, RAMMB: 8000, Labels: []string{"gpu"}}
}

// provisioned tells e what the test provisioner's worker_provisioned
// event would: worker was started as job.
func provisioned(e *books, worker, job string) {
	e.ObserveEvent(shared.Event{Kind: shared.EventWorkerProvisioned, Provisioner: testProvisioner, Worker: worker, Job: job})
}

// waitFor polls cond until it holds or the deadline passes. It is for
// state that has no channel to wait on; the short pause only keeps it
// from spinning.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// serveEngine starts an Engine over HTTP with a test signer and a log the
// test can read. Cleanup closes the engine first, ending its long polls,
// so the server's Close need not wait for them.
func serveEngine(t *testing.T, pollWait time.Duration) (*books, *httptest.Server, *host.Signer, *lockedBuffer) {
	t.Helper()
	logger, logs := testLogger(t)
	signer := host.NewSigner(testSecret)
	e := newBareBooks(logger, signer, nil)
	e.PollWait = pollWait
	srv := httptest.NewServer(booksHandler(e))
	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		e.watch(ctx)
	}()
	t.Cleanup(func() { cancel(); <-watched })
	t.Cleanup(srv.Close)
	t.Cleanup(e.Close)
	return e, srv, signer, logs
}

// storyHooks tells, one line each, what an embedder's hooks hear, into
// out: the plugins' events (within the log budget) and the summaries of
// those left out.
func storyHooks(out *lockedBuffer) Hooks {
	return Hooks{
		PluginEvent: func(ev shared.Event) {
			fmt.Fprintf(out, "%s: %s %s %s\n", ev.Provisioner, ev.Kind, ev.Worker, ev.Detail)
		},
		EventsNotTold: func(provisioner string, n int) {
			fmt.Fprintf(out, "%s: %d more event(s) not told\n", provisioner, n)
		},
		Attach: func(w WorkerInfo) { fmt.Fprintf(out, "worker %s attached\n", w.Name) },
		Result: func(r Result) { fmt.Fprintf(out, "work done by %s: %s\n", r.Worker, r.Output) },
	}
}

// testAPIs and testStatus are each test's books' worker API and status
// page, made once per books, as New makes them once per engine.
var testAPIs, testStatus sync.Map // *books -> *workerAPI, *statusPage

// apiOf is e's worker API (its polls held unless the test parks them).
func apiOf(e *books) *workerAPI {
	if a, ok := testAPIs.Load(e); ok {
		return a.(*workerAPI)
	}
	a, _ := testAPIs.LoadOrStore(e, newWorkerAPI(e, nil))
	return a.(*workerAPI)
}

// statusOf is e's GET /status, listing no provisioners, needs or held
// profiles until the test sets where they come from.
func statusOf(e *books) *statusPage {
	if s, ok := testStatus.Load(e); ok {
		return s.(*statusPage)
	}
	s, _ := testStatus.LoadOrStore(e, &statusPage{id: "test", books: e})
	return s.(*statusPage)
}

// booksHandler routes e's worker API and GET /status as Engine.Mux
// routes them, without the operator's guard.
func booksHandler(e *books) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/v1/", apiOf(e).handler())
	mux.Handle("GET /status", statusOf(e))
	return mux
}
