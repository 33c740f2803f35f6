package sshrun

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/internal/testutil"
)

// TestSSHSandboxMultiplex runs against the sandbox's real sshd (MaxSessions
// 10) and OpenSSH.
func TestSSHSandboxMultiplex(t *testing.T) {
	env := sandboxtest.Require(t)
	sshPath := testutil.LookPath(t, "ssh")
	login, err := ParseLogin(env.Login)
	if err != nil {
		t.Fatal(err)
	}
	sandbox := func(multiplex bool, sessions int) Config {
		return Config{Program: sshPath, Logins: []Login{login}, Port: env.Port, Key: env.Key, KnownHosts: env.KnownHosts,
			Timeout: 20 * time.Second, Multiplex: multiplex, MaxSessions: sessions}
	}
	cheap := []string{"true"}
	call := func(p *Transport) error {
		_, stderr, err := p.Run(context.Background(), nil, cheap...)
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
	median := func(p *Transport) time.Duration {
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

	p := newTransport(t, sandbox(true, 8))
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
		plain := newTransport(t, sandbox(false, 8))
		mux := median(p)
		pl := median(plain)
		t.Logf("median of 20 calls of %q: plain %s, multiplexed %s", strings.Join(cheap, " "), pl.Round(time.Millisecond), mux.Round(time.Millisecond))
		if mux >= pl {
			t.Errorf("multiplexed %s is no faster than plain %s", mux, pl)
		}
	})

	concurrent := func(t *testing.T, p *Transport, n int) {
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
		concurrent(t, newTransport(t, sandbox(true, 8)), 50)
	})

	masterPid := func(p *Transport, socket string) int {
		args := p.argv(p.firstLogin(), []string{"-O", "check", "-o", "ControlPath=" + socket}, "", nil)
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
		c := sandbox(true, 8)
		c.Timeout = 2 * time.Second
		w := newTransport(t, c)
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
		pj := newTransport(t, Config{Program: sshPath, Logins: []Login{{Dest: "fxtarget"}}, ConfigFile: cfgFile, Timeout: 20 * time.Second, Multiplex: true, MaxSessions: 8})
		// Retire the master the first call made, so that the timed call
		// makes one.
		if err := call(pj); err != nil {
			t.Fatal(err)
		}
		pj.retire(0, currentSocket(pj))
		start := time.Now()
		if err := call(pj); err != nil {
			t.Fatal(err)
		}
		first := time.Since(start)
		if first > WaitDelay {
			t.Errorf("the first call through a jump host took %s", first)
		}
		if !isSocket(currentSocket(pj)) {
			t.Errorf("no control socket through the jump host")
		}
		t.Logf("through ProxyJump: first call %s, then median %s", first.Round(time.Millisecond), median(pj).Round(time.Millisecond))
		// Both masters, the retired one too, exit at close.
		dir := controlDir(pj)
		pj.Close(context.Background())
		eventually(t, "no process to mention "+dir, func() bool { return len(processesMentioning(dir)) == 0 })
	})

	t.Run("close", func(t *testing.T) {
		dir := controlDir(p)
		pid := masterPid(p, currentSocket(p))
		p.Close(context.Background())
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

// TestBastionOnRealSSHD: the sandbox's sshd as both the bastion and the
// login node, with the real ssh. A bastion that does not answer (a port
// where nothing listens) is skipped for the next, which stays the one in
// use; the hop leaves no file behind. A bastion whose host key is not in
// known_hosts (reached as localhost, which known_hosts does not name)
// refuses the login as the login node would: ErrLoginRefused,
// RefusedHostKey, and ssh's words lead with the hop's own, which a
// multiplexed ssh would otherwise send to /dev/null.
func TestBastionOnRealSSHD(t *testing.T) {
	env := sandboxtest.Require(t)
	sshPath := testutil.LookPath(t, "ssh")
	login, err := ParseLogin(env.Login)
	if err != nil {
		t.Fatal(err)
	}
	user, host, _ := strings.Cut(env.Login, "@")
	if host != "127.0.0.1" {
		t.Skipf("the sandbox's login is %s; this test reaches it as localhost too", env.Login)
	}
	dead := freePort(t)
	transport := func(bastions ...Login) *Transport {
		return newTransport(t, Config{Program: sshPath, Logins: []Login{login}, Bastions: bastions, Port: env.Port, Key: env.Key,
			KnownHosts: env.KnownHosts, Timeout: 20 * time.Second, Multiplex: true})
	}

	t.Run("skips one that does not answer", func(t *testing.T) {
		tr := transport(Login{Dest: user + "@" + host, Port: dead}, Login{Dest: user + "@" + host, Port: env.Port})
		for range 2 {
			if out, stderr, err := tr.Run(context.Background(), nil, "echo", "through"); err != nil || strings.TrimSpace(string(out)) != "through" {
				t.Fatalf("through the second bastion: %v %q %s", err, out, stderr)
			}
		}
		if b := tr.bastion.Load(); b != 1 {
			t.Errorf("the bastion in use is %d, want 1 (the one that answered)", b)
		}
		tr.retire(0, currentSocket(tr))
		dir := controlDir(tr)
		if out, _, err := tr.Run(context.Background(), nil, "true"); err != nil {
			t.Fatalf("a new master through the bastion in use: %v %s", err, out)
		}
		hops, _ := filepath.Glob(filepath.Join(dir, "hop*"))
		if len(hops) > 0 {
			t.Errorf("the hops' stderr files are left behind: %q", hops)
		}
	})

	t.Run("its host key unknown", func(t *testing.T) {
		tr := transport(Login{Dest: user + "@localhost", Port: env.Port})
		_, stderr, err := tr.Run(context.Background(), nil, "true")
		t.Logf("%v: %s", err, stderr)
		if !errors.Is(err, ErrLoginRefused) {
			t.Errorf("error %v, want ErrLoginRefused", err)
		}
		if a := tr.Access(); a.Phase != AccessRefused || a.Refusal != RefusedHostKey {
			t.Errorf("Access %+v, want refused for its host key", a)
		}
		want := "No ED25519 host key is known for [localhost]:" + strconv.Itoa(env.Port)
		if !strings.HasPrefix(string(stderr), want) || !strings.Contains(string(stderr), "\nHost key verification failed.\n") {
			t.Errorf("stderr does not lead with the hop's words (%q, then Host key verification failed.):\n%s", want, stderr)
		}
	})
}

// TestBastionKeyChangedOnRealSSHD: a bastion whose key in known_hosts is
// another (the real ssh's page of warning, its decisive lines in the
// middle): the call's words lead with the line that names the host,
// then "Host key verification failed.", and the login is refused for
// its host key.
func TestBastionKeyChangedOnRealSSHD(t *testing.T) {
	env := sandboxtest.Require(t)
	sshPath := testutil.LookPath(t, "ssh")
	login, err := ParseLogin(env.Login)
	if err != nil {
		t.Fatal(err)
	}
	user, host, _ := strings.Cut(env.Login, "@")
	if host != "127.0.0.1" {
		t.Skipf("the sandbox's login is %s; this test reaches it as localhost too", env.Login)
	}
	kh, err := os.ReadFile(env.KnownHosts)
	if err != nil {
		t.Fatal(err)
	}
	// Another host's key (a public key, made with ssh-keygen -t ed25519)
	// for the bastion, reached as localhost.
	changed := filepath.Join(t.TempDir(), "known_hosts")
	other := fmt.Sprintf("[localhost]:%d %s\n", env.Port, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGvlYHefIddk9EWuLaGj+vVKjOUW4DNo2fwooKb44+ej")
	if err := os.WriteFile(changed, append(kh, other...), 0o600); err != nil {
		t.Fatal(err)
	}
	tr := newTransport(t, Config{Program: sshPath, Logins: []Login{login}, Bastions: []Login{{Dest: user + "@localhost", Port: env.Port}},
		Port: env.Port, Key: env.Key, KnownHosts: changed, Timeout: 20 * time.Second, Multiplex: true})
	_, stderr, err := tr.Run(context.Background(), nil, "true")
	t.Logf("%v: %s", err, stderr)
	want := fmt.Sprintf("Host key for [localhost]:%d has changed and you have requested strict checking.\nHost key verification failed.\n", env.Port)
	if !strings.HasPrefix(string(stderr), want) {
		t.Errorf("stderr does not lead with %q", want)
	}
	if a := tr.Access(); !errors.Is(err, ErrLoginRefused) || a.Refusal != RefusedHostKey {
		t.Errorf("error %v, Access %+v: want refused for its host key", err, a)
	}
}

// freePort is a loopback port where nothing listens.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
