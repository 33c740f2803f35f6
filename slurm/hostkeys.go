package slurm

import (
	"context"
	"strings"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/sshrun"
)

// Host keys are always checked: a provisioner sends a worker's credential
// to the login node inside the batch script, and a man in the middle who
// is accepted once has it. So no configuration may turn the check off:
// not an ssh_options entry (validate), and not the ssh_config file we are
// given (checkEffectiveSSH). What weakens the check, and what ssh would
// do with our command line, are the transport's to say
// (sshrun.WeakHostKey, sshrun.Effective).

// checkEffectiveSSH reads, with `ssh -G`, the settings ssh would use with
// the command line the provisioner would use, and refuses those that
// weaken host-key checking. It is needed only with an ssh_config:
// without one, ssh_options are checked as written and the user's own
// configuration is the user's.
func checkEffectiveSSH(ctx context.Context, sshPath string, s *settings) shared.Diagnostics {
	if s.SSHConfig == "" {
		return nil
	}
	c := s.sshConfig()
	c.Program = sshPath
	effective, err := sshrun.Effective(ctx, c)
	if err != nil {
		return shared.Diagnostics{shared.Errorf([]string{"ssh_config"}, "Unreadable ssh_config",
			"ssh could not read its configuration (ssh -G): %v. Fix the file, or remove ssh_config.", err)}
	}
	var diags shared.Diagnostics
	for _, e := range effective {
		key, value := e.Key, e.Value
		if why := sshrun.WeakHostKey(key, value); why != "" {
			diags = append(diags, shared.Errorf([]string{"ssh_config"}, "ssh_config weakens host-key checking",
				"With %s, ssh would use %s %s: %s, and a worker's credential travels in the batch script. Remove it from the file (or from the Host or Match block that applies to %s), or set known_hosts.",
				s.SSHConfig, key, value, why, s.Login))
			continue
		}
		// The known-hosts files the file names are as trusted as the
		// file (fileperm.go); with known_hosts set, the user's is ours.
		if key == "globalknownhostsfile" || (key == "userknownhostsfile" && s.KnownHosts == "") {
			for _, f := range strings.Fields(value) {
				if why := sharedWritable(f); why != "" {
					diags = append(diags, shared.Errorf([]string{"ssh_config"}, "File others can write",
						"With %s, ssh would read the login node's key from %s, but %s. Whoever can change it chooses which host key ssh trusts for the login node, where worker credentials go. Run chmod go-w on the file and its directory, or set known_hosts to a file only the engine's user can write.",
						s.SSHConfig, f, why))
				}
			}
		}
	}
	return diags
}
