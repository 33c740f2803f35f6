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

	"github.com/fluksio/provision/shared/host"
)

// TestE2ESecretStaysHome runs the engine with its signing secret in the
// variable secret_env names, and reads the environment of every process
// the test's engine started, as the kernel has it (/proc/PID/environ): the
// plugin and the ssh processes it runs. None has the variable. Before,
// every plugin inherited it, and so did everything it started, so a
// plugin could sign credentials for any provisioner's workers.
func TestE2ESecretStaysHome(t *testing.T) {
	e := newE2E(t, "e2e-secret")
	const secretVar = "FLUKSIO_E2E_SECRET"
	secret := strings.Repeat("5ec7", 16)
	cfgPath := e.config(t, e.host, "worker")
	withSecretEnv(t, cfgPath, secretVar, secret)
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
		if bytes.Contains(environ, []byte(secretVar+"=")) || bytes.Contains(environ, []byte(secret)) {
			t.Errorf("process %d (%s) has the signing secret in its environment", pid, exe)
		}
	}
	if !sawPlugin || !sawSSH {
		t.Fatalf("saw the plugin: %v, an ssh of it: %v, among %d processes; the check proves nothing", sawPlugin, sawSSH, len(procs))
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.wait(t, 90*time.Second)
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
