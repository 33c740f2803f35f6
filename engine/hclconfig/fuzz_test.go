package hclconfig

import (
	"encoding/json"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/fluksio/provision/shared"
)

var fuzzSchema = &shared.Schema{
	Attributes: []shared.Attribute{
		{Name: "login", Type: shared.TypeString, Required: true},
		{Name: "ssh_port", Type: shared.TypeInt, Default: 0},
		{Name: "max_idle", Type: shared.TypeDuration, Default: "5m"},
		{Name: "ratio", Type: shared.TypeNumber},
		{Name: "on", Type: shared.TypeBool, Default: true},
		{Name: "secret", Type: shared.TypeString, Sensitive: true},
		{Name: "worker_command", Type: shared.TypeListString, Default: []string{"w"}},
	},
	Blocks: []shared.BlockType{{Name: "profile", Labels: []string{"name"}, MinItems: 1, Body: &shared.Schema{Attributes: []shared.Attribute{
		{Name: "cpus", Type: shared.TypeInt, Default: 1},
		{Name: "sbatch", Type: shared.TypeListString},
	}}}},
}

// FuzzDecodeConfig: whatever an operator writes, decoding never panics,
// every problem has a place in the file, and what decodes is JSON that
// maps back to ranges for any path a plugin might send.
func FuzzDecodeConfig(f *testing.F) {
	for _, s := range []string{
		"login = \"u@h\"\nprofile \"a\" {\n  cpus = 2\n  sbatch = [\"--x\"]\n}\n",
		"login = 1\nssh_port = 1.5\nmax_idle = \"-1s\"\n",
		"login = \"u\"\nprofile \"a\" {}\nprofile \"b\" { cpus = 99999999999999999999999 }\n",
		"secret = upper(\"x\")\nlogin = \"${1}\"\n",
		"nope = 1\nprofile {}\n",
		"login = \"u\"\nworker_command = [\"a\", null, 3]\nprofile \"a\" { sbatch = \"x\" }\n",
	} {
		f.Add(s, "profile", "0", "sbatch")
	}
	f.Fuzz(func(t *testing.T, src, p0, p1, p2 string) {
		file, diags := hclsyntax.ParseConfig([]byte(src), "fuzz.hcl", hcl.InitialPos)
		if diags.HasErrors() {
			return
		}
		raw, diags := DecodeConfig(file.Body, fuzzSchema, nil)
		for _, d := range diags {
			if d.Subject == nil || d.Summary == "" {
				t.Fatalf("a diagnostic without a place or summary: %+v", d)
			}
		}
		if diags.HasErrors() {
			return
		}
		var v map[string]any
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatalf("DecodeConfig produced invalid JSON %s: %v", raw, err)
		}
		for _, d := range ConfigDiagnostics(file.Body, fuzzSchema, shared.Diagnostics{{Severity: shared.SeverityError, Summary: "x", Path: []string{p0, p1, p2}}}) {
			if d.Subject == nil {
				t.Fatalf("path %q mapped to no range", []string{p0, p1, p2})
			}
		}
	})
}
