// Command docrefs fails when the docs cite a test or a file that is not
// there. The docs (README.md and docs/, design records included) say
// which test keeps each claim and where a thing lives; a test renamed or
// a file moved leaves the claim pointing nowhere, which no compiler and
// no test sees. filerefs does the same for Go comments.
//
// Usage: go run ./internal/lint/docrefs [DIR]   (DIR defaults to .)
//
// What it checks, in README.md and every .md file below docs/:
//   - a test name (TestXxx, FuzzXxx, BenchmarkXxx) must be a function of
//     a test file of the module; TestXxx* and TestXxx… must start one;
//   - a relative link's target, [text](path#anchor), must exist, read
//     from the document's directory;
//   - a path in the text (engine/host/launch_test.go, sandbox/up.sh,
//     engine/internal/park) must exist when it starts at one of the
//     module's top-level entries (but bin/, which builds fill); a .go or
//     .md path that starts elsewhere (wire/limits.go), or the bare name
//     of one, must end the path of a file of the module.
//
// Absolute paths, URLs and paths with a variable or placeholder in them
// ($SANDBOX_DIR/env.sh, <dir>/x, {a,b}.go) are the reader's machine's,
// not the module's, and are not checked. CHANGELOG.md is history: it
// names what was, and is not checked.
//
// It prints FILE:LINE: cites NAME, which does not exist, a line each,
// and exits 1 if there is any.
package main

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

var (
	// testName is a test, fuzz target or benchmark named in prose, with
	// a trailing * or … when it stands for every test it starts, or
	// declared in an example (func TestXxx).
	testName = regexp.MustCompile(`(?:func )?\b(?:Test|Fuzz|Benchmark)[A-Z0-9][A-Za-z0-9_]*(?:\*|…)?`)
	// testFunc is a test function's declaration.
	testFunc = regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Benchmark)[A-Za-z0-9_]*)\(`)
	// link is a Markdown link's target.
	link = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// pathRef is a slash path, or a bare name of a Go file or a
	// document, named in prose.
	pathRef = regexp.MustCompile(`[A-Za-z0-9_.$~<>{}*-]*(?:/[A-Za-z0-9_.$~<>{}*-]+)+/?|\b[A-Za-z0-9_-]+\.(?:go|md)\b`)
)

func main() {
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	problems, err := check(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "docrefs:", err)
		os.Exit(2)
	}
	for _, p := range problems {
		fmt.Println(p)
	}
	if len(problems) > 0 {
		fmt.Printf("%d citation(s) in the docs name a test or a file that does not exist: cite it as it is now, or say what it showed\n", len(problems))
		os.Exit(1)
	}
}

// module is what the docs may cite: the module's files and directories
// and its tests.
type module struct {
	files, dirs map[string]bool
	paths       []string // files and directories, for suffix matches
	top         map[string]bool
	tests       []string
}

// check returns a line for each citation below root that names a test
// or a file that does not exist, in file and line order.
func check(root string) ([]string, error) {
	m, err := scan(root)
	if err != nil {
		return nil, err
	}
	docs := []string{"README.md"}
	for f := range m.files {
		if strings.HasPrefix(f, "docs/") && strings.HasSuffix(f, ".md") {
			docs = append(docs, f)
		}
	}
	sort.Strings(docs)
	var problems []string
	for _, doc := range docs {
		if !m.files[doc] {
			continue
		}
		found, err := checkDoc(root, doc, m)
		if err != nil {
			return nil, err
		}
		problems = append(problems, found...)
	}
	return problems, nil
}

// scan walks the module below root.
func scan(root string) (*module, error) {
	m := &module{files: map[string]bool{}, dirs: map[string]bool{}, top: map[string]bool{}}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel == "." {
			return nil
		}
		name := d.Name()
		if d.IsDir() {
			if strings.HasPrefix(name, ".") || rel == "bin" || name == "__pycache__" {
				return filepath.SkipDir
			}
			m.dirs[rel] = true
		} else {
			m.files[rel] = true
		}
		m.paths = append(m.paths, rel)
		if !strings.Contains(rel, "/") {
			m.top[rel] = true
		}
		if strings.HasSuffix(name, "_test.go") {
			src, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for _, t := range testFunc.FindAllSubmatch(src, -1) {
				m.tests = append(m.tests, string(t[1]))
			}
		}
		return nil
	})
	return m, err
}

// checkDoc returns the problems of one document.
func checkDoc(root, doc string, m *module) ([]string, error) {
	f, err := os.Open(filepath.Join(root, doc))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var problems []string
	say := func(line int, name string) {
		problems = append(problems, fmt.Sprintf("%s:%d: cites %s, which does not exist", doc, line, name))
	}
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for line := 1; s.Scan(); line++ {
		text := s.Text()
		for _, t := range testName.FindAllString(text, -1) {
			if strings.HasPrefix(t, "func ") {
				continue // an example's own test
			}
			if !m.hasTest(t) {
				say(line, t)
			}
		}
		for _, l := range link.FindAllStringSubmatch(text, -1) {
			target := l[1]
			if i := strings.IndexByte(target, '#'); i >= 0 {
				target = target[:i]
			}
			if target == "" || strings.Contains(target, ":") {
				continue // an anchor in this document, or a URL
			}
			p := path.Clean(path.Join(path.Dir(doc), target))
			if !m.files[p] && !m.dirs[p] {
				say(line, target)
			}
		}
		for _, ref := range pathRef.FindAllString(link.ReplaceAllString(text, "]"), -1) {
			if !m.hasPath(ref) {
				say(line, ref)
			}
		}
	}
	return problems, s.Err()
}

// hasTest says whether t names a test of the module, or with a trailing
// * the start of one.
func (m *module) hasTest(t string) bool {
	prefix, star := strings.CutSuffix(t, "*")
	if !star {
		prefix, star = strings.CutSuffix(t, "…")
	}
	for _, have := range m.tests {
		if have == t || star && strings.HasPrefix(have, prefix) {
			return true
		}
	}
	return false
}

// hasPath says whether ref, a path or file name in prose, is the
// module's, or not the module's to check.
func (m *module) hasPath(ref string) bool {
	ref = strings.TrimRight(ref, ".,;:")
	if strings.ContainsAny(ref, "$~<>{}*") || strings.HasPrefix(ref, "/") || strings.Contains(ref, "//") {
		return true // the reader's machine, a placeholder, or a URL
	}
	clean := strings.TrimSuffix(strings.TrimPrefix(ref, "./"), "/")
	if m.files[clean] || m.dirs[clean] {
		return true
	}
	// A package's identifier (shared/plugin.Serve) is its package's.
	if ext := path.Ext(clean); len(ext) > 1 && 'A' <= ext[1] && ext[1] <= 'Z' && m.dirs[strings.TrimSuffix(clean, ext)] {
		return true
	}
	first, _, nested := strings.Cut(clean, "/")
	switch {
	case first == "bin":
		return true // what a build makes
	case nested && m.top[first]:
		return false // from the module's top, and not there
	case path.Ext(clean) != ".go" && path.Ext(clean) != ".md" || first == "..":
		// Not the module's: a user's file (config.hcl, out/frame.png),
		// a word pair (cpu/gpu), HTTP/1.1, or a link's own business.
		return true
	}
	// A Go file or a document by the end of its path (wire/limits.go),
	// or by its name alone.
	for _, p := range m.paths {
		if strings.HasSuffix(p, "/"+clean) {
			return true
		}
	}
	return false
}
