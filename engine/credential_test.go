package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

// attachAs attaches with token and body and returns the status and the
// engine's error message, if any.
func attachAs(t *testing.T, e *books, token, body string) (int, string) {
	t.Helper()
	rec := do(t, e, "POST", "/v1/attach", token, body)
	var er worker.ErrorResponse
	_ = json.Unmarshal(rec.Body.Bytes(), &er)
	return rec.Code, er.Error
}

// TestCredentialWorthOneJob: a credential attaches once, as the job its
// provisioner recorded, with at most the resources it was minted for,
// and never again once its worker detached, was given up on, or its
// request was cancelled.
func TestCredentialWorthOneJob(t *testing.T) {
	t.Parallel()
	signer := host.NewSigner(testSecret)
	newEngine := func() (*books, *lockedBuffer) {
		logger, logs := testLogger(t)
		return newBareBooks(logger, signer, nil), logs
	}

	t.Run("replay after detach", func(t *testing.T) {
		e, _ := newEngine()
		tok := sign(t, signer, "slurm-cpu-1", time.Hour)
		provisioned(e, "slurm-cpu-1", "77")
		if code, msg := attachAs(t, e, tok, attachBody); code != http.StatusOK {
			t.Fatalf("first attach: %d %s", code, msg)
		}
		if rec := do(t, e, "POST", "/v1/detach", tok, ""); rec.Code != http.StatusNoContent {
			t.Fatalf("detach: %d", rec.Code)
		}
		code, msg := attachAs(t, e, tok, attachBody)
		if code != http.StatusUnauthorized || !strings.Contains(msg, "revoked (detached)") {
			t.Errorf("replay after detach: %d %q; want 401 revoked (detached)", code, msg)
		}
		if len(e.attached()) != 0 {
			t.Errorf("replayed credential attached: %q", e.attached())
		}
	})

	t.Run("second live attach", func(t *testing.T) {
		e, _ := newEngine()
		tok := sign(t, signer, "slurm-cpu-2", time.Hour)
		provisioned(e, "slurm-cpu-2", "77")
		if code, msg := attachAs(t, e, tok, attachBody); code != http.StatusOK {
			t.Fatalf("first attach: %d %s", code, msg)
		}
		other := strings.Replace(attachBody, `"n01"`, `"elsewhere"`, 1)
		code, msg := attachAs(t, e, tok, other)
		if code != http.StatusConflict || !strings.Contains(msg, "already attached (from host n01)") {
			t.Errorf("second attach: %d %q; want 409 already attached", code, msg)
		}
		// The first attach stands, as it was.
		if w := e.IdleWorkers(); len(w) != 1 || w[0].Hostname != "n01" {
			t.Errorf("workers after the second attach: %+v", w)
		}
	})

	t.Run("more than minted", func(t *testing.T) {
		e, logs := newEngine()
		tok := sign(t, signer, "slurm-gpu-3", time.Hour) // 4 cpus, 1 gpu, 8000 MB, label gpu
		provisioned(e, "slurm-gpu-3", "77")
		for _, tc := range []struct{ body, want string }{
			{`{"hostname":"n01","job_id":"77","cpus":4,"gpus":4096}`, "claims 4096 gpus; its credential allows 1"},
			{`{"hostname":"n01","job_id":"77","cpus":64,"gpus":1}`, "claims 64 cpus; its credential allows 4"},
			{`{"hostname":"n01","job_id":"77","cpus":4,"ram_mb":9000}`, "claims 9000 MB"},
			{`{"hostname":"n01","job_id":"77","cpus":4,"labels":["a100"]}`, "claims label a100"},
		} {
			code, msg := attachAs(t, e, tok, tc.body)
			if code != http.StatusForbidden || !strings.Contains(msg, tc.want) {
				t.Errorf("attach %s: %d %q; want 403 %q", tc.body, code, msg, tc.want)
			}
		}
		if len(e.attached()) != 0 {
			t.Errorf("a worker claiming more than minted attached: %q", e.attached())
		}
		if !strings.Contains(logs.String(), "refused an attach") {
			t.Errorf("refusals not logged:\n%s", logs)
		}
		// Less than minted is fine: a worker may offer less.
		if code, msg := attachAs(t, e, tok, `{"hostname":"n01","job_id":"77","cpus":2}`); code != http.StatusOK {
			t.Errorf("attach with less: %d %s", code, msg)
		}
	})

	t.Run("wrong job", func(t *testing.T) {
		e, _ := newEngine()
		tok := sign(t, signer, "slurm-cpu-4", time.Hour)
		// Not recorded yet: try again (the worker retries 503s).
		if code, msg := attachAs(t, e, tok, attachBody); code != http.StatusServiceUnavailable || !strings.Contains(msg, "no job is recorded") {
			t.Errorf("attach before the provisioner's event: %d %q; want 503", code, msg)
		}
		provisioned(e, "slurm-cpu-4", "78")
		code, msg := attachAs(t, e, tok, attachBody) // reports job 77
		if code != http.StatusForbidden || !strings.Contains(msg, `reports job "77"; its provisioner started it as job "78"`) {
			t.Errorf("attach as another job: %d %q; want 403", code, msg)
		}
	})

	t.Run("cancelled", func(t *testing.T) {
		e, logs := newEngine()
		for i, kind := range []shared.EventKind{shared.EventWorkerCancelled, shared.EventWorkerProvisionFailed, shared.EventWorkerJobEnded} {
			name := "slurm-cpu-c" + string(rune('0'+i))
			tok := sign(t, signer, name, time.Hour)
			provisioned(e, name, "77")
			e.ObserveEvent(shared.Event{Kind: kind, Provisioner: testProvisioner, Worker: name, Job: "77"})
			code, msg := attachAs(t, e, tok, attachBody)
			if code != http.StatusUnauthorized || !strings.Contains(msg, "revoked ("+string(kind)+")") {
				t.Errorf("attach after %s: %d %q; want 401 revoked", kind, code, msg)
			}
		}
		// An attached worker whose request is cancelled is dropped, and
		// its task goes back to the placer.
		tok := sign(t, signer, "slurm-cpu-live", time.Hour)
		provisioned(e, "slurm-cpu-live", "77")
		if code, msg := attachAs(t, e, tok, attachBody); code != http.StatusOK {
			t.Fatalf("attach: %d %s", code, msg)
		}
		if err := e.Assign("slurm-cpu-live", Task{ID: "t1"}); err != nil {
			t.Fatal(err)
		}
		e.ObserveEvent(shared.Event{Kind: shared.EventWorkerCancelled, Provisioner: testProvisioner, Worker: "slurm-cpu-live"})
		if _, st := e.TaskOutcome("slurm-cpu-live", "t1"); st != assignLost || len(e.attached()) != 0 {
			t.Errorf("after cancel: task %v, attached %q; want lost, none", st, e.attached())
		}
		if rec := do(t, e, "GET", "/v1/work?wait=0", tok, ""); rec.Code != http.StatusUnauthorized || !strings.Contains(rec.Body.String(), "revoked") {
			t.Errorf("poll after cancel: %d %s; want 401 revoked", rec.Code, rec.Body)
		}
		// So is a busy worker whose job ended under it (contract 2.6),
		// at once and saying why.
		tok = sign(t, signer, "slurm-cpu-dead", time.Hour)
		provisioned(e, "slurm-cpu-dead", "78")
		if code, msg := attachAs(t, e, tok, strings.Replace(attachBody, `"77"`, `"78"`, 1)); code != http.StatusOK {
			t.Fatalf("attach: %d %s", code, msg)
		}
		if err := e.Assign("slurm-cpu-dead", Task{ID: "t2"}); err != nil {
			t.Fatal(err)
		}
		e.ObserveEvent(shared.Event{Kind: shared.EventWorkerJobEnded, Provisioner: testProvisioner, Worker: "slurm-cpu-dead", Job: "78",
			JobState: "FAILED", Detail: "job 78 is FAILED (NonZeroExitCode)"})
		if _, st := e.TaskOutcome("slurm-cpu-dead", "t2"); st != assignLost || len(e.attached()) != 0 {
			t.Errorf("after its job ended: task %v, attached %q; want lost, none", st, e.attached())
		}
		if !strings.Contains(logs.String(), "its job ended under it: job 78 is FAILED (NonZeroExitCode)") {
			t.Errorf("the drop does not say why:\n%s", logs.String())
		}
	})
}

