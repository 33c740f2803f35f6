package slurm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/shared"
)

const (
	// sshWaitDelay bounds how long a killed ssh may keep its output pipes
	// open (a ProxyCommand or a multiplexing master can hold them). Without
	// it a hung login node could hold up Shutdown past its deadline.
	sshWaitDelay = 2 * time.Second

	// defaultMaxSessions stays below sshd's default MaxSessions (10), the
	// number of sessions one multiplexed connection may carry, with room
	// for the user's own ssh sharing the connection.
	defaultMaxSessions = 8
	// maxMaxSessions is a sanity bound: beyond it the login node is being
	// hammered, whatever its sshd allows.
	maxMaxSessions = 64

	// controlPersist is how long the master connection stays up with no
	// command running through it. It also bounds how long a master can
	// outlive a plugin that was killed before it could close it.
	controlPersist = "120s"
	// controlName is the start of the socket's name in the provisioner's
	// own directory, followed by the master's generation; the directory
	// is private, so nothing else in the name needs to be unique.
	controlName = "cm"
	// maxControlPath keeps the socket's path well under the 104 to 108
	// bytes of a Unix socket address: ssh binds the path plus a 17-byte
	// random suffix first and refuses "ControlPath too long".
	maxControlPath = 80
	// controlTimeout bounds one "ssh -O" to a master: it only talks to the
	// local socket, so it is quick unless the master is wedged.
	controlTimeout = 2 * time.Second
)

// sshConn is a Provisioner's connection to the login node: the session cap
// and, when multiplexing, the directory holding the master's socket.
type sshConn struct {
	// slots caps the ssh commands running at once at max_sessions; every
	// call holds one from before ssh starts until it has exited. Through
	// one multiplexed connection each command is a session, and sshd
	// refuses sessions beyond its MaxSessions (10 by default): ssh then
	// prints "mux_client_request_session: session request failed: Session
	// open refused by peer" (or "open failed") and falls back to a
	// connection of its own, a full handshake and a line of noise in what
	// the cluster said. Without multiplexing the cap keeps as many
	// handshakes from piling onto sshd's MaxStartups. Made on first use,
	// from the settings, which never change.
	slotsOnce sync.Once
	slots     chan struct{}

	// refusedOnce is set once a session refusal has been logged.
	refusedOnce atomic.Bool

	// mu guards the fields below. It is never held across ssh.
	mu sync.Mutex
	// dir is the private directory (0700) the control sockets live in,
	// made on the first multiplexed call; "" before that and after close.
	dir string
	// gen numbers each login's current master's socket, cm<gen>[.<login>]
	// (socket). Retiring a master moves on to the next number rather
	// than renaming its socket: a master removes its own ControlPath when
	// it exits, and a renamed one would remove its successor's.
	gen map[int]int
	// closed is set by closeSSH: later calls do not multiplex.
	closed bool
	// unusable is set when no directory short and plain enough for a
	// ControlPath could be made; calls then do not multiplex.
	unusable bool
}

// ssh runs one command on the login node and returns what it printed. It
// is the only place that talks to the cluster: the system ssh, and no new
// library, so that whatever the user's ssh already does (keys, agents,
// jump hosts) works here too.
//
// With multiplex on (the default), every call goes through one master
// connection that OpenSSH keeps open (ControlMaster=auto): the first call
// makes it, the rest run through it in a few milliseconds instead of a
// handshake each. If it dies, the next call makes a new one. Calls that
// race to make the first master are safe: ssh gives the losers a plain
// connection of their own ("ControlSocket ... already exists, disabling
// multiplexing").
//
// At most max_sessions calls run at once; a call waits for a turn for as
// long as ctx lets it, and then is bounded by submit_timeout and by ctx. A
// nonzero exit is an error; stdout and stderr are returned either way, so
// callers can report what the cluster said. stdin may be nil, in which
// case ssh reads /dev/null.
//
// The remote command is handed to the login node's shell as one string, so
// each word is shell-quoted here. Callers pass only constants, validated
// names and validated job ids.
func (p *Provisioner) ssh(ctx context.Context, stdin []byte, remote ...string) (stdout, stderr []byte, err error) {
	cfg := p.settings()
	if cfg == nil {
		return nil, nil, shared.ErrNotConfigured
	}
	return p.sshWithin(ctx, cfg.submitTimeout, stdin, remote...)
}

