package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/fluksio/provision/engine/hclconfig"
	"github.com/fluksio/provision/internal/sandboxtest"
)

// The broken configurations live in testdata/configs, one mistake per
// file. The first line of each says what validate must report:
//
//	# want: LINE:COL fragment
//
// LINE:COL is where the diagnostic must point (the file's own lines, the
// want line included), and fragment must appear in that diagnostic's
// summary or detail. @PLUGIN_DIR@ stands for the directory of the real
// Slurm plugin, in the file and in the fragment; it is always substituted
// after the column a want points at, so positions do not move.
//
// These tests run the real plugin (validate launches it to decode and
// check its part of each block) but need no Slurm: validate has no side
// effects, so they never call sandboxtest.Require.

const pluginDirPlaceholder = "@PLUGIN_DIR@"

var wantRe = regexp.MustCompile(`^# want: (\d+):(\d+) (.+)$`)

// brokenConfig is one file of testdata/configs, ready to validate.
type brokenConfig struct {
	name      string
	path      string // the substituted copy, as validate is given it
	line, col int
	fragment  string
}

// pluginDir builds the Slurm plugin and returns its directory.
func pluginDir(t *testing.T) string {
	t.Helper()
	return filepath.Dir(sandboxtest.Binary(t, "plugin", "provisioner-slurm"))
}

// writeConfig copies testdata file src into dir with the placeholder
// replaced, and returns the copy's path.
func writeConfig(t *testing.T, src, dir, plugins string) string {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, filepath.Base(src))
	if err := os.WriteFile(dst, bytes.ReplaceAll(b, []byte(pluginDirPlaceholder), []byte(plugins)), 0o644); err != nil {
		t.Fatal(err)
	}
	return dst
}

func loadBrokenConfigs(t *testing.T, plugins string) []brokenConfig {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "configs", "*.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var out []brokenConfig
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		first, _, _ := strings.Cut(string(src), "\n")
		m := wantRe.FindStringSubmatch(first)
		if m == nil {
			t.Fatalf("%s: the first line must be `# want: LINE:COL fragment`, not %q", f, first)
		}
		line, _ := strconv.Atoi(m[1])
		col, _ := strconv.Atoi(m[2])
		out = append(out, brokenConfig{
			name:     strings.TrimSuffix(filepath.Base(f), ".hcl"),
			path:     writeConfig(t, f, dir, plugins),
			line:     line,
			col:      col,
			fragment: strings.ReplaceAll(m[3], pluginDirPlaceholder, plugins),
		})
	}
	return out
}

// diagHeadRe is the first line hclconfig.WriteDiagnostics prints for a diagnostic.
var diagHeadRe = regexp.MustCompile(`^(\S+):(\d+):(\d+): (error|warning): `)

// diagnosticTexts splits hclconfig.WriteDiagnostics output into its diagnostics
// and returns the text of those whose first line starts with prefix: that
// line and everything up to the next diagnostic's first line. Two
// problems may share a position (HCL reports an unterminated string
// twice), so there can be several.
func diagnosticTexts(out, prefix string) []string {
	var texts []string
	var cur *strings.Builder
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if diagHeadRe.MatchString(l) {
			if cur != nil {
				texts = append(texts, cur.String())
				cur = nil
			}
			if strings.HasPrefix(l, prefix) {
				cur = &strings.Builder{}
			}
		}
		if cur != nil {
			cur.WriteString(l)
			cur.WriteByte('\n')
		}
	}
	if cur != nil {
		texts = append(texts, cur.String())
	}
	return texts
}

// squash collapses every run of white space to one space, because hcl
// wraps a diagnostic's detail at 100 columns.
func squash(s string) string { return strings.Join(strings.Fields(s), " ") }

// assertNoCrash fails if the output looks like a Go panic or stack trace.
func assertNoCrash(t *testing.T, out string) {
	t.Helper()
	for _, bad := range []string{"panic", "goroutine ", "runtime.", ".go:"} {
		if strings.Contains(out, bad) {
			t.Errorf("output contains %q, like a crash:\n%s", bad, out)
		}
	}
}

