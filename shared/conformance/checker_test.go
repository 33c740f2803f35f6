package conformance_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
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
// by check and its exit code.
func runChecker(t *testing.T, checker, plugin, config string, env ...string) (map[string]conformance.Result, int) {
	t.Helper()
	cmd := exec.Command(checker, "-json", "-name", "mem", "-plugin", plugin, "-config", config)
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
	config := filepath.Join(dir, "mem.hcl")
	if err := os.WriteFile(config, []byte("greeting = \"hello\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	t.Run("passes the reference plugin", func(t *testing.T) {
		results, code := runChecker(t, checker, plugin, config)
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
	} {
		t.Run("fails "+tc.broken, func(t *testing.T) {
			t.Parallel()
			results, code := runChecker(t, checker, plugin, config, "TESTPLUGIN_BREAK="+tc.broken)
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

func slicesContains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
