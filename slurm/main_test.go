package slurm

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/internal/testutil"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/shared/sharedtest"

	relayd "github.com/fluksio/provision/slurm/relay"
)

// The test binary impersonates ssh when fakeSSHEnv is set: it records its
// argv and stdin in fakeDirEnv and then behaves as the spec says for the
// remote command. A spec is a comma list of command=behaviour, such as
// "sbatch=hang,squeue=list"; a command not named behaves "ok".
//
// sbatch: ok (prints a fresh job id from 4242 up), fail (Slurm's error
// text, exit 1), long (2000 characters of error, exit 1), garbage (prints
// no id, exit 0), echo (prints the script, exit 0), echofail (prints the
// script on both outputs, exit 1), hang (records, then hangs until killed), gate (records,
// then waits for the file "gate" in the directory, then as ok), drop (the
// connection closes after sbatch ran: exit 255), refused (ssh cannot
// connect: exit 255).
// squeue: ok (prints nothing), gate (waits for the file "gate", then
// as ok), list (one PENDING job per recorded sbatch,
// 9001 and up, with the comment of its script), rows (the lines of the
// file "squeue-rows", id|state|reason|start|comment), gaterows (waits
// for the file "gate", then as rows), fail (slurmctld
// down, exit 1), drop (the connection closes, exit 255). list and rows
// print the fields -o asks for, and finished jobs only with -t all.
// scancel: ok, fail.
// scontrol (show config): ok (Slurm's defaults, cluster1), fail (slurmctld
// does not answer), rationed (24.11.5's configuration with the limiter on,
// its closing ping refused: DOWN, exit 1), noarrays, jobs20, cluster1.
//
// A file "spec" in the directory, if there is one, replaces the spec, so
// a test can change the cluster's behaviour between calls.
const (
	fakeSSHEnv = "SLURM_FAKE_SSH"
	fakeDirEnv = "SLURM_FAKE_SSH_DIR"
)

