package bench

// The rig: the sandbox, the binaries, launched plugins with their events,
// plain ssh for the baselines, and the small statistics the report needs.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
)

const (
	// eventTimeout bounds the wait for one submission's event.
	eventTimeout = 60 * time.Second
	// stopTimeout bounds a plugin's Stop: Shutdown cancels what is
	// outstanding with one scancel, then the process is killed.
	stopTimeout = 90 * time.Second
	// callTimeout bounds one RPC that should return at once.
	callTimeout = 30 * time.Second
)

func TestMain(m *testing.M) {
	// The test binary started again as measurement 15's plain HTTP
	// server, or as a task's command in measurement 16 (tasks_test.go).
	if os.Getenv(floorServerEnv) != "" {
		os.Exit(serveFloor())
	}
	if url := os.Getenv(barrierEnv); url != "" {
		os.Exit(awaitBarrier(url, os.Args[1:]))
	}
	os.Exit(sandboxtest.Run(m))
}

// reportRequested says whether TestBenchReport should run.
func reportRequested() bool { return os.Getenv("BENCH_REPORT") == "1" }

// benchEnv is the sandbox and the binaries built for it. The binaries are
// built once per test binary into a directory the sandbox's job user can
// read, since host-example is also the worker a job runs.
type benchEnv struct {
	sandboxtest.Env
	SlurmBin, TestBin, HostBin string
	// SSH is the ssh client on this machine's PATH; wrappers exec it.
	SSH string
}

