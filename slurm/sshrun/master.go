package sshrun

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Multiplexing: one master connection per login node, its socket in a
// directory of the Transport's own.

const (
	// controlPersist is how long a master connection stays up with no
	// command running through it. It also bounds how long a master can
	// outlive a process that was killed before it could close it.
	controlPersist = "120s"
	// controlName is the start of the socket's name in the Transport's
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
	// controlDirPrefix starts every control directory's name.
	controlDirPrefix = "fxssh-"
)

// muxOptions are the options that run a call through the master at
// socket; none when not multiplexing ("").
func muxOptions(socket string) []string {
	if socket == "" {
		return nil
	}
	return []string{"-o", "ControlMaster=auto", "-o", "ControlPath=" + socket, "-o", "ControlPersist=" + controlPersist}
}

// controlSocket is the ControlPath for a call to login, "" when not
// multiplexing: Multiplex off (the user's ssh_config decides, and is
// passed nothing), after Close, or when no usable directory could be
// made. The directory is made on first use, private to this Transport,
// and made again should something have removed it.
func (t *Transport) controlSocket(login int) string {
	if !t.cfg.Multiplex {
		return ""
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || t.unusable {
		return ""
	}
	if t.dir != "" {
		if _, err := os.Stat(t.dir); err == nil {
			return t.socketLocked(login)
		}
		t.dir = ""
	}
	dir, err := makeControlDir()
	if err != nil {
		t.unusable = true
		t.log.Warn("not sharing one ssh connection: every command makes its own", "reason", err)
		return ""
	}
	t.dir = dir
	t.log.Debug("sharing one ssh connection", "control_path", t.socketLocked(login))
	return t.socketLocked(login)
}

// socketLocked is the current master's ControlPath to login (its index
// in Logins): cm<gen> for the first, cm<gen>.<login> for the others, so
// that each login node has a master of its own. t.mu must be held.
func (t *Transport) socketLocked(login int) string {
	name := controlName + strconv.Itoa(t.gen[login])
	if login > 0 {
		name += "." + strconv.Itoa(login)
	}
	return filepath.Join(t.dir, name)
}

// plainPath is what may go into a ControlPath unchanged: ssh expands % and
// ~ in it, and an option line splits at whitespace.
var plainPath = regexp.MustCompile(`^/[A-Za-z0-9/._-]+$`)

// controlBase is where control directories are made: /tmp rather than
// $TMPDIR, which can be too long for a socket's path.
func controlBase() string {
	if st, err := os.Stat("/tmp"); err == nil && st.IsDir() {
		return "/tmp"
	}
	return os.TempDir()
}

// makeControlDir makes a new private directory for control sockets.
func makeControlDir() (string, error) {
	base := controlBase()
	// The pid in the name lets a later process clean up after this one
	// if it is killed (CleanStale).
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

// controlDirPattern is the MkdirTemp pattern for this process.
func controlDirPattern() string {
	return controlDirPrefix + strconv.Itoa(os.Getpid()) + "-"
}

// retire takes a master out of use: new calls use the next socket name,
// and so make a new master. Commands running through the old one go on,
// it exits by itself once idle for ControlPersist, and Close still finds
// its socket to tell it to exit. Nothing here waits on the master, which
// may be wedged.
func (t *Transport) retire(login int, socket string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.dir != "" && socket == t.socketLocked(login) {
		if t.gen == nil {
			t.gen = map[int]int{}
		}
		t.gen[login]++
	}
}

// checkMux looks at how a multiplexed call went and retires the master
// if it is no good, so that the next call makes a new one: when ssh could
// not talk to it (it then falls back to a connection of its own, or gives
// up), or when the call ran out of time, since the master may be what
// hangs (a connection that died without a word). Commands still running
// through a retired master go on.
func (t *Transport) checkMux(ctx context.Context, login int, socket string, stderr []byte) {
	if muxRefused.Match(stderr) && t.refusedOnce.CompareAndSwap(false, true) {
		t.log.Warn("the login node refused a session on the shared ssh connection; set max_sessions below its sshd's MaxSessions",
			"max_sessions", cap(t.slots))
	}
	switch {
	case muxTrouble.Match(muxRefused.ReplaceAll(stderr, nil)):
		t.log.Debug("retiring the shared ssh connection: ssh could not use it", "stderr", shorten(string(stderr)))
		t.retire(login, socket)
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		t.log.Debug("retiring the shared ssh connection after a call ran out of time")
		t.retire(login, socket)
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
	// MaxSessions. ssh falls back; the master is fine.
	muxRefused = regexp.MustCompile(`(?m)^mux_client_request_session: session request failed: .*\n?`)
	// muxNoise are the lines ssh prints when it falls back from the
	// master to a connection of its own, including when the master died
	// as ssh greeted it. The command then ran all the same; the lines
	// are about this plumbing, not the remote command.
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

// Close ends the Sessions still open, tells every master this Transport
// started to exit, and removes their directory. Calls after it run
// without multiplexing, and Start refuses. It first waits for the calls
// in flight, any of which may be making a master just now, so that none
// is left behind. It is bounded by ctx, but given a moment even if ctx
// has ended, since a master left behind lingers for ControlPersist.
func (t *Transport) Close(ctx context.Context) {
	t.mu.Lock()
	dir := t.dir
	t.dir, t.closed = "", true
	t.mu.Unlock()
	t.starting.Wait()
	t.mu.Lock()
	open := make([]*Session, 0, len(t.sessions))
	for s := range t.sessions {
		open = append(open, s)
	}
	t.mu.Unlock()
	for _, s := range open {
		s.Close()
	}
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
	// closed.
	drain, cancelDrain := context.WithTimeout(ctx, bound/2)
	defer cancelDrain()
	for held := 0; held < cap(t.slots); held++ {
		if t.acquire(drain) != nil {
			break
		}
		defer t.release()
	}

	t.stopMasters(ctx, dir)
	if err := os.RemoveAll(dir); err != nil {
		t.log.Warn("could not remove the ssh control directory", "dir", dir, "error", err)
	}
}

// stopMasters tells every ssh master whose socket is in dir to exit, at
// once, and waits for the answers (bounded by ctx). Close uses it for
// this Transport's masters, CleanStale for a dead process's.
func (t *Transport) stopMasters(ctx context.Context, dir string) {
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
			args := t.argv(t.firstLogin(), []string{"-O", "exit", "-o", "ControlPath=" + socket}, "", nil)
			cmd := exec.CommandContext(ctx, t.program, args...)
			cmd.WaitDelay = controlTimeout / 4
			if out, err := cmd.CombinedOutput(); err != nil {
				t.log.Debug("could not stop an ssh master", "control_path", socket, "error", err, "output", shorten(string(out)))
			}
		}()
	}
	wg.Wait()
}

// A process that is killed (SIGKILL, the OOM killer) cannot remove its
// control directory, /tmp/fxssh-<pid>-<random>, and the master in it
// lingers for ControlPersist. The directory's name carries the pid of the
// process that made it, so the next to start can tell which are left by
// the dead: it asks each master in them to exit and removes them. Only
// directories owned by this user and made by a process that no longer
// exists are touched; a live process's are never.

// CleanStale stops the masters in control directories that dead
// processes of this user left, and removes the directories, bounded by
// ctx. The Slurm plugin calls it once, as its poller starts.
func (t *Transport) CleanStale(ctx context.Context) {
	for _, dir := range staleControlDirs(controlBase()) {
		t.stopMasters(ctx, dir)
		if err := os.RemoveAll(dir); err != nil {
			t.log.Debug("could not remove a stale ssh control directory", "dir", dir, "error", err)
			continue
		}
		t.log.Info("removed the ssh control directory of a plugin that died", "dir", dir)
	}
}

// staleControlDirs lists the control directories in base that a dead
// process of this user left.
func staleControlDirs(base string) []string {
	entries, err := os.ReadDir(base)
	if err != nil {
		return nil
	}
	var stale []string
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), controlDirPrefix)
		if !ok || !e.IsDir() {
			continue
		}
		pidStr, _, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		if st, ok := info.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Getuid() {
			continue
		}
		if processAlive(pid) {
			continue
		}
		stale = append(stale, filepath.Join(base, e.Name()))
	}
	return stale
}

// processAlive reports whether pid exists (signal 0 reaches it, or it
// exists and is another user's).
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