func TestMain(m *testing.M) {
	// Started as the relay from the login node's cache, the test binary
	// is the relay, as the plugin binary would be (TestRelayPrivateCopy).
	if len(os.Args) > 1 && os.Args[1] == "relay" {
		os.Exit(relayd.Main(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
	}
	if spec, ok := os.LookupEnv(fakeSSHEnv); ok {
		os.Exit(fakeSSH(spec, os.Getenv(fakeDirEnv), os.Args[1:]))
	}
	// The integration tests (package slurm_test, which cannot have a
	// TestMain of its own beside this one) build the plugin with
	// sandboxtest.Binary; remove what they built.
	os.Exit(sandboxtest.Run(m))
}

// call is one recorded invocation of the fake ssh.
type call struct {
	Argv  []string
	Stdin string
}

// remote is the command after the login.
func (c call) remote() []string {
	i := slices.Index(c.Argv, "--")
	if i < 0 || i+2 > len(c.Argv) {
		return nil
	}
	r := c.Argv[i+2:]
	if len(r) > 4 && r[0] == "timeout" && r[1] == "-k" {
		// The transport's remote deadline (sshrun/deadline.go): the
		// command is what timeout runs.
		r = r[4:]
	}
	return r
}

func fakeSSH(spec, dir string, args []string) int {
	c := call{Argv: args}
	remote := c.remote()
	if len(remote) == 0 || dir == "" {
		fmt.Fprintln(os.Stderr, "fake ssh: want -- login command, and a directory to record in")
		return 255
	}
	stdin, _ := io.ReadAll(os.Stdin)
	c.Stdin = string(stdin)
	b, _ := json.Marshal(c)
	name := fmt.Sprintf("call-%020d-%d.json", time.Now().UnixNano(), os.Getpid())
	if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
		fmt.Fprintln(os.Stderr, "fake ssh:", err)
		return 255
	}

	// A login node listed in the file "down" does not answer, one in
	// "refuse" refuses the login, in ssh's words; nothing runs on either.
	dest := args[slices.Index(args, "--")+1]
	if port := slices.Index(args, "-p"); port >= 0 && port < slices.Index(args, "--") {
		dest += ":" + args[port+1]
	}
	for _, f := range []struct{ file, said string }{
		{"down", "ssh: connect to host " + dest + " port 22: Connection refused"},
		{"refuse", dest + ": Permission denied (publickey)."},
	} {
		if b, err := os.ReadFile(filepath.Join(dir, f.file)); err == nil && slices.Contains(strings.Fields(string(b)), dest) {
			fmt.Fprintln(os.Stderr, f.said)
			return 255
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "spec")); err == nil {
		spec = strings.TrimSpace(string(b))
	}
	behaviour := "ok"
	for _, kv := range strings.Split(spec, ",") {
		if k, v, _ := strings.Cut(kv, "="); k == remote[0] {
			behaviour = v
		}
	}
	switch remote[0] + "=" + behaviour {
	case "sbatch=ok":
		fmt.Println(newJobID(dir))
	case "sbatch=noarray":
		// A cluster whose sbatch refuses --array, as one with
		// MaxArraySize=0 does.
		if strings.Contains(string(stdin), "#SBATCH --array=") {
			fmt.Fprintln(os.Stderr, "sbatch: error: Invalid job array specification")
			fmt.Fprintln(os.Stderr, "sbatch: error: Batch job submission failed: Invalid job array specification")
			return 1
		}
		fmt.Println(newJobID(dir))
	case "scontrol=ok":
		// A cluster of Slurm's defaults.
		fmt.Println("Configuration data as of 2026-12-02T10:00:00\nClusterName             = cluster1\nMaxArraySize            = 1001\nMaxJobCount             = 10000")
		fmt.Println("\nSlurmctld(primary) at ctl1 is UP")
	case "scontrol=slow":
		// A controller that rations RPCs, its bucket kept empty by the
		// user's other clients: the answer comes, 4 s late.
		time.Sleep(4 * time.Second)
		fmt.Println("Configuration data as of 2026-12-02T10:00:00\nClusterName             = cluster1\nMaxArraySize            = 1001\nMaxJobCount             = 10000")
		fmt.Println("\nSlurmctld(primary) at ctl1 is UP")
	case "scontrol=fail":
		// slurmctld does not answer.
		fmt.Fprintln(os.Stderr, "slurm_load_ctl_conf error: Unable to contact slurm controller (connect failure)")
		return 1
	case "scontrol=rationed":
		// A controller whose rate limiter refused the closing ping, in
		// 24.11.5's words: the configuration, then DOWN, exit 1.
		b, _ := os.ReadFile(filepath.Join("testdata", "slurm-versions", "24.11.5", "ratelimit-show-config-drained.txt"))
		said, _, _ := strings.Cut(string(b), "\nexit ")
		fmt.Println(said)
		return 1
	case "scontrol=noarrays":
		fmt.Println("Configuration data as of 2026-12-02T10:00:00\nMaxArraySize            = 0\nMaxJobCount             = 10000")
	case "sbatch=throttle", "sbatch=notime":
		// A site's submit rule, in the words 22.05 printed
		// (testdata/slurm-versions/*/submit-rule-*.txt).
		name := "submit-rule-throttle-sbatch.txt"
		if behaviour == "notime" {
			name = "submit-rule-timelimit-sbatch.txt"
		}
		b, _ := os.ReadFile(filepath.Join("testdata", "slurm-versions", "22.05.8", name))
		said, _, _ := strings.Cut(string(b), "exit ")
		fmt.Fprint(os.Stderr, said)
		return 1
	case "sbatch=fail":
		fmt.Fprintln(os.Stderr, "sbatch: error: invalid partition specified: nope")
		fmt.Fprintln(os.Stderr, "sbatch: error: Batch job submission failed: Invalid partition name specified")
		return 1
	case "sbatch=newclient", "squeue=newclient", "sbatch=oldclient", "squeue=oldclient":
		// A login node whose Slurm client is another release than the
		// controller, in the words each real pair printed
		// (testdata/slurm-versions/mismatch).
		file := "24.11-client-22.05-controller.txt"
		if behaviour == "oldclient" {
			file = "22.05-client-24.11-controller.txt"
		}
		sbatchSaid, squeueSaid := mismatchFixture(file)
		if remote[0] == "sbatch" {
			fmt.Fprint(os.Stderr, sbatchSaid)
		} else {
			fmt.Fprint(os.Stderr, squeueSaid)
		}
		return 1
	case "sbatch=overlimit":
		// A user under MaxSubmitJobs = 5, as 22.05 refuses a larger
		// array (testdata/slurm-accounting/limit.txt).
		if m := regexp.MustCompile(`(?m)^#SBATCH --array=0-(\d+)$`).FindStringSubmatch(c.Stdin); m != nil {
			if n, _ := strconv.Atoi(m[1]); n+1 > 5 {
				fmt.Fprintln(os.Stderr, "sbatch: error: AssocMaxSubmitJobLimit")
				fmt.Fprintln(os.Stderr, "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)")
				return 1
			}
		}
		fmt.Println(newJobID(dir))
	case "sacctmgr=ok":
		// Accounting with no limits for the user.
	case "sacctmgr=limit5":
		if slices.Contains(remote, "assoc") {
			fmt.Println("cluster1|proj||5|||||normal")
			fmt.Println("othercluster|proj||1|||||normal")
		} else {
			fmt.Println("normal||8|cpu=64")
		}
	case "sacctmgr=none":
		fmt.Fprintln(os.Stderr, "You are not running a supported accounting_storage plugin")
		fmt.Fprintln(os.Stderr, "Only 'accounting_storage/slurmdbd' is supported.")
		return 1
	case "scontrol=jobs20":
		// A cluster of MaxJobCount = 20 (jobcount.go).
		fmt.Println("Configuration data as of 2026-12-02T10:00:00\nMaxArraySize            = 1001\nMaxJobCount             = 20\nMinJobAge               = 300 sec")
	case "sbatch=full":
		// slurmctld at MaxJobCount: sbatch says so once and retries
		// for two minutes (jobcount.go); here, until it is killed.
		fmt.Fprintln(os.Stderr, "sbatch: error: Slurm temporarily unable to accept job, sleeping and retrying")
		time.Sleep(time.Hour)
	case "scontrol=cluster1":
		fmt.Println("Configuration data as of 2026-12-02T10:00:00\nClusterName             = cluster1\nMaxArraySize            = 1001")
	case "sbatch=busy":
		// Weather: the same exit code as a refusal, other words.
		fmt.Fprintln(os.Stderr, "sbatch: error: Batch job submission failed: Resource temporarily unavailable")
		return 1
	case "sbatch=long":
		fmt.Fprintln(os.Stderr, "sbatch: error: "+strings.Repeat("x", 2000))
		return 1
	case "sbatch=garbage":
		fmt.Println("Submitted batch job soon")
	case "sbatch=echo", "sbatch=echofail":
		// A wrapper on the login node that echoes the script it was
		// given, and then no job id (echo) or an error (echofail).
		fmt.Print(c.Stdin)
		if behaviour == "echofail" {
			fmt.Fprint(os.Stderr, c.Stdin)
			return 1
		}
	case "sbatch=hang":
		time.Sleep(time.Hour)
	case "sbatch=gate":
		for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if _, err := os.Stat(filepath.Join(dir, "gate")); err == nil {
				fmt.Println(newJobID(dir))
				return 0
			}
		}
		return 1
	case "sbatch=drop":
		fmt.Fprintln(os.Stderr, "Connection to login.example.org closed by remote host.")
		return 255
	case "sbatch=refused":
		fmt.Fprintln(os.Stderr, "ssh: connect to host login.example.org port 22: Connection refused")
		return 255
	case "squeue=list":
		var rows []string
		id := 9001
		for _, c := range readCalls(dir) {
			if r := c.remote(); len(r) > 0 && r[0] == "sbatch" {
				if m := regexp.MustCompile(`(?m)^#SBATCH --comment=(\S+)$`).FindStringSubmatch(c.Stdin); m != nil {
					rows = append(rows, fmt.Sprintf("%d|PENDING|Priority|N/A|%s", id, m[1]))
					id++
				}
			}
		}
		printSqueue(remote, rows)
	case "squeue=rows":
		if _, err := os.Stat(filepath.Join(dir, "no-only-job-state")); err == nil && slices.Contains(remote, "--only-job-state") {
			// As Slurm before 24.05 says it.
			fmt.Fprintln(os.Stderr, "squeue: unrecognized option '--only-job-state'")
			fmt.Fprintln(os.Stderr, "Try \"squeue --help\" for more information")
			return 1
		}
		b, _ := os.ReadFile(filepath.Join(dir, "squeue-rows"))
		printSqueue(remote, strings.Split(strings.TrimSpace(string(b)), "\n"))
	case "squeue=gate":
		// Answers nothing until the gate opens, as a controller that
		// has not come back yet.
		for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if _, err := os.Stat(filepath.Join(dir, "gate")); err == nil {
				return 0
			}
		}
		return 1
	case "squeue=gaterows":
		// Waits for the gate, then as rows: a queue that holds an
		// earlier run's jobs and answers late.
		for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if _, err := os.Stat(filepath.Join(dir, "gate")); err == nil {
				b, _ := os.ReadFile(filepath.Join(dir, "squeue-rows"))
				printSqueue(remote, strings.Split(strings.TrimSpace(string(b)), "\n"))
				return 0
			}
		}
		return 1
	case "squeue=fail":
		fmt.Fprintln(os.Stderr, "slurm_load_jobs error: Unable to contact slurm controller (connect failure)")
		return 1
	case "squeue=drop":
		fmt.Fprintln(os.Stderr, "Connection to login.example.org closed by remote host.")
		return 255
	case "sh=ok":
		// The two shell snippets the plugin runs (joblog.go): making
		// log_dir, and reading back a failed job.
		switch {
		case len(remote) == 3 && strings.Contains(remote[2], "id -un"):
			// Check's login.
			fmt.Println("alice@login")
		case len(remote) == 5 && strings.Contains(remote[2], "command -v"):
			fmt.Println("/usr/bin/" + strings.Trim(remote[4], "'"))
		case len(remote) >= 5 && strings.Contains(remote[2], "mkdir -p"):
			fmt.Println("fluksio-logs 0 0 0 0")
			fmt.Println("/home/alice/.local/state/fluksio/" + strings.TrimPrefix(strings.Trim(remote[4], "'"), "~/.local/state/fluksio/"))
		case strings.Contains(remote[2], "fluksio-nodir"):
			// Check's look at log_dir.
			fmt.Println("fluksio-nodir")
		case len(remote) == 6 && strings.Contains(remote[2], "scontrol show job"):
			job := strings.Trim(remote[4], "'")
			fmt.Printf("JobId=%s JobName=fluksio-hpc\n   JobState=FAILED Reason=NonZeroExitCode Dependency=(null)\n   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=2:0\n", job)
			fmt.Printf("--- fluksio: output\n/home/alice/.local/state/fluksio/hpc/%s.out\nloading modules\n\x1b[31m/usr/bin/env: 'fluksio-worker': No such file or directory\x1b[0m\n", job)
		default:
			fmt.Fprintln(os.Stderr, "fake ssh: an unknown shell snippet")
			return 2
		}
	case "sh=here":
		// A login node whose log_dir is the directory itself (for
		// TestExplainRedactsEncodedCredentials, whose ssh runs the
		// explain script in a real sh).
		if len(remote) >= 5 && strings.Contains(remote[2], "mkdir -p") {
			fmt.Println(dir)
			return 0
		}
		fmt.Fprintln(os.Stderr, "fake ssh: an unknown shell snippet")
		return 2
	case "sh=fail":
		// A log_dir the login user may not make.
		fmt.Fprintln(os.Stderr, "mkdir: cannot create directory '/home/alice/.local/state/fluksio/hpc': Permission denied")
		return 1
	case "sh=forgot":
		// A cluster whose controller has forgotten a failed job
		// (MinJobAge) and whose accounting still has it.
		switch {
		case len(remote) >= 5 && strings.Contains(remote[2], "mkdir -p"):
			fmt.Println("fluksio-logs 0 0 0 0")
			fmt.Println("/home/alice/.local/state/fluksio/" + strings.TrimPrefix(strings.Trim(remote[4], "'"), "~/.local/state/fluksio/"))
		case strings.Contains(remote[2], "fluksio-nodir"):
			// Check's look at log_dir.
			fmt.Println("fluksio-nodir")
		case len(remote) == 6 && strings.Contains(remote[2], "sacct"):
			job := strings.Trim(remote[4], "'")
			fmt.Printf("--- fluksio: sacct\n%s|FAILED|7:0|None\n", job)
			fmt.Printf("--- fluksio: output\n/home/alice/.local/state/fluksio/hpc/%s.out\nfluksio-worker: cannot start: no such module\n", job)
		default:
			fmt.Fprintln(os.Stderr, "fake ssh: an unknown shell snippet")
			return 2
		}
	case "scancel=ok", "squeue=ok":
	case "scancel=fail":
		fmt.Fprintln(os.Stderr, "scancel: error: Unable to contact slurm controller (connect failure)")
		return 8
	default:
		fmt.Fprintf(os.Stderr, "fake ssh: no behaviour %q for %s\n", behaviour, remote[0])
		return 255
	}
	return 0
}

