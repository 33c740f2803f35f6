package sshrun

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeSSH is a stand-in ssh written in sh, for tests that need many of
// them at once or odd exits: the real ssh is in TestSSHSandboxMultiplex.
// It records each argv as a line of "calls" in its directory, the words
// apart by \x1f, and then runs body, which sees the directory as $d and
// the remote command's last word as $last.
type fakeSSH struct{ dir, path string }

func newFakeSSH(t *testing.T, body string) *fakeSSH {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "ssh")
	script := "#!/bin/sh\nd=" + dir + "\n(IFS=$(printf '\\037'); printf '%s\\n' \"$*\") >> \"$d/calls\"\nfor last; do :; done\n" + body + "\n"
	if err := os.WriteFile(path, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	return &fakeSSH{dir: dir, path: path}
}

// argvs are the recorded argvs whose last word is remote, in order.
func (s *fakeSSH) argvs(remote string) [][]string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "calls"))
	var out [][]string
	for _, line := range strings.Split(string(b), "\n") {
		if argv := strings.Split(line, "\x1f"); line != "" && argv[len(argv)-1] == remote {
			out = append(out, argv)
		}
	}
	return out
}

// callsTo are argvs(remote), each as one string, the words apart by a
// space.
func (s *fakeSSH) callsTo(remote string) []string {
	var out []string
	for _, argv := range s.argvs(remote) {
		out = append(out, strings.Join(argv, " "))
	}
	return out
}

// baseConfig is one login node reached through program, multiplexed,
// with a submit_timeout of 30 s.
func baseConfig(program string) Config {
	return Config{Program: program, Logins: []Login{{Dest: "alice@login.example.org"}}, Timeout: 30 * time.Second, Multiplex: true}
}

// newTransport is New(c), closed when the test ends.
func newTransport(t *testing.T, c Config) *Transport {
	t.Helper()
	tr := New(c, nil)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		tr.Close(ctx)
	})
	return tr
}

// currentSocket is the ControlPath the next call would use.
func currentSocket(tr *Transport) string { return tr.controlSocket(0) }

// controlDir is the Transport's control directory, "" if none.
func controlDir(tr *Transport) string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.dir
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

// withoutMux is argv without the multiplexing options the transport
// adds (three Control options right after BatchMode), for tests that pin
// the rest.
func withoutMux(argv []string) []string {
	if len(argv) < 8 || argv[1] != "BatchMode=yes" || argv[3] != "ControlMaster=auto" ||
		!strings.HasPrefix(argv[5], "ControlPath=") || argv[7] != "ControlPersist="+controlPersist {
		return argv
	}
	return append(slices.Clone(argv[:2]), argv[8:]...)
}

func TestSSHArgs(t *testing.T) {
	remote := []string{"squeue", "-h", "-o", "%i %k", "--name=fluksio-hpc"}
	tests := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"plain", Config{Logins: []Login{{Dest: "u@h"}}},
			[]string{"-o", "BatchMode=yes", "--", "u@h", "squeue", "-h", "-o", "'%i %k'", "--name=fluksio-hpc"}},
		{"everything", Config{
			Logins: []Login{{Dest: "u@h"}}, ConfigFile: "/etc/ssh cfg", Port: 2222, Key: "/k", KnownHosts: "/kh",
			Options: []string{"ControlMaster=auto", "ConnectTimeout=5"},
		}, []string{"-o", "BatchMode=yes", "-F", "/etc/ssh cfg", "-p", "2222", "-i", "/k",
			"-o", "UserKnownHostsFile=/kh", "-o", "StrictHostKeyChecking=yes",
			"-o", "ControlMaster=auto", "-o", "ConnectTimeout=5",
			"--", "u@h", "squeue", "-h", "-o", "'%i %k'", "--name=fluksio-hpc"}},
		// ConnectTimeout is half of Timeout, unless the options set one.
		{"timeout", Config{Logins: []Login{{Dest: "u@h"}}, Timeout: 30 * time.Second},
			[]string{"-o", "BatchMode=yes", "-o", "ConnectTimeout=15", "--", "u@h", "true"}},
		// Through a bastion: a ProxyCommand that carries the key,
		// known_hosts, BatchMode and ConnectTimeout to the hop, each word
		// shell-quoted, each % doubled but -W's.
		{"bastion", Config{Logins: []Login{{Dest: "u@h"}}, Bastions: []Login{{Dest: "j@jump", Port: 2200}},
			ConfigFile: "/c", Key: "/k 100%", KnownHosts: "/kh", Timeout: 30 * time.Second},
			[]string{"-o", "BatchMode=yes", "-o", "ProxyCommand=ssh -o BatchMode=yes -F /c -p 2200 -i '/k 100%%' -o IdentitiesOnly=yes" +
				" -o UserKnownHostsFile=/kh -o StrictHostKeyChecking=yes -o ConnectTimeout=15 -W %h:%p -- j@jump",
				"-F", "/c", "-i", "/k 100%", "-o", "UserKnownHostsFile=/kh", "-o", "StrictHostKeyChecking=yes",
				"-o", "ConnectTimeout=15", "--", "u@h", "true"}},
	}
	for _, tc := range tests {
		r := remote
		if tc.name == "timeout" || tc.name == "bastion" {
			r = []string{"true"}
		}
		tr := New(tc.cfg, nil)
		if got := tr.argv(tr.firstLogin(), nil, tr.proxyInUse(), r); !slices.Equal(got, tc.want) {
			t.Errorf("%s: argv = %q\nwant %q", tc.name, got, tc.want)
		}
	}
	// A login's own port comes before Port, and ssh keeps the first.
	tr := New(Config{Port: 22, Logins: []Login{{Dest: "u@h", Port: 2222}}}, nil)
	argv := tr.argv(tr.cfg.Logins[0], nil, "", []string{"true"})
	if i := slices.Index(argv, "-p"); i < 0 || argv[i+1] != "2222" || slices.Contains(argv, "22") {
		t.Errorf("argv %q: want the entry's port alone", argv)
	}
}