func TestValidateBrokenConfigs(t *testing.T) {
	plugins := pluginDir(t)
	cases := loadBrokenConfigs(t, plugins)
	if len(cases) < 25 {
		t.Fatalf("only %d broken configurations in testdata/configs; want at least 25", len(cases))
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := validateMain([]string{c.path}, &stdout, &stderr)
			out := stderr.String()
			assertNoCrash(t, stdout.String()+out)
			if code != 1 {
				t.Fatalf("exit %d, want 1\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), out)
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout should be empty for an invalid file, got:\n%s", stdout.String())
			}
			prefix := fmt.Sprintf("%s:%d:%d: error: ", c.path, c.line, c.col)
			texts := diagnosticTexts(out, prefix)
			if len(texts) == 0 {
				t.Fatalf("no line starts with %q\nstderr:\n%s", prefix, out)
			}
			for _, text := range texts {
				if strings.Contains(squash(text), squash(c.fragment)) {
					return
				}
			}
			t.Errorf("no diagnostic at %d:%d says %q; stderr:\n%s", c.line, c.col, c.fragment, out)
		})
	}
}

// TestValidateBrokenConfigsJSON checks that -json reports each problem at
// the same place, as parseable JSON, and nothing on stderr.
func TestValidateBrokenConfigsJSON(t *testing.T) {
	plugins := pluginDir(t)
	for _, c := range loadBrokenConfigs(t, plugins) {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := validateMain([]string{"-json", c.path}, &stdout, &stderr)
			assertNoCrash(t, stdout.String()+stderr.String())
			if code != 1 {
				t.Fatalf("exit %d, want 1\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
			}
			if stderr.Len() != 0 {
				t.Errorf("stderr should be empty with -json, got:\n%s", stderr.String())
			}
			var got struct {
				Valid       bool             `json:"valid"`
				Diagnostics []jsonDiagnostic `json:"diagnostics"`
			}
			dec := json.NewDecoder(&stdout)
			dec.DisallowUnknownFields()
			if err := dec.Decode(&got); err != nil {
				t.Fatalf("-json output does not parse: %v\n%s", err, stdout.String())
			}
			if got.Valid {
				t.Errorf("valid is true for a broken file")
			}
			for _, d := range got.Diagnostics {
				if d.Severity == "error" && d.Filename == c.path && d.Line == c.line && d.Column == c.col &&
					strings.Contains(squash(d.Summary+" "+d.Detail), squash(c.fragment)) {
					if d.EndLine < d.Line || (d.EndLine == d.Line && d.EndColumn < d.Column) {
						t.Errorf("the range ends (%d:%d) before it starts (%d:%d)", d.EndLine, d.EndColumn, d.Line, d.Column)
					}
					return
				}
			}
			t.Errorf("no error at %s:%d:%d saying %q in:\n%+v", c.path, c.line, c.col, c.fragment, got.Diagnostics)
		})
	}
}

func TestValidateValidConfig(t *testing.T) {
	path := writeConfig(t, filepath.Join("testdata", "valid.hcl"), t.TempDir(), pluginDir(t))

	var stdout, stderr bytes.Buffer
	if code := validateMain([]string{path}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d, want 0\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	if want := path + ": valid (1 provisioner(s))\n"; stdout.String() != want {
		t.Errorf("stdout = %q, want %q", stdout.String(), want)
	}
	if stderr.Len() != 0 {
		t.Errorf("stderr should be empty, got:\n%s", stderr.String())
	}

	stdout.Reset()
	stderr.Reset()
	if code := validateMain([]string{"-json", path}, &stdout, &stderr); code != 0 {
		t.Fatalf("-json: exit %d, want 0\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	var got map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("-json output does not parse: %v\n%s", err, stdout.String())
	}
	if got["valid"] != true {
		t.Errorf("valid = %v, want true", got["valid"])
	}
	if d, ok := got["diagnostics"].([]any); !ok || len(d) != 0 {
		t.Errorf("diagnostics = %#v, want an empty list (not null)", got["diagnostics"])
	}
}

// TestValidateUsage covers the exits that are not about the file's
// contents: no file, two files, and a file that is not there.
func TestValidateUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "usage: host-example validate"},
		{[]string{"a.hcl", "b.hcl"}, 2, "usage: host-example validate"},
		{[]string{"-bogus", "a.hcl"}, 2, "flag provided but not defined"},
		{[]string{filepath.Join(t.TempDir(), "absent.hcl")}, 1, "Configuration file not found"},
	} {
		var stdout, stderr bytes.Buffer
		code := validateMain(tc.args, &stdout, &stderr)
		assertNoCrash(t, stdout.String()+stderr.String())
		if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("validate %q: exit %d, want %d, and stderr saying %q:\n%s", tc.args, code, tc.code, tc.want, stderr.String())
		}
	}
}

