package sandboxtest

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeDocumentsTheSandbox keeps docs/development.md's sandbox table
// honest: every SANDBOX_ variable the sandbox scripts read or export is
// named there. TestReadmeGoVersionIsGoMod keeps the Go version the
// README's quick start asks for go.mod's.
func TestReadmeDocumentsTheSandbox(t *testing.T) {
	root := ModuleRoot()
	readme := read(t, filepath.Join(root, "docs/development.md"))
	scripts, err := filepath.Glob(filepath.Join(root, "sandbox", "*.sh"))
	if err != nil || len(scripts) == 0 {
		t.Fatalf("no sandbox scripts: %v", err)
	}
	seen := map[string]bool{}
	for _, f := range scripts {
		for _, v := range regexp.MustCompile(`SANDBOX_[A-Z_]*[A-Z]`).FindAllString(read(t, f), -1) {
			seen[v] = true
		}
	}
	if len(seen) < 10 {
		t.Fatalf("found only %d SANDBOX_ variables in sandbox/*.sh; is the pattern still right?", len(seen))
	}
	for v := range seen {
		if !strings.Contains(readme, "`"+v+"`") {
			t.Errorf("docs/development.md does not document %s, which sandbox/ uses", v)
		}
	}
}

func TestReadmeGoVersionIsGoMod(t *testing.T) {
	root := ModuleRoot()
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindStringSubmatch(read(t, filepath.Join(root, "go.mod")))
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	for _, f := range []string{"README.md", ".ci/run"} {
		if want := "Go " + m[1] + " or later"; !strings.Contains(read(t, filepath.Join(root, f)), want) {
			t.Errorf("%s does not say %q, which go.mod's go line asks for", f, want)
		}
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
