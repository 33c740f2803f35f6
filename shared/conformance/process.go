package conformance

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fluksio/provision/internal/wire"
	"github.com/fluksio/provision/shared"
)

// The checks in this file start the plugin outside the host, because
// what they look at is what the host cannot show: a start without the
// cookie, and a parent that dies.

// pluginEnv is the environment a host gives a plugin, without the
// client certificate; cookie says whether the magic cookie is in it.
func pluginEnv(cfg Config, cookie bool) []string {
	key := wire.Handshake.MagicCookieKey
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, key+"=") && !strings.HasPrefix(kv, "PLUGIN_") {
			env = append(env, kv)
		}
	}
	env = append(env, cfg.Env...)
	env = append(env, "PLUGIN_MIN_PORT=0", "PLUGIN_MAX_PORT=0", "PLUGIN_PROTOCOL_VERSIONS="+strconv.Itoa(wire.ProtocolVersion))
	if cookie {
		env = append(env, key+"="+wire.Handshake.MagicCookieValue)
	}
	return env
}

// refusesWithoutCookie runs the plugin as somebody would by hand: it
// must say it is a plugin and exit non-zero, not print a handshake and
// wait for a host that will never come.
func refusesWithoutCookie(ctx context.Context, cfg Config) problems {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, cfg.Binary, cfg.Args...)
	cmd.Env = pluginEnv(cfg, false)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	switch {
	case ctx.Err() != nil:
		return problems{fmt.Sprintf("without $%s it was still running after 10s; check the cookie first and exit 1 with a message on stderr", wire.Handshake.MagicCookieKey)}
	case err == nil:
		return problems{fmt.Sprintf("without $%s it exited 0; exit non-zero, so that a host or a script sees the refusal", wire.Handshake.MagicCookieKey)}
	}
	if _, ok := err.(*exec.ExitError); !ok {
		return problems{fmt.Sprintf("could not run %s: %v", cfg.Binary, err)}
	}
	if strings.Contains(stdout.String(), "|") {
		return problems{fmt.Sprintf("without $%s it printed what looks like a handshake: %.200q", wire.Handshake.MagicCookieKey, stdout.String())}
	}
	return nil
}

// exitsOnSIGTERM starts a second plugin, sends it SIGTERM and waits for
// it to shut down and exit by itself.
func exitsOnSIGTERM(ctx context.Context, cfg Config) problems {
	p, err := launch(ctx, cfg, &output{}, nil)
	if err != nil {
		return problems{fmt.Sprintf("launch: %v", err)}
	}
	defer p.Kill()
	// A host asks Info first; a plugin may set up its signal handling
	// anywhere before that answer.
	if _, err := p.Provisioner().Info(ctx, &shared.InfoRequest{}); err != nil {
		return problems{fmt.Sprintf("Info: %v", err)}
	}
	start := time.Now()
	if err := syscall.Kill(p.Pid(), syscall.SIGTERM); err != nil {
		return problems{fmt.Sprintf("SIGTERM: %v", err)}
	}
	select {
	case <-p.Exited():
	case <-time.After(3 * time.Second):
		return problems{"still running 3s after SIGTERM; on SIGTERM, cancel what is outstanding (Shutdown) and exit"}
	}
	if exit := p.ExitStatus(); exit.Signal != "" {
		return problems{fmt.Sprintf("%s %.1fs after SIGTERM: handle SIGTERM, cancel what is outstanding, then exit", exit, time.Since(start).Seconds())}
	}
	return nil
}

// exitsWhenOrphaned starts the plugin under a shell, as a host would
// (with the cookie and a client certificate, though no host connects),
// kills the shell with SIGKILL and waits for the plugin to notice and
// exit. No parent-death signal is set: that the plugin notices by
// itself is the point (a host's death signal is Linux's, and tied to a
// thread).
func exitsWhenOrphaned(ctx context.Context, cfg Config) problems {
	cert, err := clientCert()
	if err != nil {
		return problems{err.Error()}
	}
	r, w, err := os.Pipe()
	if err != nil {
		return problems{err.Error()}
	}
	defer r.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		w.Close()
		return problems{err.Error()}
	}
	defer pr.Close()
	logs, err := os.CreateTemp("", "conformance-orphan-*.log")
	if err != nil {
		w.Close()
		pw.Close()
		return problems{err.Error()}
	}
	defer os.Remove(logs.Name())
	defer logs.Close()

	// The shell tells its child's pid on fd 3, which the child does not
	// inherit, and waits for it.
	sh := exec.Command("/bin/sh", append([]string{"-c", `"$@" 3>&- & echo $! >&3; exec 3>&-; wait`, "sh", cfg.Binary}, cfg.Args...)...)
	sh.Env = append(pluginEnv(cfg, true), "PLUGIN_CLIENT_CERT="+string(cert))
	sh.Stdout, sh.Stderr, sh.ExtraFiles = w, logs, []*os.File{pw}
	if err := sh.Start(); err != nil {
		w.Close()
		pw.Close()
		return problems{fmt.Sprintf("starting the plugin under /bin/sh: %v", err)}
	}
	w.Close()
	pw.Close()
	killShell := func() {
		_ = sh.Process.Kill()
		_ = sh.Wait()
	}

	pidLine, err := readLine(pr, 10*time.Second)
	pid, perr := strconv.Atoi(strings.TrimSpace(pidLine))
	if err != nil || perr != nil {
		killShell()
		return problems{fmt.Sprintf("the shell did not say the plugin's pid: %v", err)}
	}
	defer func() {
		if alive(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}()
	if line, err := readLine(r, 20*time.Second); err != nil || strings.Count(line, "|") < 4 {
		killShell()
		return problems{fmt.Sprintf("no handshake line within 20s (%q, %v); stderr: %s", line, err, tailOf(logs.Name()))}
	}

	killShell()
	deadline := time.Now().Add(4 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			return problems{"still running 4s after its parent was killed; watch the parent (getppid() changes) at least once a second, then cancel what is outstanding and exit; stderr: " + tailOf(logs.Name())}
		}
		select {
		case <-ctx.Done():
			return problems{ctx.Err().Error()}
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// readLine reads one line from f, giving up after d.
func readLine(f *os.File, d time.Duration) (string, error) {
	_ = f.SetReadDeadline(time.Now().Add(d))
	line, err := bufio.NewReader(f).ReadString('\n')
	return strings.TrimSpace(line), err
}

// alive says whether pid is a process that has not exited: an orphan
// reparented to an init that does not reap stays a zombie, which counts
// as exited.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses and
	// may itself hold them.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z' && s[i+2] != 'X'
	}
	return true
}

func tailOf(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 3 {
		lines = lines[len(lines)-3:]
	}
	return strings.Join(lines, " | ")
}

// clientCert makes a certificate like the one go-plugin's host sends in
// PLUGIN_CLIENT_CERT, so that a plugin that insists on mutual TLS starts.
func clientCert() ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"}, DNSNames: []string{"localhost"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		IsCA:        true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}