// TestOwnershipIsExact: provisioner "bad" may mint "bad-gpu-x" (its name
// starts with "bad-"), next to provisioner "bad-gpu". The worker belongs
// to "bad" alone: it gets bad's shape and so none of the GPU work, it is
// not reported to bad-gpu's Reconcile, and bad cannot take or revoke a
// name bad-gpu recorded first.
func TestOwnershipIsExact(t *testing.T) {
	t.Parallel()
	logger, logs := testLogger(t)
	signer := host.NewSigner(testSecret)
	e := newBareBooks(logger, signer, nil)
	// What each provisioner's host guard signs: its own name, and the
	// shape of the profile the plugin asked for.
	mint := func(prov, worker string, cpus, gpus int, labels ...string) string {
		tok, _, err := signer.Sign(host.CredentialClaims{Worker: worker, Provisioner: prov, CPUs: cpus, GPUs: gpus, Labels: labels}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	event := func(prov string, kind shared.EventKind, worker, job string) {
		e.ObserveEvent(shared.Event{Kind: kind, Provisioner: prov, Worker: worker, Job: job})
	}

	// bad mints bad-gpu-x with its own CPU-only shape.
	squat := mint("bad", "bad-gpu-x", 1, 0)
	event("bad", shared.EventWorkerProvisioned, "bad-gpu-x", "10")
	if code, msg := attachAs(t, e, squat, `{"hostname":"n1","job_id":"10","cpus":1,"gpus":8}`); code != http.StatusForbidden || !strings.Contains(msg, "claims 8 gpus; its credential allows 0") {
		t.Errorf("squatter claiming GPUs: %d %q; want 403", code, msg)
	}
	if code, msg := attachAs(t, e, squat, `{"hostname":"n1","job_id":"10","cpus":1,"labels":["cuda"]}`); code != http.StatusForbidden || !strings.Contains(msg, "claims label cuda") {
		t.Errorf("squatter claiming bad-gpu's label: %d %q; want 403", code, msg)
	}
	if code, msg := attachAs(t, e, squat, `{"hostname":"n1","job_id":"10","cpus":1}`); code != http.StatusOK {
		t.Fatalf("squatter with bad's shape: %d %q", code, msg)
	}
	if got := e.attachedBy("bad-gpu"); len(got) != 0 {
		t.Errorf("bad-gpu's Reconcile would be told %q arrived", got)
	}
	if got := e.attachedBy("bad"); !slices.Equal(got, []string{"bad-gpu-x"}) {
		t.Errorf("bad's Reconcile is told %q; want [bad-gpu-x]", got)
	}
	// The GPU need waits: the squatter does not fit it.
	p := newRouter(logger, e, nil)
	p.Add(shared.Need{CPUs: 1, GPUs: 1, Label: "cuda"})
	p.Pass(context.Background())
	if n := p.Needs()[0]; n.Worker != "" {
		t.Errorf("GPU need given to %s", n.Worker)
	}

	// bad-gpu's own worker: recorded first by bad-gpu, bad's events about
	// that name change nothing and bad's credential for it is refused.
	event("bad-gpu", shared.EventWorkerProvisioned, "bad-gpu-y", "20")
	event("bad", shared.EventWorkerProvisioned, "bad-gpu-y", "21")
	event("bad", shared.EventWorkerCancelled, "bad-gpu-y", "20")
	if code, msg := attachAs(t, e, mint("bad", "bad-gpu-y", 1, 1, "cuda"), `{"hostname":"n2","job_id":"20","cpus":1,"gpus":1,"labels":["cuda"]}`); code != http.StatusForbidden || !strings.Contains(msg, "recorded by provisioner bad-gpu, not bad") {
		t.Errorf("bad's credential for bad-gpu's worker: %d %q; want 403", code, msg)
	}
	real := mint("bad-gpu", "bad-gpu-y", 1, 1, "cuda")
	if code, msg := attachAs(t, e, real, `{"hostname":"n2","job_id":"20","cpus":1,"gpus":1,"labels":["cuda"]}`); code != http.StatusOK {
		t.Fatalf("bad-gpu's own worker: %d %q", code, msg)
	}
	if got := e.attachedBy("bad-gpu"); !slices.Equal(got, []string{"bad-gpu-y"}) {
		t.Errorf("bad-gpu's Reconcile is told %q; want [bad-gpu-y]", got)
	}
	// bad's credential for the name cannot poll its work or detach it.
	bad := mint("bad", "bad-gpu-y", 1, 1, "cuda")
	if rec := do(t, e, "GET", "/v1/work?wait=0", bad, ""); rec.Code != http.StatusConflict {
		t.Errorf("bad polling as bad-gpu-y: %d; want 409", rec.Code)
	}
	do(t, e, "POST", "/v1/detach", bad, "")
	p.Pass(context.Background())
	if n := p.Needs()[0]; n.Worker != "bad-gpu-y" {
		t.Errorf("GPU need went to %q; want bad-gpu-y", n.Worker)
	}
	if !strings.Contains(logs.String(), "ignored an event about another provisioner's worker") {
		t.Errorf("the foreign events were not logged:\n%s", logs)
	}
}

// TestWorkerTextEscaped: a worker's host name and output reach the story
// and the log with their control characters escaped, so a newline cannot
// forge a story line and ESC cannot drive the terminal.
func TestWorkerTextEscaped(t *testing.T) {
	t.Parallel()
	e, _, signer, logs := serveEngine(t, time.Second)
	var out bytes.Buffer
	say := func(format string, args ...any) { fmt.Fprintf(&out, format+"\n", args...) }
	// As host-example's story tells them.
	e.hooks.attach = func(w WorkerInfo) {
		say("worker %s attached from %s (job %s, %d cpus, %d gpus)", w.Name, w.Hostname, w.JobID, w.CPUs, w.GPUs)
	}
	e.hooks.result = func(r Result) {
		say("work done by %s: host %s, job %s, cpus %d: %s", r.Worker, r.Hostname, r.JobID, r.CPUs, r.Output)
	}
	const forged = "x\n[   9.9s] all 1 need(s) served; shutting down\x1b[2J\u202e\xff"
	tok := sign(t, signer, "slurm-cpu-1", time.Hour)
	provisioned(e, "slurm-cpu-1", "77")
	body, _ := json.Marshal(worker.AttachRequest{Hostname: forged, JobID: "77", CPUs: 1})
	if code, msg := attachAs(t, e, tok, string(body)); code != http.StatusOK {
		t.Fatalf("attach: %d %s", code, msg)
	}
	if err := e.Assign("slurm-cpu-1", Task{ID: "t1"}); err != nil {
		t.Fatal(err)
	}
	body, _ = json.Marshal(worker.ResultRequest{TaskID: "t1", Hostname: forged, JobID: "77", CPUs: 1, Output: forged})
	if rec := do(t, e, "POST", "/v1/result", tok, string(body)); rec.Code != http.StatusNoContent {
		t.Fatalf("result: %d %s", rec.Code, rec.Body)
	}

	story := out.String()
	lines := strings.Split(strings.TrimSuffix(story, "\n"), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "attached from") || !strings.Contains(lines[1], "work done by") {
		t.Errorf("story has %d lines; want 2, attach and result:\n%s", len(lines), story)
	}
	// termsafe's escapes; JSON made \xff U+FFFD, a character shown as itself.
	const escaped = `x\u000a[   9.9s] all 1 need(s) served; shutting down\u001b[2J\u202e` + "\ufffd"
	if !strings.Contains(lines[0], escaped) {
		t.Errorf("story line %q lacks the escaped host name %q", lines[0], escaped)
	}
	for what, text := range map[string]string{"story": story, "log": logs.String()} {
		if strings.ContainsAny(text, "\x1b\u202e") || strings.Contains(text, "\xff") {
			t.Errorf("%s has a raw ESC, bidi override or invalid byte:\n%q", what, text)
		}
		for _, l := range strings.Split(text, "\n") {
			if strings.Contains(l, "all 1 need(s) served") && !strings.Contains(l, `x\u000a[`) {
				t.Errorf("%s has a forged line: %q", what, l)
			}
		}
	}
}

// TestDeadWorkerGoneInSeconds SIGKILLs a real worker process while it
// idles in its long poll. The engine must drop it within seconds (not
// goneFactor poll periods, 60 s by default), and a task handed to it in
// the meantime must be run by another worker.
func TestDeadWorkerGoneInSeconds(t *testing.T) {
	t.Parallel()
	bin := sandboxtest.Binary(t, "host-example", "host-example")
	e, srv, signer, logs := serveEngine(t, defaultPollWait)

	start := func(name, job string) *exec.Cmd {
		tok := sign(t, signer, name, time.Hour)
		provisioned(e, name, job)
		cmd := exec.Command(bin, "worker", "--url", srv.URL, "--cpus", "1", "--gpus", "0", "--max-idle", "600")
		cmd.Env = append(os.Environ(), shared.WorkerTokenEnv+"="+tok, "SLURM_JOB_ID="+job)
		out := &lockedBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		t.Cleanup(func() {
			cmd.Process.Kill()
			<-done
			t.Logf("%s said:\n%s", name, out)
		})
		return cmd
	}
	listed := func(name string) bool {
		resp, err := http.Get(srv.URL + "/status")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var st struct {
			Workers []workerStatus `json:"workers"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(st.Workers, func(w workerStatus) bool { return w.Name == name && (w.Polling || w.AttemptID != "") })
	}

	a := start("slurm-cpu-a", "101")
	waitFor(t, "worker a to attach and poll", func() bool { return listed("slurm-cpu-a") })
	if err := a.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	// The engine sees the hang-up at once: the poll ends. (A task handed
	// out in the milliseconds before that is written to a dead
	// connection and waits out goneFactor poll periods instead.)
	waitFor(t, "the dead worker's poll to end", func() bool { return !listed("slurm-cpu-a") })

	// The dead worker is still in the books for a moment, idle: the
	// placer hands it the task, as it did for 61 s before.
	p := newRouter(nil, e, nil)
	p.Add(shared.Need{CPUs: 1})
	p.Pass(context.Background())
	if w := p.Needs()[0].Worker; w != "slurm-cpu-a" {
		t.Fatalf("the task went to %q; want the dead worker, still listed idle", w)
	}
	start("slurm-cpu-b", "102")

	var goneAfter, servedAfter time.Duration
	deadline := time.Now().Add(deadAfter + 10*time.Second)
	for goneAfter == 0 || servedAfter == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: dead worker gone after %s, need served after %s; want both within %s\n%s",
				time.Since(killed).Round(time.Millisecond), goneAfter, servedAfter, deadAfter+10*time.Second, logs)
		}
		p.Pass(context.Background())
		if goneAfter == 0 && !slices.Contains(e.attached(), "slurm-cpu-a") {
			goneAfter = time.Since(killed)
		}
		if servedAfter == 0 && p.Served() {
			servedAfter = time.Since(killed)
		}
		time.Sleep(20 * time.Millisecond) // paces the loop; the deadline is what decides
	}
	if res := p.Needs()[0].Result; res == nil || res.Worker != "slurm-cpu-b" {
		t.Errorf("need served by %+v; want slurm-cpu-b", res)
	}
	if listed("slurm-cpu-a") {
		t.Error("/status still lists the dead worker")
	}
	t.Logf("SIGKILLed idle worker: gone after %s, its task re-run by another worker after %s (deadAfter %s, poll wait %s)",
		goneAfter.Round(10*time.Millisecond), servedAfter.Round(10*time.Millisecond), deadAfter, defaultPollWait)
	if goneAfter > deadAfter+2*time.Second {
		t.Errorf("dead worker gone after %s; want within %s", goneAfter, deadAfter+2*time.Second)
	}
}
