package bench

// Measurement 14: host-example validate of a file of 200 Slurm provisioner
// blocks against one of a single block. Validate starts each plugin binary
// once and asks it about each block, so 200 blocks cost one plugin start
// and 200 round trips, not 200 starts. It needs no Slurm: nothing is
// asked of the cluster.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/internal/sandboxtest"
)

const (
	validateBlocks = 200
	nValidate      = 5
)

// validateConfig writes a configuration of n provisioner blocks, each a
// copy of host-example/testdata/valid.hcl's, whose plugin is slurmBin.
func validateConfig(tb testing.TB, slurmBin string, n int) string {
	tb.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "engine {\n  listen     = \"127.0.0.1:0\"\n  plugin_dir = %q\n}\n", filepath.Dir(slurmBin))
	for i := range n {
		fmt.Fprintf(&b, `
provisioner "slurm" "v%d" {
  login          = "slurmuser@127.0.0.1"
  ssh_port       = 2222
  engine_url     = "http://127.0.0.1:8470"
  worker_command = ["/opt/fluksio/host-example", "worker"]
  max_idle       = "30s"

  profile "cpu" {
    cpus   = 2
    ram_mb = 500
    sbatch = ["--partition=debug", "--time=00:10:00"]
  }
  profile "gpu" {
    cpus   = 2
    gpus   = 1
    labels = ["cuda"]
    sbatch = ["--partition=debug"]
    prerun = ["module load cuda"]
  }
}
`, i)
	}
	path := filepath.Join(tb.TempDir(), fmt.Sprintf("validate-%d.hcl", n))
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		tb.Fatal(err)
	}
	return path
}

// validateOnce runs hostBin validate on path, timed; the file must be
// valid.
func validateOnce(tb testing.TB, hostBin, path string) time.Duration {
	tb.Helper()
	t0 := time.Now()
	out, err := exec.Command(hostBin, "validate", path).CombinedOutput()
	d := time.Since(t0)
	if err != nil {
		tb.Fatalf("host-example validate %s: %v\n%s", path, err, out)
	}
	return d
}

type validateResult struct {
	one, many []time.Duration
}

// measureValidate times validate of one block and of validateBlocks,
// alternating, n times each after a warm-up of each.
func measureValidate(tb testing.TB, hostBin, slurmBin string, n int) validateResult {
	one, many := validateConfig(tb, slurmBin, 1), validateConfig(tb, slurmBin, validateBlocks)
	validateOnce(tb, hostBin, one)
	validateOnce(tb, hostBin, many)
	var r validateResult
	for range n {
		r.one = append(r.one, validateOnce(tb, hostBin, one))
		r.many = append(r.many, validateOnce(tb, hostBin, many))
	}
	return r
}

func validateRows(rep *report, r validateResult) {
	m, o := median(r.many), median(r.one)
	_, rt := ratio(float64(m), float64(o))
	rep.add(row{fmt.Sprintf("host-example validate of %d Slurm provisioner blocks vs 1 block (n=%d, medians)", validateBlocks, len(r.many)),
		dur(m), dur(o), rt, "≤ 3 s", verdict(m.Seconds(), 3, true, "s")})
	lo, hi := spread(r.many)
	olo, ohi := spread(r.one)
	rep.note("validate: %d blocks ranged %s–%s, 1 block %s–%s; each plugin binary starts once per validate, so the difference is the blocks' decoding and one ValidateConfig round trip each.",
		validateBlocks, dur(lo), dur(hi), dur(olo), dur(ohi))
}

// BenchmarkValidate is measurement 14 as a Go benchmark. It needs no
// sandbox.
func BenchmarkValidate(b *testing.B) {
	hostBin := sandboxtest.Binary(b, "host-example", "host-example")
	slurmBin := sandboxtest.Binary(b, "plugin", "provisioner-slurm")
	for _, n := range []int{1, validateBlocks} {
		path := validateConfig(b, slurmBin, n)
		b.Run(fmt.Sprintf("blocks=%d", n), func(b *testing.B) {
			for range b.N {
				validateOnce(b, hostBin, path)
			}
		})
	}
}
