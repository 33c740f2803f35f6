package sandboxtest

// Private sandboxes, for tests that break things on purpose: stop
// slurmctld, take the login node's sshd away. The shared sandbox (the one
// Require returns) is used by every other test running at the same time,
// so nothing here ever touches it: a private sandbox has its own state
// directory and ports, and StopDaemon and Restart refuse an Env that
// Private did not bring up.

import (
	"bufio"
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// privateSettings are what up.sh is given for a private sandbox: small,
// so that it costs little beside the shared one.
const (
	privateCPUs  = 4
	privateGPUs  = 1
	privateMemMB = 4000
)

// privateNameRE keeps a private sandbox's directory short and plain: it
// goes into slurm.conf, sshd_config and socket paths.
var privateNameRE = regexp.MustCompile(`^[a-z0-9]{1,10}$`)

// privates are the state directories Private brought up in this process,
// with the environment up.sh was given, so that Restart gives it the same
// settings and StopDaemon can refuse any other sandbox.
var (
	privMu   sync.Mutex
	privates = map[string][]string{}
)

// Private brings up a sandbox of the test's own, for tests that stop its
// daemons: state in /tmp/pvsb-<name>-<4 hex digits>, free ports of its own
// for sshd, slurmctld and slurmd, 4 CPUs and 1 GPU. It is purged (down.sh
// --purge: jobs cancelled, daemons stopped by pid, state removed) when
// the test ends. It skips, or fails in CI, where Require would; it also
// needs root, as up.sh does. Bringing one up takes a few seconds (with
// accounting, PrivateWith, about 10 s more the first time, for apt).
func Private(t testing.TB, name string) Env {
	t.Helper()
	return PrivateWith(t, name, Options{})
}

// Options are what a private sandbox has beyond the defaults.
type Options struct {
	// Accounting brings up MariaDB and slurmdbd with it
	// (SANDBOX_ACCOUNTING=1): limits enforced, the job user in account
	// "proj". A test sets its limits with sacctmgr as root (Env.Slurm).
	Accounting bool
	// MinJobAge, when not zero, is how many seconds the controller
	// keeps a finished job (SANDBOX_MIN_JOB_AGE; Slurm's default is 300).
	MinJobAge int
	// MaxJobCount, when not zero, is slurm.conf's MaxJobCount
	// (SANDBOX_MAX_JOB_COUNT): how many jobs, array tasks and finished
	// jobs within MinJobAge slurmctld holds before sbatch retries.
	MaxJobCount int
	// Bastion starts a jump host in front of the login node
	// (SANDBOX_BASTION_PORT, a free port): Env.SSHConfig then has the
	// Host "sandbox-via-bastion", the login node reached through it.
	Bastion bool
	// JobSubmit is the site's submit rules, slurm.conf's
	// JobSubmitPlugins (SANDBOX_JOB_SUBMIT): "require_timelimit",
	// "throttle" or both, comma-separated; "" for none. JobsPerHour is
	// throttle's jobs_per_user_per_hour (SANDBOX_JOBS_PER_HOUR), 0 for
	// up.sh's default.
	JobSubmit   string
	JobsPerHour int
	// CPUs, when not zero, is the node's CPUs (SANDBOX_CPUS), for a
	// test that needs a burst to run at once; else privateCPUs.
	CPUs int
	// RateLimit turns on slurmctld's per-user RPC rate limiter
	// (SANDBOX_RATE_LIMIT): "BUCKET,REFILL", such as "10,1"; "" for
	// none. Slurm 22.05 (bookworm) has no limiter, and up.sh refuses it
	// there: a test checks Env.Version (or Suite) first.
	RateLimit string
	// DefaultTime is the partition's DefaultTime, the time limit of a
	// job without --time (SANDBOX_DEFAULT_TIME), in Slurm's form ("2",
	// "00:02:00"); "" for none.
	DefaultTime string
	// Exclusive makes the partition OverSubscribe=EXCLUSIVE
	// (SANDBOX_EXCLUSIVE=1): every job gets the whole node.
	Exclusive bool
}

// PrivateWith is Private with opts.
func PrivateWith(t testing.TB, name string, opts Options) Env {
	t.Helper()
	Require(t)
	if os.Geteuid() != 0 {
		msg := "a private sandbox needs root (up.sh starts slurmd and sshd)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg + " (in CI this is a failure, not a skip)")
		}
		t.Skip(msg)
	}
	if !privateNameRE.MatchString(name) {
		t.Fatalf("private sandbox name %q: use 1 to 10 lowercase letters and digits (it goes into paths that must stay short)", name)
	}
	var b [2]byte
	rand.Read(b[:])
	dir := "/tmp/pvsb-" + name + "-" + hex.EncodeToString(b[:])
	if dir == filepath.Clean(os.Getenv("SANDBOX_DIR")) {
		t.Fatalf("private sandbox %s would be the shared one", dir)
	}

	ports := freePorts(t, 6)
	env := cleanEnv()
	env = append(env,
		// The same Slurm as the shared sandbox: tests run on the
		// version CI asked for.
		"SANDBOX_SLURM="+Suite(),
		"SANDBOX_SSH_PORT="+strconv.Itoa(ports[0]),
		"SANDBOX_CTLD_PORT="+strconv.Itoa(ports[1]),
		"SANDBOX_SLURMD_PORT="+strconv.Itoa(ports[2]),
		"SANDBOX_CPUS="+strconv.Itoa(cmp.Or(opts.CPUs, privateCPUs)),
		"SANDBOX_GPUS="+strconv.Itoa(privateGPUs),
		"SANDBOX_MEM_MB="+strconv.Itoa(privateMemMB),
		// One node: freePorts found one free port for slurmd, and a
		// private sandbox is for daemons a test kills, not for width.
		"SANDBOX_NODES=1",
	)
	if opts.Accounting {
		env = append(env, "SANDBOX_ACCOUNTING=1",
			"SANDBOX_DBD_PORT="+strconv.Itoa(ports[3]),
			"SANDBOX_DB_PORT="+strconv.Itoa(ports[4]))
	}
	if opts.Bastion {
		env = append(env, "SANDBOX_BASTION_PORT="+strconv.Itoa(ports[5]))
	}
	if opts.JobSubmit != "" {
		env = append(env, "SANDBOX_JOB_SUBMIT="+opts.JobSubmit)
	}
	if opts.JobsPerHour > 0 {
		env = append(env, "SANDBOX_JOBS_PER_HOUR="+strconv.Itoa(opts.JobsPerHour))
	}
	if opts.RateLimit != "" {
		env = append(env, "SANDBOX_RATE_LIMIT="+opts.RateLimit)
	}
	if opts.DefaultTime != "" {
		env = append(env, "SANDBOX_DEFAULT_TIME="+opts.DefaultTime)
	}
	if opts.Exclusive {
		env = append(env, "SANDBOX_EXCLUSIVE=1")
	}
	if opts.MinJobAge > 0 {
		env = append(env, "SANDBOX_MIN_JOB_AGE="+strconv.Itoa(opts.MinJobAge))
	}
	if opts.MaxJobCount > 0 {
		env = append(env, "SANDBOX_MAX_JOB_COUNT="+strconv.Itoa(opts.MaxJobCount))
	}
	privMu.Lock()
	privates[dir] = env
	privMu.Unlock()

	// Registered before up.sh runs, so that a sandbox that came up half
	// way is taken down too.
	t.Cleanup(func() {
		start := time.Now()
		out, err := sandboxScript("down.sh", env, dir, "--purge")
		if err != nil {
			t.Errorf("down.sh %s --purge: %v\n%s", dir, err, out)
		} else {
			t.Logf("private sandbox %s purged in %.1fs", dir, time.Since(start).Seconds())
		}
		privMu.Lock()
		delete(privates, dir)
		privMu.Unlock()
	})

	start := time.Now()
	if out, err := sandboxScript("up.sh", env, dir); err != nil {
		t.Fatalf("up.sh %s: %v\n%s", dir, err, out)
	}
	e := readEnvSh(t, filepath.Join(dir, "env.sh"))
	t.Logf("private sandbox %s up in %.1fs (ssh %d, slurmctld %d, slurmd %d)", dir, time.Since(start).Seconds(), ports[0], ports[1], ports[2])
	return e
}

