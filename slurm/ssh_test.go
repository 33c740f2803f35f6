package slurm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/internal/testutil"
	"github.com/fluksio/provision/shared"
)

func TestSSHArgs(t *testing.T) {
	remote := []string{"squeue", "-h", "-o", "%i %k", "--name=fluksio-hpc"}
	tests := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"plain", Config{Login: Logins{Entries: []string{"u@h"}}},
			[]string{"-o", "BatchMode=yes", "--", "u@h", "squeue", "-h", "-o", "'%i %k'", "--name=fluksio-hpc"}},
		{"everything", Config{
			Login: Logins{Entries: []string{"u@h"}}, SSHConfig: "/etc/ssh cfg", SSHPort: 2222, SSHKey: "/k", KnownHosts: "/kh",
			SSHOptions: []string{"ControlMaster=auto", "ConnectTimeout=5"},
		}, []string{"-o", "BatchMode=yes", "-F", "/etc/ssh cfg", "-p", "2222", "-i", "/k",
			"-o", "UserKnownHostsFile=/kh", "-o", "StrictHostKeyChecking=yes",
			"-o", "ControlMaster=auto", "-o", "ConnectTimeout=5",
			"--", "u@h", "squeue", "-h", "-o", "'%i %k'", "--name=fluksio-hpc"}},
	}
	for _, tc := range tests {
		if got := sshArgs(&settings{Config: tc.cfg}, remote); !slices.Equal(got, tc.want) {
			t.Errorf("%s: argv = %q\nwant %q", tc.name, got, tc.want)
		}
	}
}

func TestSSHErrors(t *testing.T) {
	newFakeCluster(t, "scancel=fail")
	p := New(nil)
	p.sshPath = os.Args[0]
	p.cfg = &settings{Config: Config{Login: Logins{Entries: []string{"alice@login.example.org"}}}, submitTimeout: 10 * time.Second}

	_, stderr, err := p.ssh(context.Background(), nil, "scancel", "1")
	if err == nil || !strings.HasPrefix(err.Error(), "scancel on login.example.org: exit status 8") {
		t.Errorf("err = %v", err)
	}
	if !strings.Contains(string(stderr), "Unable to contact slurm controller") {
		t.Errorf("stderr = %q", stderr)
	}

	p.sshPath = "/nonexistent/ssh"
	if _, _, err := p.ssh(context.Background(), nil, "scancel", "1"); err == nil || !strings.HasPrefix(err.Error(), "scancel on login.example.org: ") {
		t.Errorf("err = %v", err)
	}
}

// withoutMux is argv without the multiplexing options the provisioner
// adds (three Control options right after BatchMode), for tests that pin
// the rest.
func withoutMux(argv []string) []string {
	if len(argv) < 8 || argv[1] != "BatchMode=yes" || argv[3] != "ControlMaster=auto" ||
		!strings.HasPrefix(argv[5], "ControlPath=") || argv[7] != "ControlPersist="+controlPersist {
		return argv
	}
	return append(slices.Clone(argv[:2]), argv[8:]...)
}