// sshWithin is ssh bounded by limit instead of submit_timeout, for the one
// call that moves more than a script: the relay's binary.
func (p *Provisioner) sshWithin(ctx context.Context, limit time.Duration, stdin []byte, remote ...string) (stdout, stderr []byte, err error) {
	cfg := p.settings()
	if cfg == nil {
		return nil, nil, shared.ErrNotConfigured
	}
	if len(remote) == 0 {
		return nil, nil, fmt.Errorf("ssh to %s: no remote command: %w", cfg.host(), shared.ErrInvalidArgument)
	}
	if err := p.conn.acquire(ctx, cfg); err != nil {
		return nil, nil, fmt.Errorf("%s on %s: waiting for an ssh session (max_sessions %d): %w", remote[0], cfg.host(), cap(p.conn.slots), err)
	}
	defer p.conn.release()

	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()

	// Each login in turn, until one lets the command in (logins.go):
	// with one login, that one.
	logins := cfg.loginList()
	order := p.logins.order(len(logins), p.now())
	var at loginAddr
	for n, i := range order {
		at = logins[i]
		started := p.now()
		stdout, stderr, err = p.sshAt(ctx, cfg, i, stdin, remote)
		out := classifyLogin(err, stdout, stderr)
		if ctx.Err() != nil && out != outcomeGotThrough {
			out = outcomeUnknown
		}
		last := n == len(order)-1 || (out != outcomeSilent && out != outcomeRefused)
		if ch := p.logins.note(len(logins), i, out, string(stderr), started, p.now(), last); ch != (loginChange{}) {
			p.logLoginChange(cfg, i, ch, string(stderr))
		}
		if last {
			break
		}
		// Nothing ran there: the next login may take it.
	}
	stderr = quietMux(stderr, err != nil)
	host := at.host()
	switch {
	case err == nil:
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		err = fmt.Errorf("%s on %s: no answer within %s: %w", remote[0], host, limit, ctx.Err())
	case ctx.Err() != nil:
		err = fmt.Errorf("%s on %s: %w", remote[0], host, ctx.Err())
	default:
		err = fmt.Errorf("%s on %s: %w", remote[0], host, err)
	}
	return stdout, stderr, err
}

// sshAt runs the command once on login i, through its shared connection
// when multiplexing.
func (p *Provisioner) sshAt(ctx context.Context, cfg *settings, i int, stdin []byte, remote []string) (stdout, stderr []byte, err error) {
	at := cfg.loginList()[i]
	socket := p.controlSocket(cfg, i)
	var mux []string
	if socket != "" {
		mux = []string{"-o", "ControlMaster=auto", "-o", "ControlPath=" + socket, "-o", "ControlPersist=" + controlPersist}
	}
	stdout, stderr, err = p.run(ctx, sshArgvAt(cfg, at, mux, remote), stdin, p.outHint.get(remote[0]))
	p.outHint.note(remote[0], len(stdout))
	if socket != "" {
		p.checkMux(ctx, cfg, i, socket, err, stdout, stderr)
		if ctx.Err() == nil && muxFailed(err, stdout, stderr) {
			// ssh gave up on the master before asking it for a
			// session, and did not log in on its own either (it would
			// have said so: the socket exists), so the command never
			// ran: run it once more on a plain connection.
			p.sshLog(cfg).Warn("the shared ssh connection failed; retrying on a connection of its own", "login", at.String(), "stderr", truncate(string(stderr)))
			stdout, stderr, err = p.run(ctx, sshArgvAt(cfg, at, []string{"-o", "ControlPath=none"}, remote), stdin, p.outHint.get(remote[0]))
		}
	}
	return stdout, stderr, err
}

// run runs ssh once with args; its output is read into a buffer made
// for about outSize bytes.
func (p *Provisioner) run(ctx context.Context, args []string, stdin []byte, outSize int) (stdout, stderr []byte, err error) {
	cmd := exec.CommandContext(ctx, p.sshPath, args...)
	cmd.WaitDelay = sshWaitDelay
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, errOut bytes.Buffer
	out.Grow(outSize)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	if errors.Is(err, exec.ErrWaitDelay) && cmd.ProcessState != nil && cmd.ProcessState.Success() {
		// ssh finished, but something it started still holds its
		// output: a master that went into the background, or its
		// ProxyCommand, on an OpenSSH that does not point them at
		// /dev/null. What ssh printed had long been read.
		err = nil
	}
	return out.Bytes(), errOut.Bytes(), err
}

// sshArgs is ssh's argv after the program name, without multiplexing.
func sshArgs(cfg *settings, remote []string) []string {
	return sshArgv(cfg, nil, remote)
}

