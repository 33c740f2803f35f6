package hclconfig

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"

	"github.com/fluksio/provision/shared"
)

// testConfigSchema resembles a Slurm provisioner's schema.
func testConfigSchema() *shared.Schema {
	return &shared.Schema{
		Attributes: []shared.Attribute{
			{Name: "login", Type: shared.TypeString, Required: true},
			{Name: "ssh_port", Type: shared.TypeInt},
			{Name: "max_idle", Type: shared.TypeDuration, Default: "5m"},
			{Name: "worker_command", Type: shared.TypeListString, Default: []string{"fluksio-worker"}},
			{Name: "password", Type: shared.TypeString, Sensitive: true},
		},
		Blocks: []shared.BlockType{{
			Name:     "profile",
			Labels:   []string{"name"},
			MinItems: 1,
			Body: &shared.Schema{Attributes: []shared.Attribute{
				{Name: "cpus", Type: shared.TypeInt, Default: 1},
				{Name: "gpus", Type: shared.TypeInt, Default: 0},
				{Name: "labels", Type: shared.TypeListString},
				{Name: "sbatch", Type: shared.TypeListString},
			}},
		}},
	}
}

// testEvalContext offers a function whose errors quote their argument,
// to show that a sensitive value cannot leak through them.
func testEvalContext() *hcl.EvalContext {
	return &hcl.EvalContext{Functions: map[string]function.Function{
		"tonumber": stdlib.MakeToFunc(cty.Number),
	}}
}

// parseConfig parses src as native syntax, or JSON when the name ends in
// .json, with a parser whose files stay available for positions.
func parseConfig(t *testing.T, name string, src []byte) hcl.Body {
	t.Helper()
	p := hclparse.NewParser()
	var f *hcl.File
	var diags hcl.Diagnostics
	if strings.HasSuffix(name, ".json") {
		f, diags = p.ParseJSON(src, name)
	} else {
		f, diags = p.ParseHCL(src, name)
	}
	if diags.HasErrors() {
		t.Fatalf("parse %s: %s", name, diags.Error())
	}
	return f.Body
}

