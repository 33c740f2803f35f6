// Package sandboxtest gives tests the throwaway Slurm that sandbox/up.sh
// starts, and the project's binaries built where the job user can run
// them.
//
// A test that needs Slurm calls Require. With the sandbox's environment
// exported (make test does it through sandbox/with-sandbox.sh) it returns
// the sandbox; without it the test is skipped on a developer's machine and
// fails in CI, where a skipped Slurm test would be a test that never ran.
package sandboxtest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// Env is a running sandbox, as env.sh describes it.
type Env struct {
	Dir        string
	Login      string // user@host
	Port       int
	Key        string
	KnownHosts string
	SSHConfig  string
	Partition  string
	SlurmConf  string
	CPUs, GPUs int
	// Nodes is how many nodes the partition has (SANDBOX_NODES); a
	// sandbox from before it was a setting has one.
	Nodes int
	// Bin holds the sandbox's own Slurm client commands when it runs a
	// newer Slurm from its root (SANDBOX_SLURM=trixie or sid); empty for
	// the machine's own. A client must be the controller's release.
	Bin string
	// Version is the Slurm release the sandbox runs, such as 24.11.5.
	Version string
	// Accounting is set when the sandbox runs slurmdbd with limits
	// enforced (SANDBOX_ACCOUNTING=1).
	Accounting bool
	// BastionPort is the jump host's port when the sandbox has one
	// (SANDBOX_BASTION_PORT), else 0; its ssh_config's Host
	// "sandbox-via-bastion" reaches the login node through it.
	BastionPort int
	// RateLimit is slurmctld's per-user RPC rate limiter as
	// SANDBOX_RATE_LIMIT set it, "BUCKET,REFILL" such as "10,1"; "" when
	// it is off.
	RateLimit string
}

// Suite is the Debian suite whose Slurm the sandbox runs (SANDBOX_SLURM):
// bookworm, trixie or sid.
func Suite() string {
	if s := os.Getenv("SANDBOX_SLURM"); s != "" {
		return s
	}
	return "bookworm"
}

// Command is a Slurm client command against this sandbox's controller,
// run locally as root: the sandbox's own client (Bin) when it has one,
// with SLURM_CONF set.
func (e Env) Command(name string, args ...string) *exec.Cmd {
	if e.Bin != "" {
		if p := filepath.Join(e.Bin, name); fileExists(p) {
			name = p
		}
	}
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "SLURM_CONF="+e.SlurmConf)
	return cmd
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// Require returns the sandbox, or skips (fails in CI) when there is none.
func Require(t testing.TB) Env {
	t.Helper()
	login := os.Getenv("SANDBOX_SSH_LOGIN")
	if login == "" {
		msg := "no sandbox Slurm: run `make test`, or `sudo make sandbox-up` and `source /tmp/pvsb/env.sh`"
		if os.Getenv("CI") != "" {
			t.Fatal(msg + " (in CI this is a failure, not a skip)")
		}
		t.Skip(msg)
	}
	var e Env
	e.Dir = os.Getenv("SANDBOX_DIR")
	e.Login = login
	fmt.Sscan(os.Getenv("SANDBOX_SSH_PORT"), &e.Port)
	e.Key = os.Getenv("SANDBOX_SSH_KEY")
	e.KnownHosts = os.Getenv("SANDBOX_SSH_KNOWN_HOSTS")
	e.SSHConfig = os.Getenv("SANDBOX_SSH_CONFIG")
	e.Partition = os.Getenv("SANDBOX_PARTITION")
	e.SlurmConf = os.Getenv("SLURM_CONF")
	fmt.Sscan(os.Getenv("SANDBOX_CPUS"), &e.CPUs)
	fmt.Sscan(os.Getenv("SANDBOX_GPUS"), &e.GPUs)
	e.Nodes = 1
	fmt.Sscan(os.Getenv("SANDBOX_NODES"), &e.Nodes)
	e.Bin = os.Getenv("SANDBOX_BIN")
	e.Version = os.Getenv("SANDBOX_SLURM_VERSION")
	e.Accounting = os.Getenv("SANDBOX_ACCOUNTING") == "1"
	e.RateLimit = os.Getenv("SANDBOX_RATE_LIMIT")
	return e
}

