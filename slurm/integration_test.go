package slurm_test

// Integration tests: the real plugin binary, launched over go-plugin as a
// host would, submitting to the sandbox Slurm that sandbox/up.sh starts.
// Without the sandbox's environment they skip (fail in CI); see
// internal/sandboxtest.
//
// Every test has its own provisioner name, so its jobs (named
// fluksio-<name>) are its own, and a cleanup that scancels whatever is
// left under that name and waits for the queue to drain.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/internal/testutil"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/shared/plugin"
	"github.com/fluksio/provision/shared/sharedtest"
)

const (
	// engineURL has characters a shell would act on, so the worker's
	// argv shows whether the script quotes it.
	engineURL = "https://engine.example.test:8765/flow?a=1&b=2"
	// jobTimeout bounds waits on the queue: a job starting, a job
	// leaving. The sandbox may be shared with other tests' jobs.
	jobTimeout = 90 * time.Second
	// eventTimeout bounds the wait for an event after a call that
	// submits or cancels over ssh.
	eventTimeout = 45 * time.Second
)

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// signer mints recognisable tokens and remembers them by worker.
type signer struct {
	mu     sync.Mutex
	tokens map[string]string
}

func (s *signer) Sign(c host.CredentialClaims, ttl time.Duration) (string, time.Time, error) {
	worker := c.Worker
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tokens == nil {
		s.tokens = map[string]string{}
	}
	tok := "tok-" + randHex(16)
	s.tokens[worker] = tok
	return tok, time.Now().Add(ttl), nil
}

func (s *signer) token(worker string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tokens[worker]
}

func (s *signer) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, t := range s.tokens {
		out = append(out, t)
	}
	return out
}

// recorder keeps the plugin's events; changed is closed and replaced on
// every event, so a waiter wakes without polling.
type recorder struct {
	mu      sync.Mutex
	events  []shared.Event
	changed chan struct{}
}

func newRecorder() *recorder { return &recorder{changed: make(chan struct{})} }

func (r *recorder) add(ev shared.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *recorder) all() []shared.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// wait returns the first event that matches, waiting up to timeout.
func (r *recorder) wait(t *testing.T, what string, timeout time.Duration, match func(shared.Event) bool) shared.Event {
	t.Helper()
	return r.waitN(t, what, timeout, 1, match)[0]
}

// waitN returns the first n events that match, waiting up to timeout.
func (r *recorder) waitN(t *testing.T, what string, timeout time.Duration, n int, match func(shared.Event) bool) []shared.Event {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		var got []shared.Event
		for _, ev := range r.events {
			if match(ev) {
				got = append(got, ev)
			}
		}
		changed := r.changed
		r.mu.Unlock()
		if len(got) >= n {
			return got[:n]
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("no %d× %s within %s; events: %+v", n, what, timeout, r.all())
		}
	}
}

func kindIs(k shared.EventKind, profile string) func(shared.Event) bool {
	return func(ev shared.Event) bool { return ev.Kind == k && ev.Profile == profile }
}

// syncBuffer is a buffer goroutines write while the test reads it.
type syncBuffer = testutil.Buffer