func TestMultiplexSettings(t *testing.T) {
	tests := []struct {
		name      string
		edit      func(map[string]any)
		multiplex bool
		sessions  int
		diag      string // "" for none, else severity:path:summary
	}{
		{"absent", func(c map[string]any) { delete(c, "multiplex"); delete(c, "max_sessions") }, true, 8, ""},
		{"null", func(c map[string]any) { c["multiplex"], c["max_sessions"] = nil, nil }, true, 8, ""},
		{"off", func(c map[string]any) { c["multiplex"], c["max_sessions"] = false, 3 }, false, 3, ""},
		{"one", func(c map[string]any) { c["max_sessions"] = 1 }, true, 1, ""},
		{"zero", func(c map[string]any) { c["max_sessions"] = 0 }, true, 0, "error:max_sessions:Invalid max_sessions"},
		{"negative", func(c map[string]any) { c["max_sessions"] = -2 }, true, 0, "error:max_sessions:Invalid max_sessions"},
		{"too many", func(c map[string]any) { c["max_sessions"] = 65 }, true, 0, "error:max_sessions:Invalid max_sessions"},
		{"sshd's limit", func(c map[string]any) { c["max_sessions"] = 10 }, true, 10, "warning:max_sessions:max_sessions at or above sshd's usual limit"},
		{"many without multiplexing", func(c map[string]any) { c["multiplex"], c["max_sessions"] = false, 64 }, false, 64, ""},
		{"multiplex wrong type", func(c map[string]any) { c["multiplex"] = "yes" }, false, 0, "error:multiplex:Wrong type"},
		{"max_sessions wrong type", func(c map[string]any) { c["max_sessions"] = 2.5 }, false, 0, "error:max_sessions:Wrong type"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := baseConfig()
			tc.edit(c)
			s, diags := parseConfig("hpc", mustJSON(t, c))
			var got string
			if len(diags) > 1 {
				t.Fatalf("diagnostics: %v", diags)
			}
			if len(diags) == 1 {
				sev := map[shared.Severity]string{shared.SeverityError: "error", shared.SeverityWarning: "warning"}[diags[0].Severity]
				got = sev + ":" + strings.Join(diags[0].Path, ".") + ":" + diags[0].Summary
				if !strings.Contains(diags[0].Detail, "MaxSessions") && tc.name != "multiplex wrong type" && tc.name != "max_sessions wrong type" {
					t.Errorf("detail %q does not mention MaxSessions", diags[0].Detail)
				}
			}
			if got != tc.diag {
				t.Fatalf("diagnostic %q, want %q", got, tc.diag)
			}
			if s != nil && (s.multiplex != tc.multiplex || s.maxSessions != tc.sessions) {
				t.Errorf("multiplex %v max_sessions %d, want %v %d", s.multiplex, s.maxSessions, tc.multiplex, tc.sessions)
			}
		})
	}
	var names []string
	for _, a := range schema().Attributes {
		names = append(names, a.Name)
	}
	if !slices.Contains(names, "multiplex") || !slices.Contains(names, "max_sessions") {
		t.Errorf("schema attributes %q lack multiplex or max_sessions", names)
	}
}

// scriptSSH is a stand-in ssh written in sh, for tests that need many of
// them at once or odd exits. It records each argv as a line of "calls" in
// its directory and then runs body, which sees the directory as $d and the
// remote command as $last.
type scriptSSH struct{ dir, path string }

func newScriptSSH(t *testing.T, body string) *scriptSSH {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "ssh")
	script := "#!/bin/sh\nd=" + dir + "\nprintf '%s\\n' \"$*\" >> \"$d/calls\"\nfor last; do :; done\n" + body + "\n"
	if err := os.WriteFile(path, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	return &scriptSSH{dir: dir, path: path}
}

// callsTo are the recorded argvs whose last word is remote: the poller
// reads the queue in the background, and its calls are not counted.
func (s *scriptSSH) callsTo(remote string) []string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "calls"))
	var calls []string
	for _, c := range strings.Split(string(b), "\n") {
		if strings.HasSuffix(c, " "+remote) {
			calls = append(calls, c)
		}
	}
	return calls
}

// configureSSH configures a Provisioner named "hpc" whose ssh is sshPath;
// edit changes the base configuration first. It is shut down at cleanup.
func configureSSH(t *testing.T, sshPath string, edit func(map[string]any)) *Provisioner {
	t.Helper()
	p := New(hclog.NewNullLogger())
	p.sshPath = sshPath
	cfg := baseConfig()
	if edit != nil {
		edit(cfg)
	}
	resp, err := p.Configure(context.Background(), &shared.ConfigureRequest{Name: "hpc", Config: mustJSON(t, cfg), Host: newFakeHost()})
	if err != nil || resp.Diagnostics.HasErrors() {
		t.Fatalf("Configure: %v %v", err, resp.Diagnostics)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		p.Shutdown(ctx, &shared.ShutdownRequest{})
	})
	return p
}

// currentSocket is the ControlPath the next call would use.
func currentSocket(p *Provisioner) string { return p.controlSocket(p.settings(), 0) }

// controlDir is the Provisioner's control directory, "" if none.
func controlDir(p *Provisioner) string {
	p.conn.mu.Lock()
	defer p.conn.mu.Unlock()
	return p.conn.dir
}