func readTestdata(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "hclconfig", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeConfigGood(t *testing.T) {
	want := strings.TrimSpace(string(readTestdata(t, "good.json")))
	for _, name := range []string{"good.hcl", "good.hcl.json"} {
		t.Run(name, func(t *testing.T) {
			body := parseConfig(t, name, readTestdata(t, name))
			got, diags := DecodeConfig(body, testConfigSchema(), testEvalContext())
			if len(diags) > 0 {
				t.Fatalf("unexpected diagnostics: %s", diags.Error())
			}
			if string(got) != want {
				t.Errorf("JSON:\n got %s\nwant %s", got, want)
			}
		})
	}
}

// wantDiag is one expected diagnostic: substrings of its summary and
// detail, and where it starts when line is not 0.
type wantDiag struct {
	summary, detail string
	line, col       int
}

func TestDecodeConfigErrors(t *testing.T) {
	const profile = "\nprofile \"cpu\" {}\n"
	tests := []struct {
		name   string
		schema *shared.Schema
		src    string
		want   []wantDiag
	}{
		{
			name: "missing required",
			src:  `ssh_port = 22` + profile,
			want: []wantDiag{{"Missing required argument", `"login" is required`, 1, 1}},
		},
		{
			name: "required but null",
			src:  `login = null` + profile,
			want: []wantDiag{{"Missing required argument", `must not be null`, 1, 9}},
		},
		{
			name: "unknown attribute lists allowed names",
			src:  "login = \"a\"\ncolour = \"red\"" + profile,
			want: []wantDiag{{"Unsupported argument", `"colour" is not expected here. Use one of: login, ssh_port, max_idle, worker_command, password.`, 2, 1}},
		},
		{
			name: "misspelt attribute gets a suggestion",
			src:  "logn = \"a\"" + profile,
			want: []wantDiag{
				{"Missing required argument", `"login"`, 1, 1},
				{"Unsupported argument", `Did you mean "login"?`, 1, 1},
			},
		},
		{
			name: "unknown block",
			src:  "login = \"a\"\nzone \"x\" {}" + profile,
			want: []wantDiag{{"Unsupported block type", `"zone" are not expected here. Use one of: profile.`, 2, 1}},
		},
		{
			name: "unknown attribute in a block",
			src:  "login = \"a\"\nprofile \"cpu\" {\n  memory = 4\n}\n",
			want: []wantDiag{{"Unsupported argument", `Use one of: cpus, gpus, labels, sbatch.`, 3, 3}},
		},
		{
			name: "missing label",
			src:  "login = \"a\"\nprofile {}\n",
			want: []wantDiag{
				{"Missing profile block", `At least 1 "profile"`, 1, 1},
				{"Missing name for profile", `must have 1 labels (name)`, 2, 9},
			},
		},
		{
			name: "string for an int",
			src:  "login = \"a\"\nssh_port = \"twenty\"" + profile,
			want: []wantDiag{{"Incorrect attribute value type", `"ssh_port": a number is required. Use a whole number`, 2, 12}},
		},
		{
			name: "string for a list",
			src:  "login = \"a\"\nworker_command = \"w\"" + profile,
			want: []wantDiag{{"Incorrect attribute value type", `"worker_command": list of string required, but have string. Use a list of strings`, 2, 18}},
		},
		{
			name: "bad list element is reported at the element",
			src:  "login = \"a\"\nworker_command = [\"w\", [\"x\"]]" + profile,
			want: []wantDiag{{"Incorrect attribute value type", `string required`, 2, 24}},
		},
		{
			name: "null list element",
			src:  "login = \"a\"\nworker_command = [\"w\", null]" + profile,
			want: []wantDiag{{`Invalid value for "worker_command"`, `Element 1 of "worker_command" is null`, 2, 24}},
		},
		{
			name: "non-whole int",
			src:  "login = \"a\"\nssh_port = 22.5" + profile,
			want: []wantDiag{{`Invalid value for "ssh_port"`, `must be a whole number (got 22.5)`, 2, 12}},
		},
		{
			name: "non-whole int in a block",
			src:  "login = \"a\"\nprofile \"cpu\" {\n  cpus = 1.5\n}\n",
			want: []wantDiag{{`Invalid value for "cpus"`, `must be a whole number`, 3, 10}},
		},
		{
			name: "bad duration",
			src:  "login = \"a\"\nmax_idle = \"5 minutes\"" + profile,
			want: []wantDiag{{`Invalid duration for "max_idle"`, `"5 minutes" is not a duration. Use a number with a unit, such as "30s", "5m" or "1h".`, 2, 12}},
		},
		{
			name: "negative duration",
			src:  "login = \"a\"\nmax_idle = \"-1m\"" + profile,
			want: []wantDiag{{`Invalid duration for "max_idle"`, `must be longer than zero. Use a number with a unit`, 2, 12}},
		},
		{
			name: "zero duration",
			src:  "login = \"a\"\nmax_idle = \"0s\"" + profile,
			want: []wantDiag{{`Invalid duration for "max_idle"`, `must be longer than zero`, 2, 12}},
		},
		{
			name: "no profile block",
			src:  "login = \"a\"\n",
			want: []wantDiag{{"Missing profile block", `Add one such as profile "<name>" { ... }.`, 1, 1}},
		},
		{
			name: "too many blocks",
			schema: &shared.Schema{Blocks: []shared.BlockType{{
				Name: "profile", Labels: []string{"name"}, MaxItems: 1,
			}}},
			src:  "profile \"a\" {}\nprofile \"b\" {}\n",
			want: []wantDiag{{"Too many profile blocks", `At most 1 "profile" block(s)`, 2, 1}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			schema := tt.schema
			if schema == nil {
				schema = testConfigSchema()
			}
			body := parseConfig(t, "test.hcl", []byte(tt.src))
			got, diags := DecodeConfig(body, schema, testEvalContext())
			if got != nil {
				t.Errorf("JSON = %s, want nil on errors", got)
			}
			checkDiags(t, diags, tt.want)
		})
	}
}

func checkDiags(t *testing.T, diags hcl.Diagnostics, want []wantDiag) {
	t.Helper()
	if len(diags) != len(want) {
		t.Errorf("got %d diagnostics, want %d:\n%s", len(diags), len(want), diags.Error())
	}
	for _, d := range diags {
		if d.Subject == nil || d.Subject.Filename == "" {
			t.Errorf("diagnostic %q has no source range", d.Summary)
		}
		if d.Detail == "" {
			t.Errorf("diagnostic %q has no detail", d.Summary)
		}
	}
	for _, w := range want {
		found := false
		for _, d := range diags {
			if !strings.Contains(d.Summary, w.summary) || !strings.Contains(d.Detail, w.detail) {
				continue
			}
			found = true
			if w.line != 0 && d.Subject != nil && (d.Subject.Start.Line != w.line || d.Subject.Start.Column != w.col) {
				t.Errorf("%q at %d:%d, want %d:%d", d.Summary, d.Subject.Start.Line, d.Subject.Start.Column, w.line, w.col)
			}
		}
		if !found {
			t.Errorf("no diagnostic with summary %q and detail %q in:\n%s", w.summary, w.detail, diags.Error())
		}
	}
}

func TestDecodeConfigSensitive(t *testing.T) {
	const secret = "hunter2"
	schema := testConfigSchema()
	schema.Attributes = append(schema.Attributes,
		shared.Attribute{Name: "secret_ttl", Type: shared.TypeDuration, Sensitive: true},
		shared.Attribute{Name: "secret_port", Type: shared.TypeInt, Sensitive: true},
	)
	src := `login = "a"
password = tonumber("hunter2")
secret_ttl = "hunter2"
secret_port = 2.5
profile "cpu" {}
`
	body := parseConfig(t, "test.hcl", []byte(src))
	_, diags := DecodeConfig(body, schema, testEvalContext())
	if len(diags) != 3 {
		t.Fatalf("got %d diagnostics, want 3:\n%s", len(diags), diags.Error())
	}
	// Render as a host would, but without the source files: the snippet
	// of source is the user's own text, everything else is ours.
	var buf bytes.Buffer
	w := hcl.NewDiagnosticTextWriter(&buf, nil, 0, false)
	if err := w.WriteDiagnostics(diags); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), secret) || strings.Contains(buf.String(), "2.5") {
		t.Errorf("a sensitive value is echoed:\n%s", buf.String())
	}
	for _, d := range diags {
		if d.Expression != nil || d.EvalContext != nil {
			t.Errorf("%q carries its expression, which the text writer would print", d.Summary)
		}
		if d.Subject == nil {
			t.Errorf("%q has no range", d.Summary)
		}
	}

	// The same function on a non-sensitive attribute does quote its
	// argument, so the check above is not vacuous.
	body = parseConfig(t, "test.hcl", []byte("login = tonumber(\"hunter2\")\nprofile \"cpu\" {}\n"))
	_, diags = DecodeConfig(body, testConfigSchema(), testEvalContext())
	if !strings.Contains(diags.Error(), secret) {
		t.Errorf("expected the non-sensitive diagnostic to quote the value: %s", diags.Error())
	}
}

