package sshrun

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Bastions.
//
// A site behind a jump host is reached through it: Config.Bastions, each
// tried in order until one answers, and the one that answered is tried
// first from then on. The transport hands ssh a ProxyCommand of its own
// making (proxyCommand), an ssh to the bastion with the transport's key,
// known_hosts, BatchMode and ConnectTimeout, which forwards the
// connection to the login node (-W). It is not ProxyJump because
// OpenSSH's -o options and -i do not reach a ProxyJump hop: the hop
// would read the user's own known_hosts and keys, and an operator's
// known_hosts and key would not be the ones it uses.
//
// A bastion that does not answer (ssh's words for a login node that does
// not answer, loginSilentRE, said before anything ran) is skipped for the
// next, for the same login node; when none answers, the login node is
// silent as far as the caller is told. A bastion that refuses the login
// (its host key, the key) is a refusal of the login node's, the same
// Refusal with ssh's words, since a person has to act either way.

// proxyCommand is the ProxyCommand that reaches a login node through
// bastion b: the same ssh program, its options the transport's own for
// the login node (ConfigFile, Key with IdentitiesOnly, KnownHosts strict,
// BatchMode, the ConnectTimeout), the bastion's port, and -W %h:%p, which
// carries ssh's connection to the login node over the bastion's. ssh
// hands the command to the user's shell and expands %-tokens in it, so
// every word is shell-quoted and each % of a word doubled. No secret is
// in it: the key is a path.
func proxyCommand(program string, c *Config, b Login) string {
	words := []string{program, "-o", "BatchMode=yes"}
	if c.ConfigFile != "" {
		words = append(words, "-F", c.ConfigFile)
	}
	if b.Port != 0 {
		words = append(words, "-p", strconv.Itoa(b.Port))
	}
	if c.Key != "" {
		words = append(words, "-i", c.Key, "-o", "IdentitiesOnly=yes")
	}
	if c.KnownHosts != "" {
		words = append(words, "-o", "UserKnownHostsFile="+c.KnownHosts, "-o", "StrictHostKeyChecking=yes")
	}
	if ct := userConnectTimeout(c.Options); ct != "" {
		words = append(words, "-o", ct)
	} else if c.Timeout > 0 {
		words = append(words, "-o", "ConnectTimeout="+strconv.FormatInt(c.connectSeconds(), 10))
	}
	for i, w := range words {
		words[i] = strings.ReplaceAll(shellQuote(w), "%", "%%")
	}
	words = append(words, "-W", "%h:%p", "--", strings.ReplaceAll(shellQuote(b.Dest), "%", "%%"))
	return strings.Join(words, " ")
}

// userConnectTimeout is the ConnectTimeout option of options, as
// written; "" when they set none.
func userConnectTimeout(options []string) string {
	for _, o := range options {
		if strings.HasPrefix(strings.ToLower(o), "connecttimeout=") {
			return o
		}
	}
	return ""
}

// runVia runs ssh once to at with extra options, through the bastions
// when there are any: the one in use first, then the others in order,
// each next one only when the one before did not answer. It notes the
// bastion that let ssh through to at (or refused it) as the one in use.
//
// socket is the call's ControlPath, "" when it is not multiplexed. A
// multiplexed ssh (ControlPersist) points its ProxyCommand's stderr at
// /dev/null, so the hop's words, the ones that say why (its host key,
// its refusal), would be lost: the hop's stderr then goes to a file of
// the call's own in the control directory, read into stderr ahead of
// the outer ssh's words when ssh failed by itself, and removed.
func (t *Transport) runVia(ctx context.Context, at Login, extra []string, socket string, stdin []byte, remote []string) (stdout, stderr []byte, err error) {
	hint := t.outHint.get(remote[0])
	if len(t.proxies) == 0 {
		return t.run(ctx, t.argv(at, extra, "", remote), stdin, hint)
	}
	first := int(t.bastion.Load())
	order := []int{first}
	for b := range t.proxies {
		if b != first {
			order = append(order, b)
		}
	}
	for _, b := range order {
		proxy, hopSaid := t.proxies[b], ""
		if socket != "" {
			hopSaid = filepath.Join(filepath.Dir(socket), "hop"+strconv.FormatUint(t.hops.Add(1), 10))
			proxy += " 2>" + strings.ReplaceAll(shellQuote(hopSaid), "%", "%%")
		}
		stdout, stderr, err = t.run(ctx, t.argv(at, extra, proxy, remote), stdin, hint)
		if hopSaid != "" {
			if said, _ := os.ReadFile(hopSaid); len(said) > 0 && t.sshFailed(err, stdout, stderr) {
				stderr = append(said, stderr...)
			}
			os.Remove(hopSaid)
		}
		if t.classify(err, stdout, stderr) != outcomeSilent || ctx.Err() != nil {
			if b != first && t.bastion.CompareAndSwap(int32(first), int32(b)) {
				t.log.Warn("going through another bastion: the one in use did not answer",
					"bastion", t.cfg.Bastions[b].String(), "was", t.cfg.Bastions[first].String())
			}
			return stdout, stderr, err
		}
	}
	return stdout, stderr, err
}

// proxyInUse is the ProxyCommand through the bastion in use, "" without
// bastions: for a Session, which does not move between bastions, and
// for the settings ssh -G reads.
func (t *Transport) proxyInUse() string {
	if len(t.proxies) == 0 {
		return ""
	}
	return t.proxies[t.bastion.Load()]
}

// BastionInUse is the jump host calls go through now: the one that
// answered last, or the first. false without bastions.
func (t *Transport) BastionInUse() (Login, bool) {
	if len(t.proxies) == 0 {
		return Login{}, false
	}
	return t.cfg.Bastions[t.bastion.Load()], true
}
