// Package fileperm is the kit's one rule for files that decide what runs
// or whom it trusts (the engine's configuration file, plugin binaries, the
// worker a plugin ships, known_hosts and ssh_config): such a file is
// refused when someone other than its owner (the engine's user or root)
// can change it. That is OpenSSH's StrictModes ("Bad owner or
// permissions") applied to files ssh never looks at.
//
// The rule, for the file as it would be opened (symbolic links followed,
// since the target is what is read, and the target's directories are
// what lead to it):
//
//   - the file is owned by the engine's user or root, and not writable by
//     group or others;
//   - every directory up to / is owned by the engine's user or root, and
//     is not writable by group or others unless its sticky bit is set
//     (then others may add their own names but not replace ours, as in
//     /tmp);
//   - a file that does not exist yet is refused when the deepest
//     directory that exists is writable by group or others, sticky or
//     not: whoever can write there could create it first.
//
// Rejected: a warning, and a check of the file alone. A warning is read
// after the fact (a block appended to a configuration others can write
// runs its program at the next SIGHUP); and a file of mode 0644 in a
// directory others can write is replaced by a rename as easily as a 0666
// file is rewritten. The cost is an lstat per path element at each
// check, microseconds beside a plugin's start.
//
// What it will not do: see ACLs (a file with an ACL granting write to
// another user passes, as it does in OpenSSH), or follow what a file
// itself names (a script's interpreter, a library it loads). Design
// record: docs/design/slurm-known-hosts-perms.md.
package fileperm

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// Problem says why a file can be changed by someone other than the
// engine's user or root, and what fixes it.
type Problem struct {
	// Path is the file or directory at fault (the file's target when it
	// is a symbolic link).
	Path string
	// Why says who can change it, with its mode or owner.
	Why string
	// Fix is the command or step that removes the problem.
	Fix string
}

// Error is Why and Fix in one sentence.
func (p *Problem) Error() string { return p.Why + "; fix: " + p.Fix }

// Check applies the rule to path, as the engine's user would open it;
// nil when nobody but that user or root can change what it reads there.
// A path that cannot be made absolute is nil: opening it fails anyway.
func Check(path string) *Problem {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil
	}
	exists := true
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	} else {
		exists = false
	}
	me := os.Getuid()
	if exists {
		if p := ownerOrMode(abs, me, "chmod go-w "+abs); p != nil {
			return p
		}
	}
	// creatable: the file is missing and dir is the deepest directory
	// that exists, where whoever can write could create what is missing;
	// above it only replacing a directory matters, which the sticky bit
	// prevents.
	creatable := !exists
	for dir := filepath.Dir(abs); ; dir = filepath.Dir(dir) {
		fi, err := os.Stat(dir)
		if err == nil {
			missing := creatable
			creatable = false
			st, ok := fi.Sys().(*syscall.Stat_t)
			mode := fi.Mode().Perm()
			switch {
			case ok && int(st.Uid) != me && st.Uid != 0:
				return &Problem{Path: dir, Why: fmt.Sprintf("its directory %s is owned by uid %d, who can replace it", dir, st.Uid),
					Fix: fmt.Sprintf("keep the file in a directory owned by the engine's user or root (chown %d %s, or move the file)", me, dir)}
			case mode&0o022 != 0 && missing:
				return &Problem{Path: dir, Why: fmt.Sprintf("%s does not exist, and its directory %s (mode %04o) lets others create it first", abs, dir, mode),
					Fix: fmt.Sprintf("create the file yourself, or use a directory only the engine's user can write (chmod go-w %s)", dir)}
			case mode&0o022 != 0 && fi.Mode()&os.ModeSticky == 0:
				return &Problem{Path: dir, Why: fmt.Sprintf("its directory %s is writable by group or others (mode %04o), who can replace it", dir, mode),
					Fix: "chmod go-w " + dir}
			}
		}
		if dir == filepath.Dir(dir) {
			return nil
		}
	}
}

// ownerOrMode says why the file at path can be changed by someone other
// than uid me or root; nil if it cannot. fix is the advice for a mode.
func ownerOrMode(path string, me int, fix string) *Problem {
	fi, err := os.Stat(path)
	if err != nil {
		return nil
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != me && st.Uid != 0 {
		return &Problem{Path: path, Why: fmt.Sprintf("%s is owned by uid %d, who can change it", path, st.Uid),
			Fix: fmt.Sprintf("chown %d %s, or use a file of the engine's user", me, path)}
	}
	if mode := fi.Mode().Perm(); mode&0o022 != 0 {
		return &Problem{Path: path, Why: fmt.Sprintf("%s is writable by group or others (mode %04o)", path, mode), Fix: fix}
	}
	return nil
}