func TestConfigDiagnosticsPaths(t *testing.T) {
	for _, name := range []string{"good.hcl", "good.hcl.json"} {
		t.Run(name, func(t *testing.T) {
			body := parseConfig(t, name, readTestdata(t, name))
			native := !strings.HasSuffix(name, ".json")
			tests := []struct {
				path      []string
				line, col int // for native syntax only
			}{
				{[]string{"profile", "1", "sbatch", "0"}, 14, 13},
				{[]string{"profile", "1", "sbatch", "1"}, 14, 29},
				{[]string{"profile", "0", "name"}, 7, 9},
				{[]string{"profile", "1"}, 12, 1},
				{[]string{"login"}, 2, 18},
				{[]string{"worker_command", "9"}, 4, 18}, // no such element: the whole list
				{[]string{"profile", "0", "gpus"}, 7, 1}, // defaulted: the block header
				{[]string{"profile", "0", "nope"}, 7, 1},
				{[]string{"profile", "5"}, 1, 1},
				{[]string{}, 1, 1},
				{[]string{"nope"}, 1, 1},
				{[]string{"max_idle"}, 1, 1}, // defaulted at the top level
			}
			var in shared.Diagnostics
			for _, tt := range tests {
				in = append(in, shared.Errorf(tt.path, "Bad", "detail"))
			}
			in = append(in, shared.Diagnostic{Severity: shared.SeverityWarning, Summary: "Careful", Detail: "d", Path: []string{"login"}})
			out := ConfigDiagnostics(body, testConfigSchema(), in)
			if len(out) != len(in) {
				t.Fatalf("got %d diagnostics, want %d", len(out), len(in))
			}
			for i, tt := range tests {
				d := out[i]
				if d.Subject == nil || d.Subject.Filename != name || d.Subject.Start.Line == 0 {
					t.Errorf("%v: no range: %#v", tt.path, d.Subject)
					continue
				}
				if d.Severity != hcl.DiagError || d.Summary != "Bad" || d.Detail != "detail" {
					t.Errorf("%v: copied wrongly: %+v", tt.path, d)
				}
				if native && (d.Subject.Start.Line != tt.line || d.Subject.Start.Column != tt.col) {
					t.Errorf("%v: at %d:%d, want %d:%d", tt.path, d.Subject.Start.Line, d.Subject.Start.Column, tt.line, tt.col)
				}
			}
			if out[len(out)-1].Severity != hcl.DiagWarning {
				t.Errorf("warning became %v", out[len(out)-1].Severity)
			}
			// In JSON, check the element mapping by its text rather than
			// its position.
			if !native {
				src := readTestdata(t, name)
				r := out[0].Subject
				if got := string(src[r.Start.Byte:r.End.Byte]); got != `"--gres=gpu:2"` {
					t.Errorf("profile.1.sbatch.0 maps to %s", got)
				}
				r = out[2].Subject
				if got := string(src[r.Start.Byte:r.End.Byte]); got != `"cpu"` {
					t.Errorf("profile.0.name maps to %s", got)
				}
			}
		})
	}
}

