package slurm

// Reach through the login node: with reach = "relay", workers on compute
// nodes that cannot open a connection to the engine dial a relay on the
// login node instead, and the plugin carries each of their connections to
// the engine over the ssh connection it already holds.
//
// The relay (package slurm/relay) runs as one session of the plugin's ssh
// connection and carries each worker's connection as a yamux stream to the
// engine's address and nothing else, so it needs no port forwarding, which
// sites turn off. The workers' leg is TLS (relaytls.go;
// docs/design/slurm-relay.md).

import (
	"bufio"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/fluksio/provision/shared"

	"github.com/fluksio/provision/slurm/internal/queue"
	relayd "github.com/fluksio/provision/slurm/relay"
	"github.com/fluksio/provision/slurm/sshrun"
)

const (
	reachDirect = "direct"
	reachRelay  = "relay"

	// relayCacheDir is where, under the login node's home directory, the
	// plugin keeps its binary for the relay: one file per version, named
	// by its sha256.
	relayCacheDir = ".cache/fluksio"

	// Exit codes of the start script (relayStartScript).
	exitWrongPlatform = 90
	exitNoBinary      = 91

	// relayUploadTimeout bounds the copy of the plugin binary to the
	// login node: 25 MB at 50 kB/s.
	relayUploadTimeout = 10 * time.Minute

	// relayRetryFirst and relayRetryMax bound the pause between restarts
	// of a relay that failed or died.
	relayRetryFirst = time.Second
	relayRetryMax   = 30 * time.Second
)

// validateReach checks reach and the relay's settings, which mean
// something only with reach = "relay".
func validateReach(s *settings) shared.Diagnostics {
	var diags shared.Diagnostics
	add := func(d shared.Diagnostic) { diags = append(diags, d) }
	switch s.Reach {
	case reachDirect:
		for _, a := range []struct {
			name string
			set  bool
		}{{"relay_listen", s.RelayListen != ""}, {"relay_host", s.RelayHost != ""}, {"relay_command", len(s.RelayCommand) > 0}} {
			if a.set {
				add(shared.Errorf([]string{a.name}, a.name+" without a relay",
					"%s configures the relay, which runs only with reach = \"relay\"; set reach = \"relay\" or remove %s.", a.name, a.name))
			}
		}
	case reachRelay:
		if s.RelayListen != "" {
			h, port, err := net.SplitHostPort(s.RelayListen)
			n, perr := strconv.Atoi(port)
			if err != nil || perr != nil || n < 0 || n > 65535 || strings.ContainsFunc(h, isSpaceOrControl) {
				add(shared.Errorf([]string{"relay_listen"}, "Invalid relay_listen",
					"%q is not host:port; write it like \"0.0.0.0:7000\", or \":0\" for every interface and a free port.", s.RelayListen))
			}
		}
		if s.RelayHost != "" && !hostRE.MatchString(s.RelayHost) {
			add(shared.Errorf([]string{"relay_host"}, "Invalid relay_host",
				"%q is not a host name or address; write the login node's name as compute nodes know it, such as \"login1.cluster.example.org\".", s.RelayHost))
		}
		for i, w := range s.RelayCommand {
			if w == "" || strings.ContainsAny(w, "\x00\n\r") {
				add(shared.Errorf([]string{"relay_command", strconv.Itoa(i)}, "Invalid relay_command",
					"Each word of relay_command must be non-empty and on one line."))
			}
		}
		if !hasHTTPS(s.EngineURL) {
			for i, w := range s.WorkerCommand {
				if f, _, _ := strings.Cut(w, "="); f == "--engine-ca" || f == "--engine-cert-sha256" {
					add(shared.Diagnostic{Severity: shared.SeverityWarning, Path: []string{"worker_command", strconv.Itoa(i)}, Summary: "A pin or CA the relay will not match",
						Detail: fmt.Sprintf("With reach = \"relay\" and an engine without TLS, the relay serves TLS with a certificate of its own and the plugin gives each worker its pin; %s in worker_command would have workers check the relay against something else. Remove it, or set engine_url to https:// if the engine serves TLS (its TLS then runs end to end).", f)})
				}
			}
		}
		// The relay holds one session of the shared connection beside
		// max_sessions; at the usual sshd limit of 10, commands beyond
		// it open connections of their own (slurm/sshrun), which costs a
		// login each but loses nothing.
	default:
		add(shared.Errorf([]string{"reach"}, "Invalid reach",
			"reach is \"direct\" (workers dial engine_url) or \"relay\" (workers dial a relay on the login node); got %q.", s.Reach))
	}
	return diags
}