// Slurm runs a Slurm client command locally (as root, against the
// sandbox's controller) and returns its output; tests use it to look at
// the queue without going through the code under test.
func (e Env) Slurm(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := e.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

var (
	buildMu  sync.Mutex // guards built
	built    = map[string]string{}
	rootOnce sync.Once
	rootDir  string
	rootErr  error
)

// Binary builds a main package of this module (such as "plugin" or
// "host-example") once per test binary, into a directory every user can
// read and execute, because Slurm runs jobs as the sandbox's job user and a
// worker binary in a 0700 temp dir fails with "Permission denied". All
// share one directory, so the worker (worker/fluksio-worker, built
// static as make build builds it) sits beside the plugin, where the
// plugin looks for the worker it ships (slurm/ship.go).
func Binary(t testing.TB, pkg, name string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built[pkg]; ok {
		return p
	}
	rootOnce.Do(func() {
		rootDir, rootErr = os.MkdirTemp("", "fluksio-bin-")
		if rootErr == nil {
			rootErr = os.Chmod(rootDir, 0o755)
		}
	})
	if rootErr != nil {
		t.Fatal(rootErr)
	}
	out := filepath.Join(rootDir, name)
	cmd := exec.Command("go", "build", "-o", out, "github.com/fluksio/provision/"+pkg)
	if pkg == "worker/fluksio-worker" {
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	}
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	built[pkg] = out
	return out
}

// ModuleRoot is the repository root, for tests that need its files.
func ModuleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Cleanup removes the binaries Binary built; call it from TestMain, or
// let Run do it.
func Cleanup() {
	if rootDir != "" {
		os.RemoveAll(rootDir)
	}
}

// Run runs a package's tests and then Cleanup, and returns their exit
// code: a TestMain of a package that builds binaries is
// os.Exit(sandboxtest.Run(m)). The binaries outlive any one test, so no
// test's Cleanup can remove them.
func Run(m *testing.M) int {
	code := m.Run()
	Cleanup()
	return code
}

// FreePort returns a loopback port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	return freePorts(t, 1)[0]
}

// EngineConfig is a config.hcl for an engine listening on 127.0.0.1:port
// with one Slurm provisioner, name, against this sandbox: plugins from
// pluginDir, workers started as worker, and profiles, the HCL of its
// profile blocks. The engines of a test run side by side as the
// sandbox's one login user: max_rpc_rate lifts the RPC budget they would
// share, which is not what they test.
func (e Env) EngineConfig(port int, pluginDir, name string, worker []string, profiles string) string {
	quoted := make([]string, len(worker))
	for i, w := range worker {
		quoted[i] = strconv.Quote(w)
	}
	return fmt.Sprintf(`engine {
  listen     = "127.0.0.1:%[1]d"
  plugin_dir = %[2]q
}

provisioner "slurm" %[3]q {
  login          = %[4]q
  ssh_port       = %[5]d
  ssh_key        = %[6]q
  known_hosts    = %[7]q
  engine_url     = "http://127.0.0.1:%[1]d"
  worker_command = [%[8]s]
  max_idle       = "30s"
  max_rpc_rate   = 100

%[9]s}
`, port, pluginDir, name, e.Login, e.Port, e.Key, e.KnownHosts, strings.Join(quoted, ", "), profiles)
}

// ShippedWorker is the worker as the plugin ships it to this sandbox's
// login node (slurm/ship.go): the binary built beside the plugin, its
// size and sha256, and where its copy goes in the job user's home, which
// is on this machine, as an administrator would see it.
type ShippedWorker struct {
	// Local is the binary beside the plugin; Size and Sum (hex sha256)
	// are its.
	Local string
	Size  int
	Sum   string
	// Home is the job user's home, UID and GID its owner; Dir is
	// ~/.local/share/fluksio/bin there, and Path the copy's file in it,
	// fluksio-worker-<the first 16 hex digits of Sum>.
	Home, Dir, Path string
	UID, GID        int
}

