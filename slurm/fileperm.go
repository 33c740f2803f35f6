package slurm

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/sshrun"
)

// The files that decide which host key ssh trusts for the login node
// (known_hosts, a UserKnownHostsFile or GlobalKnownHostsFile in
// ssh_options, and ssh_config, which can name either or turn checking
// off in ways `ssh -G` then reads back) are as trusted as the key itself:
// whoever can write one can add their own key for the login node and sit
// in the middle, where every worker credential passes in a batch script.
// So validation refuses such a file when someone other than its owner
// (the engine's user or root) can change it: the file is writable by
// group or others, is owned by another user, or sits in a directory
// others can write without the sticky bit (they could replace it), or
// does not exist yet in a directory others can write (they could create
// it first). This is OpenSSH's own rule for ~/.ssh/config and
// authorized_keys ("Bad owner or permissions"), applied here to files ssh
// does not check.
//
// It is a refusal, not a warning: nothing pins a known_hosts file's
// content as a sha256 pins a plugin binary. The known-hosts files an
// ssh_config names are checked the same way, as `ssh -G` reads them
// (checkEffectiveSSH; docs/design/slurm-known-hosts-perms.md).

// sharedWritable says who besides the engine's user can change the file
// at path, as ssh would open it; "" if nobody can.
func sharedWritable(path string) string {
	if path == "" || path == "none" {
		return ""
	}
	if rest, ok := strings.CutPrefix(path, "~/"); ok {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		path = filepath.Join(home, rest)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return ""
	}
	// Follow symbolic links: the file ssh reads is the target, and the
	// directories that lead to it are the target's.
	exists := true
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	} else {
		exists = false
	}
	me := os.Getuid()
	if exists {
		if why := unsafeOwnerOrMode(abs, me); why != "" {
			return fmt.Sprintf("%s %s", abs, why)
		}
	}
	// creatable: the file is missing and this is the deepest directory
	// that exists, where whoever can write could create what is missing;
	// above it, only replacing a directory matters, which the sticky bit
	// prevents.
	creatable := !exists
	for dir := filepath.Dir(abs); ; dir = filepath.Dir(dir) {
		fi, err := os.Stat(dir)
		if err == nil {
			exists := !creatable
			creatable = false
			st, ok := fi.Sys().(*syscall.Stat_t)
			switch {
			case ok && int(st.Uid) != me && st.Uid != 0:
				return fmt.Sprintf("its directory %s is owned by uid %d, who can replace it", dir, st.Uid)
			case fi.Mode().Perm()&0o022 != 0 && (fi.Mode()&os.ModeSticky == 0 || !exists):
				if !exists {
					return fmt.Sprintf("%s does not exist, and its directory %s (mode %04o) lets others create it first", abs, dir, fi.Mode().Perm())
				}
				return fmt.Sprintf("its directory %s is writable by group or others (mode %04o), who can replace it", dir, fi.Mode().Perm())
			}
		}
		if dir == filepath.Dir(dir) {
			return ""
		}
	}
}

// unsafeOwnerOrMode says why the file at path can be changed by someone
// other than uid me or root; "" if it cannot.
func unsafeOwnerOrMode(path string, me int) string {
	fi, err := os.Stat(path)
	if err != nil {
		return ""
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != me && st.Uid != 0 {
		return fmt.Sprintf("is owned by uid %d, who can change it", st.Uid)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Sprintf("is writable by group or others (mode %04o)", fi.Mode().Perm())
	}
	return ""
}

// validateTrustFiles refuses known_hosts, ssh_config and the known-hosts
// files of ssh_options that others can change, at the attribute that
// names them.
func validateTrustFiles(s *settings) shared.Diagnostics {
	var diags shared.Diagnostics
	check := func(path []string, name, file string) {
		why := sharedWritable(file)
		if why == "" {
			return
		}
		diags = append(diags, shared.Errorf(path, "File others can write",
			"%s names %s, but %s. Whoever can change it chooses which host key ssh trusts for the login node, where worker credentials go. Run chmod go-w on the file and its directory, or use a file only the engine's user can write.",
			name, file, why))
	}
	check([]string{"known_hosts"}, "known_hosts", s.KnownHosts)
	check([]string{"ssh_config"}, "ssh_config", s.SSHConfig)
	for i, o := range s.SSHOptions {
		key, value, ok := strings.Cut(o, "=")
		if !ok || !(strings.EqualFold(key, "UserKnownHostsFile") || strings.EqualFold(key, "GlobalKnownHostsFile")) ||
			sshrun.WeakHostKey(key, value) != "" || s.KnownHosts != "" {
			continue // not a file of trusted keys, or refused already
		}
		// ssh reads several files from one value, split at white space.
		for _, f := range strings.Fields(strings.Trim(value, `"'`)) {
			check([]string{"ssh_options", fmt.Sprint(i)}, key, f)
		}
	}
	return diags
}