// hostRE is a host name or an IPv4 or IPv6 address.
var hostRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9.:-]*[A-Za-z0-9])?$`)

// engineAddress reads the host's network:address for the engine.
func engineAddress(v string) (network, addr string, err error) {
	network, addr, ok := strings.Cut(v, ":")
	switch {
	case v == "":
		return "", "", errors.New("the engine did not say where it listens (ConfigureRequest.EngineAddress is empty); reach = \"relay\" needs an engine that does")
	case !ok || addr == "" || (network != "tcp" && network != "unix"):
		return "", "", fmt.Errorf("the engine says it listens on %q, which is not tcp:host:port or unix:path", v)
	}
	return network, addr, nil
}

// relay runs the relay on the login node and carries its streams to the
// engine. It is made by Configure in relay mode and run by one goroutine,
// which the Provisioner's wait group counts; it ends when ctx (the
// poller's) does.
type relay struct {
	p                     *Provisioner
	cfg                   *settings
	engineNet, engineAddr string
	// tls is the relay's certificate when it serves workers TLS itself
	// (an engine without TLS); nil when the engine's TLS runs end to
	// end. It never changes: jobs already submitted carry its pin.
	tls *relayd.Cert

	// mu guards the fields below; it is never held across ssh.
	mu sync.Mutex
	// addr is the host:port workers dial, "" until the relay first says.
	// A restarted relay asks for the same port, so that the jobs already
	// submitted with it still reach it; if it comes back elsewhere, those
	// jobs are cancelled (moved).
	addr string
	// phase is where the relay stands, why says why it is down, and
	// since is when the phase began.
	phase    relayPhase
	why      string
	since    time.Time
	restarts int
	streams  int64
	// want is the port the next start asks for: the last one the relay
	// had, since jobs already submitted dial it, until a relay says it
	// is taken ("" then: a free one).
	want string
	// ready is closed and replaced each time the relay comes up, so that
	// a submission can wait for it.
	ready chan struct{}
}

// relayPhase is where a relay stands.
type relayPhase int

const (
	relayStarting relayPhase = iota
	relayUp
	relayDown
)

func (ph relayPhase) String() string {
	return [...]string{"starting", "up", "down"}[ph]
}

// stateLocked is the relay's phase as Status says it: "starting", "up"
// or "down: <why>". r.mu must be held.
func (r *relay) stateLocked() string {
	if r.phase == relayDown {
		return "down: " + r.why
	}
	return r.phase.String()
}

func newRelay(p *Provisioner, cfg *settings, engineNet, engineAddr string, tls *relayd.Cert) *relay {
	return &relay{p: p, cfg: cfg, engineNet: engineNet, engineAddr: engineAddr, tls: tls, phase: relayStarting, since: p.now(), ready: make(chan struct{})}
}

// relayDial is what a job's workers are given: the URL to dial and the
// certificate to expect there, and the relay's address it was made with.
type relayDial struct {
	url, pin, addr string
}

// dial waits for the relay to be up and says how workers reach it:
// https and the relay's pin when the relay speaks TLS, else the
// engine_url's scheme (https: TLS end to end to the engine).
func (r *relay) dial(ctx context.Context) (relayDial, error) {
	for {
		r.mu.Lock()
		addr, phase, state, ready := r.addr, r.phase, r.stateLocked(), r.ready
		r.mu.Unlock()
		if phase == relayUp {
			switch {
			case r.tls != nil:
				return relayDial{url: "https://" + addr, pin: r.tls.Pin, addr: addr}, nil
			case hasHTTPS(r.cfg.EngineURL):
				return relayDial{url: "https://" + addr, addr: addr}, nil
			}
			return relayDial{url: "http://" + addr, addr: addr}, nil
		}
		select {
		case <-ready:
		case <-ctx.Done():
			return relayDial{}, fmt.Errorf("the relay on %s is not up (%s): %w", r.cfg.host(), state, ctx.Err())
		}
	}
}

// left reports whether the relay has moved from addr, where a job's
// workers dial: the job is then to be cancelled (moved).
func (r *relay) left(addr string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return addr != "" && r.addr != addr
}

// note is the relay's line in Status.
func (r *relay) note() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := fmt.Sprintf("relay %s since %s", r.stateLocked(), r.since.UTC().Format(time.RFC3339))
	if r.addr != "" {
		s += ", workers dial " + r.addr
	}
	return s + fmt.Sprintf(", engine at %s:%s, %d connection(s) carried, %d restart(s)", r.engineNet, r.engineAddr, r.streams, r.restarts)
}

// down records that the relay went down, and why.
func (r *relay) down(why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.phase, r.why, r.since = relayDown, why, r.p.now()
}

// run keeps the relay up until ctx ends, restarting it with a growing
// pause when it fails or dies.
func (r *relay) run(ctx context.Context) {
	defer r.p.wg.Done()
	pause := relayRetryFirst
	for ctx.Err() == nil {
		began := time.Now()
		err := r.session(ctx)
		if ctx.Err() != nil {
			return
		}
		r.down(truncate(err.Error()))
		r.mu.Lock()
		r.restarts++
		taken := errors.Is(err, errRelayPortTaken) && r.want != ""
		if taken {
			r.want = ""
		}
		r.mu.Unlock()
		if taken {
			// Somebody else holds the port the jobs dial: the next
			// start takes another, and the jobs are cancelled then.
			r.cfg.log.Error("the relay's port is taken on the login node; starting it on another port, and cancelling the jobs that dial the old one", "error", err, "in", pause)
		} else {
			r.cfg.log.Error("the relay stopped; starting it again", "error", err, "in", pause)
		}
		if time.Since(began) > time.Minute {
			pause = relayRetryFirst // it ran a good while: a new failure
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		pause = min(2*pause, relayRetryMax)
	}
}

// session starts the relay over one ssh session and serves its streams
// until the session ends.
func (r *relay) session(ctx context.Context) error {
	remote, err := r.command(ctx)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cfg := r.cfg
	// On the login the last command got through (r.command's, just now):
	// with several logins, the relay moves with them (logins.go). However
	// the session ends, ssh is gone before session returns.
	stderr := &tailBuffer{max: 4096}
	ssh, err := r.p.q.Transport().Start(ctx, stderr, remote...)
	if err != nil {
		return fmt.Errorf("starting ssh for the relay: %w", err)
	}
	defer ssh.Close()
	if r.tls != nil {
		// The key goes over the session, as the relay's first line of
		// input: never in argv, nor in a file on the login node.
		if _, err := io.WriteString(ssh.Stdin, r.tls.Line); err != nil {
			return fmt.Errorf("sending the relay its certificate: %w", err)
		}
	}

	out := bufio.NewReader(ssh.Stdout)
	addr, err := r.greeting(ctx, out, ssh, stderr)
	if err != nil {
		return err
	}
	sess, err := yamux.Server(relayd.Stdio{Reader: out, Writer: ssh.Stdin}, relayd.YamuxConfig(stderr))
	if err != nil {
		return err
	}
	defer sess.Close()
	r.up(ctx, addr)
	cfg.log.Info("the relay is up", "workers_dial", addr, "login", ssh.Login.String(), "engine", r.engineNet+":"+r.engineAddr)

	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		s, err := sess.AcceptStream()
		if err != nil {
			select {
			case <-ssh.Done():
				return fmt.Errorf("its ssh session ended (%v): %s", ssh.Err(), strings.TrimSpace(stderr.String()))
			default:
			}
			return fmt.Errorf("its session ended: %w", err)
		}
		r.mu.Lock()
		r.streams++
		r.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.carry(ctx, s)
		}()
	}
}

// up records that the relay listens at addr, where workers dial, and is
// up: a submission waiting for it goes on. A relay that came back
// elsewhere first has the jobs that dial its old address cancelled
// (moved).
func (r *relay) up(ctx context.Context, addr string) {
	r.mu.Lock()
	old := r.addr
	r.addr = addr
	if _, port, _ := net.SplitHostPort(cmp.Or(r.cfg.RelayListen, ":0")); port == "0" {
		_, r.want, _ = net.SplitHostPort(addr)
	}
	r.mu.Unlock()
	if old != "" && old != addr {
		// Before the relay is up, so that no job is given the new
		// address until those with the old one are listed.
		r.moved(ctx, old, addr)
	}
	r.mu.Lock()
	r.phase, r.why, r.since = relayUp, "", r.p.now()
	close(r.ready)
	r.ready = make(chan struct{})
	r.mu.Unlock()
}

// carry carries one worker's connection, a stream of the relay's
// session, to the engine, until either end closes it.
func (r *relay) carry(ctx context.Context, s *yamux.Stream) {
	var d net.Dialer
	c, err := d.DialContext(ctx, r.engineNet, r.engineAddr)
	if err != nil {
		r.cfg.log.Warn("the relay could not reach the engine", "engine", r.engineNet+":"+r.engineAddr, "error", err)
		s.Close()
		return
	}
	relayd.Splice(s, c)
}

// greeting reads the relay's first line, the address workers dial, within
// submit_timeout; the relay's own words, if it failed, are in the error.
func (r *relay) greeting(ctx context.Context, out *bufio.Reader, ssh *sshrun.Session, stderr *tailBuffer) (string, error) {
	// A login shell's start-up files may print to stdout before the
	// relay does: such lines are skipped, and kept for the error. The
	// reader stops right after the greeting, which yamux reads on from.
	line := make(chan string, 1)
	go func() {
		for range 100 {
			s, err := out.ReadString('\n')
			if strings.HasPrefix(s, relayd.Greeting) || err != nil {
				line <- s
				return
			}
			stderr.Write([]byte("stdout: " + s))
		}
		line <- ""
	}()
	t := time.NewTimer(r.cfg.submitTimeout)
	defer t.Stop()
	select {
	case s := <-line:
		if addr, ok := strings.CutPrefix(strings.TrimSpace(s), strings.TrimSpace(relayd.Greeting)+" "); ok {
			if _, _, err := net.SplitHostPort(addr); err == nil {
				return addr, nil
			}
		}
		select {
		case <-ssh.Done():
			werr := ssh.Err()
			var ee *exec.ExitError
			if errors.As(werr, &ee) && ee.ExitCode() == relayd.ExitPortTaken {
				return "", fmt.Errorf("%w: %s", errRelayPortTaken, strings.TrimSpace(stderr.String()))
			}
			return "", fmt.Errorf("the relay did not start (%v): %s", werr, strings.TrimSpace(stderr.String()))
		case <-t.C:
			return "", fmt.Errorf("the relay did not say where it listens: %s", strings.TrimSpace(stderr.String()))
		}
	case <-t.C:
		return "", fmt.Errorf("the relay did not say where it listens within %s: %s", r.cfg.submitTimeout, strings.TrimSpace(stderr.String()))
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// command is the remote command that starts the relay: relay_command as
// configured, or the start script of the plugin's own binary, which is
// copied to the login node first if it is not there.
func (r *relay) command(ctx context.Context) ([]string, error) {
	cfg := r.cfg
	listen := cmp.Or(cfg.RelayListen, ":0")
	r.mu.Lock()
	if h, port, _ := net.SplitHostPort(listen); port == "0" && r.want != "" {
		// The same port as before, so that jobs already submitted with
		// it reach the new relay, until a relay finds it taken
		// (errRelayPortTaken, in run).
		listen = net.JoinHostPort(h, r.want)
	}
	r.mu.Unlock()
	flags := []string{"relay", "-listen", listen}
	if r.tls != nil {
		flags = append(flags, "-tls")
	}
	if cfg.RelayHost != "" {
		flags = append(flags, "-host", cfg.RelayHost)
	}
	if len(cfg.RelayCommand) > 0 {
		return append(append([]string{}, cfg.RelayCommand...), flags...), nil
	}
	bin, sum, err := ownBinary()
	if err != nil {
		return nil, err
	}
	start := relayStartScript(sum, flags)
	// A quick check first, so that a missing binary is copied before the
	// long-lived session starts, rather than found by it.
	_, stderr, err := r.p.q.Run(ctx, nil, "sh", "-c", relayCheckScript(sum))
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee) && ee.ExitCode() == exitWrongPlatform:
		return nil, fmt.Errorf("%s; install the relay built for it there and set relay_command", strings.TrimSpace(string(stderr)))
	case errors.As(err, &ee) && ee.ExitCode() == exitNoBinary:
		data, rerr := os.ReadFile(bin)
		if rerr != nil {
			return nil, fmt.Errorf("reading the plugin binary to copy it to the login node: %w", rerr)
		}
		cfg.log.Info("copying the relay to the login node", "path", "~/"+relayCacheDir+"/"+relayFile(sum), "bytes", len(data))
		// Tens of megabytes: more than submit_timeout may allow over a
		// slow link, and it happens once per version.
		if _, stderr, err := r.p.q.Transport().RunWithin(ctx, max(cfg.submitTimeout, relayUploadTimeout), data, "sh", "-c", relayUploadScript(sum)); err != nil {
			return nil, fmt.Errorf("copying the relay to %s: %w", cfg.host(), queue.WithStderr(err, stderr))
		}
	default:
		return nil, fmt.Errorf("checking the relay on %s: %w", cfg.host(), queue.WithStderr(err, stderr))
	}
	return []string{"sh", "-c", start}, nil
}

// ownBinary is this program's path and sha256, read once.
func ownBinary() (bin, sum string, err error) {
	b := ownBinaryOnce()
	return b.path, b.sum, b.err
}

var ownBinaryOnce = sync.OnceValue(func() (b struct {
	path, sum string
	err       error
}) {
	bin, err := os.Executable()
	if err != nil {
		b.err = fmt.Errorf("finding the plugin binary to run as the relay: %w", err)
		return b
	}
	f, err := os.Open(bin)
	if err != nil {
		b.err = err
		return b
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		b.err = err
		return b
	}
	b.path, b.sum = bin, hex.EncodeToString(h.Sum(nil))
	return b
})

// relayFile is the cached binary's name: the version is its sha256.
func relayFile(sum string) string { return "provisioner-slurm-" + sum[:16] }

// unameOS and unameArch are what uname -s and uname -m print for a Go
// GOOS and GOARCH.
var (
	unameOS   = map[string]string{"linux": "Linux", "darwin": "Darwin", "freebsd": "FreeBSD"}
	unameArch = map[string]string{"amd64": "x86_64", "arm64": "aarch64", "ppc64le": "ppc64le", "s390x": "s390x", "riscv64": "riscv64"}
)

// uname is what uname -sm prints on a machine of this binary's kind.
func uname() string { return unameOf(runtime.GOOS, runtime.GOARCH) }

// unameOf is what uname -sm prints on a machine of GOOS goos and GOARCH
// goarch.
func unameOf(goos, goarch string) string { return unameOS[goos] + " " + unameArch[goarch] }

// goPlatform reads what uname -sm printed as a GOOS and GOARCH; ok is
// false for a machine no Go port here names. FreeBSD says amd64 where
// Linux says x86_64, and macOS arm64 where Linux says aarch64.
func goPlatform(u string) (goos, goarch string, ok bool) {
	s, m, _ := strings.Cut(strings.TrimSpace(u), " ")
	for o, name := range unameOS {
		if name == s {
			goos = o
		}
	}
	for a, name := range unameArch {
		if name == m || a == m {
			goarch = a
		}
	}
	return goos, goarch, goos != "" && goarch != ""
}

// relayPlatformScript exits exitWrongPlatform, saying why, when the
// login node is not a machine this binary runs on.
func relayPlatformScript() string {
	return fmt.Sprintf(`have="$(uname -sm)"; if [ "$have" != %s ]; then echo "the login node is $have, and the plugin binary is for %s" >&2; exit %d; fi; `,
		shellQuote(uname()), uname(), exitWrongPlatform)
}

// relayCheckScript exits exitWrongPlatform when the login node is not a
// machine this binary runs on, exitNoBinary when the cached binary is
// missing or not this version, 0 otherwise. It decides whether to copy
// the binary; it guards nothing that runs (relayStartScript does).
func relayCheckScript(sum string) string {
	return relayPlatformScript() + fmt.Sprintf(`f="$HOME/%s/%s"; printf '%%s  %%s\n' %s "$f" | sha256sum -c --status 2>/dev/null || exit %d`,
		relayCacheDir, relayFile(sum), sum, exitNoBinary)
}

// relayStartScript runs the relay from a private copy of the cached
// binary: a directory of its own (mktemp -d, mode 0700, a name nobody
// knows in advance) holds the copy, which is checked by its sha256 after
// it is written and executed from there, so that what runs is what was
// checked. Checking the cached file and then executing it, as it once
// did, left a window in which the file could be swapped (18 starts of
// 150 ran a swapped binary). A copy that does not match exits
// exitNoBinary, which copies the binary again. The relay removes its
// private copy once it runs (-private). The start also marks its binary
// as used (touch) and removes cached binaries of other versions unused
// for an hour, and private directories an hour old (left by a start
// killed between mktemp and exec). An hour, not at once: two plugin
// versions sharing one login account (an upgrade, two engines) would
// otherwise delete each other's binary at every start and copy theirs
// again each time.
func relayStartScript(sum string, flags []string) string {
	var q []string
	for _, f := range flags {
		q = append(q, shellQuote(f))
	}
	return relayPlatformScript() + fmt.Sprintf(`umask 077; c="$HOME/%[1]s"; f="$c/%[2]s"; `+
		`t="$(mktemp -d "$c/run.XXXXXXXX" 2>/dev/null)" || exit %[3]d; `+
		`if ! cp "$f" "$t/%[4]s" 2>/dev/null || ! printf '%%s  %%s\n' %[5]s "$t/%[4]s" | sha256sum -c --status 2>/dev/null; then rm -rf "$t"; exit %[3]d; fi; `+
		`touch "$f"; %[7]s`+
		`find "$c" -maxdepth 1 -name 'run.*' -mmin +60 -exec rm -rf {} + 2>/dev/null; `+
		`exec "$t/%[4]s" %[6]s -private "$t"`,
		relayCacheDir, relayFile(sum), exitNoBinary, relayd.PrivateName, sum, strings.Join(q, " "), staleCopiesScript("c", "provisioner-slurm-*", relayFile(sum)))
}

// staleCopiesScript removes, from the directory in the shell variable
// dirVar, the files named like glob but not keep that nobody has used
// (touched) for an hour: other versions' copies. An hour, not at once:
// two plugin versions sharing one login account (an upgrade, two
// engines) would otherwise delete each other's copy every time, and a
// copy a job still waiting in the queue will run must outlive a newer
// version's first submission.
func staleCopiesScript(dirVar, glob, keep string) string {
	return fmt.Sprintf(`find "$%s" -maxdepth 1 -type f -name %s ! -name %s -mmin +60 -exec rm -f {} + 2>/dev/null; `,
		dirVar, shellQuote(glob), shellQuote(keep))
}

// relayUploadScript writes standard input to the relay's cache
// (uploadScript).
func relayUploadScript(sum string) string {
	return uploadScript(relayCacheDir, relayFile(sum), sum)
}

// uploadScript writes standard input to dir/name under the login user's
// home, private to the user (dir and the file mode 0700), under a
// temporary name first, checked against sum and then renamed, so that a
// cut-short or garbled copy is never run; the temporary file goes
// either way, also when ssh's end hangs the script up. It leaves d set
// to the directory, for what follows it.
func uploadScript(dir, name, sum string) string {
	return fmt.Sprintf(`umask 077; d="$HOME/%s"; mkdir -p "$d" && chmod 700 "$d" || exit 1; t="$d/.upload.$$"; trap 'rm -f "$t"' EXIT; trap 'exit 1' HUP INT TERM; `+
		`cat > "$t" && printf '%%s  %%s\n' %s "$t" | sha256sum -c --status && chmod 700 "$t" && mv -f "$t" "$d/%s"`,
		dir, sum, name)
}

// tailBuffer keeps the last max bytes written to it: ssh's and the
// relay's stderr, for the error that says why a relay stopped.
type tailBuffer struct {
	mu  sync.Mutex // guards b
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

// String is what was written, ssh's decisive lines first (sshrun.Lead):
// through a bastion, ssh's last line is seldom why it failed.
func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(sshrun.Lead(t.b))
}
