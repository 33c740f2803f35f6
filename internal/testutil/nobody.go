package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// RunAsNobody runs the calling test binary again, as uid and gid 65534,
// from a copy that user can read, with only the test named test and
// with env (KEY=VALUE) beside a minimal PATH and HOME, and returns its
// output. The test must be run as root, which can set another uid.
func RunAsNobody(t *testing.T, test string, env ...string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "fluksio-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "nobody.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^"+test+"$")
	cmd.Env = append([]string{"HOME=" + dir, "PATH=/usr/bin:/bin", "GORACE=atexit_sleep_ms=0"}, env...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the test binary as uid 65534: %v\n%s", err, out)
	}
	return string(out)
}
