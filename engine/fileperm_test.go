package engine

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fluksio/provision/internal/testutil"
)

// TestLoadConfigRefusesWhatOthersCanWrite: a configuration file of mode
// 0666 is refused at its first line, and a plugin binary of mode 0777 at
// the plugin attribute that names it, or at plugin_dir when the plugin
// is found there; each diagnostic says the path, the mode and chmod go-w
// PATH. The same file and plugin at 0644 and 0755 load without a word.
func TestLoadConfigRefusesWhatOthersCanWrite(t *testing.T) {
	dir := t.TempDir()
	bin := testutil.BuildTestPlugin(t)
	plugins := filepath.Join(dir, "bin")
	if err := os.Mkdir(plugins, 0o755); err != nil {
		t.Fatal(err)
	}
	inDir := filepath.Join(plugins, "provisioner-memory")
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(inDir, data, 0o755); err != nil {
		t.Fatal(err)
	}
	body := "engine {\n  plugin_dir = \"bin\"\n}\nprovisioner \"memory\" \"a\" {\n  plugin   = \"" + bin + "\"\n  greeting = \"hi\"\n}\nprovisioner \"memory\" \"b\" {\n  greeting = \"hi\"\n}\n"
	path := filepath.Join(dir, "engine.hcl")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, diags := LoadConfig(path); diags.HasErrors() {
		t.Fatalf("a file of 0644 and plugins of 0755: %v", diags)
	}
	for f, mode := range map[string]os.FileMode{path: 0o666, bin: 0o777, inDir: 0o777} {
		if err := os.Chmod(f, mode); err != nil {
			t.Fatal(err)
		}
	}
	_, diags := LoadConfig(path)
	want := map[string]struct {
		line int
		says []string
	}{
		"Configuration file others can write": {1, []string{path + " is writable by group or others (mode 0666)", "chmod go-w " + path}},
		"Plugin others can write":             {5, []string{`"a"`, bin + " is writable by group or others (mode 0777)", "chmod go-w " + bin}},
	}
	found := map[int]bool{}
	for _, d := range diags {
		w, ok := want[d.Summary]
		if !ok || d.Subject == nil {
			t.Errorf("unexpected %s: %s (%v)", d.Summary, d.Detail, d.Subject)
			continue
		}
		line := d.Subject.Start.Line
		if d.Summary == "Plugin others can write" && strings.Contains(d.Detail, `"b"`) {
			w.line, w.says = 2, []string{inDir + " is writable by group or others (mode 0777)", "chmod go-w " + inDir}
		}
		found[line] = true
		if line != w.line || d.Subject.Filename != path {
			t.Errorf("%s at %s:%d, want %s:%d", d.Summary, d.Subject.Filename, line, path, w.line)
		}
		for _, s := range w.says {
			if !strings.Contains(d.Detail, s) {
				t.Errorf("%s: %q does not say %q", d.Summary, d.Detail, s)
			}
		}
	}
	if len(found) != 3 {
		t.Errorf("diagnostics at lines %v, want 1, 2 and 5: %v", found, diags)
	}
}
