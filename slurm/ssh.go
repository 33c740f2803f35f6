package slurm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"time"

	"github.com/fluksio/provision/shared"
)

// sshWaitDelay bounds how long a killed ssh may keep its output pipes
// open (a ProxyCommand or a multiplexing master can hold them). Without
// it a hung login node could hold up Shutdown past its deadline.
const sshWaitDelay = 2 * time.Second

// ssh runs one command on the login node and returns what it printed. It
// is the only place that talks to the cluster: the system ssh, and no new
// library, so that whatever the user's ssh already does (keys, agents,
// jump hosts, multiplexing) works here too.
//
// Every call is bounded by submit_timeout and by ctx. A nonzero exit is an
// error; stdout and stderr are returned either way, so callers can report
// what the cluster said. stdin may be nil, in which case ssh reads
// /dev/null.
//
// The remote command is handed to the login node's shell as one string, so
// each word is shell-quoted here. Callers pass only constants, validated
// names and validated job ids.
func (p *Provisioner) ssh(ctx context.Context, stdin []byte, remote ...string) (stdout, stderr []byte, err error) {
	cfg := p.settings()
	if cfg == nil {
		return nil, nil, shared.ErrNotConfigured
	}
	if len(remote) == 0 {
		return nil, nil, fmt.Errorf("ssh to %s: no remote command: %w", cfg.host(), shared.ErrInvalidArgument)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.submitTimeout)
	defer cancel()

	cmd := exec.CommandContext(ctx, p.sshPath, sshArgs(cfg, remote)...)
	cmd.WaitDelay = sshWaitDelay
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	switch {
	case err == nil:
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		err = fmt.Errorf("%s on %s: no answer within %s: %w", remote[0], cfg.host(), cfg.submitTimeout, ctx.Err())
	case ctx.Err() != nil:
		err = fmt.Errorf("%s on %s: %w", remote[0], cfg.host(), ctx.Err())
	default:
		err = fmt.Errorf("%s on %s: %w", remote[0], cfg.host(), err)
	}
	return out.Bytes(), errOut.Bytes(), err
}

// sshArgs is ssh's argv after the program name. BatchMode makes a prompt
// (a passphrase, an unknown host key) fail at once instead of hanging.
// Host-key checking is never turned off here; known_hosts turns it fully
// on. The user's options come after the provisioner's, and ssh keeps the
// first value it is given, so they cannot undo them. "--" ends ssh's
// options, so nothing after it is read as one.
func sshArgs(cfg *settings, remote []string) []string {
	args := []string{"-o", "BatchMode=yes"}
	if cfg.SSHConfig != "" {
		args = append(args, "-F", cfg.SSHConfig)
	}
	if cfg.SSHPort != 0 {
		args = append(args, "-p", strconv.Itoa(cfg.SSHPort))
	}
	if cfg.SSHKey != "" {
		args = append(args, "-i", cfg.SSHKey)
	}
	if cfg.KnownHosts != "" {
		args = append(args, "-o", "UserKnownHostsFile="+cfg.KnownHosts, "-o", "StrictHostKeyChecking=yes")
	}
	for _, o := range cfg.SSHOptions {
		args = append(args, "-o", o)
	}
	args = append(args, "--", cfg.Login)
	for _, r := range remote {
		args = append(args, shellQuote(r))
	}
	return args
}
