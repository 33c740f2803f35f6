package sshrun

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/fluksio/provision/internal/testutil"
)

// TestSession: a Session's streams are the remote command's, and its ssh
// goes through the login's shared connection. Close ends it and waits
// for it; the Transport's Close ends a Session its owner left open, so
// that no ssh outlives the Transport; Start after Close is refused.
func TestSession(t *testing.T) {
	fake := newFakeSSH(t, `echo $$ > "$d/pid.$last"
case "$last" in
echo) echo "ready" >&2; while read -r l; do echo "got $l"; done;;
hang) exec sleep 30;;
esac`)
	tr := newTransport(t, baseConfig(fake.path))
	pidOf := func(remote string) int {
		t.Helper()
		var pid int
		eventually(t, remote+"'s pid", func() bool {
			b, err := os.ReadFile(filepath.Join(fake.dir, "pid."+remote))
			pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
			return err == nil && pid > 0
		})
		return pid
	}
	gone := func(pid int) bool { return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) }

	var stderr testutil.Buffer
	s, err := tr.Start(context.Background(), &stderr, "echo")
	if err != nil {
		t.Fatal(err)
	}
	if s.Login.Dest != "alice@login.example.org" {
		t.Errorf("Login = %+v", s.Login)
	}
	if _, err := io.WriteString(s.Stdin, "hello\n"); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(s.Stdout).ReadString('\n')
	if err != nil || line != "got hello\n" {
		t.Errorf("read %q, %v", line, err)
	}
	if argv := fake.argvs("echo"); len(argv) != 1 || option(argv[0], "ControlPath") != currentSocket(tr) {
		t.Errorf("argv %q, want it through the shared connection %s", argv, currentSocket(tr))
	}
	if s.Err() != nil {
		t.Errorf("Err before the end: %v", s.Err())
	}
	pid := pidOf("echo")
	s.Close()
	select {
	case <-s.Done():
	default:
		t.Error("Close returned before ssh exited")
	}
	if !gone(pid) {
		t.Errorf("ssh %d is still there after Close", pid)
	}
	if !strings.Contains(stderr.String(), "ready") {
		t.Errorf("stderr = %q", stderr.String())
	}
	s.Close() // a second Close is harmless

	left, err := tr.Start(context.Background(), io.Discard, "hang")
	if err != nil {
		t.Fatal(err)
	}
	pid = pidOf("hang")
	tr.Close(context.Background())
	select {
	case <-left.Done():
	default:
		t.Error("the Transport's Close left a Session running")
	}
	if !gone(pid) {
		t.Errorf("ssh %d is still there after the Transport's Close", pid)
	}
	if _, err := tr.Start(context.Background(), io.Discard, "echo"); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("Start after Close: %v, want refused", err)
	}
}
