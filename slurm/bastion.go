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
	var more shared.Diagnostics
	s.bastions, more = parseLoginList("bastion", l, loginWords{invalid: "Invalid bastion", twice: "Bastion listed twice", one: "bastion"},
		func(path []string, e string, b sshrun.Login) *shared.Diagnostic {
			if !strings.Contains(b.Dest, "@") {
				d := shared.Errorf(path, "Invalid bastion",
					"%q names no user. Write the jump host as \"user@host\" or \"user@host:port\": the plugin's ssh logs in there with ssh_key, as that user.", e)
				return &d
			}
			return nil
		})
	diags = append(diags, more...)
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
