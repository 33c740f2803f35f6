// Command filerefs fails when a Go comment names a .go file that is not
// there: a bare file name must be one of the comment's own
// package directory, and a path (host-example/run.go, wire/limits.go)
// must end a path of a file in the module. A comment that cites a file
// is a pointer for the next reader; a stale one sends them nowhere.
//
// Usage: go run ./internal/lint/filerefs [DIR]   (DIR defaults to .)
//
// It reads every .go file below DIR except generated ones (a "Code
// generated" header) and those under testdata, vendor or a dot folder,
// and prints FILE:LINE: names NAME, which does not exist, a line each.
package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// goFileRef is a .go file named in prose: a bare name or a slash path.
var goFileRef = regexp.MustCompile(`[A-Za-z0-9_][A-Za-z0-9_./-]*\.go\b`)

func main() {
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	problems, err := check(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "filerefs:", err)
		os.Exit(2)
	}
	for _, p := range problems {
		fmt.Println(p)
	}
	if len(problems) > 0 {
		fmt.Printf("%d comment(s) name a .go file that does not exist: name the file as it is now, or say what it held\n", len(problems))
		os.Exit(1)
	}
}

// check returns a line for each comment below root that names a missing
// .go file, in file and line order.
func check(root string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, ".go") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	exists := make(map[string]bool, len(files))
	for _, f := range files {
		exists[f] = true
	}
	var problems []string
	fset := token.NewFileSet()
	for _, f := range files {
		src, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return nil, err
		}
		parsed, err := parser.ParseFile(fset, f, src, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		if isGenerated(parsed.Comments) {
			continue
		}
		dir := filepath.ToSlash(filepath.Dir(f))
		for _, group := range parsed.Comments {
			for _, c := range group.List {
				for _, ref := range goFileRef.FindAllString(c.Text, -1) {
					if !found(ref, dir, files, exists) {
						problems = append(problems, fmt.Sprintf("%s:%d: names %s, which does not exist", f, fset.Position(c.Pos()).Line, ref))
					}
				}
			}
		}
	}
	sort.Strings(problems)
	return problems, nil
}

// found says whether ref names a file: a bare name in dir, a path from
// the module's root or from dir, or the end of any file's path.
func found(ref, dir string, files []string, exists map[string]bool) bool {
	ref = strings.TrimPrefix(ref, "./")
	if !strings.Contains(ref, "/") {
		return exists[filepath.ToSlash(filepath.Join(dir, ref))]
	}
	if exists[ref] || exists[filepath.ToSlash(filepath.Join(dir, ref))] {
		return true
	}
	for _, f := range files {
		if strings.HasSuffix(f, "/"+ref) {
			return true
		}
	}
	return false
}

// isGenerated reports the "Code generated ... DO NOT EDIT." header.
func isGenerated(groups []*ast.CommentGroup) bool {
	for _, g := range groups {
		for _, c := range g.List {
			if strings.HasPrefix(c.Text, "// Code generated ") && strings.HasSuffix(c.Text, " DO NOT EDIT.") {
				return true
			}
		}
	}
	return false
}