// TestValidateHostileSizes: configuration as an attack. A 200 KB file of
// nested brackets, or of nested blocks, or of nested JSON, is refused at
// the place it gets too deep, before a parser can overflow its stack (a
// fatal error no recover catches); a file over 1 MiB is refused unread.
func TestValidateHostileSizes(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	brackets := "engine {\n  listen = " + strings.Repeat("[", 200_000) + "\n}\n"
	blocks := strings.Repeat("a {\n", 50_000)
	jsonDeep := `{"engine": ` + strings.Repeat(`{"a": `, 100_000)
	huge := bytes.Repeat([]byte("# padding padding padding padding padding padding\n"), 30_000)
	for _, tc := range []struct {
		file, summary, at string
	}{
		{write("brackets.hcl", []byte(brackets)), "Configuration nested too deeply", ":2:"},
		{write("blocks.hcl", []byte(blocks)), "Configuration nested too deeply", ":65:"},
		{write("deep.json", []byte(jsonDeep)), "Configuration nested too deeply", ":1:"},
		{write("huge.hcl", huge), "Configuration file too large", ":1:1"},
	} {
		var stdout, stderr bytes.Buffer
		code := validateMain([]string{tc.file}, &stdout, &stderr)
		out := stderr.String()
		assertNoCrash(t, out)
		if code != 1 || !strings.Contains(out, tc.summary) || !strings.Contains(out, tc.file+tc.at) {
			t.Errorf("%s: exit %d\n%.600s\nwant %q at %s", filepath.Base(tc.file), code, out, tc.summary, tc.at)
		}
	}
}

// TestValidateHostileChains: nesting without brackets, with the attack's
// figures. 300,000 `!`, 500,000 `-`, 300,000 `[*]`, and long chains of
// attribute steps, indexes and binary operators (also spread over lines
// inside parentheses, where the parser ignores newlines, and inside a
// JSON string, which is decoded as a template) are refused by validate,
// script and run at the place the chain gets too long, fast, before a
// parser or the evaluator can overflow its stack.
func TestValidateHostileChains(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	attr := func(expr string) string { return "engine {\n  listen = " + expr + "\n}\n" }
	cases := []struct{ file, at string }{
		{write("bang.hcl", attr(strings.Repeat("!", 300_000)+"true")), ":2:"},
		{write("minus.hcl", attr(strings.Repeat("-", 500_000)+"1")), ":2:"},
		{write("splat.hcl", attr("a"+strings.Repeat("[*]", 300_000))), ":2:"},
		// The other forms, at a size that is past the limit without
		// costing the test the lexer's time on a megabyte each.
		{write("attrs.hcl", attr("a"+strings.Repeat(".b", 20_000))), ":2:"},
		{write("index.hcl", attr("a"+strings.Repeat("[a]", 20_000))), ":2:"},
		{write("plus.hcl", attr("1"+strings.Repeat("+1", 20_000))), ":2:"},
		{write("lines.hcl", attr("("+strings.Repeat("!\n", 20_000)+"true)")), ":258:"},
		{write("template.hcl", attr(`"${`+strings.Repeat("!", 20_000)+`true}"`)), ":2:"},
		{write("deep.json", `{"engine": {"listen": "${`+strings.Repeat("!", 20_000)+`true}"}}`), ":1:"},
	}
	for i, tc := range cases {
		for _, cmd := range []struct {
			name string
			main func([]string, io.Writer, io.Writer) int
			args []string
		}{
			{"validate", validateMain, []string{tc.file}},
			{"script", scriptMain, []string{"-config", tc.file, "-profile", "p"}},
			{"run", runMain, []string{"-config", tc.file}},
		} {
			if i > 0 && cmd.name != "validate" {
				continue // the three share engine.LoadConfig: one case each is enough
			}
			start := time.Now()
			var stdout, stderr bytes.Buffer
			code := cmd.main(cmd.args, &stdout, &stderr)
			took := time.Since(start)
			out := stderr.String()
			assertNoCrash(t, out)
			if code != 1 || !strings.Contains(out, "Expression chained too long") || !strings.Contains(out, tc.file+tc.at) ||
				!strings.Contains(out, "shorten this one") {
				t.Errorf("%s %s: exit %d\n%.600s\nwant \"Expression chained too long\" at %s", cmd.name, filepath.Base(tc.file), code, out, tc.at)
			}
			// The lexer is most of it: 300,000 `[*]` are 900,000 tokens, 1.5 s
			// alone here, 5 s under -race on a shared machine.
			if took > 15*time.Second {
				t.Errorf("%s %s took %v", cmd.name, filepath.Base(tc.file), took)
			}
		}
	}
	// What a real configuration does at one level stays accepted: a long
	// list, a chain of 200 steps, and a multi-line object.
	ok := write("ok.hcl", attr("["+strings.Repeat("\"x\",\n", 5_000)+"]")+"x = a"+strings.Repeat(".b", 200)+"\ny = {\n"+strings.Repeat("  k = -1\n", 500)+"}\n")
	if p := hclconfig.CheckConfigSource(mustRead(t, ok), ok, false); p.HasErrors() {
		t.Errorf("a real configuration refused: %v", p)
	}
}