func setup(tb testing.TB) benchEnv {
	tb.Helper()
	e := benchEnv{Env: sandboxtest.Require(tb)}
	e.SlurmBin = sandboxtest.Binary(tb, "plugin", "provisioner-slurm")
	e.TestBin = sandboxtest.Binary(tb, "examples/testplugin", "testplugin")
	e.HostBin = sandboxtest.Binary(tb, "host-example", "host-example")
	ssh, err := exec.LookPath("ssh")
	if err != nil {
		tb.Fatalf("no ssh client: %v", err)
	}
	if e.SSH, err = filepath.Abs(ssh); err != nil {
		tb.Fatal(err)
	}
	return e
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// uniqueName is a provisioner name of this run: its jobs are called
// fluksio-<name>, so cleaning up by name touches nobody else's.
func uniqueName(what string) string { return "bench-" + what + "-" + randHex(3) }

// progress tells whoever runs make bench what is going on; stdout is kept
// for the table.
func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench %s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// slurmLocal runs a Slurm client command here, as root, against the
// sandbox's controller.
func (e benchEnv) slurmLocal(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "SLURM_CONF="+e.SlurmConf)
	cmd.WaitDelay = 2 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

// cancelJobs scancels every job of a provisioner name, whatever the plugin
// did or did not do. It is a cleanup: it logs, never fails.
func (e benchEnv) cancelJobs(tb testing.TB, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := e.slurmLocal(ctx, "scancel", "--name=fluksio-"+name); err != nil {
		tb.Logf("cleanup: %v", err)
	}
}

// queued counts the jobs of a provisioner name still pending or running.
func (e benchEnv) queued(name string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// -r: a burst's array counts each of its tasks.
	out, err := e.slurmLocal(ctx, "squeue", "-h", "-r", "--name=fluksio-"+name, "-t", "PENDING,RUNNING", "-o", "%i")
	if err != nil {
		return 0, err
	}
	return len(strings.Fields(out)), nil
}

// pendingSbatch makes a job that stays PENDING (reason BeginTime) and
// never runs: the submissions measured here must cost the scheduler
// nothing but a queue entry.
func (e benchEnv) pendingSbatch() []string {
	return []string{"--partition=" + e.Partition, "--begin=now+1hour", "--time=00:05:00", "--output=/dev/null"}
}

func profile(name string, cpus, gpus int, ramMB int64, labels, sbatch []string) map[string]any {
	return map[string]any{
		"name": name, "cpus": cpus, "gpus": gpus, "ram_mb": ramMB,
		"labels": labels, "sbatch": sbatch, "prerun": nil,
	}
}

// pendingProfiles is n profiles named prefix000... (prefix0000... from a
// thousand), each of one CPU whose jobs stay pending. A need with the
// profile's name as its label matches exactly that profile.
func (e benchEnv) pendingProfiles(prefix string, n int) []map[string]any {
	var out []map[string]any
	for _, name := range labels(prefix, n) {
		out = append(out, profile(name, 1, 0, 0, nil, e.pendingSbatch()))
	}
	return out
}

// slurmConfig is the plugin's configuration as a host's DecodeConfig
// makes it: every attribute present, durations as strings. extra adds or
// overrides attributes; those the plugin's schema does not have are
// dropped by plug.configure, so attributes still being written (such as
// poll_interval) can be asked for without breaking an older plugin.
func (e benchEnv) slurmConfig(extra map[string]any, profiles []map[string]any) map[string]any {
	c := map[string]any{
		"login":             e.Login,
		"ssh_port":          e.Port,
		"ssh_key":           e.Key,
		"known_hosts":       e.KnownHosts,
		"ssh_config":        "",
		"ssh_options":       nil,
		"engine_url":        "http://127.0.0.1:9/",
		"artifact_url":      "",
		"max_idle":          "1m",
		"provision_timeout": "1h",
		"submit_timeout":    "60s",
		// Above --begin=now+1hour + provision_timeout + --time and the
		// worker's last report (2h15m), which the plugin requires.
		"token_ttl":      "3h",
		"worker_command": []string{"/bin/true"},
		"multiplex":      true,
		"max_sessions":   8,
		// The measurements ask for up to a thousand machines at once;
		// the default caps (256 alive, 64 pending) would hold them back.
		"max_workers": 10000,
		"max_pending": 10000,
		// The measurements are of the plugin's own cost, not of the
		// login user's RPC budget (max_rpc_rate) pacing it.
		"max_rpc_rate": 1000.0,
		"profile":      profiles,
	}
	for k, v := range extra {
		c[k] = v
	}
	return c
}

// stamped is an event and when the host side received it.
type stamped struct {
	ev shared.Event
	at time.Time
}

// recorder keeps a plugin's events; changed is closed and replaced on
// every event, so a waiter wakes without polling.
type recorder struct {
	mu      sync.Mutex
	events  []stamped
	changed chan struct{}
}

func newRecorder() *recorder { return &recorder{changed: make(chan struct{})} }

func (r *recorder) add(ev shared.Event) {
	at := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, stamped{ev, at})
	close(r.changed)
	r.changed = make(chan struct{})
}

func (r *recorder) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events)
}

// waitN returns the first n events from index from on that match,
// waiting up to timeout, or what it has with an error.
func (r *recorder) waitN(from, n int, timeout time.Duration, match func(shared.Event) bool) ([]stamped, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	// Each wake looks at the events that came since the last, not all of
	// them again: at 10,000 events a scan from the start on every one
	// held the lock long enough that add, the plugin's event handler,
	// fell behind and the host channel's queue dropped events.
	var got []stamped
	pos := from
	for {
		r.mu.Lock()
		for _, s := range r.events[min(pos, len(r.events)):] {
			if match(s.ev) {
				got = append(got, s)
			}
		}
		pos = max(pos, len(r.events))
		changed := r.changed
		r.mu.Unlock()
		if len(got) >= n {
			return got[:n], nil
		}
		select {
		case <-changed:
		case <-deadline.C:
			return got, fmt.Errorf("%d of %d events within %s", len(got), n, timeout)
		}
	}
}

// submitted matches the event that ends a submission, either way.
func submitted(ev shared.Event) bool {
	return ev.Kind == shared.EventWorkerProvisioned || ev.Kind == shared.EventWorkerProvisionFailed
}

// syncBuffer is a buffer goroutines write while the test reads it.
type syncBuffer = testutil.Buffer

// signer mints throwaway tokens; nothing here checks them.
type signer struct{}