// printSqueue prints rows (id|state|reason|start|comment) as squeue would
// for the remote command: the fields its -o asks for, and finished jobs
// only with -t all.
func printSqueue(remote []string, rows []string) {
	var format string
	all := false
	for i, a := range remote {
		if a == "-o" && i+1 < len(remote) {
			format = strings.Trim(remote[i+1], "'")
		}
		if a == "-t" && i+1 < len(remote) && remote[i+1] == "all" {
			all = true
		}
	}
	for _, row := range rows {
		// id|state|reason|start|comment[|user]: the fake login's user,
		// alice, unless a row names another.
		f := strings.SplitN(row, "|", 6)
		if len(f) < 5 {
			continue
		}
		if len(f) == 5 {
			f = append(f, "alice")
		}
		if !all && slices.Contains([]string{"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "DEADLINE", "NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY", "PREEMPTED"}, f[1]) {
			continue
		}
		var out []string
		for _, spec := range strings.Split(format, "|") {
			i := strings.Index("%i%T%r%S%k%u", spec)
			if len(spec) != 2 || i < 0 || i%2 != 0 {
				out = append(out, "?")
				continue
			}
			out = append(out, f[i/2])
		}
		fmt.Println(strings.Join(out, "|"))
	}
}

// newJobID hands out ids from 4242 up; O_EXCL makes concurrent fakes get
// different ones.
func newJobID(dir string) int {
	for id := 4242; ; id++ {
		f, err := os.OpenFile(filepath.Join(dir, "job-"+strconv.Itoa(id)), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err == nil {
			f.Close()
			return id
		}
	}
}

func readCalls(dir string) []call {
	names, _ := filepath.Glob(filepath.Join(dir, "call-*.json"))
	sort.Strings(names)
	var calls []call
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			continue
		}
		var c call
		if json.Unmarshal(b, &c) == nil {
			calls = append(calls, c)
		}
	}
	return calls
}