// sshArgv is ssh's argv after the program name. BatchMode makes a prompt
// (a passphrase, an unknown host key) fail at once instead of hanging.
// Host-key checking is never turned off here; known_hosts turns it fully
// on. extra (the multiplexing options) comes next, then the user's
// options, and ssh keeps the first value it is given, so they cannot undo
// the provisioner's; the user's ssh_config still applies to everything
// not set here, ProxyJump included. Unless the user's options set one,
// ConnectTimeout is half of submit_timeout (connectTimeout). "--" ends
// ssh's options, so nothing after it is read as one.
func sshArgv(cfg *settings, extra, remote []string) []string {
	return sshArgvAt(cfg, cfg.firstLogin(), extra, remote)
}

// sshArgvAt is sshArgv for one login node of several: its port, when the
// entry names one, comes before ssh_port's, and ssh keeps the first.
func sshArgvAt(cfg *settings, at loginAddr, extra, remote []string) []string {
	args := []string{"-o", "BatchMode=yes"}
	args = append(args, extra...)
	if cfg.SSHConfig != "" {
		args = append(args, "-F", cfg.SSHConfig)
	}
	if at.port != 0 {
		args = append(args, "-p", strconv.Itoa(at.port))
	} else if cfg.SSHPort != 0 {
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
	if cfg.submitTimeout > 0 && !slices.ContainsFunc(cfg.SSHOptions, func(o string) bool {
		return strings.HasPrefix(strings.ToLower(o), "connecttimeout=")
	}) {
		args = append(args, "-o", "ConnectTimeout="+strconv.FormatInt(connectTimeout(cfg.submitTimeout), 10))
	}
	args = append(args, "--", at.dest)
	for _, r := range remote {
		args = append(args, shellQuote(r))
	}
	return args
}

// connectTimeout is ssh's ConnectTimeout, in seconds, for a call bounded
// by submit_timeout: half of it, so that a login node that accepts the
// connection and then says nothing (a wedged sshd) fails with ssh's own
// "Connection timed out during banner exchange", which says the command
// never ran, rather than with the call running out of time, after which
// a submission's job might exist and would have to be looked for.
func connectTimeout(submitTimeout time.Duration) int64 {
	return max(1, int64((submitTimeout/2+time.Second-1)/time.Second))
}

// acquire takes one of the max_sessions slots, waiting as long as ctx
// allows.
func (c *sshConn) acquire(ctx context.Context, cfg *settings) error {
	c.slotsOnce.Do(func() {
		n := defaultMaxSessions
		if cfg != nil && cfg.maxSessions >= 1 {
			n = cfg.maxSessions
		}
		c.slots = make(chan struct{}, n)
	})
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case c.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *sshConn) release() { <-c.slots }

// controlSocket is the ControlPath for this call, "" when not multiplexing:
// multiplex off (the user's ssh_config decides, and is passed nothing),
// after closeSSH, or when no usable directory could be made. The directory
// is made on first use, private to this Provisioner, and made again should
// something have removed it.
func (p *Provisioner) controlSocket(cfg *settings, login int) string {
	if !cfg.multiplex {
		return ""
	}
	c := &p.conn
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.unusable {
		return ""
	}
	if c.dir != "" {
		if _, err := os.Stat(c.dir); err == nil {
			return c.socket(login)
		}
		c.dir = ""
	}
	dir, err := makeControlDir()
	if err != nil {
		c.unusable = true
		p.sshLog(cfg).Warn("not sharing one ssh connection: every command makes its own", "reason", err)
		return ""
	}
	c.dir = dir
	p.sshLog(cfg).Debug("sharing one ssh connection", "control_path", c.socket(login))
	return c.socket(login)
}

// socket is the current master's ControlPath to login (its index in
// the configured order): cm<gen> for the first, cm<gen>.<login> for the
// others, so that each login node has a master of its own. c.mu must be
// held.
func (c *sshConn) socket(login int) string {
	name := controlName + strconv.Itoa(c.gen[login])
	if login > 0 {
		name += "." + strconv.Itoa(login)
	}
	return filepath.Join(c.dir, name)
}

// plainPath is what may go into a ControlPath unchanged: ssh expands % and
// ~ in it, and an option line splits at whitespace.
var plainPath = regexp.MustCompile(`^/[A-Za-z0-9/._-]+$`)

// controlBase is where control directories are made.
func controlBase() string {
	if st, err := os.Stat("/tmp"); err == nil && st.IsDir() {
		return "/tmp"
	}
	return os.TempDir()
}

// makeControlDir makes a new private directory for a control socket, in
// /tmp rather than $TMPDIR, which can be too long for a socket's path.
func makeControlDir() (string, error) {
	base := controlBase()
	// The pid in the name lets a later plugin clean up after this one
	// if it is killed (controldir.go).
	dir, err := os.MkdirTemp(base, controlDirPattern()) // 0700
	if err != nil {
		return "", err
	}
	if socket := filepath.Join(dir, controlName+"999999.99"); len(socket) > maxControlPath || !plainPath.MatchString(socket) {
		os.Remove(dir)
		return "", fmt.Errorf("the temporary directory %q makes too long or too odd a ControlPath", base)
	}
	return dir, nil
}

// retire takes a master out of use: new calls use the next socket name,
// and so make a new master. Commands running through the old one go on,
// it exits by itself once idle for ControlPersist, and closeSSH still
// finds its socket to tell it to exit. Nothing here waits on the master,
// which may be wedged.
func (p *Provisioner) retire(login int, socket string) {
	c := &p.conn
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dir != "" && socket == c.socket(login) {
		if c.gen == nil {
			c.gen = map[int]int{}
		}
		c.gen[login]++
	}
}

// closeSSH tells every master this Provisioner started to exit, and
// removes their directory. Shutdown calls it last; ssh calls after it run
// without multiplexing. It first waits for the calls in flight, any of
// which may be making a master just now, so that none is left behind. It
// is bounded by ctx, but given a moment even if ctx has ended, since a
// master left behind lingers for ControlPersist.
func (p *Provisioner) closeSSH(ctx context.Context) {
	c := &p.conn
	c.mu.Lock()
	dir := c.dir
	c.dir, c.closed = "", true
	c.mu.Unlock()
	if dir == "" {
		return
	}
	bound := controlTimeout
	if d, ok := ctx.Deadline(); ok {
		bound = min(bound, max(time.Until(d), controlTimeout/4))
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bound)
	defer cancel()

	// Holding every slot means no call is running; later calls see
	// closed. A dir implies the slots were made: calls make them first.
	drain, cancelDrain := context.WithTimeout(ctx, bound/2)
	defer cancelDrain()
	for held := 0; held < cap(c.slots); held++ {
		if c.acquire(drain, nil) != nil {
			break
		}
		defer c.release()
	}

	if cfg := p.settings(); cfg != nil {
		p.stopMasters(ctx, cfg, dir)
	}
	if err := os.RemoveAll(dir); err != nil {
		p.logger.Warn("could not remove the ssh control directory", "dir", dir, "error", err)
	}
}

// checkMux looks at how a multiplexed call went and retires the master
// if it is no good, so that the next call makes a new one: when ssh could
// not talk to it (it then falls back to a connection of its own, or gives
// up), or when the call ran out of time, since the master may be what
// hangs (a connection that died without a word). Commands still running
// through a retired master go on.
func (p *Provisioner) checkMux(ctx context.Context, cfg *settings, login int, socket string, err error, stdout, stderr []byte) {
	if muxRefused.Match(stderr) && p.conn.refusedOnce.CompareAndSwap(false, true) {
		p.sshLog(cfg).Warn("the login node refused a session on the shared ssh connection; set max_sessions below its sshd's MaxSessions",
			"max_sessions", cap(p.conn.slots))
	}
	switch {
	case muxTrouble.Match(muxRefused.ReplaceAll(stderr, nil)):
		p.sshLog(cfg).Debug("retiring the shared ssh connection: ssh could not use it", "stderr", truncate(string(stderr)))
		p.retire(login, socket)
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		p.sshLog(cfg).Debug("retiring the shared ssh connection after a call ran out of time")
		p.retire(login, socket)
	}
}

// muxFailed says whether a call failed in ssh's multiplexing before the
// command could start: ssh's own exit status 255, nothing on stdout, ssh
// unable to reach the master or greet it, and not falling back to a
// connection of its own (after which a failure is not the master's). A
// master that dies during a session is not one of these: the command may
// have run.
func muxFailed(err error, stdout, stderr []byte) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee) && ee.ExitCode() == 255 && len(stdout) == 0 &&
		muxUnreachable.Match(stderr) && !muxFallback.Match(stderr)
}

