package slurm

import (
	"bufio"
	"bytes"
	"context"
	"os/exec"
	"strings"
	"time"

	"github.com/fluksio/provision/shared"
)

// Host keys are always checked: a provisioner sends a worker's credential
// to the login node inside the batch script, and a man in the middle who
// is accepted once has it. So no configuration may turn the check off:
// not an ssh_options entry, and not the ssh_config file we are given.
// ssh_options are read as written; for ssh_config, `ssh -G` prints the
// settings ssh would use with exactly our command line, which is the only
// reading that follows Include, Match and the order of precedence as ssh
// does. `ssh -G` connects to nothing.
//
// Refused: StrictHostKeyChecking no, off or accept-new (accept-new trusts
// the first key it sees), a UserKnownHostsFile that is only /dev/null or
// none (half of the usual recipe for not checking), and
// KnownHostsCommand, which could vouch for any key. With
// known_hosts set the provisioner passes StrictHostKeyChecking=yes and
// the file itself, and those win over ssh_config.

// weakHostKeyOption says why an ssh option, as key and value, weakens
// host-key checking; "" if it does not.
func weakHostKeyOption(key, value string) string {
	v := strings.ToLower(strings.Trim(strings.TrimSpace(value), `"'`))
	// An ssh inside the value (ProxyCommand=ssh -o StrictHostKeyChecking=no
	// -W %h:%p jump) checks the jump host's key: the same rule applies.
	fields := strings.Fields(v)
	for i, f := range fields {
		if opt, ok := strings.CutPrefix(f, "-o"); ok {
			if opt == "" && i+1 < len(fields) {
				opt = fields[i+1]
			}
			if k, val, ok := strings.Cut(opt, "="); ok && !strings.EqualFold(k, key) {
				if why := weakHostKeyOption(k, val); why != "" {
					return why + " (inside " + key + ")"
				}
			}
		}
	}
	switch strings.ToLower(key) {
	case "stricthostkeychecking":
		switch v {
		case "no", "off", "false", "accept-new":
			return "StrictHostKeyChecking " + v + " lets ssh accept a host key it has never seen"
		}
	case "userknownhostsfile":
		files := strings.Fields(v)
		if len(files) == 0 {
			return ""
		}
		for _, f := range files {
			if f != "/dev/null" && f != "none" {
				return ""
			}
		}
		return key + " " + v + " leaves ssh no known host keys to check against"
	case "knownhostscommand":
		return "KnownHostsCommand could vouch for any host key"
	}
	return ""
}

// effectiveSSHTimeout bounds `ssh -G`, which reads files and connects to
// nothing.
const effectiveSSHTimeout = 10 * time.Second

// checkEffectiveSSH runs `ssh -G` with the command line the provisioner
// would use and refuses settings that weaken host-key checking. It is
// needed only with an ssh_config: without one, ssh_options are checked as
// written and the user's own configuration is the user's.
func checkEffectiveSSH(ctx context.Context, sshPath string, s *settings) shared.Diagnostics {
	if s.SSHConfig == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, effectiveSSHTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, sshPath, append([]string{"-G"}, sshArgv(s, nil, nil)...)...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return shared.Diagnostics{shared.Errorf([]string{"ssh_config"}, "Unreadable ssh_config",
			"ssh could not read its configuration (ssh -G): %v: %s. Fix the file, or remove ssh_config.", err, truncate(stderr.String()))}
	}
	var diags shared.Diagnostics
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		key, value, _ := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		if why := weakHostKeyOption(key, value); why != "" {
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