// fakeCluster points the fake ssh at a fresh directory with a spec.
type fakeCluster struct{ dir string }

func newFakeCluster(t *testing.T, spec string) *fakeCluster {
	t.Helper()
	dir := t.TempDir()
	// A race-enabled binary sleeps a second on its way out, which would
	// make every fake ssh call take a second.
	t.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	t.Setenv(fakeSSHEnv, spec)
	t.Setenv(fakeDirEnv, dir)
	return &fakeCluster{dir: dir}
}

func (f *fakeCluster) calls() []call { return readCalls(f.dir) }

func (f *fakeCluster) callsTo(cmd string) []call {
	var out []call
	for _, c := range f.calls() {
		if r := c.remote(); len(r) > 0 && r[0] == cmd {
			out = append(out, c)
		}
	}
	return out
}

// setSpec changes how the fake behaves from its next call on.
func (f *fakeCluster) setSpec(t *testing.T, spec string) {
	t.Helper()
	f.write(t, "spec", spec)
}

// setRows sets what squeue=rows prints: id|state|reason|start|comment.
func (f *fakeCluster) setRows(t *testing.T, rows ...string) {
	t.Helper()
	f.write(t, "squeue-rows", strings.Join(rows, "\n")+"\n")
}

// write replaces a file in the directory at once, so that a fake running
// meanwhile reads the old contents or the new, never half of them.
func (f *fakeCluster) write(t *testing.T, name, contents string) {
	t.Helper()
	tmp := filepath.Join(f.dir, "."+name)
	if err := os.WriteFile(tmp, []byte(contents), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(f.dir, name)); err != nil {
		t.Fatal(err)
	}
}

