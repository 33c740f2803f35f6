package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/testutil"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/shared/sharedtest"
)

// The test binary is its own plugin: run with servePluginEnv set, it
// calls Serve before any test runs, as a plugin's main would. So Serve is
// tested as an engine meets it, across a real handshake.
const (
	servePluginEnv = "SERVE_TEST_PLUGIN"
	// shutdownMarkEnv names a file the plugin's Shutdown writes, so a
	// test can tell that Serve shut the provisioner down before exiting.
	shutdownMarkEnv = "SERVE_TEST_SHUTDOWN_MARK"
)

func TestMain(m *testing.M) {
	if os.Getenv(servePluginEnv) != "" {
		Serve(newServeTestPlugin, WithUsage("  also: nothing else\n"))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// newServeTestPlugin is a provisioner that, once configured, publishes an
// event and mints a credential through the Host the SDK gave it, and
// logs a line.
func newServeTestPlugin(logger hclog.Logger) shared.Provisioner {
	return &sharedtest.Provisioner{
		InfoF: func(context.Context, *shared.InfoRequest) (*shared.InfoResponse, error) {
			return &shared.InfoResponse{Kind: "servetest", Version: "9.9", ContractVersion: shared.ContractVersion}, nil
		},
		ConfigureF: func(ctx context.Context, r *shared.ConfigureRequest) (*shared.ConfigureResponse, error) {
			logger.Info("configured", "name", r.Name)
			if r.Host == nil {
				return nil, errors.New("Serve gave the provisioner no Host")
			}
			cred, err := r.Host.MintCredential(ctx, &shared.MintCredentialRequest{Worker: r.Name + "-w1", TTL: time.Minute, CPUs: 1})
			if err != nil {
				return nil, err
			}
			ev := shared.Event{Kind: shared.EventWorkerProvisionFailed, Worker: r.Name + "-w1", Class: shared.FailureTransient,
				Detail: "token of " + len1(cred.Token)}
			if err := r.Host.Publish(ctx, ev); err != nil {
				return nil, err
			}
			return &shared.ConfigureResponse{}, nil
		},
		ShutdownF: func(context.Context, *shared.ShutdownRequest) (*shared.ShutdownResponse, error) {
			if mark := os.Getenv(shutdownMarkEnv); mark != "" {
				_ = os.WriteFile(mark, []byte("shut down"), 0o600)
			}
			return &shared.ShutdownResponse{Cancelled: []string{"42"}}, nil
		},
	}
}

// len1 says how long a token is without echoing it.
func len1(s string) string { return strings.Repeat("x", len(s)) }

type tokenSigner struct{}

func (tokenSigner) Sign(c host.CredentialClaims, ttl time.Duration) (string, time.Time, error) {
	return "tok", time.Now().Add(ttl), nil
}

// launchSelf starts this test binary as a plugin, the way an engine does.
func launchSelf(t *testing.T, logs *testutil.Buffer, onEvent func(shared.Event), env ...string) *host.Plugin {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var logger hclog.Logger
	if logs != nil {
		logger = hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := host.Launch(ctx, host.LaunchConfig{Name: "st", Path: exe, Logger: logger, Signer: tokenSigner{},
		OnEvent: onEvent, Env: append([]string{servePluginEnv + "=1"}, env...)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}

// TestServeSpeaksTheContract: a provisioner served by Serve answers the
// host over go-plugin, gets a Host that publishes and mints through the
// host channel, logs through the host, and on Stop is shut down and
// exits 0.
func TestServeSpeaksTheContract(t *testing.T) {
	logs := &testutil.Buffer{}
	events := make(chan shared.Event, 4)
	p := launchSelf(t, logs, func(ev shared.Event) { events <- ev })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	info, err := p.Provisioner().Info(ctx, &shared.InfoRequest{})
	if err != nil || info.Kind != "servetest" || info.ContractVersion != shared.ContractVersion {
		t.Fatalf("Info: %+v %v", info, err)
	}
	if _, err := p.Provisioner().Configure(ctx, &shared.ConfigureRequest{Name: "st", Config: json.RawMessage(`{}`)}); err != nil {
		t.Fatalf("Configure (mints and publishes through the Host): %v", err)
	}
	select {
	case ev := <-events:
		if ev.Provisioner != "st" || ev.Seq != 1 || ev.Class != shared.FailureTransient || ev.Detail != "token of xxx" {
			t.Errorf("event %+v", ev)
		}
	case <-ctx.Done():
		t.Fatal("the plugin's event did not arrive")
	}
	resp, err := p.Stop(ctx)
	if err != nil || len(resp.Cancelled) != 1 || resp.Cancelled[0] != "42" {
		t.Fatalf("Stop: %+v %v", resp, err)
	}
	if exit := p.ExitStatus(); exit == nil || exit.Code != 0 && exit.Signal == "" {
		t.Errorf("exit %v after Stop; want it ended", exit)
	}
	if !strings.Contains(logs.String(), "configured") || !strings.Contains(logs.String(), "name=st") {
		t.Errorf("the plugin's log line did not reach the host's log:\n%s", logs.String())
	}
}

// TestServeLeavesOnSIGTERM: a plugin told to stop by a signal shuts its
// provisioner down (cancelling what it asked for) and exits 0, rather
// than dying with its jobs left behind.
func TestServeLeavesOnSIGTERM(t *testing.T) {
	mark := filepath.Join(t.TempDir(), "shutdown")
	p := launchSelf(t, nil, nil, shutdownMarkEnv+"="+mark)
	if err := syscall.Kill(p.Pid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Exited():
	case <-time.After(20 * time.Second):
		t.Fatal("the plugin did not exit within 20s of SIGTERM")
	}
	if exit := p.ExitStatus(); exit.Code != 0 || exit.Signal != "" {
		t.Errorf("exit %v after SIGTERM; want status 0", exit)
	}
	if b, err := os.ReadFile(mark); err != nil || string(b) != "shut down" {
		t.Errorf("the provisioner was not shut down before the exit: %q %v", b, err)
	}
}

// TestServeWritesHeapProfilesOnSIGUSR1: with HeapProfileDirEnv set, each
// SIGUSR1 makes the plugin write a heap profile (gzipped protobuf, as
// go tool pprof reads it) named by its pid and a count, and it keeps
// serving after.
func TestServeWritesHeapProfilesOnSIGUSR1(t *testing.T) {
	dir := t.TempDir()
	p := launchSelf(t, nil, nil, HeapProfileDirEnv+"="+dir)
	for n := 1; n <= 2; n++ {
		if err := syscall.Kill(p.Pid(), syscall.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, fmt.Sprintf("heap-%d-%d.pprof", p.Pid(), n))
		deadline := time.Now().Add(20 * time.Second)
		var b []byte
		for {
			var err error
			if b, err = os.ReadFile(path); err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Fatalf("SIGUSR1 number %d: %s holds %d bytes, want a gzipped heap profile", n, path, len(b))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := p.Provisioner().Info(ctx, &shared.InfoRequest{}); err != nil {
		t.Errorf("Info after the profiles: %v", err)
	}
}

// TestServeByHand: the binary run by a person (no handshake cookie) says
// what it is and exits, with the codes a shell script can test.
func TestServeByHand(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, string, int) {
		cmd := exec.Command(exe, args...)
		cmd.Env = append(os.Environ(), servePluginEnv+"=1")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()
	}
	prog := filepath.Base(exe)
	if out, _, code := run("--version"); code != 0 || !strings.Contains(out, prog) || !strings.Contains(out, "(kind servetest, plugin 9.9, contract "+shared.ContractVersion+")") {
		t.Errorf("--version: %d %q", code, out)
	}
	if out, _, code := run("--help"); code != 0 || !strings.Contains(out, `provisioner "servetest" "NAME"`) || !strings.Contains(out, "also: nothing else") {
		t.Errorf("--help: %d %q", code, out)
	}
	if out, errOut, code := run(); code != 1 || out != "" || !strings.Contains(errOut, "is a provisioner plugin") {
		t.Errorf("no arguments: %d, stdout %q, stderr %q; want 1 and the help on stderr", code, out, errOut)
	}
	if _, errOut, code := run("--frobnicate"); code != 2 || !strings.Contains(errOut, `unknown argument "--frobnicate"`) {
		t.Errorf("an unknown argument: %d %q; want 2", code, errOut)
	}
	// A plugin whose Info fails says so instead of printing help.
	var stderr bytes.Buffer
	broken := func(hclog.Logger) shared.Provisioner {
		return &sharedtest.Provisioner{InfoF: func(context.Context, *shared.InfoRequest) (*shared.InfoResponse, error) {
			return nil, errors.New("boom")
		}}
	}
	if code := byHand([]string{"p", "--help"}, broken, nil, &bytes.Buffer{}, &stderr); code != 1 || !strings.Contains(stderr.String(), "Info fails: boom") {
		t.Errorf("Info failing: %d %q", code, stderr.String())
	}
}