var (
	// muxTrouble is ssh complaining about the master in any way.
	muxTrouble = regexp.MustCompile(`(?m)^(Control socket connect\(|mux_client_|muxclient: |master hello exchange failed)`)
	// muxUnreachable is ssh failing before it asked for a session.
	muxUnreachable = regexp.MustCompile(`(?m)^(Control socket connect\(|mux_client_hello_exchange|(muxclient: )?master hello exchange failed)`)
	muxFallback    = regexp.MustCompile(`(?m)^ControlSocket .* already exists, disabling multiplexing`)
	// muxRefused is a master full up: sshd's MaxSessions is below
	// max_sessions. ssh falls back; the master is fine.
	muxRefused = regexp.MustCompile(`(?m)^mux_client_request_session: session request failed: .*\n?`)
	// muxNoise are the lines ssh prints when it falls back from the
	// master to a connection of its own, including when the master died
	// as ssh greeted it. The command then ran all the
	// same; the lines are about this plumbing, not the cluster.
	muxNoise = regexp.MustCompile(`(?m)^(ControlSocket .* already exists, disabling multiplexing|mux_client_request_session: session request failed: .*|(muxclient: )?master hello exchange failed)\r?\n`)
)

// quietMux drops muxNoise from stderr, unless the call failed and that is
// all there is to say.
func quietMux(stderr []byte, failed bool) []byte {
	if !muxNoise.Match(stderr) {
		return stderr
	}
	if q := muxNoise.ReplaceAll(stderr, nil); !failed || len(bytes.TrimSpace(q)) > 0 {
		return q
	}
	return stderr
}