func TestSSHErrors(t *testing.T) {
	fake := newFakeSSH(t, `echo "scancel: error: Unable to contact slurm controller (connect failure)" >&2; exit 8`)
	tr := newTransport(t, Config{Program: fake.path, Logins: []Login{{Dest: "alice@login.example.org"}}, Timeout: 10 * time.Second})

	_, stderr, err := tr.Run(context.Background(), nil, "scancel", "1")
	if err == nil || !strings.HasPrefix(err.Error(), "scancel on login.example.org: exit status 8") {
		t.Errorf("err = %v", err)
	}
	if !strings.Contains(string(stderr), "Unable to contact slurm controller") {
		t.Errorf("stderr = %q", stderr)
	}

	tr = newTransport(t, Config{Program: "/nonexistent/ssh", Logins: []Login{{Dest: "alice@login.example.org"}}, Timeout: 10 * time.Second})
	if _, _, err := tr.Run(context.Background(), nil, "scancel", "1"); err == nil || !strings.HasPrefix(err.Error(), "scancel on login.example.org: ") {
		t.Errorf("err = %v", err)
	}
	if _, _, err := tr.Run(context.Background(), nil); err == nil || !strings.Contains(err.Error(), "no remote command") {
		t.Errorf("no command: err = %v", err)
	}
}

