package conformance_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fluksio/provision/shared/conformance"
)

// buildChecker builds the checker binary into dir.
func buildChecker(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "provisioner-conformance")
	if out, err := exec.Command("go", "build", "-o", bin, "./provisioner-conformance").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// runChecker runs the checker binary with -json and returns its results
// by check and its exit code. extra are more of the checker's arguments.
func runChecker(t *testing.T, checker, plugin, config string, extra []string, env ...string) (map[string]conformance.Result, int) {
	t.Helper()
	cmd := exec.Command(checker, append([]string{"-json", "-name", "mem", "-plugin", plugin, "-config", config}, extra...)...)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	results := map[string]conformance.Result{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var r conformance.Result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("the checker printed a line that is not JSON: %q (%v)\nstderr: %s", sc.Text(), err, stderr.String())
		}
		results[r.Check] = r
	}
	if len(results) != len(conformance.Checks) {
		t.Fatalf("%d results for %d checks:\n%s\nstderr: %s", len(results), len(conformance.Checks), out, stderr.String())
	}
	return results, code
}

// The checker binary passes the Go reference plugin and fails each broken
// variant of it, naming the check that variant breaks and no other.
func TestCheckerBinary(t *testing.T) {
	dir := t.TempDir()
	checker, plugin := buildChecker(t, dir), buildTestPlugin(t, dir)
	write := func(name, body string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	config := write("mem.hcl", "greeting = \"hello\"\n")
	// The diagnostics of any plugin, from a file; and a configuration
	// whose machines all fail, for the backoff check.
	extra := []string{"-invalid", write("boom.hcl", "# path: greeting\ngreeting = \"boom\"\n"),
		"-failing", write("failing.hcl", "greeting = \"hello\"\nfail_provision = true\n")}

	t.Run("passes the reference plugin", func(t *testing.T) {
		results, code := runChecker(t, checker, plugin, config, extra)
		for _, r := range results {
			if !r.Pass {
				t.Errorf("%s: %s", r.Check, r.Detail)
			}
		}
		if code != 0 {
			t.Errorf("exit code %d, want 0", code)
		}
	})

	for _, tc := range []struct {
		broken string
		check  []string
		says   string
	}{
		{"controller", []string{"exits on GRPCController.Shutdown"}, "killed"},
		{"details", []string{"error details: NOT_CONFIGURED", "error details: SHUT_DOWN"}, "ErrorInfo"},
		{"stdout", []string{"nothing on stdout after the handshake"}, `"configured!"`},
		{"sigterm", []string{"exits within 3s of SIGTERM"}, "still running 3s after SIGTERM"},
		{"contract", []string{"contract version"}, `"1.0"`},
		{"cookie", []string{"handshake"}, "exited with status 1 before the plugin handshake"},
		{"storm", []string{"provision", "machines do not fail right after Provision", "backs off a profile whose machines fail"}, "exited with status 1 before it attached"},
		{"dies", []string{"machines do not fail right after Provision"}, "worker mem-small-00000001 (profile small) failed right after Provision (worker_provision_failed, died_before_attach)"},
		{"diagpath", []string{"validate"}, "a broken configuration at greeting was not reported there"},
	} {
		t.Run("fails "+tc.broken, func(t *testing.T) {
			t.Parallel()
			results, code := runChecker(t, checker, plugin, config, extra, "TESTPLUGIN_BREAK="+tc.broken)
			if code != 1 {
				t.Errorf("exit code %d, want 1", code)
			}
			for _, name := range conformance.Checks {
				r := results[name]
				want := slicesContains(tc.check, name)
				switch {
				case want && (r.Pass || r.Skipped):
					t.Errorf("%s passed or was skipped; it should fail", name)
				case want && !strings.Contains(r.Detail, tc.says):
					t.Errorf("%s failed but does not say %q: %s", name, tc.says, r.Detail)
				case !want && !r.Pass && !(tc.broken == "cookie" && r.Skipped):
					t.Errorf("%s failed too: %s", name, r.Detail)
				}
			}
		})
	}
}

// TestCheckerHelp: -h is an answer, on stdout with exit 0, as every
// command of the project gives it.
func TestCheckerHelp(t *testing.T) {
	checker := buildChecker(t, t.TempDir())
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(checker, "-h")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Errorf("-h: %v, want exit 0", err)
	}
	if !strings.Contains(stdout.String(), "usage: provisioner-conformance") || !strings.Contains(stdout.String(), "-invalid") || stderr.Len() != 0 {
		t.Errorf("-h wrote stdout %q, stderr %q; want the usage on stdout alone", stdout.String(), stderr.String())
	}
}

func TestParseInvalid(t *testing.T) {
	t.Parallel()
	for body, want := range map[string][]string{
		"# path: profile.0.cpus\nprofile \"a\" {\n  cpus = 0\n}\n": {"profile", "0", "cpus"},
		"greeting = \"x\"\n  // path: [\"a.b\", \"0\"]\n":          {"a.b", "0"},
		"# a broken one\n# path:\n":                                {},
	} {
		inv, err := conformance.ParseInvalid(body)
		if err != nil || !slices.Equal(inv.Path, want) || inv.HCL != body {
			t.Errorf("ParseInvalid(%q) = %+v, %v; want path %q", body, inv, err, want)
		}
	}
	if _, err := conformance.ParseInvalid("greeting = \"boom\"\n"); err == nil || !strings.Contains(err.Error(), "# path:") {
		t.Errorf("a file without a path comment: %v, want an error saying how to add one", err)
	}
}

func slicesContains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