// forget drops the record of the calls so far.
func (f *fakeCluster) forget(t *testing.T) {
	t.Helper()
	names, _ := filepath.Glob(filepath.Join(f.dir, "call-*.json"))
	for _, n := range names {
		if err := os.Remove(n); err != nil {
			t.Fatal(err)
		}
	}
}

func (f *fakeCluster) openGate(t *testing.T) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(f.dir, "gate"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	// The deadline only matters when cond never holds: long enough for
	// a submit_timeout to run out on a loaded machine.
	for end := time.Now().Add(30 * time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// newFakeHost is the engine a harness's provisioner talks to: it records
// events and mints tokens that are easy to look for.
func newFakeHost() *sharedtest.Host { return &sharedtest.Host{Token: tokenFor} }

func tokenFor(worker string) string { return "s3cr3t-" + worker + "-t0k3n" }

// waitEvents waits until h has at least n events and returns them all.
func waitEvents(t *testing.T, h *sharedtest.Host, n int) []shared.Event {
	t.Helper()
	eventually(t, fmt.Sprintf("%d events", n), func() bool { return len(h.Events()) >= n })
	return h.Events()
}

func kinds(evs []shared.Event) []shared.EventKind {
	var ks []shared.EventKind
	for _, e := range evs {
		ks = append(ks, e.Kind)
	}
	return ks
}

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// syncBuffer is a buffer goroutines write while the test reads it.
type syncBuffer = testutil.Buffer

// baseConfig is a valid configuration as the host would send it, with two
// profiles written largest first so that sorting shows.
func baseConfig() map[string]any {
	return map[string]any{
		"login":             "alice@login.example.org",
		"ssh_port":          0,
		"ssh_key":           "",
		"known_hosts":       "",
		"ssh_config":        "",
		"ssh_options":       nil,
		"engine_url":        "https://engine.example.org:8765",
		"artifact_url":      "",
		"max_idle":          "5m",
		"provision_timeout": "15m",
		"submit_timeout":    "30s",
		"token_ttl":         "24h",
		// Tests run poll cycles themselves, with poll.once.
		"poll_interval":  "1h",
		"attach_timeout": "10m",
		"worker_command": []string{"fluksio-worker"},
		// Every unit test's fake login is one login user: the budget
		// they would share is budget_test.go's to test.
		"max_rpc_rate": 1000.0,
		"profile": []any{
			map[string]any{"name": "gpu", "cpus": 8, "gpus": 1, "ram_mb": 32000, "labels": []string{"cuda"}, "sbatch": []string{"--partition=gpu"}, "prerun": nil},
			map[string]any{"name": "cpu", "cpus": 4, "gpus": 0, "ram_mb": 0, "labels": nil, "sbatch": []string{"--partition=debug"}, "prerun": []string{"module load python"}},
		},
	}
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type harness struct {
	p     *Provisioner
	host  *sharedtest.Host
	clock *fakeClock
	logs  *syncBuffer
	fake  *fakeCluster
	// wants is the demand the test has expressed so far (want).
	wants sharedtest.Wants
	// callsBefore is how many commands the queue had run when the record
	// of calls started (calls counts from it).
	callsBefore int64
}

// newHarness configures a Provisioner named "hpc" whose ssh is the fake
// with spec. edit, if not nil, changes the base configuration first. The
// record of calls starts after Configure, which reads the queue once to
// adopt what an earlier run left there.
func newHarness(t *testing.T, spec string, edit func(map[string]any)) *harness {
	t.Helper()
	h := newUnconfigured(t, spec)
	h.configure(t, edit)
	h.fake.forget(t)
	h.callsBefore = h.p.q.Calls()
	return h
}

// newUnconfigured is newHarness without Configure.
func newUnconfigured(t *testing.T, spec string) *harness {
	t.Helper()
	h := &harness{
		host:  newFakeHost(),
		clock: &fakeClock{t: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)},
		logs:  &syncBuffer{},
		fake:  newFakeCluster(t, spec),
	}
	h.p = New(hclog.New(&hclog.LoggerOptions{Output: h.logs, Level: hclog.Trace}))
	h.p.sshPath = os.Args[0]
	h.p.now = h.clock.Now
	t.Cleanup(func() {
		// Whatever a test leaves running is stopped, so no fake ssh
		// outlives it.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		h.p.Shutdown(ctx, &shared.ShutdownRequest{})
	})
	return h
}

// configure configures the harness's Provisioner with the base
// configuration, changed by edit if not nil.
func (h *harness) configure(t *testing.T, edit func(map[string]any)) {
	t.Helper()
	cfg := baseConfig()
	if edit != nil {
		edit(cfg)
	}
	resp, err := h.p.Configure(context.Background(), &shared.ConfigureRequest{Name: "hpc", Config: mustJSON(t, cfg), Host: h.host})
	if err != nil || resp.Diagnostics.HasErrors() {
		t.Fatalf("Configure: %v %v", err, resp.Diagnostics)
	}
	// Adoption runs on the poller's goroutine; the tests reason about
	// what follows it, so they start from where it has been tried, and
	// the read of the accounting limits after it has been made.
	<-h.p.poll.adoptTried
	h.limitsRead(t)
}

func (h *harness) provision(t *testing.T, need shared.Need) *shared.DemandOutcome {
	t.Helper()
	o, _, err := h.wants.Ask(context.Background(), h.p, need, 1)
	if err != nil {
		t.Fatalf("Provision(%+v): %v", need, err)
	}
	return o
}

// provisionN wants count machines of need, with the whole response.
func (h *harness) provisionN(t *testing.T, need shared.Need, count int) (*shared.DemandOutcome, *shared.ProvisionResponse) {
	t.Helper()
	h.wants.Set(need, count)
	o, resp, err := h.wants.Ask(context.Background(), h.p, need, count)
	if err != nil {
		t.Fatalf("Provision(%d × %+v): %v", count, need, err)
	}
	return o, resp
}

// provisionAll is provision, with the whole response.
func (h *harness) provisionAll(t *testing.T, need shared.Need) (*shared.DemandOutcome, *shared.ProvisionResponse) {
	t.Helper()
	o, resp, err := h.wants.Ask(context.Background(), h.p, need, 1)
	if err != nil {
		t.Fatalf("Provision(%+v): %v", need, err)
	}
	return o, resp
}

// profileDemand is resp's entry for profile.
func profileDemand(resp *shared.ProvisionResponse, profile string) shared.ProfileDemand {
	for _, pd := range resp.Profiles {
		if pd.Profile == profile {
			return pd
		}
	}
	return shared.ProfileDemand{}
}

func (h *harness) status(t *testing.T) *shared.StatusResponse {
	t.Helper()
	st, err := h.p.Status(context.Background(), &shared.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// requestOf is the first request of profile in the books, nil if there is
// none. p.mu must be held.
func (p *Provisioner) requestOf(profile string) *request {
	for _, r := range p.sortedLocked() {
		if r.profile == profile {
			return r
		}
	}
	return nil
}
