package slurm_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/shared"
)

// attachSeen is a loopback HTTP server where the workers of a test dial
// as their engine: it records each attach's credential and holds the
// request open, so that the worker stays up, waiting for its answer,
// until the test ends. It stands in for the engine because the rig mints
// its own credentials, which a real engine would refuse; what is tested
// is the worker reaching it, not the engine's answer.
type attachSeen struct {
	url string
	mu  sync.Mutex // guards tokens
	// tokens are the credentials of the attaches seen, in order.
	tokens []string
	seen   chan struct{}
}

func newAttachSeen(t *testing.T) *attachSeen {
	t.Helper()
	a := &attachSeen{seen: make(chan struct{}, 100)}
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/attach" {
			a.mu.Lock()
			a.tokens = append(a.tokens, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
			a.mu.Unlock()
			a.seen <- struct{}{}
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
		http.Error(w, `{"error": "the test is over"}`, http.StatusServiceUnavailable)
	}))
	// Close waits for the held requests, which release lets go first.
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	a.url = srv.URL
	return a
}

// attached reports whether a worker attached with token.
func (a *attachSeen) attached(token string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, tok := range a.tokens {
		if tok == token {
			return true
		}
	}
	return false
}

// waitAttached waits for a worker to attach with token.
func (a *attachSeen) waitAttached(t *testing.T, token string) {
	t.Helper()
	deadline := time.NewTimer(jobTimeout)
	defer deadline.Stop()
	for !a.attached(token) {
		select {
		case <-a.seen:
		case <-deadline.C:
			t.Fatalf("no worker attached with the job's credential within %s", jobTimeout)
		}
	}
}

// processOf is the pid of the process of job whose executable is exe,
// found the way an administrator would: /proc/PID/exe and the job id in
// its environment. 0 when there is none. The executable is compared as
// a file, not as a path: the newer Slurms' sandboxes run their jobs in
// a chroot, where the link reads as the path inside it.
func processOf(job, exe string) int {
	want, err := os.Stat(exe)
	if err != nil {
		return 0
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if got, err := os.Stat(fmt.Sprintf("/proc/%d/exe", pid)); err != nil || !os.SameFile(got, want) {
			continue
		}
		environ, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		for _, kv := range strings.Split(string(environ), "\x00") {
			if kv == "SLURM_JOB_ID="+job {
				return pid
			}
		}
	}
	return 0
}