// option is the value ssh's argv gives option key ("" if none).
func option(argv []string, key string) string {
	for i := 0; i+1 < len(argv) && argv[i] != "--"; i++ {
		if argv[i] == "-o" && strings.HasPrefix(argv[i+1], key+"=") {
			return strings.TrimPrefix(argv[i+1], key+"=")
		}
	}
	return ""
}

func TestSSHMultiplexArgv(t *testing.T) {
	f := newFakeCluster(t, "")
	opts := func(on bool) func(map[string]any) {
		return func(c map[string]any) {
			c["multiplex"] = on
			c["ssh_options"] = []string{"ControlMaster=no", "ConnectTimeout=5"}
		}
	}
	p := configureSSH(t, os.Args[0], opts(true))
	for range 2 {
		if _, stderr, err := p.ssh(context.Background(), nil, "scancel", "7"); err != nil {
			t.Fatalf("%v %s", err, stderr)
		}
	}
	calls := f.callsTo("scancel")
	if len(calls) != 2 {
		t.Fatalf("%d calls", len(calls))
	}
	argv := calls[0].Argv
	socket := option(argv, "ControlPath")
	if argv[0] != "-o" || argv[1] != "BatchMode=yes" || option(argv, "ControlMaster") != "auto" || option(argv, "ControlPersist") != controlPersist {
		t.Errorf("argv = %q", argv)
	}
	// The provisioner's options come before the user's, which ssh would
	// otherwise take.
	if i, j := slices.Index(argv, "ControlMaster=auto"), slices.Index(argv, "ControlMaster=no"); i < 0 || j < i {
		t.Errorf("the user's ControlMaster comes first: %q", argv)
	}
	if len(socket) >= 100 || filepath.Base(socket) != controlName+"0" || !slices.Equal(calls[1].Argv, argv) {
		t.Errorf("control path %q; second argv %q", socket, calls[1].Argv)
	}
	st, err := os.Stat(filepath.Dir(socket))
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("control directory: %v %v", st, err)
	}
	if !slices.Equal(withoutMux(argv), []string{"-o", "BatchMode=yes", "-o", "ControlMaster=no", "-o", "ConnectTimeout=5", "--", "alice@login.example.org", "scancel", "7"}) {
		t.Errorf("withoutMux = %q", withoutMux(argv))
	}

	// After closeSSH the directory is gone, and calls go plain.
	p.closeSSH(context.Background())
	if _, err := os.Stat(filepath.Dir(socket)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("control directory after close: %v", err)
	}
	if _, _, err := p.ssh(context.Background(), nil, "scancel", "7"); err != nil {
		t.Fatal(err)
	}
	if argv := f.callsTo("scancel")[2].Argv; option(argv, "ControlPath") != "" || option(argv, "ControlMaster") != "no" {
		t.Errorf("after close argv = %q", argv)
	}

	// Off, the user's ssh config and options decide alone.
	p = configureSSH(t, os.Args[0], opts(false))
	if _, _, err := p.ssh(context.Background(), nil, "scancel", "7"); err != nil {
		t.Fatal(err)
	}
	if argv := f.callsTo("scancel")[3].Argv; !slices.Equal(argv, withoutMux(argv)) || option(argv, "ControlMaster") != "no" {
		t.Errorf("multiplex off: argv = %q", argv)
	}
	if controlDir(p) != "" {
		t.Errorf("multiplex off made %s", controlDir(p))
	}
}

// TestSSHSessionCap: never more than max_sessions ssh at once, however
// many calls come in together.
func TestSSHSessionCap(t *testing.T) {
	for _, multiplex := range []bool{true, false} {
		t.Run(fmt.Sprint("multiplex=", multiplex), func(t *testing.T) {
			// Only the probes count: the poller's squeue and any control
			// command run this script too, outside the probes' window.
			fake := newScriptSSH(t, `[ "$last" = probe ] || { echo ok; exit 0; }
: > "$d/run.$$"
ls "$d" | grep -c '^run\.' >> "$d/peak"
sleep 0.05
rm -f "$d/run.$$"
echo ok`)
			p := configureSSH(t, fake.path, func(c map[string]any) { c["multiplex"], c["max_sessions"] = multiplex, 3 })
			var wg sync.WaitGroup
			errs := make(chan error, 30)
			for range 30 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					out, _, err := p.ssh(context.Background(), nil, "probe")
					if err == nil && string(out) != "ok\n" {
						err = fmt.Errorf("stdout %q", out)
					}
					errs <- err
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Error(err)
				}
			}
			b, _ := os.ReadFile(filepath.Join(fake.dir, "peak"))
			peak := 0
			for _, l := range strings.Fields(string(b)) {
				n, _ := strconv.Atoi(l)
				peak = max(peak, n)
			}
			if peak > 3 || peak < 2 {
				t.Errorf("at most %d ssh ran at once, want 2 or 3 (max_sessions 3)", peak)
			}
			if n := len(fake.callsTo("probe")); n != 30 {
				t.Errorf("%d calls, want 30", n)
			}
		})
	}
}

