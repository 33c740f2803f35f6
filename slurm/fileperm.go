package slurm

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/fluksio/provision/internal/fileperm"
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
// at path, as ssh would open it; "" if nobody can. The rule is
// internal/fileperm's; "~/" and "none" are ssh's.
func sharedWritable(path string) string {
	if path == "" || path == "none" {
		return ""
	}
	path, err := expandHome(path)
	if err != nil {
		return ""
	}
	if p := fileperm.Check(path); p != nil {
		return p.Why
	}
	return ""
}

// expandHome is path with a leading "~/" read as ssh reads it: under
// this user's home.
func expandHome(path string) (string, error) {
	rest, ok := strings.CutPrefix(path, "~/")
	if !ok {
		return path, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return path, err
	}
	return filepath.Join(home, rest), nil
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
