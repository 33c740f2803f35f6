package sshrun

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fluksio/provision/internal/clip"
	"github.com/hashicorp/go-hclog"
)

const (
	// WaitDelay bounds how long a killed ssh may keep its output pipes
	// open (a ProxyCommand or a multiplexing master can hold them).
	// Without it a hung login node could hold up a caller's deadline.
	WaitDelay = 2 * time.Second

	// DefaultMaxSessions stays below sshd's default MaxSessions (10), the
	// number of sessions one multiplexed connection may carry, with room
	// for the user's own ssh sharing the connection.
	DefaultMaxSessions = 8

	// maxSaid is how much of what ssh said is kept for a note or a log
	// line: enough for a two-line refusal, not a page of a login banner.
	maxSaid = 500
)

// Config is how one cluster is reached. It never changes once given to
// New.
type Config struct {
	// Program is the ssh to run; "" is "ssh" on PATH.
	Program string
	// Logins are the login nodes, tried in this order.
	Logins []Login
	// Bastions are the jump hosts every login node is reached through,
	// tried in this order (bastion.go); none: ssh goes straight to the
	// login node, or as the user's ssh configuration says.
	Bastions []Login
	// ConfigFile is ssh's -F; "" leaves the user's own configuration.
	ConfigFile string
	// Port is ssh's -p for a login that names no port; 0 leaves it to
	// ssh.
	Port int
	// Key is ssh's -i; "" is none.
	Key string
	// KnownHosts, when set, is the only file of known host keys, and
	// checking is strict: a key not in it is refused.
	KnownHosts string
	// Options are ssh's -o options (Key=Value). They come after the
	// transport's own, and ssh keeps the first value it is given, so
	// they cannot undo them.
	Options []string
	// Timeout bounds each call of Run and RunOn, and ConnectTimeout is
	// half of it unless Options set one or ConnectTimeout does; 0 leaves
	// a call to its context.
	Timeout time.Duration
	// ConnectTimeout, when not 0, bounds the connection instead of half
	// of Timeout: a check that waits long for a rationing controller
	// still gives up soon on a login that does not answer.
	ConnectTimeout time.Duration
	// Multiplex runs the commands to each login through one master
	// connection (ControlMaster). Off, the user's ssh configuration and
	// Options decide alone.
	Multiplex bool
	// MaxSessions caps the commands running at once; 0 or less is
	// DefaultMaxSessions.
	MaxSessions int
	// RemoteSaid, if set, matches the stderr of a remote command that
	// exits 255 by itself, ssh's own failure status (sbatch does, for an
	// option it cannot parse): such a failure is the command's, not the
	// login node's.
	RemoteSaid *regexp.Regexp
	// Now is the clock a silent login's retry is counted by; nil is
	// time.Now.
	Now func() time.Time
	// AccessChanged, if set, is told of each change of Access, on the
	// goroutine of the call that found it, with no lock held.
	AccessChanged func(AccessChange)
}

// Transport runs commands on one cluster's login nodes. Its methods may
// be called from any goroutine.
type Transport struct {
	cfg     Config
	program string
	log     hclog.Logger
	// proxies are the ProxyCommands through each of cfg.Bastions
	// (proxyCommand), made by New; they never change.
	proxies []string
	// bastion is the index of the bastion in use: the last that let ssh
	// through or refused it (bastion.go).
	bastion atomic.Int32
	// hops numbers the files a multiplexed call's hop writes its stderr
	// to (runVia).
	hops atomic.Uint64

	// slots caps the ssh commands running at once at MaxSessions; every
	// call holds one from before ssh starts until it has exited. Through
	// one multiplexed connection each command is a session, and sshd
	// refuses sessions beyond its MaxSessions (10 by default): ssh then
	// prints "mux_client_request_session: session request failed: Session
	// open refused by peer" (or "open failed") and falls back to a
	// connection of its own, a full handshake and a line of noise in what
	// the remote command said. Without multiplexing the cap keeps as many
	// handshakes from piling onto sshd's MaxStartups.
	slots chan struct{}
	// refusedOnce is set once a session refusal has been logged.
	refusedOnce atomic.Bool
	// outHint sizes the buffer each command's output is read into; it
	// has its own lock.
	outHint outputSizes
	// logins is where each login node stands (logins.go); it has its own
	// lock.
	logins loginBook
	// noTimeout is set once a login node is found without coreutils'
	// timeout: commands then run bare (deadline.go).
	noTimeout atomic.Bool
	// starting counts Starts under way. Add happens under mu and only
	// while closed is false, so no Add races Close's Wait.
	starting sync.WaitGroup

	// mu guards the fields below. It is never held across ssh or a hook.
	mu sync.Mutex
	// dir is the private directory (0700) the control sockets live in,
	// made on the first multiplexed call; "" before that and after Close.
	dir string
	// gen numbers each login's current master's socket, cm<gen>[.<login>]
	// (socket). Retiring a master moves on to the next number rather
	// than renaming its socket: a master removes its own ControlPath when
	// it exits, and a renamed one would remove its successor's.
	gen map[int]int
	// closed is set by Close: later calls do not multiplex, and Start
	// refuses.
	closed bool
	// unusable is set when no directory short and plain enough for a
	// ControlPath could be made; calls then do not multiplex.
	unusable bool
	// sessions are the Sessions started and not yet closed.
	sessions map[*Session]struct{}
}

