package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/provision/engine/host"
)

// TestE2ESecretStaysHome runs the engine with its signing secret in the
// variable secret_env names and the operator's token in the one
// operator_token_env names, and reads the environment of the engine and
// of every process it started, as the kernel has it (/proc/PID/environ):
// the engine itself, the plugin and the ssh processes it runs. None has
// either variable or value: a plugin that could read the secret could
// sign credentials for any provisioner's workers, and os.Unsetenv alone
// leaves it in the engine's own /proc/PID/environ.
func TestE2ESecretStaysHome(t *testing.T) {
	e := newE2E(t, "e2e-secret")
	const secretVar = "FLUKSIO_E2E_SECRET"
	secret := strings.Repeat("5ec7", 16)
	cfgPath := e.config(t, e.host, "worker")
	withSecretEnv(t, cfgPath, secretVar, secret)
	const tokenVar = "FLUKSIO_E2E_OP_TOKEN"
	token := strings.Repeat("70ce", 8)
	withOperatorTokenEnv(t, cfgPath, tokenVar, token)
	p := e.startEngine(t, "-config", cfgPath)
	poll(t, 60*time.Second, "the provisioner to be ready and to have run ssh", func() bool {
		if p.exited() {
			t.Fatalf("the engine exited:\n%s", p.stderr)
		}
		return strings.Contains(p.stdout.String(), "provisioner ready") && len(e.markedProcs(t)) >= 2
	})
	procs := e.markedProcs(t)
	sawPlugin, sawSSH := false, false
	for pid, environ := range procs {
		exe, _ := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "exe"))
		sawPlugin = sawPlugin || strings.HasSuffix(exe, "provisioner-slurm")
		sawSSH = sawSSH || filepath.Base(exe) == "ssh"
		hasSecret(t, pid, exe, environ)
	}
	// The engine itself: the kernel's copy of its initial environment.
	pid := p.cmd.Process.Pid
	environ, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(environ, []byte(e.mark)) {
		t.Fatalf("the engine's environ (%d bytes) lacks the test's mark: not the engine's", len(environ))
	}
	hasSecret(t, pid, "the engine", environ)
	// And the engine has the secret all the same: it signs with it.
	raw, _ := host.ParseSecret(secret)
	if epoch := host.CredentialEpoch(raw); !strings.Contains(p.stderr.String(), "credential_epoch="+epoch) {
		t.Errorf("the engine does not sign with the secret it was given (want credential_epoch=%s):\n%s", epoch, p.stderr)
	}
	if !sawPlugin || !sawSSH {
		t.Fatalf("saw the plugin: %v, an ssh of it: %v, among %d processes; the check proves nothing", sawPlugin, sawSSH, len(procs))
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.wait(t, 90*time.Second)
}

// hasSecret fails t if environ holds the signing secret or the
// operator's token, by name or by value.
func hasSecret(t *testing.T, pid int, exe string, environ []byte) {
	t.Helper()
	for _, s := range []string{"FLUKSIO_E2E_SECRET=", strings.Repeat("5ec7", 16)} {
		if bytes.Contains(environ, []byte(s)) {
			t.Errorf("process %d (%s) has the signing secret in its environment (%q)", pid, exe, s[:10])
		}
	}
	for _, s := range []string{"FLUKSIO_E2E_OP_TOKEN=", strings.Repeat("70ce", 8)} {
		if bytes.Contains(environ, []byte(s)) {
			t.Errorf("process %d (%s) has the operator's token in its environment (%q)", pid, exe, s[:10])
		}
	}
}

// withOperatorTokenEnv sets operator_token_env in the engine block of the
// configuration file cfg to name, and name to value for the test.
func withOperatorTokenEnv(t *testing.T, cfg, name, value string) {
	t.Helper()
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b = bytes.Replace(b, []byte("engine {\n"), []byte("engine {\n  operator_token_env = \""+name+"\"\n"), 1)
	if err := os.WriteFile(cfg, b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(name, value)
}

// markedProcs maps the pid of every process but the engine itself that
// carries the test's mark in its environment (everything the engine
// started, and what they started) to that environment.
func (e *e2e) markedProcs(t *testing.T) map[int][]byte {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int][]byte{}
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		exe, _ := os.Readlink(filepath.Join("/proc", ent.Name(), "exe"))
		if strings.TrimSuffix(exe, " (deleted)") == e.host {
			continue // the engine, whose initial environment has it
		}
		environ, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "environ"))
		if err != nil {
			continue
		}
		for _, kv := range bytes.Split(environ, []byte{0}) {
			if string(kv) == e.mark {
				out[pid] = environ
				break
			}
		}
	}
	return out
}

// Not parallel: t.Setenv.
func TestEngineSecret(t *testing.T) {
	const name = "FLUKSIO_TEST_SECRET"
	t.Setenv(name, "")
	secret, fromEnv, err := engineSecret(name)
	if err != nil || fromEnv || len(secret) != host.MinSecretLen {
		t.Errorf("engineSecret unset = %d bytes, %v, %v; want %d random bytes", len(secret), fromEnv, err, host.MinSecretLen)
	}
	t.Setenv(name, strings.Repeat("0f", 32))
	secret, fromEnv, err = engineSecret(name)
	if err != nil || !fromEnv || !bytes.Equal(secret, bytes.Repeat([]byte{0x0f}, 32)) {
		t.Errorf("engineSecret set = %x, %v, %v", secret, fromEnv, err)
	}
	if v, ok := os.LookupEnv(name); ok {
		t.Errorf("engineSecret left $%s set (%d bytes): children would inherit it", name, len(v))
	}
	t.Setenv(name, "short")
	if _, _, err := engineSecret(name); err == nil || !strings.Contains(err.Error(), name) {
		t.Errorf("engineSecret with a short secret: %v; want an error naming %s", err, name)
	}
}