func TestSSHMultiplexArgv(t *testing.T) {
	fake := newFakeSSH(t, "exit 0")
	cfg := func(on bool) Config {
		c := baseConfig(fake.path)
		c.Multiplex = on
		c.Options = []string{"ControlMaster=no", "ConnectTimeout=5"}
		return c
	}
	tr := newTransport(t, cfg(true))
	for range 2 {
		if _, stderr, err := tr.Run(context.Background(), nil, "scancel", "7"); err != nil {
			t.Fatalf("%v %s", err, stderr)
		}
	}
	calls := fake.argvs("7")
	if len(calls) != 2 {
		t.Fatalf("%d calls", len(calls))
	}
	argv := calls[0]
	socket := option(argv, "ControlPath")
	if argv[0] != "-o" || argv[1] != "BatchMode=yes" || option(argv, "ControlMaster") != "auto" || option(argv, "ControlPersist") != controlPersist {
		t.Errorf("argv = %q", argv)
	}
	// The transport's options come before the user's, which ssh would
	// otherwise take.
	if i, j := slices.Index(argv, "ControlMaster=auto"), slices.Index(argv, "ControlMaster=no"); i < 0 || j < i {
		t.Errorf("the user's ControlMaster comes first: %q", argv)
	}
	if len(socket) >= 100 || filepath.Base(socket) != controlName+"0" || !slices.Equal(calls[1], argv) {
		t.Errorf("control path %q; second argv %q", socket, calls[1])
	}
	st, err := os.Stat(filepath.Dir(socket))
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("control directory: %v %v", st, err)
	}
	// The command runs under the login node's timeout, given a little
	// less than the call's 30 s (deadline.go).
	plain := withoutMux(argv)
	given, _ := strconv.ParseFloat(plain[len(plain)-3], 64)
	if !slices.Equal(plain, []string{"-o", "BatchMode=yes", "-o", "ControlMaster=no", "-o", "ConnectTimeout=5", "--", "alice@login.example.org",
		"timeout", "-k", "1", plain[len(plain)-3], "scancel", "7"}) || given < 27 || given >= 30 {
		t.Errorf("withoutMux = %q", plain)
	}

	// After Close the directory is gone, and calls go plain.
	tr.Close(context.Background())
	if _, err := os.Stat(filepath.Dir(socket)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("control directory after close: %v", err)
	}
	if _, _, err := tr.Run(context.Background(), nil, "scancel", "7"); err != nil {
		t.Fatal(err)
	}
	if argv := fake.argvs("7")[2]; option(argv, "ControlPath") != "" || option(argv, "ControlMaster") != "no" {
		t.Errorf("after close argv = %q", argv)
	}

	// Off, the user's ssh config and options decide alone.
	tr = newTransport(t, cfg(false))
	if _, _, err := tr.Run(context.Background(), nil, "scancel", "7"); err != nil {
		t.Fatal(err)
	}
	if argv := fake.argvs("7")[3]; !slices.Equal(argv, withoutMux(argv)) || option(argv, "ControlMaster") != "no" {
		t.Errorf("multiplex off: argv = %q", argv)
	}
	if controlDir(tr) != "" {
		t.Errorf("multiplex off made %s", controlDir(tr))
	}
}