// ShippedWorker builds the worker beside the plugin and says where the
// plugin ships it. A test that looks at the copy holds WorkerCopies.
func (e Env) ShippedWorker(t testing.TB) ShippedWorker {
	t.Helper()
	w := ShippedWorker{Local: Binary(t, "worker/fluksio-worker", "fluksio-worker")}
	data, err := os.ReadFile(w.Local)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(data)
	w.Size, w.Sum = len(data), hex.EncodeToString(h[:])
	name, _, _ := strings.Cut(e.Login, "@")
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	w.UID, _ = strconv.Atoi(u.Uid)
	w.GID, _ = strconv.Atoi(u.Gid)
	w.Home = u.HomeDir
	w.Dir = filepath.Join(u.HomeDir, ".local/share/fluksio/bin")
	w.Path = filepath.Join(w.Dir, "fluksio-worker-"+w.Sum[:16])
	return w
}

// UserRPCs is how many RPCs slurmctld has taken from the sandbox's job
// user, from sdiag's table by user (root runs it); false when sdiag does
// not answer or does not say, as a controller busy starting many jobs
// can time it out: it is tried three times.
func (e Env) UserRPCs() (int, bool) {
	user, _, _ := strings.Cut(e.Login, "@")
	re := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(user) + `\s+\(\s*\d+\) count:(\d+)`)
	for range 3 {
		out, err := e.Command("sdiag").CombinedOutput()
		if m := re.FindSubmatch(out); err == nil && m != nil {
			n, _ := strconv.Atoi(string(m[1]))
			return n, true
		}
	}
	return 0, false
}

// LoginProcesses are the command lines of the processes that ssh
// sessions to this sandbox's sshd run on its login node (this machine):
// those whose SSH_CONNECTION ends with its port, sshd's own left out. A
// test reads what is left running there after the plugin gave a command
// up.
func (e Env) LoginProcesses(t testing.TB) []string {
	t.Helper()
	envs, err := filepath.Glob("/proc/[0-9]*/environ")
	if err != nil {
		t.Fatal(err)
	}
	port := " " + strconv.Itoa(e.Port)
	var out []string
	for _, f := range envs {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // gone, or not ours to read
		}
		ok := false
		for _, kv := range strings.Split(string(b), "\x00") {
			if v, found := strings.CutPrefix(kv, "SSH_CONNECTION="); found && strings.HasSuffix(v, port) {
				ok = true
			}
		}
		if !ok {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join(filepath.Dir(f), "cmdline"))
		if c := strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " ")); c != "" && !strings.HasPrefix(c, "sshd") {
			out = append(out, c)
		}
	}
	return out
}

// WorkerCopies takes, until the test ends, the lock of the shipped
// workers' directory on the sandbox's login node
// (~/.local/share/fluksio/bin of its job user): every test that ships
// the worker there, or looks into the directory, holds it, so that one
// test's swapped or stale copy is not another's. A file, taken with
// flock, so that it holds across packages.
func WorkerCopies(t testing.TB) {
	t.Helper()
	lockFile(t, "fluksio-worker-copies.lock")
}

// RelayCache takes, until the test ends, the lock of the relay's cache on
// the sandbox's login node (~/.cache/fluksio of its job user): every test
// that starts a relay there, or looks into the cache, holds it, so that a
// test of one package does not find another package's relay half started
// in it, or empty it under another's feet. go test runs packages at once;
// the lock is a file, taken with flock, so it holds across them.
func RelayCache(t testing.TB) {
	t.Helper()
	lockFile(t, "fluksio-relay-cache.lock")
}

// lockFile holds an exclusive flock on name in the temp directory until
// the test ends.
func lockFile(t testing.TB, name string) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(os.TempDir(), name), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	})
}