// New is a Transport for c, logging to log (nil: nowhere). It starts
// nothing: the first call makes the control directory and the master.
func New(c Config, log hclog.Logger) *Transport {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	if c.MaxSessions < 1 {
		c.MaxSessions = DefaultMaxSessions
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	c.Logins, c.Bastions = slices.Clone(c.Logins), slices.Clone(c.Bastions)
	t := &Transport{cfg: c, program: cmp.Or(c.Program, "ssh"), log: log,
		slots: make(chan struct{}, c.MaxSessions), sessions: map[*Session]struct{}{}}
	for _, b := range c.Bastions {
		t.proxies = append(t.proxies, proxyCommand(t.program, &t.cfg, b))
	}
	return t
}

// Run runs one command on a login node and returns what it printed,
// bounded by Timeout and by ctx. Each login is tried in turn until one
// lets the command in (logins.go); with one login, that one.
//
// With Multiplex on, every call to a login goes through one master
// connection that OpenSSH keeps open (ControlMaster=auto): the first call
// makes it, the rest run through it in a few milliseconds instead of a
// handshake each. If it dies, the next call makes a new one. Calls that
// race to make the first master are safe: ssh gives the losers a plain
// connection of their own ("ControlSocket ... already exists, disabling
// multiplexing"), and those lines are left out of stderr.
//
// At most MaxSessions calls run at once; a call waits for a turn for as
// long as ctx lets it. A nonzero exit is an error, which names the
// command and the login; stdout and stderr are returned either way, so
// that callers can report what the remote command said. stdin may be nil,
// in which case ssh reads /dev/null.
func (t *Transport) Run(ctx context.Context, stdin []byte, remote ...string) (stdout, stderr []byte, err error) {
	return t.RunWithin(ctx, t.cfg.Timeout, stdin, remote...)
}

// RunWithin is Run bounded by limit instead of Timeout, for a call that
// moves more than a command's input (a binary copied to the login node).
func (t *Transport) RunWithin(ctx context.Context, limit time.Duration, stdin []byte, remote ...string) (stdout, stderr []byte, err error) {
	logins := t.cfg.Logins
	if len(remote) == 0 || len(logins) == 0 {
		return nil, nil, fmt.Errorf("ssh to %s: no remote command, or no login node to run it on", t.host())
	}
	if err := t.acquire(ctx); err != nil {
		return nil, nil, fmt.Errorf("%s on %s: waiting for an ssh session (max_sessions %d): %w", remote[0], t.host(), cap(t.slots), err)
	}
	defer t.release()
	ctx, cancel := withLimit(ctx, limit)
	defer cancel()

	var at Login
	stopped := false
	order := t.logins.order(len(logins), t.cfg.Now())
	tried, refused := false, false
	for n, i := range order {
		if !t.logins.take(len(logins), i, t.cfg.Now()) {
			// Another command tries it, or its retry is no longer due.
			continue
		}
		at, tried = logins[i], true
		started := t.cfg.Now()
		stdout, stderr, stopped, err = t.runAt(ctx, i, stdin, remote)
		out := t.classify(err, stdout, stderr)
		if ctx.Err() != nil && out != outcomeGotThrough {
			out = outcomeUnknown
		}
		refused = out == outcomeRefused
		last := n == len(order)-1 || (out != outcomeSilent && out != outcomeRefused)
		if ch := t.logins.note(len(logins), i, out, string(stderr), started, t.cfg.Now(), last); ch != (loginChange{}) {
			t.changed(i, ch, string(stderr))
		}
		if last {
			break
		}
		// Nothing ran there: the next login may take it.
	}
	if !tried {
		// Every login this command could go to refused the login, and
		// none's retry is due: nothing knocks before it is.
		return nil, nil, t.logins.held(remote[0], logins)
	}
	stderr = quietMux(stderr, err != nil)
	host := at.Host()
	switch {
	case err == nil:
	case stopped:
		err = fmt.Errorf("%s on %s: no answer within %s: %w: %w", remote[0], host, limit, ErrStoppedThere, context.DeadlineExceeded)
	case refused:
		err = refusalError{fmt.Errorf("%s on %s: %w", remote[0], host, err)}
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		err = fmt.Errorf("%s on %s: no answer within %s: %w", remote[0], host, limit, ctx.Err())
	case ctx.Err() != nil:
		err = fmt.Errorf("%s on %s: %w", remote[0], host, ctx.Err())
	default:
		err = fmt.Errorf("%s on %s: %w", remote[0], host, err)
	}
	return stdout, stderr, err
}

// RunOn runs one command on login (its index in Logins) alone, bounded
// by Timeout and by ctx, for a check of each login: it does not fail
// over, and what it finds does not change how the logins stand. Its
// error is ssh's own, not wrapped, for the caller to word with the login
// it chose; stderr is without ssh's multiplexing noise.
func (t *Transport) RunOn(ctx context.Context, login int, stdin []byte, remote ...string) (stdout, stderr []byte, err error) {
	if len(remote) == 0 || login < 0 || login >= len(t.cfg.Logins) {
		return nil, nil, fmt.Errorf("ssh to login %d of %d: no remote command, or no such login", login+1, len(t.cfg.Logins))
	}
	if err := t.acquire(ctx); err != nil {
		return nil, nil, err
	}
	defer t.release()
	ctx, cancel := withLimit(ctx, t.cfg.Timeout)
	defer cancel()
	stdout, stderr, stopped, err := t.runAt(ctx, login, stdin, remote)
	if stopped {
		err = fmt.Errorf("%w: %w", ErrStoppedThere, context.DeadlineExceeded)
	}
	return stdout, quietMux(stderr, err != nil), err
}

// withLimit is ctx bounded by limit, when there is one.
func withLimit(ctx context.Context, limit time.Duration) (context.Context, context.CancelFunc) {
	if limit <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, limit)
}

