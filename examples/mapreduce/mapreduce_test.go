package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/internal/sandboxtest"
)

func TestMain(m *testing.M) {
	os.Exit(sandboxtest.Run(m))
}

// TestMapReduce runs the engine kit's worked example (docs/engine-kit.md)
// on the sandbox's Slurm: 8 files, 8 maps, a reduce over their counts;
// the top ten it prints are the words' true counts, and nothing of the
// run is left in the queue.
func TestMapReduce(t *testing.T) {
	env := sandboxtest.Require(t)
	bin := sandboxtest.Binary(t, "examples/mapreduce", "mapreduce")
	plugin := sandboxtest.Binary(t, "plugin", "provisioner-slurm")
	wbin := sandboxtest.Binary(t, "worker/fluksio-worker", "fluksio-worker")
	var b [4]byte
	rand.Read(b[:])
	name := "mapred-" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		if q := strings.TrimSpace(env.Slurm(t, "squeue", "-h", "--name=fluksio-"+name)); q != "" {
			t.Logf("cancelling what the test left:\n%s", q)
			env.Slurm(t, "scancel", "--name=fluksio-"+name)
		}
	})
	// The k-th word (wb .. wm: letters, as the maps' tr splits) appears
	// k times in each of 8 files (k = 1..12), so that the top ten are
	// wm .. wd, each 8k times.
	dir := t.TempDir()
	var files []string
	for f := range 8 {
		var text strings.Builder
		for k := 1; k <= 12; k++ {
			for range k {
				fmt.Fprintf(&text, "w%c ", 'a'+k)
			}
			text.WriteString("\n")
		}
		p := filepath.Join(dir, fmt.Sprintf("part-%d.txt", f))
		if err := os.WriteFile(p, []byte(text.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		files = append(files, p)
	}
	profiles := fmt.Sprintf("  profile \"c1\" {\n    cpus   = 1\n    ram_mb = 200\n    sbatch = [\"--partition=%s\", \"--time=00:10:00\"]\n  }\n", env.Partition)
	cfg := filepath.Join(t.TempDir(), "config.hcl")
	if err := os.WriteFile(cfg, []byte(env.EngineConfig(sandboxtest.FreePort(t), filepath.Dir(plugin), name, []string{wbin}, profiles)), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{cfg}, files...)...)
	var errOut strings.Builder
	cmd.Stderr = &errOut
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.Output()
	exited := time.Now()
	t.Logf("mapreduce printed:\n%s", out)
	if err != nil {
		t.Fatalf("mapreduce: %v\n%s", err, &errOut)
	}
	var want []string
	for k := 12; k >= 3; k-- {
		want = append(want, fmt.Sprintf("%d w%c", 8*k, 'a'+k))
	}
	if got := strings.TrimSpace(string(out)); got != strings.Join(want, "\n") {
		t.Errorf("the top ten:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
	env.AssertCleanStop(t, "fluksio-"+name, exited, "mapreduce's exit")
}

// TestDocShowsThisExample: docs/engine-kit.md shows main.go whole, as
// it is.
func TestDocShowsThisExample(t *testing.T) {
	code, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "engine-kit.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "```go\n"+string(code)+"```\n") {
		t.Error("docs/engine-kit.md does not show examples/mapreduce/main.go as it is: copy it into its worked example")
	}
}