// TestConfigRemainBody decodes the body gohcl leaves after the host took
// its meta-arguments, as the host does.
func TestConfigRemainBody(t *testing.T) {
	src := `provisioner "slurm" "hpc" {
  plugin = "./fluksio-slurm"
  login  = "alice"
  profile "cpu" {
    sbatch = ["--qos=low"]
  }
}
`
	type provisioner struct {
		Kind   string   `hcl:"kind,label"`
		Name   string   `hcl:"name,label"`
		Plugin string   `hcl:"plugin,optional"`
		Rest   hcl.Body `hcl:",remain"`
	}
	var root struct {
		Provisioners []provisioner `hcl:"provisioner,block"`
	}
	body := parseConfig(t, "main.hcl", []byte(src))
	if diags := gohcl.DecodeBody(body, nil, &root); diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	p := root.Provisioners[0]
	if p.Plugin != "./fluksio-slurm" {
		t.Fatalf("plugin = %q", p.Plugin)
	}

	got, diags := DecodeConfig(p.Rest, testConfigSchema(), nil)
	if len(diags) > 0 {
		t.Fatalf("unexpected diagnostics: %s", diags.Error())
	}
	var obj map[string]any
	if err := json.Unmarshal(got, &obj); err != nil {
		t.Fatal(err)
	}
	if _, ok := obj["plugin"]; ok {
		t.Errorf("the host's plugin argument leaked into the JSON: %s", got)
	}
	if obj["login"] != "alice" {
		t.Errorf("login = %v in %s", obj["login"], got)
	}

	out := ConfigDiagnostics(p.Rest, testConfigSchema(), shared.Diagnostics{
		shared.Errorf([]string{"profile", "0", "sbatch", "0"}, "Bad", "d"),
		shared.Errorf([]string{"plugin"}, "Bad", "d"),
		shared.Errorf(nil, "Bad", "d"),
	})
	at := func(i int) [2]int { return [2]int{out[i].Subject.Start.Line, out[i].Subject.Start.Column} }
	if got := at(0); got != [2]int{5, 15} {
		t.Errorf("sbatch element at %v, want 5:15", got)
	}
	// The plugin cannot address the host's meta-argument: its path is
	// unknown to the schema and so maps to the whole block body.
	if got := at(1); got != [2]int{1, 27} {
		t.Errorf("plugin at %v, want the body at 1:27", got)
	}
	if got := at(2); got != [2]int{1, 27} {
		t.Errorf("empty path at %v, want the body at 1:27", got)
	}

	// A name the plugin does not know is still reported in a remain body.
	bad := strings.Replace(src, `login  = "alice"`, `login = "alice"
  colour = "red"`, 1)
	root.Provisioners = nil
	if diags := gohcl.DecodeBody(parseConfig(t, "main.hcl", []byte(bad)), nil, &root); diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	_, diags = DecodeConfig(root.Provisioners[0].Rest, testConfigSchema(), nil)
	checkDiags(t, diags, []wantDiag{{"Unsupported argument", `"colour"`, 4, 3}})
}