// runAt runs the command once on login i, through its shared connection
// when multiplexing. When ssh failed by itself, its stderr comes back
// with its decisive lines first (Lead), for every caller's words.
//
// With a deadline, the command runs under the login node's timeout
// (deadline.go); stopped says that timeout ended it, err being then its
// exit status. A login node without timeout has the command run once
// more, bare: nothing ran the first time.
func (t *Transport) runAt(ctx context.Context, i int, stdin []byte, remote []string) (stdout, stderr []byte, stopped bool, err error) {
	bounded, given := t.bounded(ctx, remote)
	started := time.Now()
	stdout, stderr, err = t.runMux(ctx, i, stdin, bounded)
	if given > 0 && lacksTimeout(err, stderr) {
		if t.noTimeout.CompareAndSwap(false, true) {
			t.log.Warn("the login node has no timeout command: a command cut off at its deadline may run on there",
				"login", t.cfg.Logins[i].String(), "stderr", shorten(string(stderr)))
		}
		given = 0
		stdout, stderr, err = t.runMux(ctx, i, stdin, remote)
	}
	if t.sshFailed(err, stdout, stderr) {
		stderr = Lead(stderr)
	}
	return stdout, stderr, stoppedThere(err, given, time.Since(started)), err
}

// sshFailed reports whether a call's end is ssh's own failure: its exit
// status 255, nothing on stdout, and not a remote command's words
// (RemoteSaid).
func (t *Transport) sshFailed(err error, stdout, stderr []byte) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee) && ee.ExitCode() == 255 && len(stdout) == 0 &&
		(t.cfg.RemoteSaid == nil || !t.cfg.RemoteSaid.Match(stderr))
}

// runMux is runAt before the words are led.
func (t *Transport) runMux(ctx context.Context, i int, stdin []byte, remote []string) (stdout, stderr []byte, err error) {
	at := t.cfg.Logins[i]
	socket := t.controlSocket(i)
	stdout, stderr, err = t.runVia(ctx, at, muxOptions(socket), socket, stdin, remote)
	t.outHint.note(remote[0], len(stdout))
	if socket != "" {
		t.checkMux(ctx, i, socket, stderr)
		if ctx.Err() == nil && muxFailed(err, stdout, stderr) {
			// ssh gave up on the master before asking it for a
			// session, and did not log in on its own either (it would
			// have said so: the socket exists), so the command never
			// ran: run it once more on a plain connection.
			t.log.Warn("the shared ssh connection failed; retrying on a connection of its own", "login", at.String(), "stderr", shorten(string(stderr)))
			stdout, stderr, err = t.runVia(ctx, at, []string{"-o", "ControlPath=none"}, "", stdin, remote)
		}
	}
	return stdout, stderr, err
}