func (signer) Sign(_ host.CredentialClaims, ttl time.Duration) (string, time.Time, error) {
	return "tok-" + randHex(16), time.Now().Add(ttl), nil
}

// plug is one launched plugin process.
type plug struct {
	name string
	pl   *host.Plugin
	prov shared.Provisioner
	rec  *recorder
	logs *syncBuffer
	// attrs are the attribute names of the plugin's schema.
	attrs map[string]bool
	// dropped lists configuration attributes the plugin does not have.
	dropped []string
}

// launch starts a plugin process with Env added to its environment, and
// stops it when the test ends.
func launch(tb testing.TB, path, name string, env []string) *plug {
	tb.Helper()
	p, err := launchErr(path, name, env)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { p.stop(tb) })
	return p
}

// launchErr is launch without a cleanup: the start-up measurement stops
// each plugin itself, untimed.
func launchErr(path, name string, env []string) (*plug, error) {
	p := &plug{name: name, rec: newRecorder(), logs: &syncBuffer{}}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	pl, err := host.Launch(ctx, host.LaunchConfig{
		Name:    name,
		Path:    path,
		Logger:  hclog.New(&hclog.LoggerOptions{Output: p.logs, Level: hclog.Info}),
		Signer:  signer{},
		OnEvent: p.rec.add,
		Env:     env,
	})
	if err != nil {
		return nil, err
	}
	p.pl, p.prov = pl, pl.Provisioner()
	return p, nil
}

// configure sends a configuration, dropping the attributes the plugin's
// schema does not have (remembered in dropped).
func (p *plug) configure(tb testing.TB, cfg map[string]any) {
	tb.Helper()
	if err := p.configureErr(cfg); err != nil {
		tb.Fatalf("%v\nplugin log:\n%s", err, p.logs.String())
	}
}

func (p *plug) configureErr(cfg map[string]any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*callTimeout)
	defer cancel()
	if p.attrs == nil {
		s, err := p.prov.Schema(ctx, &shared.SchemaRequest{})
		if err != nil {
			return fmt.Errorf("%s: Schema: %w", p.name, err)
		}
		p.attrs = map[string]bool{}
		for _, a := range s.Schema.Attributes {
			p.attrs[a.Name] = true
		}
		for _, b := range s.Schema.Blocks {
			p.attrs[b.Name] = true
		}
	}
	fitted := map[string]any{}
	for k, v := range cfg {
		if p.attrs[k] {
			fitted[k] = v
		} else {
			p.dropped = append(p.dropped, k)
			noteDropped(k)
		}
	}
	raw, err := json.Marshal(fitted)
	if err != nil {
		return err
	}
	resp, err := p.prov.Configure(ctx, &shared.ConfigureRequest{Name: p.name, Config: raw})
	if err != nil {
		return fmt.Errorf("%s: Configure: %w", p.name, err)
	}
	if resp.Diagnostics.HasErrors() {
		return fmt.Errorf("%s: Configure: %v", p.name, resp.Diagnostics)
	}
	return nil
}

var (
	droppedMu sync.Mutex
	dropped   = map[string]bool{}
)

func noteDropped(attr string) {
	droppedMu.Lock()
	defer droppedMu.Unlock()
	dropped[attr] = true
}

