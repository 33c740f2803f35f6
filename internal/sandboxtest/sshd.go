package sandboxtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// SSHD is a second sshd of a private sandbox, started by a test: another
// login node of the same cluster (same host key, same users, same
// slurm.conf), on a port of its own. The test owns its process: Stop
// ends it and the connections it forked, Start brings it back, and the
// test's cleanup stops it.
type SSHD struct {
	Port int
	// KnownHosts has the sandbox's known hosts and this port's line, for
	// the plugin's known_hosts.
	KnownHosts string
	config     string
	log        string
	bin        string
	cmd        *exec.Cmd
	exited     chan struct{}
}

var (
	portLine = regexp.MustCompile(`(?m)^Port .*$`)
	pidLine  = regexp.MustCompile(`(?m)^PidFile .*$`)
)

// ExtraSSHD starts a second sshd for e, a private sandbox, on a free
// port, and waits until it accepts connections.
func (e Env) ExtraSSHD(t testing.TB) *SSHD {
	t.Helper()
	privateEnv(t, e)
	dir := t.TempDir()
	conf, err := os.ReadFile(filepath.Join(e.Dir, "ssh", "sshd_config"))
	if err != nil {
		t.Fatal(err)
	}
	port := FreePort(t)
	s := &SSHD{Port: port, config: filepath.Join(dir, "sshd_config"), log: filepath.Join(dir, "sshd.log"),
		KnownHosts: filepath.Join(dir, "known_hosts"), bin: "/usr/sbin/sshd"}
	if e.Bin != "" {
		s.bin = filepath.Join(e.Dir, "bin", "sshd")
	}
	c := portLine.ReplaceAllString(string(conf), "Port "+strconv.Itoa(port))
	c = pidLine.ReplaceAllString(c, "PidFile "+filepath.Join(dir, "sshd.pid"))
	if err := os.WriteFile(s.config, []byte(c), 0o600); err != nil {
		t.Fatal(err)
	}
	known, err := os.ReadFile(e.KnownHosts)
	if err != nil {
		t.Fatal(err)
	}
	// The same host key answers on the new port.
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(known)), "\n") {
		lines = append(lines, l)
		if f := strings.Fields(l); len(f) >= 2 && strings.HasPrefix(f[0], "[127.0.0.1]:") {
			lines = append(lines, fmt.Sprintf("[127.0.0.1]:%d %s", port, strings.Join(f[1:], " ")))
		}
	}
	if err := os.WriteFile(s.KnownHosts, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.stop() })
	s.Start(t)
	return s
}

// Start starts the sshd (again) and waits until it accepts connections.
func (s *SSHD) Start(t testing.TB) {
	t.Helper()
	if s.cmd != nil {
		t.Fatal("ExtraSSHD.Start: it is running")
	}
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		t.Fatal(err)
	}
	log, err := os.OpenFile(s.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	// -D: it stays this test's child, so that it is waited for.
	cmd := exec.Command(s.bin, "-D", "-f", s.config, "-E", s.log)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	go func() {
		cmd.Wait()
		close(s.exited)
	}()
	for end := time.Now().Add(10 * time.Second); ; {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(s.Port), time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-s.exited:
			b, _ := os.ReadFile(s.log)
			s.cmd = nil
			t.Fatalf("the extra sshd exited at once:\n%s", b)
		default:
		}
		if time.Now().After(end) {
			t.Fatalf("the extra sshd on port %d does not accept connections: %v", s.Port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop stops the sshd and the connection processes it forked, so that
// the login node is down for connections made before as much as for new
// ones, and returns once they are gone.
func (s *SSHD) Stop(t testing.TB) {
	t.Helper()
	if s.cmd == nil {
		t.Fatal("ExtraSSHD.Stop: it is not running")
	}
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
}

func (s *SSHD) stop() error {
	if s.cmd == nil {
		return nil
	}
	pid := s.cmd.Process.Pid
	children := procChildren(pid)
	for _, p := range append([]int{pid}, children...) {
		_ = syscall.Kill(p, syscall.SIGTERM)
	}
	for _, p := range children {
		if !WaitGone(p, 5*time.Second) {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	}
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(pid, syscall.SIGKILL)
		<-s.exited
	}
	s.cmd = nil
	return nil
}

// Log is what the sshd has logged so far.
func (s *SSHD) Log(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(s.log)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
