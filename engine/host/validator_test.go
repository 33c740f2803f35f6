package host

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
)

// countingExecutable writes an executable script at path that appends a
// line to count each time it starts and then runs then, so a test counts
// real process starts.
func countingExecutable(t *testing.T, path, count, then string) {
	t.Helper()
	script := fmt.Sprintf("#!/bin/sh\necho start >> %q\n%s\n", count, then)
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
}

func countStarts(t *testing.T, count string) int {
	t.Helper()
	b, err := os.ReadFile(count)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

// TestValidatorStartsEachBinaryOnce: a Validator starts a plugin binary
// once for all the blocks that name it, and reports each block's problems
// at that block's own range: a greeting the plugin refuses in the 4th of 6
// blocks, and, for 3 blocks naming a binary that exits before its
// handshake, "Plugin did not start" at each one's plugin = "…" after one
// start of it. A plugin that has died is started again for the next block.
func TestValidatorStartsEachBinaryOnce(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good, goodCount := filepath.Join(dir, "memory"), filepath.Join(dir, "memory.starts")
	countingExecutable(t, good, goodCount, fmt.Sprintf("exec %q \"$@\"", testPlugin(t)))
	bad, badCount := filepath.Join(dir, "broken"), filepath.Join(dir, "broken.starts")
	countingExecutable(t, bad, badCount, "echo 'no plugin here' >&2\nexit 3")

	var src strings.Builder
	for i := range 6 {
		greeting := "hi"
		if i == 3 {
			greeting = "boom" // refused by the plugin's ValidateConfig
		}
		fmt.Fprintf(&src, "provisioner \"memory\" \"m%d\" {\n  plugin = %q\n  greeting = %q\n}\n", i, good, greeting)
	}
	for i := range 3 {
		fmt.Fprintf(&src, "provisioner \"memory\" \"b%d\" {\n  plugin = %q\n}\n", i, bad)
	}
	blocks := parseBlocks(t, src.String())

	var v Validator
	defer v.Close()
	for i, b := range blocks {
		diags := v.Validate(context.Background(), b)
		var want, at string
		switch {
		case i == 3:
			want, at = "Invalid greeting", "15:14" // block 3's greeting = "boom"
		case i >= 6:
			want, at = "Plugin did not start", fmt.Sprintf("%d:12", 26+3*(i-6)) // its plugin = "…"
		}
		if want == "" {
			if diags.HasErrors() {
				t.Errorf("block %d: %v", i, diags)
			}
			continue
		}
		if len(diags) != 1 || diags[0].Summary != want || diags[0].Subject == nil ||
			fmt.Sprintf("%d:%d", diags[0].Subject.Start.Line, diags[0].Subject.Start.Column) != at {
			t.Errorf("block %d: want only %q at %s; got %v", i, want, at, diags)
		} else if name := fmt.Sprintf("provisioner %q", b.Name); i >= 6 && !strings.Contains(diags[0].Detail, name) {
			t.Errorf("block %d: the diagnostic does not say %s: %s", i, name, diags[0].Detail)
		}
	}
	if g, b := countStarts(t, goodCount), countStarts(t, badCount); g != 1 || b != 1 {
		t.Errorf("6 blocks of one binary and 3 of another started them %d and %d times; want once each", g, b)
	}

	// The plugin dies between two blocks: the next is served by a new one.
	v.mu.Lock()
	p := v.plugins[pluginKey{good, ""}].l.plugin
	v.mu.Unlock()
	if err := syscall.Kill(p.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("the killed plugin did not exit")
	}
	if diags := v.Validate(context.Background(), blocks[0]); diags.HasErrors() {
		t.Errorf("after the plugin died: %v", diags)
	}
	if g := countStarts(t, goodCount); g != 2 {
		t.Errorf("after the plugin died, it was started %d times in all; want 2", g)
	}
}

// parseBlocks decodes every provisioner block of src.
func parseBlocks(t *testing.T, src string) []*Block {
	t.Helper()
	file, diags := hclparse.NewParser().ParseHCL([]byte(src), "engine.hcl")
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	content, diags := file.Body.Content(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{
		{Type: "provisioner", LabelNames: []string{"kind", "name"}},
	}})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	var out []*Block
	for _, hb := range content.Blocks {
		b, diags := DecodeBlock(hb, t.TempDir())
		if diags.HasErrors() {
			t.Fatal(diags)
		}
		out = append(out, b)
	}
	return out
}

// parseBlock parses src, a file with one provisioner block, the way an
// engine reads its own file, and decodes the block.
func parseBlock(t *testing.T, src string) (*Block, hcl.Diagnostics) {
	t.Helper()
	file, diags := hclparse.NewParser().ParseHCL([]byte(src), "engine.hcl")
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	content, diags := file.Body.Content(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{
		{Type: "provisioner", LabelNames: []string{"kind", "name"}},
	}})
	if diags.HasErrors() || len(content.Blocks) != 1 {
		t.Fatalf("%d blocks: %v", len(content.Blocks), diags)
	}
	return DecodeBlock(content.Blocks[0], t.TempDir())
}

// TestValidateSaysWhere: problems are reported against the block, at the
// attribute or label at fault, with what to do.
func TestValidateSaysWhere(t *testing.T) {
	t.Parallel()
	bin := testPlugin(t)
	tests := []struct {
		name, src, summary string
		line, col          int
	}{
		{"wrong type", fmt.Sprintf("provisioner \"memory\" \"m\" {\n  plugin = %q\n  greeting = [1]\n}\n", bin), "Incorrect attribute value type", 3, 14},
		{"missing required", fmt.Sprintf("provisioner \"memory\" \"m\" {\n  plugin = %q\n}\n", bin), "Missing required argument", 1, 26},
		{"no such kind", "provisioner \"nosuch\" \"m\" {\n}\n", "Unknown provisioner kind \"nosuch\"", 1, 13},
		{"other kind", fmt.Sprintf("provisioner \"slurm\" \"m\" {\n  plugin = %q\n  greeting = \"hi\"\n}\n", bin), "Plugin is of another kind", 1, 13},
		{"bad pin", fmt.Sprintf("provisioner \"memory\" \"m\" {\n  plugin = %q\n  sha256 = \"abc\"\n}\n", bin), "Invalid sha256 pin", 3, 12},
		{"bad name", "provisioner \"memory\" \"-m\" {\n}\n", "Invalid provisioner name", 1, 22},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, diags := parseBlock(t, tc.src)
			if !diags.HasErrors() {
				if b.Path == "" {
					b.Path = DefaultPluginPath(t.TempDir(), "bin", b.Kind)
				}
				diags = Validate(context.Background(), b)
			}
			for _, d := range diags {
				if d.Summary == tc.summary && d.Subject != nil && d.Subject.Start.Line == tc.line && d.Subject.Start.Column == tc.col && d.Detail != "" {
					return
				}
			}
			t.Errorf("want %q at %d:%d; got %v", tc.summary, tc.line, tc.col, diags)
		})
	}
}
