package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/internal/testutil"
)

// memoryConfig writes a configuration of one provisioner of the test
// plugin (kind memory), listening on port, and returns its path and the
// plugin's.
func memoryConfig(t *testing.T, port int) (cfg, plugin string) {
	t.Helper()
	plugin = testutil.BuildTestPlugin(t)
	cfg = filepath.Join(t.TempDir(), "engine.hcl")
	body := fmt.Sprintf("engine {\n  listen = \"127.0.0.1:%d\"\n}\n\nprovisioner \"memory\" \"mem\" {\n  plugin   = %q\n  greeting = \"hi\"\n}\n", port, plugin)
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return cfg, plugin
}

// TestValidateRefusesWhatOthersCanWrite: validate and run refuse a
// configuration file of mode 0666 at file:1:1, saying its mode and
// chmod go-w PATH, and a plugin binary of mode 0777 at the plugin
// attribute (line 6); run exits before it listens or starts a plugin.
func TestValidateRefusesWhatOthersCanWrite(t *testing.T) {
	port := sandboxtest.FreePort(t)
	cfg, plugin := memoryConfig(t, port)
	var stdout, stderr bytes.Buffer
	if code := validateMain([]string{cfg}, &stdout, &stderr); code != 0 {
		t.Fatalf("validate on a 0644 file: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	if err := os.Chmod(cfg, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(plugin, 0o777); err != nil {
		t.Fatal(err)
	}
	stdout.Reset()
	stderr.Reset()
	code := validateMain([]string{cfg}, &stdout, &stderr)
	t.Logf("validate, 0666 file and 0777 plugin: exit %d\n%s%s", code, stdout.String(), stderr.String())
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	for _, want := range []string{
		cfg + ":1:1: error: Configuration file others can write",
		"(mode 0666)", "chmod go-w " + cfg,
		cfg + ":6:14: error: Plugin others can write",
		plugin + " is writable by group or others (mode 0777)", "chmod go-w " + plugin,
	} {
		// The detail is wrapped at the terminal's width.
		if !strings.Contains(strings.Join(strings.Fields(stderr.String()), " "), want) {
			t.Errorf("validate does not say %q", want)
		}
	}

	host := sandboxtest.Binary(t, "host-example", "host-example")
	out, err := execRun(t, host, cfg)
	t.Logf("run, 0666 file: %v\n%s", err, out)
	if err == nil || !strings.Contains(out, cfg+":1:1: error: Configuration file others can write") || !strings.Contains(strings.Join(strings.Fields(out), " "), "chmod go-w "+cfg) {
		t.Errorf("run started from a 0666 file, or did not say why not")
	}
}

// execRun runs host-example run -config cfg to its end (bounded) and
// returns its output.
func execRun(t *testing.T, host, cfg string) (string, error) {
	t.Helper()
	p := (&e2e{host: host}).startEngine(t, "-config", cfg)
	p.waitDone(t, time.Minute)
	return p.stdout.String() + p.stderr.String(), p.err
}

// TestReloadRefusesAFileOthersCanWrite: a running engine (host-example run
// with the test plugin) whose file is made 0666 with a provisioner
// appended, then SIGHUP: the reload is refused at file:1:1 with the
// mode and chmod go-w PATH, GET /status still says generation 1 with the
// first digest and one provisioner; made 0644 again, the same file is
// taken at the next SIGHUP (generation 2, two provisioners).
func TestReloadRefusesAFileOthersCanWrite(t *testing.T) {
	port := sandboxtest.FreePort(t)
	cfg, plugin := memoryConfig(t, port)
	e := &e2e{host: sandboxtest.Binary(t, "host-example", "host-example"), port: port}
	p := e.startEngine(t, "-config", cfg)
	type status struct {
		Config struct {
			Generation int    `json:"generation"`
			Digest     string `json:"digest"`
		} `json:"config"`
		Provisioners []json.RawMessage `json:"provisioners"`
	}
	client := &http.Client{Timeout: 5 * time.Second}
	read := func() (st status, ok bool) {
		resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/status", port))
		if err != nil {
			return st, false
		}
		defer resp.Body.Close()
		return st, resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&st) == nil
	}
	var before status
	poll(t, time.Minute, "the engine to answer GET /status", func() bool {
		if p.exited() {
			t.Fatalf("the engine exited\n%s%s", p.stdout, p.stderr)
		}
		st, ok := read()
		before = st
		return ok
	})
	if before.Config.Generation != 1 || len(before.Provisioners) != 1 {
		t.Fatalf("at start: %+v", before)
	}

	added := fmt.Sprintf("\nprovisioner \"memory\" \"theirs\" {\n  plugin   = %q\n  greeting = \"appended by someone else\"\n}\n", plugin)
	f, err := os.OpenFile(cfg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(added); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Chmod(cfg, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	poll(t, time.Minute, "the refused reload's diagnostic", func() bool {
		return strings.Contains(p.stderr.String(), cfg+":1:1: error: Configuration file others can write")
	})
	log := strings.Join(strings.Fields(p.stderr.String()), " ")
	for _, want := range []string{"(mode 0666)", "chmod go-w " + cfg, "configuration reload refused"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log does not say %q", want)
		}
	}
	if st, ok := read(); !ok || st.Config != before.Config || len(st.Provisioners) != 1 {
		t.Errorf("after the refused reload GET /status says %+v (%d provisioners); want %+v and 1", st.Config, len(st.Provisioners), before.Config)
	}

	if err := os.Chmod(cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	poll(t, time.Minute, "generation 2 from the same file at 0644", func() bool {
		st, ok := read()
		return ok && st.Config.Generation == 2 && len(st.Provisioners) == 2
	})
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	p.waitDone(t, time.Minute)
	if t.Failed() {
		t.Logf("stdout:\n%s\nstderr:\n%s", p.stdout, p.stderr)
	}
}

// squatterScript is another user's server on the engine's port that
// answers every GET 200 "fluksio engine", as an engine of an earlier
// release did.
const squatterScript = `
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"fluksio engine\n")
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
`

// TestValidateProbeSquatted: another user (uid 65534) holds the engine's
// port and answers the probe path 200 "fluksio engine". validate -check
// -probe is not "reached": it exits 1 with an error at listen saying the
// uid, the pid and what answered, and submits nothing (no provisioner is
// checked). With this user's engine (host-example run) on the port
// instead, validate takes it for the engine and says whose it is.
func TestValidateProbeSquatted(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("runs a server as uid 65534: needs root")
	}
	// Debian's, not a shim under root's home that uid 65534 cannot run.
	python := "/usr/bin/python3"
	port := sandboxtest.FreePort(t)
	cfg, _ := memoryConfig(t, port)
	squatter := exec.Command(python, "-c", squatterScript, strconv.Itoa(port))
	squatter.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	var out lockedBuffer
	squatter.Stdout, squatter.Stderr = &out, &out
	if err := squatter.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = squatter.Process.Kill()
		_ = squatter.Wait()
	})
	poll(t, 30*time.Second, "the squatter to listen", func() bool {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.Close()
		}
		return err == nil
	})

	var stdout, stderr bytes.Buffer
	code := validateMain([]string{"-check", "-probe", cfg}, &stdout, &stderr)
	t.Logf("validate -check -probe, port squatted: exit %d\n%s%s", code, stdout.String(), stderr.String())
	said := strings.Join(strings.Fields(stdout.String()+stderr.String()), " ")
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	for _, want := range []string{
		cfg + ":2:12: error: Engine address held by another user",
		fmt.Sprintf("held by uid 65534, pid %d (python3), which answered 200 OK \"fluksio engine\"", squatter.Process.Pid),
	} {
		if !strings.Contains(said, want) {
			t.Errorf("validate does not say %q", want)
		}
	}
	if strings.Contains(said, "reached") || strings.Contains(said, "provisioner \"mem\"") {
		t.Error("validate went on to a probe, or says the engine was reached")
	}
	_ = squatter.Process.Kill()
	_ = squatter.Wait()

	e := &e2e{host: sandboxtest.Binary(t, "host-example", "host-example"), port: port}
	p := e.startEngine(t, "-config", cfg)
	poll(t, time.Minute, "the engine to listen", func() bool {
		if p.exited() {
			t.Fatalf("the engine exited\n%s%s", p.stdout, p.stderr)
		}
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	stdout.Reset()
	stderr.Reset()
	code = validateMain([]string{"-check", "-probe", cfg}, &stdout, &stderr)
	t.Logf("validate -check -probe, the engine running: exit %d\n%s%s", code, stdout.String(), stderr.String())
	if want := fmt.Sprintf("is in use by an engine of this user (uid 0, pid %d (host-example), which answered 200 OK \"fluksio engine ", p.cmd.Process.Pid); code != 0 || !strings.Contains(stdout.String(), want) {
		t.Errorf("exit %d, want 0 and %q", code, want)
	}
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	p.waitDone(t, time.Minute)
}