// Restart runs up.sh on a private sandbox again, which starts whatever
// daemon is not running and waits until the cluster answers (a smoke job
// runs when one was started).
func (e Env) Restart(t testing.TB) {
	t.Helper()
	env := privateEnv(t, e)
	start := time.Now()
	if out, err := sandboxScript("up.sh", env, e.Dir); err != nil {
		t.Fatalf("up.sh %s (restart): %v\n%s", e.Dir, err, out)
	}
	t.Logf("private sandbox %s restarted in %.1fs", e.Dir, time.Since(start).Seconds())
}

// StopDaemon stops one daemon of a private sandbox, "slurmctld", "slurmd",
// "munged" or "sshd", by the pid in its pid file (never by name): SIGTERM,
// then SIGKILL if it is still there after 15 s. It returns once the
// process is gone; a zombie counts as gone, since pid 1 may take seconds
// to reap it. For sshd, the processes it forked for open connections are
// stopped as well, so that the login node is down for connections made
// before as much as for new ones (down.sh does the same).
func (e Env) StopDaemon(t testing.TB, daemon string) {
	t.Helper()
	privateEnv(t, e)
	switch daemon {
	case "slurmctld", "slurmd", "munged", "sshd":
	default:
		t.Fatalf("StopDaemon: unknown daemon %q", daemon)
	}
	pidFile := filepath.Join(e.Dir, "pid", daemon+".pid")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("StopDaemon %s: %v", daemon, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		t.Fatalf("StopDaemon %s: %s holds %q, not a pid", daemon, pidFile, b)
	}
	if !ProcLive(pid) {
		t.Fatalf("StopDaemon %s: pid %d from %s is not running", daemon, pid, pidFile)
	}
	if comm := procComm(pid); comm != daemon {
		t.Fatalf("StopDaemon %s: pid %d is %q, not %s; not touching it", daemon, pid, comm, daemon)
	}
	var children []int
	if daemon == "sshd" {
		children = procChildren(pid)
	}
	start := time.Now()
	for _, p := range append([]int{pid}, children...) {
		_ = syscall.Kill(p, syscall.SIGTERM)
	}
	for _, p := range append([]int{pid}, children...) {
		if !WaitGone(p, 15*time.Second) {
			t.Logf("StopDaemon %s: pid %d ignored SIGTERM for 15s; sending SIGKILL", daemon, p)
			_ = syscall.Kill(p, syscall.SIGKILL)
			if !WaitGone(p, 5*time.Second) {
				t.Fatalf("StopDaemon %s: pid %d still alive after SIGKILL", daemon, p)
			}
		}
	}
	t.Logf("stopped %s (pid %d, and %d connection process(es)) of %s in %.2fs", daemon, pid, len(children), e.Dir, time.Since(start).Seconds())
}