// droppedAttrs lists the attributes some plugin's schema lacked.
func droppedAttrs() []string {
	droppedMu.Lock()
	defer droppedMu.Unlock()
	var out []string
	for k := range dropped {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// has says whether the plugin's schema has an attribute.
func (p *plug) has(attr string) bool { return p.attrs[attr] }

// stop shuts the plugin down (cancelling what it has outstanding) and ends
// the process. It is a cleanup: it logs, never fails.
func (p *plug) stop(tb testing.TB) {
	select {
	case <-p.pl.Exited():
		return
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	if _, err := p.pl.Stop(ctx); err != nil {
		tb.Logf("stopping %s: %v", p.name, err)
	}
}

// rssKB is a process's resident set (VmRSS) in kB.
// liveHeapKB is the plugin's live heap in kB as it reports it itself
// (StatusResponse.Runtime, contract 2.8), beside the VmRSS its rows
// show: RSS also counts what the allocator keeps; 0 when it does not say.
func liveHeapKB(tb testing.TB, prov shared.Provisioner) int64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := prov.Status(ctx, &shared.StatusRequest{})
	if err != nil {
		tb.Fatalf("Status: %v", err)
	}
	if st.Runtime == nil {
		return 0
	}
	return st.Runtime.HeapLiveBytes / 1024
}

// memStr is a plugin row's figure: its RSS, and its live heap when it
// says.
func memStr(rssKB, heapKB int64) string {
	if heapKB <= 0 {
		return fmt.Sprintf("%.1f MB", mb(rssKB))
	}
	return fmt.Sprintf("%.1f MB (live heap %.1f MB)", mb(rssKB), mb(heapKB))
}

func rssKB(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				return strconv.ParseInt(f[0], 10, 64)
			}
		}
	}
	return 0, errors.New("no VmRSS in /proc/" + strconv.Itoa(pid) + "/status")
}

// --- plain ssh, for the baselines ---

// sshArgv is ssh's argv after the program name, as the plugin builds it:
// BatchMode, the port, the key, strict host key checking, then mux
// options, the login and the remote command.
func (e benchEnv) sshArgv(mux []string, remote ...string) []string {
	args := []string{"-o", "BatchMode=yes"}
	args = append(args, mux...)
	args = append(args, "-p", strconv.Itoa(e.Port), "-i", e.Key,
		"-o", "UserKnownHostsFile="+e.KnownHosts, "-o", "StrictHostKeyChecking=yes", "--", e.Login)
	return append(args, remote...)
}

// plainSSH makes ssh open a connection of its own even if some master is
// running (ControlMaster=no alone would still use one).
var plainSSH = []string{"-o", "ControlMaster=no", "-o", "ControlPath=none"}

// runSSH runs ssh and returns what it printed.
func (e benchEnv) runSSH(ctx context.Context, args []string, stdin []byte) (stdout, stderr []byte, err error) {
	cmd := exec.CommandContext(ctx, e.SSH, args...)
	cmd.WaitDelay = 2 * time.Second
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	if errors.Is(err, exec.ErrWaitDelay) && cmd.ProcessState != nil && cmd.ProcessState.Success() {
		err = nil
	}
	return out.Bytes(), errOut.Bytes(), err
}

// sbatch submits a script over ssh and returns the job id.
func (e benchEnv) sbatch(ctx context.Context, mux []string, script []byte) (string, error) {
	stdout, stderr, err := e.runSSH(ctx, e.sshArgv(mux, "sbatch", "--parsable"), script)
	if err != nil {
		return "", fmt.Errorf("ssh sbatch: %w: %s", err, firstLine(string(stderr)))
	}
	id, ok := parseJobID(string(stdout))
	if !ok {
		return "", fmt.Errorf("sbatch printed %q: %s", stdout, firstLine(string(stderr)))
	}
	return id, nil
}

func parseJobID(out string) (string, bool) {
	var last string
	for _, l := range strings.Split(out, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			last = l
		}
	}
	id, _, _ := strings.Cut(last, ";")
	if id == "" || strings.Trim(id, "0123456789") != "" {
		return "", false
	}
	return id, true
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// baselineScript is a batch script the size and shape of the plugin's:
// the same #SBATCH lines, a token in the environment, a worker command.
func baselineScript(name, worker string, sbatch []string) []byte {
	var b strings.Builder
	b.WriteString("#!/bin/bash\n")
	fmt.Fprintf(&b, "#SBATCH --job-name=fluksio-%s\n#SBATCH --comment=fluksio:%s\n#SBATCH --cpus-per-task=1\n", name, worker)
	for _, s := range sbatch {
		fmt.Fprintf(&b, "#SBATCH %s\n", s)
	}
	fmt.Fprintf(&b, "\nexport FLUKSIO_WORKER_TOKEN=tok-%s\n", randHex(16))
	b.WriteString("exec /bin/true --url http://127.0.0.1:9/ --cpus 1 --gpus 0 --max-idle 60\n")
	return []byte(b.String())
}