// TestIntegrationWorkerShipped: with worker_command unset, on a login
// node where no fluksio-worker is installed or on PATH, the plugin ships
// the fluksio-worker built beside it and a need is served by it.
//
//   - The copy is at ~/.local/share/fluksio/bin/fluksio-worker-<16 hex of
//     its sha256>, the login user's, the directory and the file 0700,
//     byte for byte the worker beside the plugin.
//   - The job ran it: the job's process is that file (/proc/PID/exe),
//     and it attached with the job's credential.
//   - Another version's copy unused for two hours is gone after the
//     ship; another of our naming used a minute ago, and a file not of
//     our naming, stay.
//   - A copy swapped for another executable of the same name is refused
//     by the next job: its output says the sha256 did not match, the
//     other program never ran and no worker attached; the plugin then
//     checks its copy, copies the worker again, and the job after that
//     runs it and attaches.
func TestIntegrationWorkerShipped(t *testing.T) {
	sandboxtest.WorkerCopies(t)
	env := sandboxtest.Require(t)
	// Built beside the plugin (one directory for every Binary), where
	// the plugin looks for the worker to ship; the login node is this
	// machine, its user's home reachable here.
	w := env.ShippedWorker(t)
	sum, uid, gid, dir, shipped := w.Sum, w.UID, w.GID, w.Dir, w.Path
	name, _, _ := strings.Cut(env.Login, "@")
	if out, err := sshAs(env, "command -v fluksio-worker"); err == nil {
		t.Fatalf("the login node has a fluksio-worker on PATH (%s); the test needs one without", out)
	}
	os.Remove(shipped)
	t.Cleanup(func() { os.Remove(shipped) })

	// What the directory holds before: another version's copy unused
	// for two hours, another used a minute ago, a file not of ours.
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{filepath.Join(w.Home, ".local"), filepath.Join(w.Home, ".local/share"), filepath.Dir(dir), dir} {
		os.Chown(d, uid, gid)
	}
	stale, recent, notOurs := filepath.Join(dir, "fluksio-worker-0000000000000000"), filepath.Join(dir, "fluksio-worker-1111111111111111"), filepath.Join(dir, "notes.txt")
	for p, age := range map[string]time.Duration{stale: 2 * time.Hour, recent: time.Minute, notOurs: 2 * time.Hour} {
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o700); err != nil {
			t.Fatal(err)
		}
		os.Chown(p, uid, gid)
		at := time.Now().Add(-age)
		os.Chtimes(p, at, at)
		t.Cleanup(func() { os.Remove(p) })
	}

	engine := newAttachSeen(t)
	r := newRig(t, "shipped", func(r *rig) map[string]any {
		c := r.config(profile("small", 1, 0, 100, nil, []string{"--partition=" + r.env.Partition, "--time=00:05:00"}))
		delete(c, "worker_command") // unset: the plugin ships its own
		c["engine_url"] = engine.url
		c["poll_interval"] = "2s"
		return c
	})
	need := shared.Need{CPUs: 1}
	r.provision(t, need, "small")
	first := r.provisioned(t, "small")
	engine.waitAttached(t, r.signer.token(first.Worker))

	st, err := os.Stat(shipped)
	if err != nil {
		t.Fatalf("no copy at %s: %v", shipped, err)
	}
	if st.Mode().Perm() != 0o700 || st.Sys().(*syscall.Stat_t).Uid != uint32(uid) {
		t.Errorf("%s: mode %v, owner %d; want 0700, %s's", shipped, st.Mode().Perm(), st.Sys().(*syscall.Stat_t).Uid, name)
	}
	if dst, err := os.Stat(dir); err != nil || dst.Mode().Perm() != 0o700 {
		t.Errorf("%s: %v %v; want mode 0700", dir, dst.Mode().Perm(), err)
	}
	if got, _ := os.ReadFile(shipped); fmt.Sprintf("%x", sha256.Sum256(got)) != sum {
		t.Errorf("%s is not the worker beside the plugin (%s)", shipped, w.Local)
	}
	if pid := processOf(first.Job, shipped); pid == 0 {
		t.Errorf("no process of job %s runs %s", first.Job, shipped)
	}
	if _, err := os.Stat(stale); err == nil {
		t.Errorf("another version's copy unused for two hours is still there: %s", stale)
	}
	for _, p := range []string{recent, notOurs} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s is gone: %v; only other versions' copies unused for an hour go", p, err)
		}
	}

	// Swapped: another executable under the copy's name (renamed over
	// it, as the first job's worker still runs the old file).
	marker := filepath.Join(dir, ".swapped-ran")
	swap := filepath.Join(dir, ".swap")
	if err := os.WriteFile(swap, []byte("#!/bin/sh\ntouch "+marker+"\necho SWAPPED-RAN\nsleep 300\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	os.Chown(swap, uid, gid)
	t.Cleanup(func() { os.Remove(swap); os.Remove(marker) })
	if err := os.Rename(swap, shipped); err != nil {
		t.Fatal(err)
	}
	if out, _, err := r.wants.Ask(context.Background(), r.prov, need, 2); err != nil || out.Outcome != shared.OutcomeRequested {
		t.Fatalf("asking for a second machine: %+v %v", out, err)
	}
	second := r.events.wait(t, "worker_provisioned for a second machine", eventTimeout, func(ev shared.Event) bool {
		return ev.Kind == shared.EventWorkerProvisioned && ev.Worker != first.Worker
	})
	failed := r.events.wait(t, "the second machine's job to fail", jobTimeout, func(ev shared.Event) bool {
		return ev.Kind == shared.EventWorkerProvisionFailed && ev.Worker == second.Worker
	})
	t.Logf("worker_provision_failed: %s", failed.Detail)
	if want := "fluksio: the worker " + shipped + " does not match its sha256 " + sum; !strings.Contains(failed.Detail, want) {
		t.Errorf("the failure does not quote the job's line %q: %q", want, failed.Detail)
	}
	out := filepath.Join(w.Home, ".local/state/fluksio", r.name, second.Job+".out")
	if b, err := os.ReadFile(out); err != nil || !strings.Contains(string(b), "does not match its sha256") || strings.Contains(string(b), "SWAPPED-RAN") {
		t.Errorf("the job's output %s (%v):\n%s\nwant the line saying the sha256 did not match, and nothing of the swapped program", out, err, b)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Errorf("the swapped program ran")
	}
	if engine.attached(r.signer.token(second.Worker)) {
		t.Errorf("the refused job's worker attached")
	}

	// The plugin checks its copy again, copies the worker again, and
	// the next job runs it. The profile backs off after the failure.
	poll(t, "the profile to be asked for again after its backoff", jobTimeout, func() (bool, string) {
		o, _, err := r.wants.Ask(context.Background(), r.prov, need, 2)
		if err != nil {
			return false, err.Error()
		}
		return o.Outcome == shared.OutcomeRequested, fmt.Sprint(o.Outcome)
	})
	third := r.events.wait(t, "worker_provisioned for a third machine", eventTimeout, func(ev shared.Event) bool {
		return ev.Kind == shared.EventWorkerProvisioned && ev.Worker != first.Worker && ev.Worker != second.Worker
	})
	engine.waitAttached(t, r.signer.token(third.Worker))
	if got, _ := os.ReadFile(shipped); fmt.Sprintf("%x", sha256.Sum256(got)) != sum {
		t.Errorf("%s was not copied again after the swap", shipped)
	}
	if pid := processOf(third.Job, shipped); pid == 0 {
		t.Errorf("no process of job %s runs %s", third.Job, shipped)
	}
	if !strings.Contains(r.logs.String(), "copying the worker to the login node") {
		t.Errorf("the plugin's log does not say it copied the worker")
	}
	r.stop(t)
	waitQueueEmpty(t, r.env, r.name)
}

// sshAs runs a command on the sandbox's login node as its user, the way a
// person would, and returns what it printed.
func sshAs(env sandboxtest.Env, command string) (string, error) {
	cmd := exec.Command("ssh", "-i", env.Key, "-p", strconv.Itoa(env.Port), "-o", "BatchMode=yes",
		"-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile="+env.KnownHosts, "-o", "ConnectTimeout=10",
		env.Login, command)
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}
