package sandboxtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestUpReadsRateLimit runs sandbox/up.sh with SANDBOX_RATE_LIMIT settings
// it must refuse, and with ones it must take, and starts nothing: every
// run also has SANDBOX_SMOKE=never, which up.sh refuses right after the
// limiter's check and before it makes the state directory. So a setting
// up.sh takes ends with the SANDBOX_SMOKE refusal, one it refuses with
// its own words, and neither leaves the directory behind.
func TestUpReadsRateLimit(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("sandbox/up.sh refuses to read its settings unless run as root")
	}
	const smokeRefused = "SANDBOX_SMOKE must be auto, 1 or 0"
	cases := []struct {
		suite, limit string
		want         string
	}{
		{"bookworm", "10,1", "Slurm 22.05, which has no RPC rate limiter: use SANDBOX_SLURM=trixie or sid"},
		{"trixie", "10", "SANDBOX_RATE_LIMIT='10' is not BUCKET,REFILL"},
		{"sid", "0,1", "SANDBOX_RATE_LIMIT='0,1' is not BUCKET,REFILL"},
		{"trixie", "10,x", "SANDBOX_RATE_LIMIT='10,x' is not BUCKET,REFILL"},
		{"trixie", "10,1", smokeRefused},
		{"sid", "30,2", smokeRefused},
		// none clears the limiter, which bookworm may then run without.
		{"bookworm", "none", smokeRefused},
	}
	for _, c := range cases {
		dir := filepath.Join(t.TempDir(), "sb")
		env := append(cleanEnv(), "SANDBOX_SLURM="+c.suite, "SANDBOX_RATE_LIMIT="+c.limit, "SANDBOX_SMOKE=never")
		out, err := sandboxScript("up.sh", env, dir)
		if err == nil {
			t.Fatalf("%s %s: up.sh succeeded; it should have stopped at SANDBOX_SMOKE=never:\n%s", c.suite, c.limit, out)
		}
		if !strings.Contains(string(out), c.want) {
			t.Errorf("SANDBOX_SLURM=%s SANDBOX_RATE_LIMIT=%s: up.sh said %q, want it to say %q", c.suite, c.limit, strings.TrimSpace(string(out)), c.want)
		}
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("%s %s: up.sh left %s behind", c.suite, c.limit, dir)
		}
	}
}
