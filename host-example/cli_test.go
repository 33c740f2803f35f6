package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/fluksio/provision/internal/sandboxtest"
)

// run runs a built binary and returns its exit code, stdout and stderr.
func runBinary(t *testing.T, bin string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	// Without the plugin handshake's cookie: run by hand.
	cmd.Env = os.Environ()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, stdout.String(), stderr.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), stdout.String(), stderr.String()
	}
	t.Fatalf("%s %q: %v", bin, args, err)
	return 0, "", ""
}

// TestCLIHelpAndVersion runs the real binaries as an operator would: -h
// and --help on every command exit 0 with the command's usage on stdout;
// version and --version print the module version and the revision line;
// the plugin binary run by hand says what it is and how it is used.
func TestCLIHelpAndVersion(t *testing.T) {
	host := sandboxtest.Binary(t, "host-example", "host-example")
	plugin := sandboxtest.Binary(t, "plugin", "provisioner-slurm")

	for _, c := range commands {
		for _, h := range []string{"-h", "-help", "--help"} {
			code, stdout, stderr := runBinary(t, host, c.name, h)
			if code != 0 || !strings.Contains(stdout, "usage: host-example "+c.name) {
				t.Errorf("host-example %s %s: exit %d, stdout %q, stderr %q; want exit 0 and the usage on stdout", c.name, h, code, stdout, stderr)
			}
		}
		code, stdout, _ := runBinary(t, host, "help", c.name)
		if code != 0 || !strings.Contains(stdout, "usage: host-example "+c.name) {
			t.Errorf("host-example help %s: exit %d, stdout %q", c.name, code, stdout)
		}
	}
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}} {
		code, stdout, _ := runBinary(t, host, args...)
		if code != 0 || !strings.Contains(stdout, "commands:") {
			t.Errorf("host-example %q: exit %d, stdout %q", args, code, stdout)
		}
	}
	if code, _, stderr := runBinary(t, host); code != 2 || !strings.Contains(stderr, "usage: host-example") {
		t.Errorf("host-example with no command: exit %d, stderr %q; want 2 and the usage", code, stderr)
	}
	if code, _, stderr := runBinary(t, host, "frobnicate"); code != 2 || !strings.Contains(stderr, `unknown command "frobnicate"`) {
		t.Errorf("host-example frobnicate: exit %d, stderr %q", code, stderr)
	}

	versionLine := regexp.MustCompile(`^host-example \S+ github\.com/fluksio/provision rev \S+ go1\.\d+`)
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		code, stdout, _ := runBinary(t, host, args...)
		if code != 0 || !versionLine.MatchString(stdout) {
			t.Errorf("host-example %q: exit %d, stdout %q; want a line matching %s", args, code, stdout, versionLine)
		}
	}

	pluginVersion := regexp.MustCompile(`^provisioner-slurm \S+ \(kind slurm, plugin \S+, contract \d+\.\d+\) github\.com/fluksio/provision rev \S+ go1\.`)
	for _, v := range []string{"--version", "-version", "version"} {
		code, stdout, _ := runBinary(t, plugin, v)
		if code != 0 || !pluginVersion.MatchString(stdout) {
			t.Errorf("provisioner-slurm %s: exit %d, stdout %q; want a line matching %s", v, code, stdout, pluginVersion)
		}
	}
	for _, h := range []string{"-h", "--help"} {
		code, stdout, _ := runBinary(t, plugin, h)
		if code != 0 || !strings.Contains(stdout, `is a provisioner plugin (kind "slurm"`) || !strings.Contains(stdout, "provisioner-slurm relay") {
			t.Errorf("provisioner-slurm %s: exit %d, stdout %q", h, code, stdout)
		}
	}
	// By hand, with nothing: not a screen of go-plugin's, but what it is
	// and what to do with it, and a failure, since nothing was served.
	code, stdout, stderr := runBinary(t, plugin)
	if code != 1 || stdout != "" || !strings.Contains(stderr, "An engine runs it") || !strings.Contains(stderr, `provisioner "slurm" "NAME"`) {
		t.Errorf("provisioner-slurm by hand: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if code, _, stderr := runBinary(t, plugin, "--frobnicate"); code != 2 || !strings.Contains(stderr, `unknown argument "--frobnicate"`) {
		t.Errorf("provisioner-slurm --frobnicate: exit %d, stderr %q", code, stderr)
	}
	if code, _, _ := runBinary(t, plugin, "relay", "-h"); code != 0 {
		t.Errorf("provisioner-slurm relay -h: exit %d, want 0", code)
	}
}

// TestFlagsAfterArguments: flags may follow the file, as in other tools;
// "--" ends the flags; what is left over is refused with the usage.
func TestFlagsAfterArguments(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "engine.hcl")
	if err := os.WriteFile(file, []byte("engine {\n  listen = \"127.0.0.1:0\"\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := validateMain([]string{file, "-json"}, &stdout, &stderr); code != 0 {
		t.Fatalf("validate FILE -json: exit %d, stderr %s", code, stderr.String())
	}
	var out struct{ Valid bool }
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil || !out.Valid {
		t.Fatalf("validate FILE -json did not print valid JSON saying valid: %v\n%s", err, stdout.String())
	}

	stdout.Reset()
	stderr.Reset()
	if code := validateMain([]string{"--", "-json"}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "-json") {
		t.Errorf("validate -- -json: exit %d (want 1: a file named -json, which is absent), stderr %q", code, stderr.String())
	}

	stdout.Reset()
	stderr.Reset()
	if code := runMain([]string{"-config", file, "extra"}, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), `takes no arguments, got ["extra"]`) || !strings.Contains(stderr.String(), "usage: host-example run") {
		t.Errorf("run -config FILE extra: exit %d, stderr %q", code, stderr.String())
	}
	stdout.Reset()
	stderr.Reset()
	if code := runMain([]string{"-config", file, "-log-level", "loud"}, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), `-log-level "loud"`) {
		t.Errorf("run -log-level loud: exit %d, stderr %q", code, stderr.String())
	}
}
