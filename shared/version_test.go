package shared

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The contract's version is written once, in the proto's "Versions:"
// line. These are the forms in which other files state the version
// itself, as opposed to the version a feature came in.
var (
	// protoVersionLine is the proto's one statement of the version.
	protoVersionLine = regexp.MustCompile(`(?m)^// Versions: the contract is (\d+\.\d+)\.`)
	// statesTheVersion finds a statement of the current version in the
	// docs and comments: "the contract is 2.7", "the contract is at
	// 2.7", "`contract_version` `2.7`", "contract version 2.7".
	statesTheVersion = regexp.MustCompile("(?i)(?:contract is (?:at )?|`contract_version` `|contract version )(\\d+\\.\\d+)")
	// citesAVersion finds the version a rule or field came in:
	// "contract 2.5", "Since 2.7", "Deprecated since 2.5".
	citesAVersion = regexp.MustCompile(`(?i)\b(?:contract|since) (\d+\.\d+)\b`)
	// changelogSection is a version's heading in CHANGELOG.md.
	changelogSection = regexp.MustCompile(`(?m)^## \[(\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$`)
)

// TestContractVersionHasOneSource holds the contract's version to its
// one source, the proto: ContractVersion is the proto's, every doc and
// comment that states the version states the proto's, no rule in the
// proto cites a later one, and CHANGELOG.md has a section for every
// version the proto cites, the newest being the proto's.
func TestContractVersionHasOneSource(t *testing.T) {
	proto := readRepoFile(t, "shared/proto/provisioner.proto")
	m := protoVersionLine.FindAllStringSubmatch(proto, -1)
	if len(m) != 1 {
		t.Fatalf("shared/proto/provisioner.proto has %d lines %q, want one: it is where the contract's version is written", len(m), "// Versions: the contract is X.Y.")
	}
	version := m[0][1]
	if ContractVersion != version {
		t.Errorf("ContractVersion is %q, the proto says %q: set shared/provisioner.go's constant to the proto's", ContractVersion, version)
	}

	// Where the version is stated: the docs, the README, and the Go
	// comments of the contract's packages (the proto is read above).
	var files []string
	for _, pattern := range []string{"README.md", "docs/*.md", "docs/design/*.md", "shared/*.go", "shared/plugin/*.go", "shared/conformance/*.go"} {
		found, err := filepath.Glob(filepath.Join("..", pattern))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, found...)
	}
	statements := 0
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		text := readRepoFile(t, strings.TrimPrefix(path, "../"))
		for _, para := range paragraphs(text) {
			for _, s := range statesTheVersion.FindAllStringSubmatch(para.text, -1) {
				statements++
				if s[1] != version {
					t.Errorf("%s:%d: states the contract's version as %s, the proto says %s (%q)", strings.TrimPrefix(path, "../"), para.line, s[1], version, s[0])
				}
			}
		}
	}
	if statements == 0 {
		t.Errorf("no doc states the contract's version; docs/plugin-protocol.md should (%q)", "`contract_version` `"+version+"`")
	}

	changelog := readRepoFile(t, "CHANGELOG.md")
	var sections []string
	for _, s := range changelogSection.FindAllStringSubmatch(changelog, -1) {
		sections = append(sections, s[1])
	}
	if len(sections) == 0 || sections[0] != version {
		t.Errorf("CHANGELOG.md's newest version section is %v, want [%s] (its sections: %v)", first(sections), version, sections)
	}
	for _, c := range citesAVersion.FindAllStringSubmatch(proto, -1) {
		if newer(c[1], version) {
			t.Errorf("shared/proto/provisioner.proto cites %q, later than the contract's %s: raise the version line", c[0], version)
		}
		if !slices.Contains(sections, c[1]) {
			t.Errorf("shared/proto/provisioner.proto cites %q; CHANGELOG.md has no section ## [%s]", c[0], c[1])
		}
	}

	// ContractVersion's doc names its source and its history.
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "provisioner.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	doc := constDoc(f, "ContractVersion")
	for _, want := range []string{"shared/proto/provisioner.proto", "CHANGELOG.md"} {
		if !strings.Contains(doc, want) {
			t.Errorf("ContractVersion's doc does not name %s", want)
		}
	}
}

// readRepoFile reads a file by its path from the module's root.
func readRepoFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// paragraph is a paragraph's wrapped lines, or a comment's, joined,
// so that a statement broken across two lines is read whole, with the
// number of its first line.
type paragraph struct {
	line int
	text string
}

func paragraphs(text string) []paragraph {
	var out []paragraph
	var cur []string
	start := 0
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		line = strings.TrimSpace(strings.TrimPrefix(line, "//"))
		if line == "" {
			if cur != nil {
				out = append(out, paragraph{start, strings.Join(cur, " ")})
				cur = nil
			}
			continue
		}
		if cur == nil {
			start = i + 1
		}
		cur = append(cur, line)
	}
	if cur != nil {
		out = append(out, paragraph{start, strings.Join(cur, " ")})
	}
	return out
}

// constDoc is the doc comment of the constant name in f.
func constDoc(f *ast.File, name string) string {
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			v := s.(*ast.ValueSpec)
			for _, n := range v.Names {
				if n.Name != name {
					continue
				}
				if v.Doc != nil {
					return v.Doc.Text()
				}
				return g.Doc.Text()
			}
		}
	}
	return ""
}

// newer reports whether version a is later than b (both "major.minor").
func newer(a, b string) bool {
	am, an := split(a)
	bm, bn := split(b)
	return am > bm || am == bm && an > bn
}

func split(v string) (major, minor int) {
	ma, mi, _ := strings.Cut(v, ".")
	major, _ = strconv.Atoi(ma)
	minor, _ = strconv.Atoi(mi)
	return major, minor
}

func first(list []string) string {
	if len(list) == 0 {
		return "none"
	}
	return "[" + list[0] + "]"
}
