package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
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