// privateEnv returns the environment up.sh was given for e, failing the
// test when e is not a private sandbox of this process.
func privateEnv(t testing.TB, e Env) []string {
	t.Helper()
	privMu.Lock()
	env, ok := privates[e.Dir]
	privMu.Unlock()
	if !ok {
		t.Fatalf("%q is not a private sandbox brought up by this test binary; refusing to stop or restart its daemons", e.Dir)
	}
	return env
}

// sandboxScript runs bash sandbox/<script> with args under env.
func sandboxScript(script string, env []string, args ...string) ([]byte, error) {
	cmd := exec.Command("bash", append([]string{filepath.Join(ModuleRoot(), "sandbox", script)}, args...)...)
	cmd.Env = env
	cmd.WaitDelay = 5 * time.Second
	return cmd.CombinedOutput()
}

// cleanEnv is this process's environment without the shared sandbox's
// settings, which up.sh would otherwise take for the private one's.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "SANDBOX_") || k == "SLURM_CONF" {
			continue
		}
		if k == "PATH" && os.Getenv("SANDBOX_BIN") != "" {
			// The shared sandbox's client wrappers are its own.
			parts := strings.Split(v, ":")
			kv = "PATH=" + strings.Join(slices.DeleteFunc(parts, func(p string) bool { return p == os.Getenv("SANDBOX_BIN") }), ":")
		}
		env = append(env, kv)
	}
	return env
}