// TestSSHSessionCap: never more than MaxSessions ssh at once, however
// many calls come in together.
func TestSSHSessionCap(t *testing.T) {
	for _, multiplex := range []bool{true, false} {
		t.Run(fmt.Sprint("multiplex=", multiplex), func(t *testing.T) {
			// Only the probes count: control commands run this script
			// too, outside the probes' window.
			fake := newFakeSSH(t, `[ "$last" = probe ] || { echo ok; exit 0; }
: > "$d/run.$$"
ls "$d" | grep -c '^run\.' >> "$d/peak"
sleep 0.05
rm -f "$d/run.$$"
echo ok`)
			c := baseConfig(fake.path)
			c.Multiplex, c.MaxSessions = multiplex, 3
			tr := newTransport(t, c)
			var wg sync.WaitGroup
			errs := make(chan error, 30)
			for range 30 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					out, _, err := tr.Run(context.Background(), nil, "probe")
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

// eventually polls cond until it holds, or fails the test after 30 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestSSHSessionWaitEnds: a call that gets no slot before its context ends
// fails with the context's error and never starts ssh.
func TestSSHSessionWaitEnds(t *testing.T) {
	fake := newFakeSSH(t, `[ "$last" = hang ] && exec sleep 30
echo ok`)
	c := baseConfig(fake.path)
	c.MaxSessions = 1
	tr := newTransport(t, c)
	hung, cancelHung := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, _, err := tr.Run(hung, nil, "hang")
		done <- err
	}()
	eventually(t, "the first call to start", func() bool { return len(fake.callsTo("hang")) == 1 })

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, _, err := tr.Run(ctx, nil, "probe")
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "waiting for an ssh session") {
		t.Errorf("err = %v", err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if _, _, err := tr.Run(ctx2, nil, "probe"); !errors.Is(err, context.Canceled) {
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
	if out, _, err := tr.Run(context.Background(), nil, "probe"); err != nil || string(out) != "ok\n" {
		t.Errorf("after: %q %v", out, err)
	}
}

// TestSSHStaleSocket: when ssh gives up on the master, the call is retried
// once on a connection of its own and the socket is retired; anything else
// is not retried.
func TestSSHStaleSocket(t *testing.T) {
	fake := newFakeSSH(t, `case "$*" in *ControlPath=none*) echo plain; exit 0;; esac
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
	tr := newTransport(t, baseConfig(fake.path))

	// A stale socket: retired, and the call retried plain.
	socket := currentSocket(tr)
	if err := os.WriteFile(socket, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	out, stderr, err := tr.Run(context.Background(), nil, "stale")
	if err != nil || string(out) != "plain\n" {
		t.Fatalf("stale: %q %q %v", out, stderr, err)
	}
	calls := fake.callsTo("stale")
	if len(calls) != 2 || !strings.Contains(calls[0], "ControlPath="+socket+" ") || !strings.Contains(calls[1], "ControlPath=none") {
		t.Errorf("calls = %q", calls)
	}
	if next := currentSocket(tr); next == socket || filepath.Dir(next) != filepath.Dir(socket) {
		t.Errorf("after a stale socket the next call uses %s", next)
	}
	// The next call goes through the master again.
	if out, _, err := tr.Run(context.Background(), nil, "probe"); err != nil || string(out) != "mux\n" {
		t.Errorf("next: %q %v", out, err)
	}

	// Not retried: ssh fell back, the command printed, the command
	// failed, or the master died during the session, when the command
	// may have run. The master is retired when ssh could not use it.
	for _, tc := range []struct {
		remote  string
		retired bool
	}{{"fellback", false}, {"printed", true}, {"slurm", true}, {"noise", false}, {"midsession", true}} {
		socket := currentSocket(tr)
		_, stderr, err := tr.Run(context.Background(), nil, tc.remote)
		if n := len(fake.callsTo(tc.remote)); err == nil || n != 1 {
			t.Errorf("%s: err %v after %d calls, want an error after one", tc.remote, err, n)
		}
		if tc.remote == "noise" && string(stderr) != "squeue: error: Invalid user\n" {
			t.Errorf("noise: stderr = %q", stderr)
		}
		if retired := currentSocket(tr) != socket; retired != tc.retired {
			t.Errorf("%s: master retired %v, want %v", tc.remote, retired, tc.retired)
		}
	}
}

// TestSSHTimeoutRetires: a call that runs out of time takes the master
// out of use, since it may be the master that hangs.
func TestSSHTimeoutRetires(t *testing.T) {
	fake := newFakeSSH(t, `[ "$last" = hang ] && exec sleep 30
echo ok`)
	c := baseConfig(fake.path)
	c.Timeout = 200 * time.Millisecond
	tr := newTransport(t, c)
	socket := currentSocket(tr)
	if _, _, err := tr.Run(context.Background(), nil, "probe"); err != nil {
		t.Fatal(err)
	}
	if currentSocket(tr) != socket {
		t.Fatal("a call that went well retired the master")
	}
	if _, _, err := tr.Run(context.Background(), nil, "hang"); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no answer within 200ms") {
		t.Fatalf("err = %v", err)
	}
	if currentSocket(tr) == socket {
		t.Error("the master was not retired")
	}
}

// TestCloseSSHWaitsForCalls: Close lets the calls in flight finish before
// it removes the directory, since one of them may be making a master
// there.
func TestCloseSSHWaitsForCalls(t *testing.T) {
	fake := newFakeSSH(t, `if [ "$last" = slow ]; then
  sleep 0.3
  cp=$(printf '%s\n' "$*" | sed -n 's/.*ControlPath=\([^ ]*\).*/\1/p')
  if : > "$cp"; then echo made > "$d/made"; fi
fi
echo ok`)
	tr := newTransport(t, baseConfig(fake.path))
	done := make(chan error, 1)
	go func() {
		_, _, err := tr.Run(context.Background(), nil, "slow")
		done <- err
	}()
	eventually(t, "the call to start", func() bool { return len(fake.callsTo("slow")) == 1 })
	dir := controlDir(tr)
	tr.Close(context.Background())
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(fake.dir, "made")); err != nil {
		t.Errorf("Close did not wait for the call in flight: %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("control directory after close: %v", err)
	}
}

// TestSSHLingeringOutput: an ssh that exits 0 while something it started
// holds its stderr (an old OpenSSH's ControlPersist ProxyCommand) is a
// success, returned within WaitDelay.
func TestSSHLingeringOutput(t *testing.T) {
	fake := newFakeSSH(t, `sleep 5 >&2 &
echo ok`)
	tr := newTransport(t, baseConfig(fake.path))
	start := time.Now()
	out, _, err := tr.Run(context.Background(), nil, "probe")
	if err != nil || string(out) != "ok\n" {
		t.Errorf("%q %v", out, err)
	}
	if d := time.Since(start); d > WaitDelay+time.Second {
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