// fillSSHDefaults gives multiplex and max_sessions their defaults when
// absent.
func (c *Config) fillSSHDefaults() {
	if c.Multiplex == nil {
		on := true
		c.Multiplex = &on
	}
	if c.MaxSessions == nil {
		n := defaultMaxSessions
		c.MaxSessions = &n
	}
}

// validateSSH checks max_sessions and resolves the multiplexing settings.
func validateSSH(s *settings) shared.Diagnostics {
	var diags shared.Diagnostics
	s.multiplex = s.Multiplex == nil || *s.Multiplex
	n := defaultMaxSessions
	if s.MaxSessions != nil {
		n = *s.MaxSessions
	}
	switch {
	case n < 1 || n > maxMaxSessions:
		diags = append(diags, shared.Errorf([]string{"max_sessions"}, "Invalid max_sessions",
			"max_sessions must be between 1 and %d; got %d. Most sshd allow 10 sessions per connection (MaxSessions); stay below it.", maxMaxSessions, n))
	case n >= 10 && s.multiplex:
		s.maxSessions = n
		diags = append(diags, shared.Diagnostic{Severity: shared.SeverityWarning, Path: []string{"max_sessions"}, Summary: "max_sessions at or above sshd's usual limit",
			Detail: fmt.Sprintf("Most sshd allow 10 sessions per connection (MaxSessions); stay below it. With %d, commands beyond the login node's limit each open a connection of their own.", n)})
	default:
		s.maxSessions = n
	}
	return diags
}

// sshLog is the provisioner's logger, also for settings made without
// Configure.
func (p *Provisioner) sshLog(cfg *settings) hclog.Logger {
	if cfg.log != nil {
		return cfg.log
	}
	return p.logger
}

// stopMasters tells every ssh master whose socket is in dir to exit, at
// once, and waits for the answers (bounded by ctx). closeSSH uses it for
// this plugin's masters, cleanStaleControlDirs for a dead plugin's.
func (p *Provisioner) stopMasters(ctx context.Context, cfg *settings, dir string) {
	entries, _ := os.ReadDir(dir)
	var wg sync.WaitGroup
	for _, e := range entries {
		if e.Type()&os.ModeSocket == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			socket := filepath.Join(dir, e.Name())
			args := sshArgv(cfg, []string{"-O", "exit", "-o", "ControlPath=" + socket}, nil)
			cmd := exec.CommandContext(ctx, p.sshPath, args...)
			cmd.WaitDelay = controlTimeout / 4
			if out, err := cmd.CombinedOutput(); err != nil {
				p.sshLog(cfg).Debug("could not stop an ssh master", "control_path", socket, "error", err, "output", truncate(string(out)))
			}
		}()
	}
	wg.Wait()
}

// outputSizes remembers how much each command printed last, so that the
// next call reads it into a buffer of that size at once: squeue prints a
// megabyte at 10,000 jobs, and a buffer grown to it by doubling cost two
// megabytes and a copy of each a poll cycle.
type outputSizes struct {
	mu   sync.Mutex     // guards last
	last map[string]int // by command name
}

// maxOutputHint bounds a hint, so that one huge answer does not make
// every later call of the command allocate as much.
const maxOutputHint = 16 << 20

func (o *outputSizes) get(command string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := o.last[command]
	return n + n/8 // room for a little growth
}

func (o *outputSizes) note(command string, n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.last == nil {
		o.last = map[string]int{}
	}
	o.last[command] = min(n, maxOutputHint)
}
