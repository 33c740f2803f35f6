package sshrun

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/internal/testutil"
	"github.com/hashicorp/go-hclog"
)

// TestRemoteDeadlineStopsTheCommand: on the sandbox's real sshd, a
// command still running at its call's deadline is stopped on the login
// node, not left to run on: through the shared connection, by the time
// the call returns (no process of it is in /proc: the login node is this
// machine), and the error says it was stopped there and is a deadline;
// on a connection of its own, whose handshake comes out of the time the
// command is given there, within a few seconds after. Without the remote
// timeout the sleep runs its minute out.
func TestRemoteDeadlineStopsTheCommand(t *testing.T) {
	env := sandboxtest.Require(t)
	login, err := ParseLogin(env.Login)
	if err != nil {
		t.Fatal(err)
	}
	for _, multiplex := range []bool{true, false} {
		t.Run(fmt.Sprintf("multiplex=%v", multiplex), func(t *testing.T) {
			tr := newTransport(t, Config{Program: testutil.LookPath(t, "ssh"), Logins: []Login{login}, Port: env.Port, Key: env.Key,
				KnownHosts: env.KnownHosts, Timeout: 20 * time.Second, Multiplex: multiplex})
			// Warm the master, so that the cut falls on the command.
			if _, stderr, err := tr.Run(context.Background(), nil, "true"); err != nil {
				t.Fatalf("%v: %s", err, stderr)
			}
			mark := fmt.Sprintf("61.%d", os.Getpid()%1000*10+len(t.Name())%10)
			start := time.Now()
			_, stderr, err := tr.RunWithin(context.Background(), 2500*time.Millisecond, nil, "sleep", mark)
			took := time.Since(start)
			if !errors.Is(err, context.DeadlineExceeded) || (multiplex && !errors.Is(err, ErrStoppedThere)) {
				t.Errorf("err = %v (stderr %q) after %s; want a deadline, and through the shared connection one stopped on the login node", err, stderr, took)
			}
			if err != nil && !strings.Contains(err.Error(), "sleep on 127.0.0.1: no answer within 2.5s") {
				t.Errorf("err = %v; want the command, the login and the limit named", err)
			}
			left := processesMentioning("sleep\x00" + mark)
			if !multiplex {
				// The handshake's time, at most ConnectTimeout (10 s).
				for end := time.Now().Add(10 * time.Second); len(left) > 0 && time.Now().Before(end); left = processesMentioning("sleep\x00" + mark) {
					time.Sleep(50 * time.Millisecond) // a poll of /proc with a deadline
				}
			}
			if len(left) > 0 {
				t.Errorf("after the call, still on the login node: %q", left)
			}
		})
	}
}

// TestRemoteDeadlineWithoutTimeout: a login node without a timeout
// command (a stand-in ssh whose shell says so, exit 127, as bash and
// dash do) has the command run once more, bare, and every later one too;
// the Transport says so once in its log, and StopsThere turns false.
func TestRemoteDeadlineWithoutTimeout(t *testing.T) {
	fake := newFakeSSH(t, `for w; do if [ "$w" = timeout ]; then echo "bash: line 1: timeout: command not found" >&2; exit 127; fi; done; echo ran`)
	var logs bytes.Buffer
	tr := New(baseConfig(fake.path), hclog.New(&hclog.LoggerOptions{Output: &logs}))
	defer tr.Close(context.Background())
	if !tr.StopsThere() {
		t.Fatal("StopsThere is false before any call")
	}
	for range 2 {
		stdout, stderr, err := tr.Run(context.Background(), nil, "squeue", "-h")
		if err != nil || strings.TrimSpace(string(stdout)) != "ran" {
			t.Fatalf("Run = %q, %v (stderr %q); want it run bare", stdout, err, stderr)
		}
	}
	if calls := fake.callsTo("-h"); len(calls) != 3 || !strings.Contains(calls[0], " timeout -k 1 ") || strings.Contains(calls[1], "timeout") || strings.Contains(calls[2], "timeout") {
		t.Errorf("calls:\n%s\nwant one under timeout, then two bare", strings.Join(calls, "\n"))
	}
	if tr.StopsThere() {
		t.Error("StopsThere is still true")
	}
	if n := strings.Count(logs.String(), "has no timeout command"); n != 1 {
		t.Errorf("the log says it %d times:\n%s", n, logs.String())
	}
}

// TestRemoteMargin: the remote command is given a little less than the
// call has, the difference bounded both ways.
func TestRemoteMargin(t *testing.T) {
	for _, c := range []struct{ left, want time.Duration }{
		{time.Second, 300 * time.Millisecond},
		{3 * time.Second, 600 * time.Millisecond},
		{30 * time.Second, 2 * time.Second},
	} {
		if got := remoteMargin(c.left); got != c.want {
			t.Errorf("remoteMargin(%s) = %s, want %s", c.left, got, c.want)
		}
	}
}