// TestStringOrList: a string or a list of strings, passed on as written;
// a bad element is reported at its own position, and the plugin's path
// to an element comes back to that element.
func TestStringOrList(t *testing.T) {
	s := &shared.Schema{Attributes: []shared.Attribute{{Name: "login", Type: shared.TypeStringOrList, Required: true}}}
	for _, tc := range []struct{ src, want string }{
		{`login = "a@h"`, `{"login":"a@h"}`},
		{`login = ["a@h", "b@g:2222"]`, `{"login":["a@h","b@g:2222"]}`},
	} {
		raw, diags := DecodeConfig(parseConfig(t, "c.hcl", []byte(tc.src)), s, nil)
		if diags.HasErrors() || string(raw) != tc.want {
			t.Errorf("%s: got %s %v, want %s", tc.src, raw, diags, tc.want)
		}
	}
	body := parseConfig(t, "c.hcl", []byte("login = [\"a@h\",\n  true,\n  {}]\n"))
	_, diags := DecodeConfig(body, s, nil)
	if !diags.HasErrors() || diags[0].Subject.Start.Line != 3 {
		t.Errorf("an object in the list: %v, want an error at line 3", diags)
	}
	body = parseConfig(t, "c.hcl", []byte("login = [\"a@h\",\n  \"-b\"]\n"))
	got := ConfigDiagnostics(body, s, shared.Diagnostics{shared.Errorf([]string{"login", "1"}, "Invalid login", "no")})
	if got[0].Subject.Start.Line != 2 || got[0].Subject.Start.Column != 3 {
		t.Errorf("the path login.1 went to %v, want line 2 column 3", got[0].Subject)
	}
}

// TestWriteDiagnosticsEscapes: a diagnostic whose summary, detail, file
// name and source line carry control and bidi characters (as a hostile
// plugin's diagnostic or a crafted file would) is printed with each as a
// visible escape, in text and in JSON; the JSON still decodes to the
// text the diagnostic held, and the first line stays one line.
func TestWriteDiagnosticsEscapes(t *testing.T) {
	const evil = "\u202e\x1b[2J\u0085\u2066\x7f"
	name := "cfg" + evil + "\n.hcl"
	src := []byte("provisioner \"slurm\" \"hpc" + evil + "\" {}\n")
	rng := &hcl.Range{Filename: name, Start: hcl.Pos{Line: 1, Column: 21, Byte: 20}, End: hcl.Pos{Line: 1, Column: 30, Byte: 29}}
	diags := hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Bad " + evil + "\nforged:1:1: error: x", Detail: "detail " + evil, Subject: rng}}
	raw := func(s string) (rune, bool) {
		for _, r := range s {
			if r != '\n' && r != '\t' && !unicode.IsGraphic(r) {
				return r, true
			}
		}
		return 0, false
	}

	var text bytes.Buffer
	WriteDiagnostics(&text, map[string]*hcl.File{name: {Bytes: src}}, diags)
	if r, ok := raw(text.String()); ok {
		t.Errorf("text: %U printed raw:\n%s", r, text.String())
	}
	first, _, _ := strings.Cut(text.String(), "\n")
	if want := `cfg\u202e\u001b[2J\u0085\u2066\u007f\u000a.hcl:1:21: error: Bad \u202e\u001b[2J\u0085\u2066\u007f\u000aforged:1:1: error: x`; first != want {
		t.Errorf("first line %q; want %q", first, want)
	}
	if !strings.Contains(text.String(), `   1: provisioner "slurm" "hpc\u202e\u001b[2J\u0085\u2066\u007f" {}`) {
		t.Errorf("the source line is not escaped:\n%s", text.String())
	}

	var js bytes.Buffer
	if err := WriteDiagnosticsJSON(&js, diags); err != nil {
		t.Fatal(err)
	}
	if r, ok := raw(js.String()); ok {
		t.Errorf("json: %U printed raw:\n%s", r, js.String())
	}
	var back struct{ Diagnostics []jsonDiagnostic }
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Diagnostics) != 1 || back.Diagnostics[0].Detail != diags[0].Detail || back.Diagnostics[0].Filename != name {
		t.Errorf("json reads back %+v, %v; want the diagnostic as it was", back.Diagnostics, err)
	}
}
