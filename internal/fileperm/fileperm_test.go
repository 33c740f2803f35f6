package fileperm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheck: the rule on each case it names. A file of ours at 0644 in a
// directory of ours passes, and so does one in a sticky directory of
// root's or ours (as /tmp); a file writable by group or others, one
// owned by another uid, one in a directory others can write without
// the sticky bit or in a sticky one another uid owns, and a missing one
// where others can create it are refused, each with its path, its mode
// or owner, and the fix. A symbolic link is judged by its target.
func TestCheck(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("gives files to uid 65534: needs root")
	}
	dir := t.TempDir()
	mk := func(name string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	mkdir := func(name string, mode os.FileMode, uid int) string {
		p := filepath.Join(dir, name)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := mk("good", 0o644)
	anyone := mk("anyone", 0o666)
	group := mk("group", 0o664)
	foreign := mk("foreign", 0o644)
	if err := os.Chown(foreign, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	open := mkdir("open", 0o777, 0)
	inOpen := filepath.Join(open, "f")
	if err := os.WriteFile(inOpen, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	sticky := mkdir("sticky", 0o777|os.ModeSticky, 0)
	inSticky := filepath.Join(sticky, "f")
	if err := os.WriteFile(inSticky, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	theirs := mkdir("theirs", 0o777|os.ModeSticky, 65534)
	inTheirs := filepath.Join(theirs, "f")
	if err := os.WriteFile(inTheirs, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(anyone, link); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path string
		why, fix   string // "" and "": passes
	}{
		{"own 0644", good, "", ""},
		{"in a sticky directory of root's", inSticky, "", ""},
		{"0666", anyone, anyone + " is writable by group or others (mode 0666)", "chmod go-w " + anyone},
		{"0664", group, "mode 0664", "chmod go-w " + group},
		{"another uid's", foreign, "owned by uid 65534", "chown 0 " + foreign},
		{"in a directory others can write", inOpen, "its directory " + open + " is writable by group or others (mode 0777)", "chmod go-w " + open},
		{"in a sticky directory of another uid's", inTheirs, "its directory " + theirs + " is owned by uid 65534", "chown 0 " + theirs},
		{"missing in a sticky directory", filepath.Join(sticky, "none"), "does not exist, and its directory " + sticky, "chmod go-w " + sticky},
		{"a link to a 0666 file", link, anyone + " is writable", "chmod go-w " + anyone},
	} {
		p := Check(tc.path)
		switch {
		case tc.why == "" && p != nil:
			t.Errorf("%s: refused: %v", tc.name, p)
		case tc.why != "" && p == nil:
			t.Errorf("%s: passed, want refused for %q", tc.name, tc.why)
		case tc.why != "" && (!strings.Contains(p.Why, tc.why) || !strings.Contains(p.Fix, tc.fix)):
			t.Errorf("%s: %q, want it to say %q and %q", tc.name, p.Error(), tc.why, tc.fix)
		}
	}
}