// freePorts returns n distinct loopback ports that were free a moment
// ago.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	for len(ports) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, l) // held until all are chosen, so they differ
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// readEnvSh reads the exports of a sandbox's env.sh into an Env.
func readEnvSh(t testing.TB, path string) Env {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	vars := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "export ")
		if !ok {
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok {
			vars[k] = v
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	e := Env{
		Dir:        vars["SANDBOX_DIR"],
		Login:      vars["SANDBOX_SSH_LOGIN"],
		Key:        vars["SANDBOX_SSH_KEY"],
		KnownHosts: vars["SANDBOX_SSH_KNOWN_HOSTS"],
		SSHConfig:  vars["SANDBOX_SSH_CONFIG"],
		Partition:  vars["SANDBOX_PARTITION"],
		SlurmConf:  vars["SLURM_CONF"],
		Bin:        vars["SANDBOX_BIN"],
		Version:    vars["SANDBOX_SLURM_VERSION"],
		Accounting: vars["SANDBOX_ACCOUNTING"] == "1",
		RateLimit:  vars["SANDBOX_RATE_LIMIT"],
	}
	fmt.Sscan(vars["SANDBOX_SSH_PORT"], &e.Port)
	fmt.Sscan(vars["SANDBOX_CPUS"], &e.CPUs)
	fmt.Sscan(vars["SANDBOX_GPUS"], &e.GPUs)
	fmt.Sscan(vars["SANDBOX_BASTION_PORT"], &e.BastionPort)
	e.Nodes = 1
	fmt.Sscan(vars["SANDBOX_NODES"], &e.Nodes)
	if e.Dir == "" || e.Login == "" || e.Port == 0 || e.SlurmConf == "" {
		t.Fatalf("%s does not describe a sandbox: %v", path, vars)
	}
	return e
}

// procState is the state letter of /proc/PID/stat, "" if there is no
// such process.
func procState(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	// comm may hold spaces and parentheses: the state follows the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return ""
	}
	return string(b[i+2])
}

// ProcLive reports whether pid is a process that is neither gone nor a
// zombie.
func ProcLive(pid int) bool {
	s := procState(pid)
	return s != "" && s != "Z" && s != "X"
}

// PIDsOf lists the live processes whose executable is exe, ascending.
func PIDsOf(exe string) []int {
	exes, _ := filepath.Glob("/proc/[0-9]*/exe")
	var pids []int
	for _, f := range exes {
		if p, err := os.Readlink(f); err != nil || p != exe {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(f))); err == nil && ProcLive(pid) {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	return pids
}

// RelayPIDs lists the Slurm plugin's relay processes running on this
// machine (the sandbox's login node), read from /proc: "…provisioner-slurm
// relay …", whether run from the copy the plugin keeps in the login
// user's cache or from a relay_command.
func RelayPIDs() []int {
	var pids []int
	files, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) > 2 && strings.Contains(args[0], "provisioner-slurm") && args[1] == "relay" {
			if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(f))); err == nil && ProcLive(pid) {
				pids = append(pids, pid)
			}
		}
	}
	slices.Sort(pids)
	return pids
}

func procComm(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// procChildren lists the live processes whose parent is pid.
func procChildren(pid int) []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var out []int
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(b[i+1:]))
		if len(fields) < 2 || fields[1] != strconv.Itoa(pid) {
			continue
		}
		if child, err := strconv.Atoi(filepath.Base(filepath.Dir(f))); err == nil && ProcLive(child) {
			out = append(out, child)
		}
	}
	return out
}

// WaitGone polls until pid is gone or a zombie, up to limit.
func WaitGone(pid int, limit time.Duration) bool {
	for end := time.Now().Add(limit); ProcLive(pid); {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}