// slurm runs a Slurm client command locally, returning its error rather
// than failing, for the commands that fail on purged jobs.
func slurm(env sandboxtest.Env, name string, args ...string) (string, error) {
	out, err := env.Command(name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// poll calls cond until it holds or timeout passes; cond says what it saw.
func poll(t *testing.T, what string, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	end := time.Now().Add(timeout)
	for {
		ok, saw := cond()
		if ok {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("timed out after %s waiting for %s; last saw: %s", timeout, what, saw)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitQueueEmpty waits until nothing named fluksio-<name> is queued or
// running.
func waitQueueEmpty(t *testing.T, env sandboxtest.Env, name string) {
	t.Helper()
	poll(t, "no job named fluksio-"+name+" in squeue", jobTimeout, func() (bool, string) {
		out, err := slurm(env, "squeue", "-h", "--name=fluksio-"+name, "-o", "%i %T")
		if err != nil {
			return false, err.Error()
		}
		return strings.TrimSpace(out) == "", out
	})
}

// waitJobGone waits until a job is no longer queued or running: gone
// from squeue, or CANCELLED under -t all.
func waitJobGone(t *testing.T, env sandboxtest.Env, job string) {
	t.Helper()
	poll(t, "job "+job+" to leave the queue", jobTimeout, func() (bool, string) {
		out, err := slurm(env, "squeue", "-h", "-t", "all", "-j", job, "-o", "%T")
		if err != nil {
			// Purged already: "Invalid job id specified".
			return strings.Contains(out, "Invalid job id"), err.Error()
		}
		state := strings.TrimSpace(out)
		return state == "" || state == "CANCELLED", state
	})
}

// worker is the recording script used as worker_command: it writes its
// argv, environment and /proc/self/cmdline into rec, one file set per
// job, then stays up like a worker waiting for work.
type worker struct {
	script string
	rec    string
}

func newWorker(t *testing.T) *worker {
	t.Helper()
	// Not t.TempDir: its parents are 0700 and the job runs as the
	// sandbox's job user.
	dir, err := os.MkdirTemp("", "fluksio-it-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	rec := filepath.Join(dir, "rec")
	if err := os.Mkdir(rec, 0o777); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "worker.sh")
	body := fmt.Sprintf(`#!/bin/sh
# Records how it was started, then waits like a worker with nothing to do.
rec=%s
id=${SLURM_JOB_ID:-none}
# An array task is recorded as its provisioner names it: <array>_<task>.
[ -n "$SLURM_ARRAY_TASK_ID" ] && id=${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}
# A node of a multi-node allocation is recorded as <job>.n<task>.
[ "${SLURM_NNODES:-1}" -gt 1 ] && id=$id.n${SLURM_PROCID:-x}
for a in "$@"; do printf '%%s\n' "$a"; done > "$rec/$id.args.part"
env > "$rec/$id.env.part"
tr '\000' '\n' < /proc/$$/cmdline > "$rec/$id.cmdline.part"
for f in args env cmdline; do mv "$rec/$id.$f.part" "$rec/$id.$f"; done
: > "$rec/$id.done"
sleep 300 &
wait $!
`, rec)
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		path string
		mode os.FileMode
	}{{dir, 0o755}, {rec, 0o777}, {script, 0o755}} {
		if err := os.Chmod(p.path, p.mode); err != nil {
			t.Fatal(err)
		}
	}
	return &worker{script: script, rec: rec}
}

// recording waits for the job to have started the script and returns
// what it recorded: argv, environment and /proc/self/cmdline, each as
// lines.
func (w *worker) recording(t *testing.T, job string) (args, env, cmdline []string) {
	t.Helper()
	poll(t, "job "+job+" to start its worker", jobTimeout, func() (bool, string) {
		_, err := os.Stat(filepath.Join(w.rec, job+".done"))
		return err == nil, fmt.Sprint(err)
	})
	read := func(what string) []string {
		b, err := os.ReadFile(filepath.Join(w.rec, job+"."+what))
		if err != nil {
			t.Fatal(err)
		}
		return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	}
	return read("args"), read("env"), read("cmdline")
}

// outputOption sends the job's output next to the recording, so that
// nothing accumulates in the job user's home.
func (w *worker) outputOption() string {
	return "--output=" + filepath.Join(w.rec, "slurm-%j.out")
}

// rig is one launched plugin, configured against the sandbox.
type rig struct {
	env    sandboxtest.Env
	name   string
	plugin *host.Plugin
	prov   shared.Provisioner
	events *recorder
	signer *signer
	logs   *syncBuffer
	worker *worker
	// engineID and epoch go to Configure; empty as from an engine that
	// says none. The configure function may set them.
	engineID, epoch string
	// wants is the demand the test has expressed so far.
	wants sharedtest.Wants
}

func profile(name string, cpus, gpus int, ramMB int64, labels, sbatch []string) map[string]any {
	return map[string]any{
		"name": name, "cpus": cpus, "gpus": gpus, "ram_mb": ramMB,
		"labels": labels, "sbatch": sbatch, "prerun": nil,
	}
}

// config is a configuration as the host's DecodeConfig produces it:
// every attribute present, durations as strings, profiles as a list of
// objects with their name.
func (r *rig) config(profiles ...map[string]any) map[string]any {
	return map[string]any{
		"login":             r.env.Login,
		"ssh_port":          r.env.Port,
		"ssh_key":           r.env.Key,
		"known_hosts":       r.env.KnownHosts,
		"ssh_config":        "",
		"ssh_options":       nil,
		"engine_url":        engineURL,
		"artifact_url":      "",
		"max_idle":          "1m30s",
		"provision_timeout": "15m",
		"submit_timeout":    "30s",
		// Long enough for the profiles that wait an hour for their
		// --begin (validation refuses a begin the credential would not
		// outlast); short of the engine's 12 h cap, so the cap is not
		// what is tested.
		"token_ttl":      "4h",
		"worker_command": []string{r.worker.script},
		// The tests run side by side as the sandbox's one login user;
		// the RPC budget they would share is not what most test (the
		// limiter's tests read the site's, which caps it).
		"max_rpc_rate": 200.0,
		"profile":      profiles,
	}
}

// sbatch is a profile's usual sbatch lines.
func (r *rig) sbatch(extra ...string) []string {
	return append([]string{"--partition=" + r.env.Partition, "--time=00:05:00", r.worker.outputOption()}, extra...)
}

// newRig launches the plugin under a name of its own. configure is
// called with the rig to build the configuration.
func newRig(t *testing.T, tag string, configure func(r *rig) map[string]any) *rig {
	t.Helper()
	return launchRig(t, sandboxtest.Require(t), "it-"+tag, true, configure)
}

// launchRig launches the plugin against env under the name prefix plus a
// random suffix. Its cleanup cancels what a failing test left, by name,
// and with drain waits for the queue to empty; a private sandbox's own
// cleanup, registered earlier and so run later, stops everything anyway.
func launchRig(t *testing.T, env sandboxtest.Env, prefix string, drain bool, configure func(r *rig) map[string]any) *rig {
	t.Helper()
	r := &rig{
		env:    env,
		name:   prefix + "-" + randHex(3),
		events: newRecorder(),
		signer: &signer{},
		logs:   &syncBuffer{},
	}
	r.worker = newWorker(t)
	// Registered before Launch so that it runs after the plugin is
	// killed: whatever a failing test left is cancelled by name.
	t.Cleanup(func() {
		if out, err := slurm(env, "scancel", "--name=fluksio-"+r.name); err != nil {
			t.Errorf("cleanup: %v %s", err, out)
		}
		if drain {
			waitQueueEmpty(t, env, r.name)
		}
		if t.Failed() {
			t.Logf("plugin log:\n%s", r.logs.String())
		}
	})

	bin := sandboxtest.Binary(t, "plugin", "provisioner-slurm")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := host.Launch(ctx, host.LaunchConfig{
		Name:    r.name,
		Path:    bin,
		Logger:  hclog.New(&hclog.LoggerOptions{Output: r.logs, Level: hclog.Trace}),
		Signer:  r.signer,
		OnEvent: r.events.add,
		Env:     []string{plugin.LogLevelEnv + "=trace"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Shutdown, not just a kill, so the plugin closes what it holds
		// open to the login node; a second Stop only kills.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		p.Stop(ctx)
	})
	r.plugin, r.prov = p, p.Provisioner()

	schema, err := r.prov.Schema(ctx, &shared.SchemaRequest{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := configure(r)
	completeConfig(t, cfg, schema.Schema)
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := r.prov.Configure(ctx, &shared.ConfigureRequest{Name: r.name, Config: raw, EngineID: r.engineID, CredentialEpoch: r.epoch})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Diagnostics.HasErrors() {
		t.Fatalf("Configure: %s", resp.Diagnostics.Error())
	}
	return r
}

// completeConfig gives every attribute of the plugin's schema that cfg
// leaves out its default, as the host's DecodeConfig does, so the tests
// send what a host sends even as the schema grows. A name cfg has and the
// schema does not is a mistake in the test.
func completeConfig(t *testing.T, cfg map[string]any, s *shared.Schema) {
	t.Helper()
	fill := func(obj map[string]any, s *shared.Schema, labels []string, where string) {
		known := map[string]bool{}
		for _, l := range labels {
			known[l] = true
		}
		for _, a := range s.Attributes {
			known[a.Name] = true
			if _, ok := obj[a.Name]; !ok {
				obj[a.Name] = a.Default
			}
		}
		for _, b := range s.Blocks {
			known[b.Name] = true
		}
		for k := range obj {
			if !known[k] {
				t.Fatalf("the test's configuration sets %s%s, which the plugin's schema does not have", where, k)
			}
		}
	}
	fill(cfg, s, nil, "")
	for _, b := range s.Blocks {
		blocks, _ := cfg[b.Name].([]map[string]any)
		for i, obj := range blocks {
			fill(obj, b.Body, b.Labels, fmt.Sprintf("%s.%d.", b.Name, i))
		}
	}
}

func (r *rig) provision(t *testing.T, need shared.Need, wantProfile string) {
	t.Helper()
	resp, _, err := r.wants.Ask(context.Background(), r.prov, need, 1)
	if err != nil {
		t.Fatalf("Provision(%+v): %v", need, err)
	}
	if resp.Outcome != shared.OutcomeRequested || resp.Profile != wantProfile {
		t.Fatalf("Provision(%+v) = %+v, want requested %s", need, resp, wantProfile)
	}
}

// provisioned waits for the profile's worker_provisioned event.
func (r *rig) provisioned(t *testing.T, profile string) shared.Event {
	t.Helper()
	ev := r.events.wait(t, "worker_provisioned for "+profile, eventTimeout, kindIs(shared.EventWorkerProvisioned, profile))
	if ev.Job == "" || !strings.HasPrefix(ev.Worker, r.name+"-"+profile+"-") {
		t.Fatalf("worker_provisioned = %+v, want a job id and a worker named %s-%s-…", ev, r.name, profile)
	}
	return ev
}

func (r *rig) status(t *testing.T) *shared.StatusResponse {
	t.Helper()
	st, err := r.prov.Status(context.Background(), &shared.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (r *rig) stop(t *testing.T) *shared.ShutdownResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp, err := r.plugin.Stop(ctx)
	if err != nil {
		t.Fatalf("Stop: %v", err)
	}
	return resp
}

func outstandingWorkers(st *shared.StatusResponse) []string {
	var ws []string
	for _, o := range st.Outstanding {
		ws = append(ws, o.Worker)
	}
	return ws
}

func TestIntegrationProfilesInQueue(t *testing.T) {
	r := newRig(t, "profiles", func(r *rig) map[string]any {
		return r.config(
			profile("small", 1, 0, 200, nil, r.sbatch()),
			profile("big", 4, 0, 1000, nil, r.sbatch()),
			profile("gpu", 2, 1, 500, []string{"cuda"}, r.sbatch()),
		)
	})
	cases := []struct {
		profile string
		need    shared.Need
		cpus    string
		mem     string
		gpus    int
	}{
		{"small", shared.Need{CPUs: 1}, "1", "200M", 0},
		{"big", shared.Need{CPUs: 3, RAMMB: 800}, "4", "1000M", 0},
		{"gpu", shared.Need{CPUs: 1, Label: "cuda"}, "2", "500M", 1},
	}
	for _, c := range cases {
		r.provision(t, c.need, c.profile)
	}
	var jobs []string
	for _, c := range cases {
		ev := r.provisioned(t, c.profile)
		jobs = append(jobs, ev.Job)
		out := r.env.Slurm(t, "squeue", "-h", "-j", ev.Job, "-o", "%C|%m|%b|%j|%k")
		f := strings.Split(strings.TrimSpace(out), "|")
		if len(f) != 5 {
			t.Errorf("%s: squeue printed %q, want 5 fields", c.profile, out)
			continue
		}
		cpus, mem, gres, name, comment := f[0], f[1], f[2], f[3], f[4]
		if cpus != c.cpus || mem != c.mem {
			t.Errorf("%s: job %s has %s CPUs and %s memory, want %s and %s", c.profile, ev.Job, cpus, mem, c.cpus, c.mem)
		}
		switch {
		case c.gpus > 0 && !strings.HasSuffix(gres, fmt.Sprintf("gpu:%d", c.gpus)):
			t.Errorf("%s: job %s has gres %q, want gpu:%d", c.profile, ev.Job, gres, c.gpus)
		case c.gpus == 0 && strings.Contains(gres, "gpu"):
			t.Errorf("%s: job %s has gres %q, want no GPUs", c.profile, ev.Job, gres)
		}
		// An engine that gives no id: the tag falls back to the
		// provisioner's name and epoch 0.
		if want := "fluksio:v2:" + r.name + ":0:" + ev.Worker; name != "fluksio-"+r.name || comment != want {
			t.Errorf("%s: job %s is named %q with comment %q, want fluksio-%s and %s", c.profile, ev.Job, name, comment, r.name, want)
		}
	}

	st := r.status(t)
	if len(st.Outstanding) != len(cases) {
		t.Errorf("Status lists %d outstanding, want %d: %+v", len(st.Outstanding), len(cases), st.Outstanding)
	}
	resp := r.stop(t)
	if !sameSet(resp.Cancelled, jobs) {
		t.Errorf("Shutdown cancelled %v, want %v", resp.Cancelled, jobs)
	}
	waitQueueEmpty(t, r.env, r.name)
}

func TestIntegrationPayloadStarts(t *testing.T) {
	r := newRig(t, "payload", func(r *rig) map[string]any {
		return r.config(
			profile("plain", 1, 0, 0, nil, r.sbatch()),
			profile("full", 2, 1, 300, []string{"cuda", "fast"}, r.sbatch()),
		)
	})
	cases := []struct {
		profile string
		need    shared.Need
		argv    []string
	}{
		{"plain", shared.Need{CPUs: 1}, []string{"--url", engineURL, "--cpus", "1", "--gpus", "0", "--max-idle", "90"}},
		{"full", shared.Need{GPUs: 1}, []string{"--url", engineURL, "--cpus", "2", "--gpus", "1", "--max-idle", "90", "--ram-mb", "300", "--labels", "cuda,fast"}},
	}
	for _, c := range cases {
		r.provision(t, c.need, c.profile)
	}
	for _, c := range cases {
		ev := r.provisioned(t, c.profile)
		args, env, _ := r.worker.recording(t, ev.Job)
		if !slices.Equal(args, c.argv) {
			t.Errorf("%s: the worker's argv is\n%q\nwant\n%q", c.profile, args, c.argv)
		}
		token := r.signer.token(ev.Worker)
		if token == "" {
			t.Fatalf("%s: no credential was minted for %s", c.profile, ev.Worker)
		}
		if got := envValue(env, "FLUKSIO_WORKER_TOKEN"); got != token {
			t.Errorf("%s: FLUKSIO_WORKER_TOKEN is %q, want the minted %q", c.profile, got, token)
		}
		if got := envValue(env, "SLURM_JOB_ID"); got != ev.Job {
			t.Errorf("%s: SLURM_JOB_ID is %q, want %s", c.profile, got, ev.Job)
		}
	}
	r.stop(t)
	waitQueueEmpty(t, r.env, r.name)
}

func envValue(env []string, key string) string {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

func TestIntegrationTokenNotExposed(t *testing.T) {
	r := newRig(t, "token", func(r *rig) map[string]any {
		prof := profile("small", 1, 0, 100, []string{"cuda"}, r.sbatch())
		// A prerun line sees what every prerun command would: it must
		// not be the credential, which is the worker's alone.
		prof["prerun"] = []string{`env > "` + r.worker.rec + `/$SLURM_JOB_ID.prerun-env"`}
		return r.config(prof)
	})
	r.provision(t, shared.Need{CPUs: 1}, "small")
	ev := r.provisioned(t, "small")
	args, env, cmdline := r.worker.recording(t, ev.Job)
	token := r.signer.token(ev.Worker)
	if token == "" || envValue(env, "FLUKSIO_WORKER_TOKEN") != token {
		t.Fatalf("the running job does not have the minted token %q in its environment, so there is nothing to look for", token)
	}
	prerunEnv, err := os.ReadFile(filepath.Join(r.worker.rec, ev.Job+".prerun-env"))
	if err != nil || !bytes.Contains(prerunEnv, []byte("SLURM_JOB_ID=")) {
		t.Fatalf("the prerun line recorded no environment (%v), so there is nothing to look at", err)
	}
	if bytes.Contains(prerunEnv, []byte(token)) || bytes.Contains(prerunEnv, []byte("FLUKSIO_WORKER_TOKEN")) {
		t.Errorf("a prerun command inherited the worker's credential")
	}
	for what, lines := range map[string][]string{"argv": args, "/proc/self/cmdline": cmdline} {
		if strings.Contains(strings.Join(lines, "\n"), token) {
			t.Errorf("the token is in the worker's %s: %q", what, lines)
		}
	}

	// Every process on the machine, while the job runs. The worker's own
	// command line must be among them, or the scan proves nothing.
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	sawWorker := false
	for _, f := range cmdlines {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // It exited meanwhile.
		}
		if bytes.Contains(b, []byte(r.worker.script)) && bytes.Contains(b, []byte(engineURL)) {
			sawWorker = true
		}
		if bytes.Contains(b, []byte(token)) {
			t.Errorf("the token is on the command line of %s: %q", f, bytes.ReplaceAll(b, []byte{0}, []byte{' '}))
		}
	}
	if !sawWorker {
		t.Errorf("none of %d command lines is the worker's (%s --url %s …), so the scan saw nothing of the job", len(cmdlines), r.worker.script, engineURL)
	}

	r.stop(t)
	waitQueueEmpty(t, r.env, r.name)
	tokens := r.signer.all()
	for _, e := range r.events.all() {
		for _, tok := range tokens {
			if strings.Contains(e.Detail, tok) {
				t.Errorf("event %+v carries a token", e)
			}
		}
	}
	logs := r.logs.String()
	if !strings.Contains(logs, ev.Worker) {
		t.Errorf("the plugin's log never mentions worker %s; is it captured at all?\n%s", ev.Worker, logs)
	}
	for _, tok := range tokens {
		if strings.Contains(logs, tok) {
			t.Errorf("the plugin's log contains token %s:\n%s", tok, logs)
		}
	}
}

func TestIntegrationReconcileArrived(t *testing.T) {
	r := newRig(t, "arrived", func(r *rig) map[string]any {
		return r.config(profile("small", 1, 0, 100, nil, r.sbatch()))
	})
	r.provision(t, shared.Need{CPUs: 1}, "small")
	ev := r.provisioned(t, "small")
	if ws := outstandingWorkers(r.status(t)); !slices.Equal(ws, []string{ev.Worker}) {
		t.Fatalf("outstanding before Reconcile = %v, want [%s]", ws, ev.Worker)
	}
	resp, err := r.prov.Reconcile(context.Background(), &shared.ReconcileRequest{Attached: []string{"somebody-else-1", ev.Worker}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(resp.Arrived, []string{ev.Worker}) || len(resp.Expired) != 0 {
		t.Errorf("Reconcile = %+v, want arrived [%s] and nothing expired", resp, ev.Worker)
	}
	if st := r.status(t); len(st.Outstanding) != 0 {
		t.Errorf("outstanding after the worker attached = %+v, want none", st.Outstanding)
	}
	// The job is the worker's now: Shutdown must not cancel it.
	stopped := r.stop(t)
	if slices.Contains(stopped.Cancelled, ev.Job) {
		t.Errorf("Shutdown cancelled %v, including job %s whose worker had attached", stopped.Cancelled, ev.Job)
	}
	if out := r.env.Slurm(t, "squeue", "-h", "-j", ev.Job, "-o", "%T"); strings.TrimSpace(out) == "" {
		t.Errorf("job %s of an attached worker is gone after Shutdown", ev.Job)
	}
	// The rig's cleanup scancels it.
}

func TestIntegrationReconcileExpires(t *testing.T) {
	r := newRig(t, "expires", func(r *rig) map[string]any {
		c := r.config(profile("small", 1, 0, 100, nil, r.sbatch()))
		c["provision_timeout"] = "3s"
		return c
	})
	asked := time.Now()
	r.provision(t, shared.Need{CPUs: 1}, "small")
	ev := r.provisioned(t, "small")

	ctx := context.Background()
	if time.Since(asked) < 2*time.Second {
		// Still within provision_timeout: nothing may expire yet.
		resp, err := r.prov.Reconcile(ctx, &shared.ReconcileRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Expired) != 0 && time.Since(asked) < 3*time.Second {
			t.Errorf("Reconcile expired %v before provision_timeout", resp.Expired)
		}
	}
	var expired []string
	poll(t, "Reconcile to expire the request", 30*time.Second, func() (bool, string) {
		resp, err := r.prov.Reconcile(ctx, &shared.ReconcileRequest{Attached: []string{"somebody-else-1"}})
		if err != nil {
			return false, err.Error()
		}
		expired = resp.Expired
		return len(expired) > 0, fmt.Sprintf("%+v", resp)
	})
	if !slices.Equal(expired, []string{ev.Job}) {
		t.Errorf("Reconcile expired %v, want [%s]", expired, ev.Job)
	}
	cancelled := r.events.wait(t, "worker_cancelled", eventTimeout, kindIs(shared.EventWorkerCancelled, "small"))
	if cancelled.Job != ev.Job || cancelled.Worker != ev.Worker || !strings.Contains(cancelled.Detail, "3s") {
		t.Errorf("worker_cancelled = %+v, want job %s, worker %s, and the timeout in the detail", cancelled, ev.Job, ev.Worker)
	}
	if st := r.status(t); len(st.Outstanding) != 0 || st.LastError != "" {
		t.Errorf("Status after expiry = %+v, want nothing outstanding and no error", st)
	}
	waitJobGone(t, r.env, ev.Job)
	// Reconcile is idempotent: the job is not expired twice.
	if resp, err := r.prov.Reconcile(ctx, &shared.ReconcileRequest{}); err != nil || len(resp.Expired) != 0 {
		t.Errorf("a second Reconcile = %+v (%v), want nothing expired", resp, err)
	}
}

func TestIntegrationShutdownCancels(t *testing.T) {
	r := newRig(t, "shutdown", func(r *rig) map[string]any {
		return r.config(
			profile("a", 1, 0, 100, nil, r.sbatch()),
			profile("b", 1, 0, 150, nil, r.sbatch()),
			profile("c", 1, 0, 200, nil, r.sbatch()),
		)
	})
	profiles := []string{"a", "b", "c"}
	for _, p := range profiles {
		r.provision(t, shared.Need{Label: p}, p)
	}
	var jobs []string
	for _, p := range profiles {
		jobs = append(jobs, r.provisioned(t, p).Job)
	}
	resp := r.stop(t)
	if !sameSet(resp.Cancelled, jobs) {
		t.Errorf("Shutdown cancelled %v, want %v", resp.Cancelled, jobs)
	}
	evs := r.events.waitN(t, "worker_cancelled", 5*time.Second, len(jobs), func(ev shared.Event) bool { return ev.Kind == shared.EventWorkerCancelled })
	var evJobs []string
	for _, ev := range evs {
		evJobs = append(evJobs, ev.Job)
	}
	if !sameSet(evJobs, jobs) {
		t.Errorf("worker_cancelled events for %v, want %v", evJobs, jobs)
	}
	waitQueueEmpty(t, r.env, r.name)
}

func TestIntegrationShutdownInFlight(t *testing.T) {
	r := newRig(t, "inflight", func(r *rig) map[string]any {
		return r.config(
			profile("a", 1, 0, 100, nil, r.sbatch()),
			profile("b", 1, 0, 150, nil, r.sbatch()),
		)
	})
	r.provision(t, shared.Need{Label: "a"}, "a")
	r.provision(t, shared.Need{Label: "b"}, "b")
	resp := r.stop(t) // Both submissions are still in flight.

	// Each submission ends in an event, and every job that was accepted
	// is cancelled.
	ended := func(ev shared.Event) bool {
		return ev.Kind == shared.EventWorkerProvisioned || ev.Kind == shared.EventWorkerProvisionFailed
	}
	for _, ev := range r.events.waitN(t, "submission outcome", 5*time.Second, 2, ended) {
		if ev.Kind == shared.EventWorkerProvisioned && !slices.Contains(resp.Cancelled, ev.Job) {
			t.Errorf("job %s (%s) was accepted but Shutdown cancelled only %v", ev.Job, ev.Worker, resp.Cancelled)
		}
	}
	waitQueueEmpty(t, r.env, r.name)
}

// TestIntegrationRejectedSbatch: profiles the real Slurm refuses for good
// (a partition that does not exist, more GPUs than any node has) fail
// with Slurm's words in the event and in Status, are marked misconfigured
// after one attempt, and are not submitted again.
func TestIntegrationRejectedSbatch(t *testing.T) {
	r := newRig(t, "rejected", func(r *rig) map[string]any {
		return r.config(
			profile("nopart", 1, 0, 0, nil, []string{"--partition=nope", "--time=00:05:00"}),
			profile("manygpus", 1, 4, 0, nil, r.sbatch()),
		)
	})
	cases := []struct{ profile, want string }{
		{"nopart", "invalid partition specified: nope"},
		{"manygpus", "Requested node configuration is not available"},
	}
	for _, c := range cases {
		r.provision(t, shared.Need{Label: c.profile}, c.profile)
		ev := r.events.wait(t, "worker_provision_failed for "+c.profile, eventTimeout, kindIs(shared.EventWorkerProvisionFailed, c.profile))
		t.Logf("%s: worker_provision_failed: %s", c.profile, ev.Detail)
		if !strings.Contains(ev.Detail, c.want) {
			t.Errorf("%s: the event's detail is %q, want Slurm's %q", c.profile, ev.Detail, c.want)
		}
		st := r.status(t)
		if !strings.Contains(st.LastError, c.want) {
			t.Errorf("%s: LastError is %q, want Slurm's %q", c.profile, st.LastError, c.want)
		}
		if len(st.Outstanding) != 0 {
			t.Errorf("%s: a rejected submission is still outstanding: %+v", c.profile, st.Outstanding)
		}
	}
	if evs := r.events.all(); slices.ContainsFunc(evs, func(ev shared.Event) bool { return ev.Kind == shared.EventWorkerProvisioned }) {
		t.Errorf("a rejected submission was reported provisioned: %+v", evs)
	}

	// Both refusals are verdicts: each profile is marked misconfigured
	// after its one attempt, with Slurm's words in Status and in one loud
	// log line, and asking again submits nothing.
	sbatches := func() int64 {
		for _, c := range r.status(t).Counters.Commands {
			if c.Command == "sbatch" {
				return c.Calls
			}
		}
		return 0
	}
	before := sbatches()
	if before != 2 {
		t.Errorf("%d sbatch calls for two refused profiles, want 2", before)
	}
	st := r.status(t)
	for _, c := range cases {
		held := false
		for _, n := range st.Notes {
			held = held || (strings.Contains(n, "profile "+c.profile+" is misconfigured") && strings.Contains(n, c.want))
		}
		if !held {
			t.Errorf("%s: no note in Status that it is misconfigured, with Slurm's %q: %q", c.profile, c.want, st.Notes)
		}
		for _, b := range st.BackingOff {
			// misconfiguredHold is an hour; the doubling backoff's cap
			// is five minutes.
			if b.Profile == c.profile && time.Until(b.Until) < 50*time.Minute {
				t.Errorf("%s: held back only until %s, want about an hour", c.profile, b.Until)
			}
		}
		for range 3 {
			resp, _, err := r.wants.Ask(context.Background(), r.prov, shared.Need{Label: c.profile}, 1)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Outcome != shared.OutcomeBackingOff || !strings.Contains(resp.Detail, "misconfigured") || !strings.Contains(resp.Detail, c.want) {
				t.Errorf("%s asked for again: %+v; want backing_off, misconfigured, with Slurm's words", c.profile, resp)
			}
		}
	}
	if n := strings.Count(r.logs.String(), "profile misconfigured; Slurm refused it for good"); n != 2 {
		t.Errorf("%d \"profile misconfigured\" log lines for two profiles, want 2 (one each)", n)
	}
	if after := sbatches(); after != before {
		t.Errorf("%d more sbatch calls after the profiles were marked misconfigured, want none", after-before)
	}
}

func TestIntegrationSSHFailures(t *testing.T) {
	const submitTimeout = 10 * time.Second
	// The failure must arrive within submit_timeout; the margin is for
	// the event's way back, not for ssh.
	const deadline = submitTimeout + 5*time.Second

	t.Run("closed port", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		r := newRig(t, "closedport", func(r *rig) map[string]any {
			c := r.config(profile("small", 1, 0, 100, nil, r.sbatch()))
			c["ssh_port"] = port
			c["submit_timeout"] = submitTimeout.String()
			return c
		})
		r.provision(t, shared.Need{CPUs: 1}, "small")
		ev := r.events.wait(t, "worker_provision_failed", deadline, kindIs(shared.EventWorkerProvisionFailed, "small"))
		checkFailure(t, r, ev, "Connection refused")
	})

	t.Run("wrong host key", func(t *testing.T) {
		dir := t.TempDir()
		key := filepath.Join(dir, "other")
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", key).CombinedOutput(); err != nil {
			t.Fatalf("ssh-keygen: %v\n%s", err, out)
		}
		pub, err := os.ReadFile(key + ".pub")
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(pub))
		env := sandboxtest.Require(t)
		host := env.Login[strings.LastIndexByte(env.Login, '@')+1:]
		knownHosts := filepath.Join(dir, "known_hosts")
		line := fmt.Sprintf("[%s]:%d %s %s\n", host, env.Port, f[0], f[1])
		if err := os.WriteFile(knownHosts, []byte(line), 0o600); err != nil {
			t.Fatal(err)
		}
		r := newRig(t, "hostkey", func(r *rig) map[string]any {
			c := r.config(profile("small", 1, 0, 100, nil, r.sbatch()))
			c["known_hosts"] = knownHosts
			c["submit_timeout"] = submitTimeout.String()
			return c
		})
		// A host key that is not the one known is a refusal: a person
		// must check known_hosts. No machine fails and no profile backs
		// off; the need is answered "login needed" in ssh's words.
		need := shared.Need{CPUs: 1}
		var o *shared.DemandOutcome
		poll(t, "Provision to answer login needed", deadline, func() (bool, string) {
			o = r.ask(t, need)
			return o.Condition == shared.ConditionLoginNeeded, fmt.Sprintf("%+v", o)
		})
		for _, want := range []string{"Host key verification failed", "Check known_hosts"} {
			if !strings.Contains(o.Detail, want) {
				t.Errorf("the answer does not say %q: %s", want, o.Detail)
			}
		}
		for _, ev := range r.events.all() {
			if ev.Kind == shared.EventWorkerProvisionFailed {
				t.Errorf("a machine failed for a host key: %+v", ev)
			}
		}
		if st := r.status(t); len(st.BackingOff) != 0 || len(st.Outstanding) != 0 {
			t.Errorf("backing off %+v, outstanding %+v; want neither", st.BackingOff, st.Outstanding)
		}
	})
}

// checkFailure asserts that a failed submission says one of want in its
// event and in LastError, and left nothing outstanding.
func checkFailure(t *testing.T, r *rig, ev shared.Event, want ...string) {
	t.Helper()
	says := func(s string) bool {
		return slices.ContainsFunc(want, func(w string) bool { return strings.Contains(s, w) })
	}
	t.Logf("worker_provision_failed: %s", ev.Detail)
	if !says(ev.Detail) {
		t.Errorf("the event's detail is %q, want one of %q", ev.Detail, want)
	}
	st := r.status(t)
	if !says(st.LastError) {
		t.Errorf("LastError is %q, want one of %q", st.LastError, want)
	}
	if len(st.Outstanding) != 0 {
		t.Errorf("a failed submission is still outstanding: %+v", st.Outstanding)
	}
	if strings.Contains(ev.Detail, "no answer within") {
		t.Errorf("ssh timed out instead of failing at once: %q", ev.Detail)
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// TestIntegrationBurstIsOneArray asks the real Slurm for six machines of
// one profile and two of another in one demand: one sbatch each, a job
// array, whose tasks are one machine apiece, each with its own worker
// name and credential (what each task's worker was started with is read
// from the task itself). The same demand again asks for nothing; a
// smaller one gives up pending tasks, never running ones; Shutdown
// cancels the rest.
func TestIntegrationBurstIsOneArray(t *testing.T) {
	r := newRig(t, "burst", func(r *rig) map[string]any {
		// hold keeps the big profile's tasks pending until released, so
		// that falling demand has pending tasks to give up.
		return r.config(
			profile("small", 1, 0, 100, nil, r.sbatch()),
			profile("held", 1, 0, 150, nil, r.sbatch("--hold")),
		)
	})
	ctx := context.Background()
	small, held := shared.Need{Label: "small"}, shared.Need{Label: "held"}
	req := &shared.ProvisionRequest{Demand: []shared.Demand{{Need: small, Count: 2}, {Need: held, Count: 6}}}
	resp, err := r.prov.Provision(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		name string
		n    int
	}{{"small", 2}, {"held", 6}} {
		if pd := findProfile(resp, p.name); pd.Requested != p.n || pd.Submissions != 1 {
			t.Errorf("%s: %+v, want %d requested in 1 submission", p.name, pd, p.n)
		}
	}
	evs := r.events.waitN(t, "8 worker_provisioned", 2*eventTimeout, 8, func(ev shared.Event) bool { return ev.Kind == shared.EventWorkerProvisioned })
	arrays := map[string][]string{} // array job -> workers
	for _, ev := range evs {
		job, task, ok := strings.Cut(ev.Job, "_")
		if !ok || !strings.HasSuffix(ev.Worker, "-"+task) {
			t.Errorf("%+v: want an array task whose worker ends in -<task>", ev)
		}
		arrays[job] = append(arrays[job], ev.Worker)
	}
	if len(arrays) != 2 {
		t.Fatalf("%d arrays for 2 profiles: %v", len(arrays), arrays)
	}
	// What Slurm recorded: one job per profile, an array of the right
	// size, each task tagged for the array.
	for job, workers := range arrays {
		out, err := slurm(r.env, "scontrol", "show", "job", job)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "ArrayJobId="+job) || !strings.Contains(out, "ArrayTaskId=") {
			t.Errorf("scontrol show job %s does not show an array:\n%s", job, out)
		}
		tasks, err := slurm(r.env, "squeue", "-h", "-r", "-j", job, "-o", "%i")
		if err != nil {
			t.Fatal(err)
		}
		if n := len(strings.Fields(tasks)); n != len(workers) {
			t.Errorf("array %s has %d tasks in squeue -r, want %d:\n%s", job, n, len(workers), tasks)
		}
		if len(workers) != 2 {
			continue
		}
		// The small profile runs: each task's worker has its own
		// credential, the one minted for its own name.
		for _, w := range workers {
			task := w[strings.LastIndexByte(w, '-')+1:]
			_, env, _ := r.worker.recording(t, job+"_"+task)
			if got, want := envValue(env, "FLUKSIO_WORKER_TOKEN"), r.signer.token(w); got == "" || got != want {
				t.Errorf("task %s: FLUKSIO_WORKER_TOKEN %q, want the one minted for %s (%q)", task, got, w, want)
			}
		}
	}
	if t0, t1 := r.signer.token(arrays[firstKey(arrays)][0]), r.signer.token(arrays[firstKey(arrays)][1]); t0 == t1 {
		t.Errorf("two tasks share a credential")
	}

	// The same demand: nothing new.
	again, err := r.prov.Provision(ctx, req)
	if err != nil || findProfile(again, "held").Requested != 0 || findProfile(again, "small").Requested != 0 {
		t.Errorf("the same demand again: %+v %v", again, err)
	}
	// Demand falls to two held machines: four pending tasks are given up.
	fewer := &shared.ProvisionRequest{Demand: []shared.Demand{{Need: small, Count: 2}, {Need: held, Count: 2}}}
	less, err := r.prov.Provision(ctx, fewer)
	if err != nil || findProfile(less, "held").Cancelled != 4 {
		t.Fatalf("demand 2 of 6 held: %+v %v", less, err)
	}
	cancelled := r.events.waitN(t, "4 worker_cancelled", eventTimeout, 4, func(ev shared.Event) bool { return ev.Kind == shared.EventWorkerCancelled })
	for _, ev := range cancelled {
		if _, task, _ := strings.Cut(ev.Job, "_"); task < "2" {
			t.Errorf("gave up %s; want the newest tasks (2-5)", ev.Job)
		}
	}
	r.stop(t)
	waitQueueEmpty(t, r.env, r.name)
}

func findProfile(resp *shared.ProvisionResponse, profile string) shared.ProfileDemand {
	for _, pd := range resp.Profiles {
		if pd.Profile == profile {
			return pd
		}
	}
	return shared.ProfileDemand{}
}

func firstKey(m map[string][]string) string {
	for k, v := range m {
		if len(v) == 2 {
			return k
		}
	}
	return ""
}

// TestIntegrationMultiNode: a profile of nodes = 2 is one job of two
// nodes per allocation, a worker on each with its own name and its own
// credential, and no worker holds a sibling's. The demand counts
// machines: three ask for two allocations (four machines) in one array.
func TestIntegrationMultiNode(t *testing.T) {
	env := sandboxtest.Require(t)
	if env.Nodes < 2 {
		t.Fatalf("the sandbox has %d node(s); this test needs 2 (SANDBOX_NODES=2, the default)", env.Nodes)
	}
	r := newRig(t, "nodes", func(r *rig) map[string]any {
		p := profile("pair", 1, 0, 100, nil, r.sbatch())
		p["nodes"] = 2
		return r.config(p)
	})
	ctx := context.Background()
	req := &shared.ProvisionRequest{Demand: []shared.Demand{{Need: shared.Need{CPUs: 1}, Count: 3}}}
	resp, err := r.prov.Provision(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if pd := findProfile(resp, "pair"); pd.Requested != 4 || pd.Submissions != 1 {
		t.Fatalf("3 machines of a 2-node profile: %+v, want 4 requested (2 allocations) in 1 submission", pd)
	}
	evs := r.events.waitN(t, "4 worker_provisioned", 2*eventTimeout, 4, func(ev shared.Event) bool { return ev.Kind == shared.EventWorkerProvisioned })
	byJob := map[string][]string{}
	for _, ev := range evs {
		byJob[ev.Job] = append(byJob[ev.Job], ev.Worker)
	}
	if len(byJob) != 2 {
		t.Fatalf("4 machines in %d jobs, want 2 allocations of 2: %v", len(byJob), byJob)
	}
	for job, workers := range byJob {
		slices.Sort(workers)
		// What Slurm recorded: two nodes, one task on each.
		out, err := slurm(r.env, "scontrol", "show", "job", job)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "NumNodes=2") || !strings.Contains(out, "ArrayTaskId=") {
			t.Errorf("scontrol show job %s: want an array task of 2 nodes:\n%s", job, out)
		}
		alloc := strings.TrimSuffix(workers[0], "-n0")
		if want := []string{alloc + "-n0", alloc + "-n1"}; !slices.Equal(workers, want) {
			t.Errorf("job %s: workers %v, want %v", job, workers, want)
		}
		for i, w := range workers {
			_, wenv, cmdline := r.worker.recording(t, job+".n"+strconv.Itoa(i))
			if got, want := envValue(wenv, "FLUKSIO_WORKER_TOKEN"), r.signer.token(w); got == "" || got != want {
				t.Errorf("%s on node %d: FLUKSIO_WORKER_TOKEN %q, want the one minted for it (%q)", job, i, got, want)
			}
			for _, kv := range wenv {
				if strings.HasPrefix(kv, "FLUKSIO_WORKER_TOKEN_") {
					t.Errorf("%s on node %d: a sibling's credential is in the worker's environment: %s", job, i, kv)
				}
			}
			for _, sib := range workers {
				if tok := r.signer.token(sib); strings.Contains(strings.Join(cmdline, " "), tok) {
					t.Errorf("%s on node %d: the credential of %s is in the worker's argv", job, i, sib)
				}
			}
			if node := envValue(wenv, "SLURMD_NODENAME"); node == "" {
				t.Errorf("%s on node %d: no SLURMD_NODENAME", job, i)
			}
		}
		if r.signer.token(workers[0]) == r.signer.token(workers[1]) {
			t.Errorf("the two nodes of %s share a credential", job)
		}
	}
	// Demand falls by one machine: less than an allocation, so nothing is
	// given up (and the running ones never are).
	less, err := r.prov.Provision(ctx, &shared.ProvisionRequest{Demand: []shared.Demand{{Need: shared.Need{CPUs: 1}, Count: 3}}})
	if err != nil || findProfile(less, "pair").Requested != 0 || findProfile(less, "pair").Cancelled != 0 {
		t.Errorf("the same demand again: %+v %v", less, err)
	}
	r.stop(t)
	waitQueueEmpty(t, r.env, r.name)
}

// TestIntegrationStartedMachineIsNotGivenUp: the books said pending, but
// the task started before the demand fell. Giving it up must not cancel
// it: scancel --state=PENDING leaves it running, and the next look at the
// queue takes it back into the books, while its pending sibling is
// cancelled.
func TestIntegrationStartedMachineIsNotGivenUp(t *testing.T) {
	r := newRig(t, "started", func(r *rig) map[string]any {
		c := r.config(profile("held", 1, 0, 100, nil, r.sbatch("--hold")))
		// No poll of its own between the release below and the fall of
		// the demand: the books still hold the state of the submission.
		c["poll_interval"] = "10m"
		return c
	})
	ctx := context.Background()
	need := shared.Need{Label: "held"}
	if _, err := r.prov.Provision(ctx, &shared.ProvisionRequest{Demand: []shared.Demand{{Need: need, Count: 2}}}); err != nil {
		t.Fatal(err)
	}
	evs := r.events.waitN(t, "2 worker_provisioned", 2*eventTimeout, 2, func(ev shared.Event) bool { return ev.Kind == shared.EventWorkerProvisioned })
	jobs := map[string]string{}
	for _, ev := range evs {
		jobs[ev.Job] = ev.Worker
	}
	array, _, _ := strings.Cut(evs[0].Job, "_")
	started, pending := array+"_1", array+"_0"
	if jobs[started] == "" || jobs[pending] == "" {
		t.Fatalf("jobs %v: want %s and %s", jobs, started, pending)
	}
	if out, err := slurm(r.env, "scontrol", "release", started); err != nil {
		t.Fatalf("scontrol release %s: %v %s", started, err, out)
	}
	poll(t, started+" running", jobTimeout, func() (bool, string) {
		out, _ := slurm(r.env, "squeue", "-h", "-j", started, "-o", "%T")
		return strings.TrimSpace(out) == "RUNNING", out
	})

	resp, err := r.prov.Provision(ctx, &shared.ProvisionRequest{})
	if err != nil || findProfile(resp, "held").Cancelled != 2 {
		t.Fatalf("demand gone: %+v %v; want both given up as far as the books know", resp, err)
	}
	cancelled := r.events.waitN(t, "worker_cancelled", eventTimeout, 1, func(ev shared.Event) bool { return ev.Kind == shared.EventWorkerCancelled })
	if cancelled[0].Job != pending {
		t.Errorf("cancelled %s, want the pending %s", cancelled[0].Job, pending)
	}
	// What Slurm recorded: the started task runs on, the pending one is
	// cancelled. Slurm 26.05 lists a pending task cancelled alone under
	// the bare array id (testdata/slurm-versions), so the whole array is
	// read, by the job id alone.
	out, _ := slurm(r.env, "squeue", "-h", "-t", "all", "-r", "-j", array, "-o", "%i %T")
	if !strings.Contains(out, started+" RUNNING") || !(strings.Contains(out, pending+" CANCELLED") || strings.Contains(out, "\n"+array+" CANCELLED") || strings.HasPrefix(out, array+" CANCELLED")) {
		t.Errorf("squeue: %s; want %s RUNNING and %s (or, on 26.05, %s) CANCELLED", out, started, pending, array)
	}
	st, err := r.prov.Status(ctx, &shared.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var starting int
	for _, c := range st.Counts {
		if c.Profile == "held" {
			starting = c.Starting
		}
	}
	if starting != 1 {
		t.Errorf("status counts %+v: want the started machine back in the books as starting", st.Counts)
	}
	for _, ev := range r.events.all() {
		if ev.Kind == shared.EventWorkerCancelled && ev.Job == started {
			t.Errorf("the engine heard the started machine was cancelled: %+v", ev)
		}
	}
	r.stop(t)
	waitQueueEmpty(t, r.env, r.name)
}

// TestIntegrationCapsHold: 200 machines wanted of a profile that cannot
// start (held) put exactly max_pending (64) tasks in Slurm's queue, in
// one array; the same demand again adds none; a profile with
// min_workers 2 and no demand keeps two; the demand falling to 10 leaves
// 10 in the queue.
func TestIntegrationCapsHold(t *testing.T) {
	r := newRig(t, "caps", func(r *rig) map[string]any {
		warm := profile("warm", 1, 0, 100, []string{"warm"}, r.sbatch("--hold"))
		warm["min_workers"] = 2
		return r.config(profile("held", 1, 0, 100, nil, r.sbatch("--hold")), warm)
	})
	ctx := context.Background()
	need := shared.Need{CPUs: 1}
	queued := func(want map[string]int) {
		t.Helper()
		poll(t, fmt.Sprintf("squeue to show %v", want), jobTimeout, func() (bool, string) {
			out, err := slurm(r.env, "squeue", "-h", "-r", "--name=fluksio-"+r.name, "-t", "PENDING,RUNNING", "-o", "%k")
			if err != nil {
				return false, err.Error()
			}
			got := map[string]int{}
			for _, c := range strings.Fields(out) {
				for p := range want {
					if strings.Contains(c, "-"+p+"-") {
						got[p]++
					}
				}
			}
			return maps.Equal(got, want), fmt.Sprint(got)
		})
	}
	resp, err := r.prov.Provision(ctx, &shared.ProvisionRequest{Demand: []shared.Demand{{Need: need, Count: 200}}})
	if err != nil {
		t.Fatal(err)
	}
	// max_pending is the provisioner's: the warm profile's two come first
	// in the books only if it is asked first; either way 64 in all.
	held, warm := findProfile(resp, "held"), findProfile(resp, "warm")
	if held.Requested+warm.Requested != 64 || warm.Requested != 2 || held.Submissions != 1 {
		t.Fatalf("200 wanted, max_pending 64: held %+v, warm %+v; want 62 + 2 in one array each", held, warm)
	}
	queued(map[string]int{"held": 62, "warm": 2})
	again, err := r.prov.Provision(ctx, &shared.ProvisionRequest{Demand: []shared.Demand{{Need: need, Count: 200}}})
	if err != nil || findProfile(again, "held").Requested != 0 || again.Outcomes[0].Outcome != shared.OutcomeCapped {
		t.Fatalf("the same demand again: %+v %v; want capped, nothing new", again, err)
	}
	queued(map[string]int{"held": 62, "warm": 2})
	less, err := r.prov.Provision(ctx, &shared.ProvisionRequest{Demand: []shared.Demand{{Need: need, Count: 10}}})
	if err != nil || findProfile(less, "held").Cancelled != 52 || findProfile(less, "warm").Cancelled != 0 {
		t.Fatalf("demand down to 10: %+v %v; want 52 held given up, the warm two kept", less, err)
	}
	queued(map[string]int{"held": 10, "warm": 2})
	r.stop(t)
	waitQueueEmpty(t, r.env, r.name)
}

// TestIntegrationJobFailsWithItsWords: a payload that prints a line and
// exits 2 at once, on the real Slurm, with output left to log_dir. The
// failure event, Status and the log carry the exit code, the output's
// path (in log_dir, named by the job) and its last line, which is really
// in that file.
func TestIntegrationJobFailsWithItsWords(t *testing.T) {
	dir, err := os.MkdirTemp("", "fluksio-it-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	failing := filepath.Join(dir, "failing-worker.sh")
	body := "#!/bin/sh\necho 'loading the worker'\necho \"fluksio-worker: cannot start: \\033[31mno such module\\033[0m\" >&2\nexit 2\n"
	if err := os.WriteFile(failing, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, failing} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	r := newRig(t, "exits2", func(r *rig) map[string]any {
		c := r.config(profile("small", 1, 0, 100, nil, []string{"--partition=" + r.env.Partition, "--time=00:05:00"}))
		c["worker_command"] = []string{failing}
		c["poll_interval"] = "2s"
		return c
	})
	r.provision(t, shared.Need{CPUs: 1}, "small")
	job := r.provisioned(t, "small").Job
	ev := r.events.wait(t, "worker_provision_failed", jobTimeout, kindIs(shared.EventWorkerProvisionFailed, "small"))
	t.Logf("worker_provision_failed: %s", ev.Detail)

	// The plugin's log reaches the host through its stderr, which may
	// come after the event: the failure's line is waited for.
	poll(t, "the plugin's log line of the failure", 10*time.Second, func() (bool, string) {
		return strings.Contains(r.logs.String(), "a request failed before its worker attached"), "not yet"
	})
	out := "/home/" + strings.Split(r.env.Login, "@")[0] + "/.local/state/fluksio/" + r.name + "/" + job + ".out"
	for _, want := range []string{"job " + job + " ended FAILED", "exit code 2", "output " + out,
		"its last lines: loading the worker | fluksio-worker: cannot start: no such module"} {
		if !strings.Contains(ev.Detail, want) {
			t.Errorf("the event's detail does not say %q: %q", want, ev.Detail)
		}
		if st := r.status(t); !strings.Contains(st.LastError, want) {
			t.Errorf("LastError does not say %q: %q", want, st.LastError)
		}
		if !strings.Contains(r.logs.String(), want) {
			t.Errorf("the log does not say %q", want)
		}
	}
	// The file is where the event says, and holds what it quotes.
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("the job's output is not in log_dir: %v", err)
	}
	if !strings.Contains(string(b), "loading the worker") {
		t.Errorf("%s holds %q", out, b)
	}
}

// TestIntegrationSetXLeaksNoCredential: the attack of issue 24, item 6,
// on the real Slurm. A profile whose prerun is `set -x` traces the
// assignment that hands the worker its credential into the job's output
// ("+ FLUKSIO_WORKER_TOKEN=…"), and a worker that fails before attaching
// prints its own; the failure report quotes the output's last lines in
// the event, Status's last_error and the log. Each shows [redacted] and
// not one 8-byte run of the token.
func TestIntegrationSetXLeaksNoCredential(t *testing.T) {
	dir, err := os.MkdirTemp("", "fluksio-it-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	failing := filepath.Join(dir, "failing-worker.sh")
	body := "#!/bin/sh\necho \"my credential is $FLUKSIO_WORKER_TOKEN\"\necho 'fluksio-worker: cannot start' >&2\nexit 2\n"
	if err := os.WriteFile(failing, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, failing} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	r := newRig(t, "setx", func(r *rig) map[string]any {
		prof := profile("small", 1, 0, 100, nil, []string{"--partition=" + r.env.Partition, "--time=00:05:00"})
		prof["prerun"] = []string{"set -x"}
		c := r.config(prof)
		c["worker_command"] = []string{failing}
		c["poll_interval"] = "2s"
		return c
	})
	r.provision(t, shared.Need{CPUs: 1}, "small")
	prov := r.provisioned(t, "small")
	token := r.signer.token(prov.Worker)
	ev := r.events.wait(t, "worker_provision_failed", jobTimeout, kindIs(shared.EventWorkerProvisionFailed, "small"))
	t.Logf("worker_provision_failed: %s", ev.Detail)

	// The output file really holds the token: the attack is real.
	out := "/home/" + strings.Split(r.env.Login, "@")[0] + "/.local/state/fluksio/" + r.name + "/" + prov.Job + ".out"
	if b, err := os.ReadFile(out); err != nil || !strings.Contains(string(b), "+ FLUKSIO_WORKER_TOKEN="+token) {
		t.Fatalf("%s does not trace the credential (%v):\n%s", out, err, b)
	}
	// The plugin's log reaches the host through its stderr, which may
	// come after the event: the failure's line is waited for.
	poll(t, "the plugin's log line of the failure", 10*time.Second, func() (bool, string) {
		return strings.Contains(r.logs.String(), "a request failed before its worker attached"), "not yet"
	})
	for what, text := range map[string]string{"the event": ev.Detail, "last_error": r.status(t).LastError, "the log": r.logs.String()} {
		for _, want := range []string{"+ FLUKSIO_WORKER_TOKEN=[redacted]", "my credential is [redacted]"} {
			if !strings.Contains(text, want) {
				t.Errorf("%s does not say %q", what, want)
			}
		}
		for i := 0; i+8 <= len(token); i++ {
			if strings.Contains(text, token[i:i+8]) {
				t.Errorf("%s holds bytes %d-%d of the token (%q)", what, i, i+8, token[i:i+8])
				break
			}
		}
	}
}

// TestIntegrationBegin: a profile that starts its machines an hour after
// they are asked for is accepted by the real Slurm (its automatic
// --deadline no longer clashes with the begin), and Slurm records the
// begin an hour out and the deadline provision_timeout plus the time
// limit after it; the plugin does not give the job up at
// provision_timeout from the request.
func TestIntegrationBegin(t *testing.T) {
	r := newRig(t, "begin", func(r *rig) map[string]any {
		return r.config(profile("later", 1, 0, 100, nil, r.sbatch("--begin=now+1hour")))
	})
	asked := time.Now()
	r.provision(t, shared.Need{CPUs: 1}, "later")
	job := r.provisioned(t, "later").Job
	show := r.env.Slurm(t, "scontrol", "show", "job", job)
	at := func(key string) time.Time {
		m := regexp.MustCompile(`\b` + key + `=(\S+)`).FindStringSubmatch(show)
		if m == nil {
			t.Fatalf("scontrol show job %s has no %s:\n%s", job, key, show)
		}
		v, err := time.ParseInLocation("2006-01-02T15:04:05", m[1], time.Local)
		if err != nil {
			t.Fatalf("%s=%s: %v", key, m[1], err)
		}
		return v
	}
	// scontrol calls the begin time EligibleTime.
	begin, deadline := at("EligibleTime"), at("Deadline")
	t.Logf("asked at %s; Slurm has EligibleTime=%s Deadline=%s", asked.Format(time.TimeOnly), begin.Format(time.TimeOnly), deadline.Format(time.TimeOnly))
	if d := begin.Sub(asked); d < 59*time.Minute || d > 61*time.Minute {
		t.Errorf("EligibleTime is %s after the request, want an hour", d)
	}
	// provision_timeout (15m by the rig's default) + --time=00:05:00.
	if d := deadline.Sub(begin); d < 19*time.Minute || d > 21*time.Minute {
		t.Errorf("Deadline is %s after EligibleTime, want provision_timeout + the time limit, 20m", d)
	}
	if !strings.Contains(show, "JobState=PENDING") || !strings.Contains(show, "Reason=BeginTime") {
		t.Errorf("the job is not pending for its begin time:\n%s", show)
	}
}