// master is a ControlMaster this harness starts itself: the floor of what
// a submission through one shared connection can cost.
type master struct {
	e    benchEnv
	dir  string
	sock string
}

func startMaster(tb testing.TB, e benchEnv) *master {
	tb.Helper()
	dir, err := os.MkdirTemp("/tmp", "fxb-")
	if err != nil {
		tb.Fatal(err)
	}
	m := &master{e: e, dir: dir, sock: filepath.Join(dir, "cm")}
	tb.Cleanup(m.close)
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	// ControlPersist puts the master in the background once `true` is
	// done; it keeps the connection for the calls that follow.
	args := e.sshArgv([]string{"-o", "ControlMaster=yes", "-o", "ControlPath=" + m.sock, "-o", "ControlPersist=300"}, "true")
	if _, stderr, err := e.runSSH(ctx, args, nil); err != nil {
		tb.Fatalf("starting a ControlMaster: %v: %s", err, stderr)
	}
	if _, err := os.Stat(m.sock); err != nil {
		tb.Fatalf("the ControlMaster left no socket: %v", err)
	}
	return m
}

// args are the mux options for a call through this master.
func (m *master) args() []string {
	return []string{"-o", "ControlMaster=no", "-o", "ControlPath=" + m.sock}
}

func (m *master) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m.e.runSSH(ctx, m.e.sshArgv([]string{"-O", "exit", "-o", "ControlPath=" + m.sock}), nil)
	os.RemoveAll(m.dir)
}

// wrappedPlugin returns a launcher for the Slurm plugin that runs it with
// a script named ssh first on its PATH. The script appends each call's
// argv to log and, when errLog is set, keeps a copy of what ssh wrote to
// stderr in errLog (passing it on as well).
//
// The PATH is set by a launcher script that execs the plugin (so the
// process and its pid are the plugin's), not with LaunchConfig.Env:
// go-plugin appends the host's own environment after Launch's, and for a
// variable set twice the last one wins, so Env can add variables but not
// override PATH.
func wrappedPlugin(tb testing.TB, e benchEnv, log, errLog string) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "fxb-ssh-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	wrapper := fmt.Sprintf(`#!/bin/sh
# ssh as the benchmark harness watches it: the argv of every call goes to
# BENCH_SSH_LOG; with BENCH_SSH_ERR, what ssh says on stderr is kept too.
printf '%%s\n' "$*" >> "$BENCH_SSH_LOG"
# and when each call began, for a timeline of a burst (P9b's note)
echo "$(date +%%s.%%N) ${*##* -- }" >> "$BENCH_SSH_LOG.t"
if [ -z "$BENCH_SSH_ERR" ]; then exec %[1]s "$@"; fi
err="$BENCH_SSH_ERR.$$"
%[1]s "$@" 2>"$err"
rc=$?
if [ -s "$err" ]; then cat "$err" >&2; cat "$err" >> "$BENCH_SSH_ERR"; fi
rm -f "$err"
exit $rc
`, shellQuote(e.SSH))
	launcher := fmt.Sprintf(`#!/bin/sh
PATH=%s:$PATH BENCH_SSH_LOG=%s BENCH_SSH_ERR=%s
export PATH BENCH_SSH_LOG BENCH_SSH_ERR
exec %s "$@"
`, shellQuote(dir), shellQuote(log), shellQuote(errLog), shellQuote(e.SlurmBin))
	for name, body := range map[string]string{"ssh": wrapper, "provisioner-slurm": launcher} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	return filepath.Join(dir, "provisioner-slurm")
}

// wrapperCalls counts the calls an ssh wrapper logged that contain substr.
func wrapperCalls(log, substr string) int {
	b, _ := os.ReadFile(log)
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, substr) {
			n++
		}
	}
	return n
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// --- statistics ---

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func spread(ds []time.Duration) (lo, hi time.Duration) {
	if len(ds) == 0 {
		return 0, 0
	}
	return slices.Min(ds), slices.Max(ds)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
