package sshrun

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// Host keys are always checked: a remote command's stdin may carry a
// secret (the Slurm plugin's batch script holds a worker's credential),
// and a man in the middle who is accepted once has it. So the transport
// never turns the check off, and WeakHostKey says which settings would:
// StrictHostKeyChecking no, off or accept-new (accept-new trusts the
// first key it sees), a UserKnownHostsFile that is only /dev/null or none
// (half of the usual recipe for not checking), and KnownHostsCommand,
// which could vouch for any key, wherever they stand, an ssh inside a
// ProxyCommand included. Options are read as written; for a ConfigFile,
// Effective asks `ssh -G`, which prints the settings ssh would use with
// exactly the transport's command line, the only reading that follows
// Include, Match and the order of precedence as ssh does. With KnownHosts
// set the transport passes StrictHostKeyChecking=yes and the file itself,
// and those win over the ConfigFile.

// WeakHostKey says why an ssh option, as key and value, weakens host-key
// checking; "" if it does not.
func WeakHostKey(key, value string) string {
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
				if why := WeakHostKey(k, val); why != "" {
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

// effectiveTimeout bounds `ssh -G`, which reads files and connects to
// nothing.
const effectiveTimeout = 10 * time.Second

// Setting is one of the settings ssh would use: its key in lower case,
// as `ssh -G` prints it, and its value.
type Setting struct {
	Key, Value string
}

// Effective is the settings ssh would use with c's command line to its
// first login, as `ssh -G` prints them (it connects to nothing; bounded
// by ctx and 10 s). Its error, when ssh could not read its configuration,
// ends with what ssh said.
func Effective(ctx context.Context, c Config) ([]Setting, error) {
	t := New(c, nil)
	ctx, cancel := context.WithTimeout(ctx, effectiveTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, t.program, append([]string{"-G"}, t.argv(t.firstLogin(), nil, t.proxyInUse(), nil)...)...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%w: %s", err, shorten(stderr.String()))
	}
	var settings []Setting
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		key, value, _ := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		settings = append(settings, Setting{Key: key, Value: value})
	}
	return settings, nil
}
