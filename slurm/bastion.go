package slurm

// A bastion: the login nodes reached through a jump host, the bastion
// attribute. The way through is the ssh transport's (slurm/sshrun,
// bastion.go there): a ProxyCommand of its own making, which carries the
// provisioner's ssh_key and known_hosts to the hop, where ssh_config's
// ProxyJump would not. Here the attribute is read and checked: each
// entry user@host or user@host:port, and no other way through (a
// ProxyJump or ProxyCommand in ssh_options) beside it.

import (
	"strconv"
	"strings"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/sshrun"
)

// validateBastions resolves s.Bastion into s.bastions, with a diagnostic
// at the string, or at each bad element of a list.
func validateBastions(s *settings) shared.Diagnostics {
	var diags shared.Diagnostics
	l := s.Bastion
	if len(l.Entries) == 0 || !l.List && l.Entries[0] == "" {
		return nil
	}
	seen := map[string]int{}
	for i, e := range l.Entries {
		path := []string{"bastion"}
		if l.List {
			path = append(path, strconv.Itoa(i))
		}
		b, err := sshrun.ParseLogin(e)
		switch {
		case err != nil:
			diags = append(diags, shared.Errorf(path, "Invalid bastion", "%s.", strings.Replace(err.Error(), "the login node", "the bastion", 1)))
			continue
		case !strings.Contains(b.Dest, "@"):
			diags = append(diags, shared.Errorf(path, "Invalid bastion",
				"%q names no user. Write the jump host as \"user@host\" or \"user@host:port\": the plugin's ssh logs in there with ssh_key, as that user.", e))
			continue
		}
		if j, dup := seen[b.String()]; dup {
			diags = append(diags, shared.Errorf(path, "Bastion listed twice",
				"%q is entry %d as well. Each bastion once: the list is the order they are tried in.", e, j+1))
			continue
		}
		seen[b.String()] = i
		s.bastions = append(s.bastions, b)
	}
	if len(s.bastions) == 0 {
		return diags
	}
	for i, o := range s.SSHOptions {
		key, _, _ := strings.Cut(o, "=")
		if strings.EqualFold(key, "ProxyJump") || strings.EqualFold(key, "ProxyCommand") {
			diags = append(diags, shared.Errorf([]string{"ssh_options", strconv.Itoa(i)}, "Two ways through a bastion",
				"bastion is set, and the plugin reaches the login node through it with a ProxyCommand of its own; %s would be another way. Keep one: remove this option, or bastion.", key))
		}
	}
	return diags
}
