package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestCheck runs the lint over a small module whose docs cite tests and
// files that exist, tests and files that do not, and what is not the
// module's to check; it must name exactly the missing ones, at their
// lines.
func TestCheck(t *testing.T) {
	root := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("engine/host/launch_test.go", "package host\n\nfunc TestKilledPlugin(t *testing.T) {}\nfunc FuzzName(f *testing.F) {}\n")
	write("engine/host/guard.go", "package host\n")
	write("sandbox/up.sh", "")
	write("CHANGELOG.md", "`shared/launch_test.go` `TestGone` (history is not checked)\n")
	write("bin/tools/staticcheck", "")
	write("README.md", `1 `+"`TestKilledPlugin`, `FuzzName`, `TestKilled*`, `TestKill…`"+`
2 `+"`TestEmbedServesNeeds`"+` and `+"`TestNo*`"+`
3 [ok](docs/a.md#anchor), [gone](docs/gone.md), [here](#top), [web](https://example.com/x.go)
4 `+"`engine/host/launch_test.go`, `engine/host/`, `sandbox/up.sh`, `host/guard.go`, `guard.go`"+`
5 `+"`shared/launch_test.go`, `engine/hots/`, `sandbox/down.sh`, `wire/limits.go`, `limits.go`"+`
6 config.hcl, out/frame.png, $SANDBOX_DIR/env.sh, /etc/slurm/slurm.conf, HTTP/1.1, cpu/gpu, bin/provisioner-slurm, engine/host.Launch
`)
	write("docs/a.md", "[up](../README.md) [sandbox](../sandbox/) [missing](../sandbox/none.sh)\n```go\nfunc TestConformance(t *testing.T) {}\n```\n")
	write("docs/design/b.md", "`TestKilledPlugin` `TestMoved`\n")

	got, err := check(root)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"README.md:2: cites TestEmbedServesNeeds, which does not exist",
		"README.md:2: cites TestNo*, which does not exist",
		"README.md:3: cites docs/gone.md, which does not exist",
		"README.md:5: cites shared/launch_test.go, which does not exist",
		"README.md:5: cites engine/hots/, which does not exist",
		"README.md:5: cites sandbox/down.sh, which does not exist",
		"README.md:5: cites wire/limits.go, which does not exist",
		"README.md:5: cites limits.go, which does not exist",
		"docs/a.md:1: cites ../sandbox/none.sh, which does not exist",
		"docs/design/b.md:1: cites TestMoved, which does not exist",
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%q\nwant:\n%q", got, want)
	}
}