// TestSSHSessionWaitEnds: a call that gets no slot before its context ends
// fails with the context's error and never starts ssh.
func TestSSHSessionWaitEnds(t *testing.T) {
	fake := newScriptSSH(t, `[ "$last" = hang ] && exec sleep 30
echo ok`)
	p := configureSSH(t, fake.path, func(c map[string]any) { c["max_sessions"] = 1 })
	hung, cancelHung := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, _, err := p.ssh(hung, nil, "hang")
		done <- err
	}()
	eventually(t, "the first call to start", func() bool { return len(fake.callsTo("hang")) == 1 })

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, _, err := p.ssh(ctx, nil, "probe")
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "waiting for an ssh session") {
		t.Errorf("err = %v", err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if _, _, err := p.ssh(ctx2, nil, "probe"); !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v", err)
	}
	if n := len(fake.callsTo("probe")); n != 0 {
		t.Errorf("%d ssh started without a slot", n)
	}

	cancelHung()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("hung call: %v", err)
	}
	// The slot is free again.
	if out, _, err := p.ssh(context.Background(), nil, "probe"); err != nil || string(out) != "ok\n" {
		t.Errorf("after: %q %v", out, err)
	}
}

// TestSSHStaleSocket: when ssh gives up on the master, the call is retried
// once on a connection of its own and the socket is retired; anything else
// is not retried.
func TestSSHStaleSocket(t *testing.T) {
	fake := newScriptSSH(t, `case "$*" in *ControlPath=none*) echo plain; exit 0;; esac
case "$last" in
stale) echo "Control socket connect($d/cm): Connection refused" >&2; echo "mux_client_hello_exchange: read packet failed" >&2; exit 255;;
fellback) echo "mux_client_request_session: session request failed: Session open refused by peer" >&2
  echo "ControlSocket /x/cm already exists, disabling multiplexing" >&2; echo "ssh: connect to host h port 22: Connection refused" >&2; exit 255;;
printed) echo partial; echo "mux_client_read_packet: read header failed: Broken pipe" >&2; exit 255;;
midsession) echo "mux_client_read_packet: read header failed: Broken pipe" >&2; exit 255;;
slurm) echo "Control socket connect(x): nonsense" >&2; exit 1;;
noise) echo "ControlSocket /x/cm already exists, disabling multiplexing" >&2; echo "squeue: error: Invalid user" >&2; exit 1;;
esac
echo mux`)
	p := configureSSH(t, fake.path, nil)

	// A stale socket: retired, and the call retried plain.
	socket := currentSocket(p)
	if err := os.WriteFile(socket, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	out, stderr, err := p.ssh(context.Background(), nil, "stale")
	if err != nil || string(out) != "plain\n" {
		t.Fatalf("stale: %q %q %v", out, stderr, err)
	}
	calls := fake.callsTo("stale")
	if len(calls) != 2 || !strings.Contains(calls[0], "ControlPath="+socket+" ") || !strings.Contains(calls[1], "ControlPath=none") {
		t.Errorf("calls = %q", calls)
	}
	if next := currentSocket(p); next == socket || filepath.Dir(next) != filepath.Dir(socket) {
		t.Errorf("after a stale socket the next call uses %s", next)
	}
	// The next call goes through the master again.
	if out, _, err := p.ssh(context.Background(), nil, "probe"); err != nil || string(out) != "mux\n" {
		t.Errorf("next: %q %v", out, err)
	}

	// Not retried: ssh fell back, the command printed, the command
	// failed, or the master died during the session, when the command
	// may have run. The master is retired when ssh could not use it.
	for _, tc := range []struct {
		remote  string
		retired bool
	}{{"fellback", false}, {"printed", true}, {"slurm", true}, {"noise", false}, {"midsession", true}} {
		socket := currentSocket(p)
		_, stderr, err := p.ssh(context.Background(), nil, tc.remote)
		if n := len(fake.callsTo(tc.remote)); err == nil || n != 1 {
			t.Errorf("%s: err %v after %d calls, want an error after one", tc.remote, err, n)
		}
		if tc.remote == "noise" && string(stderr) != "squeue: error: Invalid user\n" {
			t.Errorf("noise: stderr = %q", stderr)
		}
		if retired := currentSocket(p) != socket; retired != tc.retired {
			t.Errorf("%s: master retired %v, want %v", tc.remote, retired, tc.retired)
		}
	}
}

// TestSSHTimeoutRetires: a call that runs out of time takes the master
// out of use, since it may be the master that hangs.
func TestSSHTimeoutRetires(t *testing.T) {
	fake := newScriptSSH(t, `[ "$last" = hang ] && exec sleep 30
echo ok`)
	p := configureSSH(t, fake.path, func(c map[string]any) { c["submit_timeout"] = "200ms" })
	socket := currentSocket(p)
	if _, _, err := p.ssh(context.Background(), nil, "probe"); err != nil {
		t.Fatal(err)
	}
	if currentSocket(p) != socket {
		t.Fatal("a call that went well retired the master")
	}
	if _, _, err := p.ssh(context.Background(), nil, "hang"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
	if currentSocket(p) == socket {
		t.Error("the master was not retired")
	}
}

// TestCloseSSHWaitsForCalls: closeSSH lets the calls in flight finish
// before it removes the directory, since one of them may be making a
// master there.
func TestCloseSSHWaitsForCalls(t *testing.T) {
	fake := newScriptSSH(t, `if [ "$last" = slow ]; then
  sleep 0.3
  cp=$(printf '%s\n' "$*" | sed -n 's/.*ControlPath=\([^ ]*\).*/\1/p')
  if : > "$cp"; then echo made > "$d/made"; fi
fi
echo ok`)
	p := configureSSH(t, fake.path, nil)
	done := make(chan error, 1)
	go func() {
		_, _, err := p.ssh(context.Background(), nil, "slow")
		done <- err
	}()
	eventually(t, "the call to start", func() bool { return len(fake.callsTo("slow")) == 1 })
	dir := controlDir(p)
	p.closeSSH(context.Background())
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(fake.dir, "made")); err != nil {
		t.Errorf("closeSSH did not wait for the call in flight: %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("control directory after close: %v", err)
	}
}

// TestSSHLingeringOutput: an ssh that exits 0 while something it started
// holds its stderr (an old OpenSSH's ControlPersist ProxyCommand) is a
// success, returned within sshWaitDelay.
func TestSSHLingeringOutput(t *testing.T) {
	fake := newScriptSSH(t, `sleep 5 >&2 &
echo ok`)
	p := configureSSH(t, fake.path, nil)
	start := time.Now()
	out, _, err := p.ssh(context.Background(), nil, "probe")
	if err != nil || string(out) != "ok\n" {
		t.Errorf("%q %v", out, err)
	}
	if d := time.Since(start); d > sshWaitDelay+time.Second {
		t.Errorf("took %s", d)
	}
}

func TestQuietMux(t *testing.T) {
	const noise = "ControlSocket /t/cm already exists, disabling multiplexing\r\n"
	tests := []struct {
		in     string
		failed bool
		want   string
	}{
		{"", false, ""},
		{"squeue: error: x\n", true, "squeue: error: x\n"},
		{noise + "squeue: error: x\n", true, "squeue: error: x\n"},
		{"mux_client_request_session: session request failed: Session open refused by peer\r\n" + noise + "sbatch: error: y\n", true, "sbatch: error: y\n"},
		{noise, false, ""},
		{noise, true, noise},
		// The master died while ssh greeted it; ssh ran the command on a
		// connection of its own.
		{"muxclient: master hello exchange failed\r\n", false, ""},
	}
	for _, tc := range tests {
		if got := string(quietMux([]byte(tc.in), tc.failed)); got != tc.want {
			t.Errorf("quietMux(%q, %v) = %q, want %q", tc.in, tc.failed, got, tc.want)
		}
	}
}

// TestSSHSandboxMultiplex runs against the sandbox's real sshd (MaxSessions
// 10) and OpenSSH.
func TestSSHSandboxMultiplex(t *testing.T) {
	env := sandboxtest.Require(t)
	sshPath := testutil.LookPath(t, "ssh")
	sandbox := func(multiplex bool, sessions int) func(map[string]any) {
		return func(c map[string]any) {
			c["login"], c["ssh_port"], c["ssh_key"], c["known_hosts"] = env.Login, env.Port, env.Key, env.KnownHosts
			c["submit_timeout"] = "20s"
			c["multiplex"], c["max_sessions"] = multiplex, sessions
		}
	}
	cheap := []string{"squeue", "-h", "--name=fluksio-nonexistent"}
	call := func(p *Provisioner) error {
		_, stderr, err := p.ssh(context.Background(), nil, cheap...)
		if err == nil && len(stderr) > 0 {
			err = fmt.Errorf("stderr %q", stderr)
		}
		if err != nil {
			return fmt.Errorf("%w: %s", err, stderr)
		}
		return nil
	}
	isSocket := func(path string) bool {
		st, err := os.Lstat(path)
		return err == nil && st.Mode()&os.ModeSocket != 0
	}
	median := func(p *Provisioner) time.Duration {
		var ds []time.Duration
		for range 20 {
			start := time.Now()
			if err := call(p); err != nil {
				t.Fatal(err)
			}
			ds = append(ds, time.Since(start))
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return ds[len(ds)/2]
	}

	p := configureSSH(t, sshPath, sandbox(true, 8))
	socket := ""
	t.Run("sequential", func(t *testing.T) {
		for i := range 20 {
			if err := call(p); err != nil {
				t.Fatalf("call %d: %v", i, err)
			}
			if i == 0 {
				socket = currentSocket(p)
				if !isSocket(socket) {
					t.Fatalf("no control socket at %s after the first call", socket)
				}
			}
		}
	})
	if socket == "" {
		t.FailNow()
	}

	t.Run("latency", func(t *testing.T) {
		plain := configureSSH(t, sshPath, sandbox(false, 8))
		mux := median(p)
		pl := median(plain)
		t.Logf("median of 20 calls of %q: plain %s, multiplexed %s", strings.Join(cheap, " "), pl.Round(time.Millisecond), mux.Round(time.Millisecond))
		if mux >= pl {
			t.Errorf("multiplexed %s is no faster than plain %s", mux, pl)
		}
	})

	concurrent := func(t *testing.T, p *Provisioner, n int) {
		var wg sync.WaitGroup
		errs := make(chan error, n)
		start := time.Now()
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- call(p)
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
		t.Logf("%d concurrent calls took %s", n, time.Since(start).Round(time.Millisecond))
	}
	t.Run("concurrent", func(t *testing.T) { concurrent(t, p, 50) })
	t.Run("concurrent from cold", func(t *testing.T) {
		concurrent(t, configureSSH(t, sshPath, sandbox(true, 8)), 50)
	})

	masterPid := func(p *Provisioner, socket string) int {
		args := sshArgv(p.settings(), []string{"-O", "check", "-o", "ControlPath=" + socket}, nil)
		out, _ := exec.Command(sshPath, args...).CombinedOutput()
		var pid int
		fmt.Sscanf(string(bytes.TrimSpace(out)), "Master running (pid=%d)", &pid)
		return pid
	}

	t.Run("master killed", func(t *testing.T) {
		for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
			pid := masterPid(p, currentSocket(p))
			if pid == 0 {
				t.Fatal("no master")
			}
			if err := syscall.Kill(pid, sig); err != nil {
				t.Fatal(err)
			}
			// Every call succeeds, and soon one makes a new master.
			var newPid int
			for i := 0; newPid == 0 || newPid == pid; i++ {
				if err := call(p); err != nil {
					t.Fatalf("after %s, call %d: %v", sig, i, err)
				}
				if i == 5 {
					t.Fatalf("after %s: no new master after %d calls", sig, i)
				}
				newPid = masterPid(p, currentSocket(p))
			}
		}
	})

	t.Run("master wedged", func(t *testing.T) {
		// A master that takes the connection but never answers: the
		// call in flight runs out of time, and the next makes a new one.
		w := configureSSH(t, sshPath, func(c map[string]any) {
			sandbox(true, 8)(c)
			c["submit_timeout"] = "2s"
		})
		if err := call(w); err != nil {
			t.Fatal(err)
		}
		pid := masterPid(w, currentSocket(w))
		syscall.Kill(pid, syscall.SIGSTOP)
		defer syscall.Kill(pid, syscall.SIGKILL)
		if err := call(w); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("through a wedged master: %v", err)
		}
		if err := call(w); err != nil {
			t.Fatal(err)
		}
		if n := masterPid(w, currentSocket(w)); n == 0 || n == pid {
			t.Errorf("no new master: %d", n)
		}
		syscall.Kill(pid, syscall.SIGKILL)
	})

	t.Run("proxyjump", func(t *testing.T) {
		// The user's ssh_config, with a jump host, applies to the master;
		// and the first call, which makes the master, returns at once.
		cfgFile := filepath.Join(t.TempDir(), "ssh_config")
		user, host, _ := strings.Cut(env.Login, "@")
		hostBlock := func(alias string) string {
			return fmt.Sprintf("Host %s\n  HostName %s\n  Port %d\n  User %s\n  IdentityFile %s\n  UserKnownHostsFile %s\n  StrictHostKeyChecking yes\n", alias, host, env.Port, user, env.Key, env.KnownHosts)
		}
		if err := os.WriteFile(cfgFile, []byte(hostBlock("fxjump")+hostBlock("fxtarget")+"  ProxyJump fxjump\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		pj := configureSSH(t, sshPath, func(c map[string]any) {
			c["login"], c["ssh_config"], c["multiplex"], c["max_sessions"] = "fxtarget", cfgFile, true, 8
		})
		// The poller may have made a master already: retire it, so
		// that the timed call makes one.
		if err := call(pj); err != nil {
			t.Fatal(err)
		}
		pj.retire(0, currentSocket(pj))
		start := time.Now()
		if err := call(pj); err != nil {
			t.Fatal(err)
		}
		first := time.Since(start)
		if first > sshWaitDelay {
			t.Errorf("the first call through a jump host took %s", first)
		}
		if !isSocket(currentSocket(pj)) {
			t.Errorf("no control socket through the jump host")
		}
		t.Logf("through ProxyJump: first call %s, then median %s", first.Round(time.Millisecond), median(pj).Round(time.Millisecond))
		// Both masters, the retired one too, exit at close.
		dir := controlDir(pj)
		pj.closeSSH(context.Background())
		eventually(t, "no process to mention "+dir, func() bool { return len(processesMentioning(dir)) == 0 })
	})

	t.Run("close", func(t *testing.T) {
		dir := controlDir(p)
		pid := masterPid(p, currentSocket(p))
		p.closeSSH(context.Background())
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("control directory after close: %v", err)
		}
		eventually(t, "the master to exit", func() bool { return syscall.Kill(pid, 0) != nil || isZombie(pid) })
		eventually(t, "no process to mention "+dir, func() bool { return len(processesMentioning(dir)) == 0 })
		// Calls still work, without a master.
		if err := call(p); err != nil {
			t.Error(err)
		}
		if len(processesMentioning(dir)) > 0 {
			t.Errorf("a process mentions %s after close: %q", dir, processesMentioning(dir))
		}
	})
}

// isZombie says whether pid has exited and waits to be reaped (by pid 1,
// which for a daemonised master may take a while).
func isZombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
}

// processesMentioning lists the live processes whose command line mentions
// s (a ControlMaster's is "ssh: <ControlPath> [mux]").
func processesMentioning(s string) []string {
	var found []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range procs {
		b, err := os.ReadFile(f)
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
		if err == nil && bytes.Contains(b, []byte(s)) && !isZombie(pid) {
			found = append(found, string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
		}
	}
	return found
}