// TestValidateManyDiagnostics: 5,000 bad blocks (51 KB) and 10,000 (101 KB)
// print 50 diagnostics in full and "and N more", and -json still lists
// every one. The time bound is a guard against a writer that scans the
// whole file for each diagnostic (minutes at these sizes), far above what
// a loaded machine under -race takes; it is not a speed goal.
func TestValidateManyDiagnostics(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []int{5_000, 10_000} {
		p := filepath.Join(dir, fmt.Sprintf("bad%d.hcl", n))
		if err := os.WriteFile(p, []byte(strings.Repeat("bogus_ {}\n", n)), 0o644); err != nil {
			t.Fatal(err)
		}
		var stdout, stderr bytes.Buffer
		validateMain([]string{"-json", p}, &stdout, &stderr)
		var got struct{ Diagnostics []jsonDiagnostic }
		if err := json.Unmarshal(stdout.Bytes(), &got); err != nil || len(got.Diagnostics) < n {
			t.Fatalf("%d bad blocks: -json lists %d diagnostics (%v)", n, len(got.Diagnostics), err)
		}
		stdout.Reset()
		stderr.Reset()
		start := time.Now()
		code := validateMain([]string{p}, &stdout, &stderr)
		took := time.Since(start)
		out := stderr.String()
		heads := len(diagnosticTexts(out, p))
		if code != 1 || heads != 50 || !strings.HasSuffix(out, fmt.Sprintf("and %d more (validate -json lists them all)\n", len(got.Diagnostics)-50)) {
			t.Errorf("%d bad blocks: exit %d, %d diagnostics printed\n%s", n, code, heads, out[max(0, len(out)-600):])
		}
		if took > 20*time.Second {
			t.Errorf("%d bad blocks (%d KB): validate took %v", n, len(strings.Repeat("bogus_ {}\n", n))/1000, took)
		}
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// jsonDiagnostic is one problem in validate -json output, as a script
// reads it; written out here, not borrowed from the renderer, so that a
// change to the format fails this test.
type jsonDiagnostic struct {
	Severity  string `json:"severity"`
	Summary   string `json:"summary"`
	Detail    string `json:"detail"`
	Filename  string `json:"filename"`
	Line      int    `json:"line"`
	Column    int    `json:"column"`
	EndLine   int    `json:"end_line"`
	EndColumn int    `json:"end_column"`
}

// countingPlugin writes an executable at path that appends a line to
// count each time it starts and then becomes the real plugin, so a test
// counts real process starts.
func countingPlugin(t *testing.T, path, real, count string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf("#!/bin/sh\necho start >> %q\nexec %q \"$@\"\n", count, real)
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
}

// starts is how many times a countingPlugin has started.
func starts(t *testing.T, count string) int {
	t.Helper()
	b, err := os.ReadFile(count)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

// manyBlocks writes a configuration of n Slurm provisioner blocks: those
// whose index other says yes name the plugin at otherPath, the rest the
// plugin in pluginDir. extra(i) is added to block i's body, as one line.
// It returns the file and each block's first line (1-based).
func manyBlocks(t *testing.T, dir, pluginDir, otherPath string, n, sshPort int, other func(int) bool, extra func(int) string) (string, []int) {
	t.Helper()
	var b strings.Builder
	line := 1
	write := func(s string) {
		b.WriteString(s)
		line += strings.Count(s, "\n")
	}
	write(fmt.Sprintf("engine {\n  listen     = \"127.0.0.1:0\"\n  plugin_dir = %q\n}\n", pluginDir))
	first := make([]int, n)
	for i := range n {
		first[i] = line
		write(fmt.Sprintf("provisioner \"slurm\" \"p%d\" {\n", i))
		if other(i) {
			write(fmt.Sprintf("  plugin         = %q\n", otherPath))
		}
		write(fmt.Sprintf("  login          = \"slurmuser@127.0.0.1\"\n  ssh_port       = %d\n", sshPort))
		write("  engine_url     = \"http://127.0.0.1:8470\"\n  worker_command = [\"/opt/fluksio/host-example\", \"worker\"]\n")
		write(extra(i) + "\n")
		write("  profile \"cpu\" {\n    cpus   = 2\n    ram_mb = 500\n    sbatch = [\"--partition=debug\", \"--time=00:10:00\"]\n  }\n}\n")
	}
	path := filepath.Join(dir, "many.hcl")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, first
}

// TestValidateManyBlocksOneStartPerPlugin: validate of 200 provisioner
// blocks, 150 naming plugin_dir's plugin and 50 another binary by plugin =
// "…", starts each binary once, not once a block, and
// still reports a bad block among them at its own line and column: one
// the plugin's ValidateConfig refuses (block 137, of the first binary) and
// one the schema refuses (block 171, of the other). With -check, whose
// preflight is per block, 12 blocks still start each binary once, and
// each block's failed login is reported at its own ssh_port.
func TestValidateManyBlocksOneStartPerPlugin(t *testing.T) {
	real := filepath.Join(pluginDir(t), "provisioner-slurm")
	dir := t.TempDir()
	countA, countB := filepath.Join(dir, "a.starts"), filepath.Join(dir, "b.starts")
	countingPlugin(t, filepath.Join(dir, "a", "provisioner-slurm"), real, countA)
	otherPath := filepath.Join(dir, "b", "other-slurm")
	countingPlugin(t, otherPath, real, countB)
	other := func(i int) bool { return i%4 == 3 }

	const n, badPlugin, badSchema = 200, 137, 171
	extra := func(i int) string {
		switch i {
		case badPlugin:
			return `  max_idle       = "5 minutes"`
		case badSchema:
			return `  bogus_setting  = 1`
		}
		return `  max_idle       = "30s"`
	}
	// A block's extra line is its 7th, or its 6th without plugin = "…".
	extraLine := func(first []int, i int) int {
		if other(i) {
			return first[i] + 6
		}
		return first[i] + 5
	}
	path, first := manyBlocks(t, filepath.Join(dir, "cfg"), filepath.Join(dir, "a"), otherPath, n, 2222, other, extra)
	if other(badPlugin) || !other(badSchema) {
		t.Fatal("the bad blocks must be one of each binary")
	}

	var stdout, stderr bytes.Buffer
	code := validateMain([]string{"-json", path}, &stdout, &stderr)
	var got struct{ Diagnostics []jsonDiagnostic }
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("-json output does not parse: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if a, b := starts(t, countA), starts(t, countB); a != 1 || b != 1 {
		t.Errorf("validate of %d blocks started plugin_dir's plugin %d times and the other %d times; want once each", n, a, b)
	}
	want := map[string]bool{
		fmt.Sprintf("%d:20 is not a duration", extraLine(first, badPlugin)):   false,
		fmt.Sprintf("%d:3 Unsupported argument", extraLine(first, badSchema)): false,
	}
	for _, d := range got.Diagnostics {
		if d.Severity != "error" {
			continue
		}
		matched := false
		for w := range want {
			at, fragment, _ := strings.Cut(w, " ")
			if fmt.Sprintf("%d:%d", d.Line, d.Column) == at && strings.Contains(d.Summary+" "+d.Detail, fragment) {
				want[w], matched = true, true
			}
		}
		if !matched {
			t.Errorf("unexpected error at %d:%d: %s: %s", d.Line, d.Column, d.Summary, d.Detail)
		}
	}
	for w, seen := range want {
		if !seen {
			t.Errorf("no error at %s in %+v", w, got.Diagnostics)
		}
	}

	// -check: the preflight logs in for each block, to a port where
	// nothing listens; the plugins are still started once.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	os.Remove(countA)
	os.Remove(countB)
	const m = 12
	path, first = manyBlocks(t, filepath.Join(dir, "check"), filepath.Join(dir, "a"), otherPath, m, closed, other,
		func(int) string { return `  max_idle       = "30s"` })
	stdout.Reset()
	stderr.Reset()
	code = validateMain([]string{"-check", "-json", path}, &stdout, &stderr)
	got.Diagnostics = nil
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("-check -json output does not parse: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	if a, b := starts(t, countA), starts(t, countB); code != 1 || a != 1 || b != 1 {
		t.Errorf("validate -check of %d blocks: exit %d, started plugin_dir's plugin %d times and the other %d times; want exit 1 and once each", m, code, a, b)
	}
	unreachable := map[int]bool{}
	for _, d := range got.Diagnostics {
		if d.Severity == "error" && d.Summary == "Login node unreachable" {
			unreachable[d.Line] = true
		}
	}
	for i := range m {
		at := first[i] + 2 // the ssh_port line
		if other(i) {
			at++
		}
		if !unreachable[at] {
			t.Errorf("block %d: no \"Login node unreachable\" at its ssh_port (line %d) in %+v", i, at, got.Diagnostics)
		}
	}
}

// TestValidateEscapesControlCharacters: a provisioner name with a bidi
// override (refused by the engine) and a profile name with one, an ESC
// sequence and a C1 character (refused by the real plugin) are reported
// at their positions with each character as a visible escape: no byte of
// validate's output, text or -json, is a control, bidi or zero-width
// character.
func TestValidateEscapesControlCharacters(t *testing.T) {
	plugins := pluginDir(t)
	dir := t.TempDir()
	for _, c := range []struct {
		name, block, at, escaped string
	}{
		{"provisioner", `provisioner "slurm" "hpc` + "\u202e" + `txt.exe" {
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  profile "cpu" {}
}

`, ":5:21: error: Invalid provisioner name", `"hpc\u202etxt.exe"`},
		{"profile", `provisioner "slurm" "hpc" {
  login      = "u@127.0.0.1"
  engine_url = "http://127.0.0.1:8470"
  profile "c` + "\u202e" + `pu` + "\x1b[2J\u0085\u2066" + `" {}
}

`, ":8:11: error: Invalid profile name", `c\u202epu\u001b[2J\u0085\u2066`},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, c.name+".hcl")
			src := "engine {\n  plugin_dir = \"" + plugins + "\"\n}\n\n" + c.block
			if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			for _, args := range [][]string{{path}, {"-json", path}} {
				var stdout, stderr bytes.Buffer
				if code := validateMain(args, &stdout, &stderr); code != 1 {
					t.Fatalf("%v: exit %d, want 1\n%s%s", args, code, stdout.String(), stderr.String())
				}
				out := stdout.String() + stderr.String()
				for _, r := range out {
					if r != '\n' && r != '\t' && !unicode.IsGraphic(r) {
						t.Errorf("%v: %U printed raw:\n%s", args, r, out)
						break
					}
				}
				if args[0] == "-json" {
					var got struct{ Diagnostics []jsonDiagnostic }
					if err := json.Unmarshal(stdout.Bytes(), &got); err != nil || len(got.Diagnostics) == 0 || !strings.Contains(got.Diagnostics[0].Detail, `\u202e`) {
						t.Errorf("-json: %v, %+v; want a detail showing \\u202e", err, got.Diagnostics)
					}
					continue
				}
				if !strings.Contains(out, path+c.at) || !strings.Contains(out, c.escaped) {
					t.Errorf("%v: want %q at %s%s:\n%s", args, c.escaped, path, c.at, out)
				}
			}
		})
	}
}