// run runs ssh once with args; its output is read into a buffer made
// for about outSize bytes.
func (t *Transport) run(ctx context.Context, args []string, stdin []byte, outSize int) (stdout, stderr []byte, err error) {
	cmd := exec.CommandContext(ctx, t.program, args...)
	cmd.WaitDelay = WaitDelay
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

// argv is ssh's argv after the program name, to login at, through the
// ProxyCommand proxy unless it is "" (bastion.go). BatchMode
// makes a prompt (a passphrase, an unknown host key) fail at once instead
// of hanging. Host-key checking is never turned off here; KnownHosts
// turns it fully on. extra (the multiplexing options) and proxy come
// next, then the user's options, and ssh keeps the first value it is given, so they
// cannot undo the transport's; the user's ssh_config still applies to
// everything not set here, ProxyJump included. A login's own port comes
// before Port. Unless the user's options set one, ConnectTimeout is half
// of Timeout (connectTimeout). "--" ends ssh's options, so nothing after
// it is read as one.
func (t *Transport) argv(at Login, extra []string, proxy string, remote []string) []string {
	c := &t.cfg
	args := []string{"-o", "BatchMode=yes"}
	args = append(args, extra...)
	if proxy != "" {
		args = append(args, "-o", "ProxyCommand="+proxy)
	}
	if c.ConfigFile != "" {
		args = append(args, "-F", c.ConfigFile)
	}
	if at.Port != 0 {
		args = append(args, "-p", strconv.Itoa(at.Port))
	} else if c.Port != 0 {
		args = append(args, "-p", strconv.Itoa(c.Port))
	}
	if c.Key != "" {
		args = append(args, "-i", c.Key)
	}
	if c.KnownHosts != "" {
		args = append(args, "-o", "UserKnownHostsFile="+c.KnownHosts, "-o", "StrictHostKeyChecking=yes")
	}
	for _, o := range c.Options {
		args = append(args, "-o", o)
	}
	if c.Timeout > 0 && userConnectTimeout(c.Options) == "" {
		args = append(args, "-o", "ConnectTimeout="+strconv.FormatInt(c.connectSeconds(), 10))
	}
	args = append(args, "--", at.Dest)
	for _, r := range remote {
		args = append(args, shellQuote(r))
	}
	return args
}

// firstLogin is the first login, the one an argv without a login of its
// own is about (the settings ssh -G reads, a master's control command).
func (t *Transport) firstLogin() Login {
	if len(t.cfg.Logins) == 0 {
		return Login{}
	}
	return t.cfg.Logins[0]
}

// connectTimeout is ssh's ConnectTimeout, in seconds, for a call bounded
// by timeout: half of it, so that a login node that accepts the
// connection and then says nothing (a wedged sshd) fails with ssh's own
// "Connection timed out during banner exchange", which says the command
// never ran, rather than with the call running out of time, after which
// the caller cannot tell whether it ran.
func connectTimeout(timeout time.Duration) int64 {
	return max(1, int64((timeout/2+time.Second-1)/time.Second))
}

// connectSeconds is ConnectTimeout in whole seconds, or half of
// Timeout's.
func (c Config) connectSeconds() int64 {
	if c.ConnectTimeout > 0 {
		return max(1, int64((c.ConnectTimeout+time.Second-1)/time.Second))
	}
	return connectTimeout(c.Timeout)
}

// acquire takes one of the MaxSessions slots, waiting as long as ctx
// allows.
func (t *Transport) acquire(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case t.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (t *Transport) release() { <-t.slots }

// host is the login nodes without their users, for messages: the first,
// or all of them when there are several.
func (t *Transport) host() string {
	hosts := make([]string, len(t.cfg.Logins))
	for i, a := range t.cfg.Logins {
		hosts[i] = a.Host()
	}
	return strings.Join(hosts, " or ")
}

// shellQuote quotes s for the login node's shell, which reads the remote
// command as one string; words of only safe characters stay as they are.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool { return !isShellSafe(r) }) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func isShellSafe(r rune) bool {
	return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || strings.ContainsRune("@%+=:,./_-", r)
}

// shorten keeps at most maxSaid runes of s, both ends (clip.Ends).
func shorten(s string) string { return clip.Ends(s, maxSaid) }

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
