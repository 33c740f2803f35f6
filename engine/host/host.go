package host

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fluksio/provision/internal/wire"
	"github.com/fluksio/provision/shared"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/hashicorp/go-plugin/runner"
	"google.golang.org/grpc"
)

// DefaultMaxCredentialTTL caps how long a credential minted for a plugin
// may live. A credential should live as long as its job (queue wait plus
// walltime), which the plugin knows and passes as the TTL; the cap is for
// a plugin that asks for more. Twelve hours covers a day shift's queue
// wait and a long walltime without leaving a stolen token good for days.
const DefaultMaxCredentialTTL = 12 * time.Hour

// DefaultEventQueue is how many events of one plugin may wait for
// LaunchConfig.OnEvent before more are dropped.
const DefaultEventQueue = wire.DefaultEventQueue

// DefaultCredentialTTL is the lifetime of a credential whose plugin did
// not say how long its job may take.
const DefaultCredentialTTL = time.Hour

// CredentialClaims is what a worker credential binds: the worker's name,
// the provisioner that asked for it, and the most the worker may claim to
// be. The engine believes these, and not the worker, about who owns a
// worker and what it may be given.
type CredentialClaims struct {
	Worker      string
	Provisioner string
	CPUs        int
	GPUs        int
	RAMMB       int64
	Labels      []string
}

// CredentialSigner signs worker credentials. The engine implements it and
// keeps the secret; plugins only ever see the signed token.
type CredentialSigner interface {
	Sign(c CredentialClaims, ttl time.Duration) (token string, expires time.Time, err error)
}

// LaunchConfig says how to start one provisioner plugin.
type LaunchConfig struct {
	// Name is the provisioner's name from the configuration. It names the
	// logger, and it is the prefix ("<Name>-") every worker the plugin
	// asks a credential for must carry.
	Name string
	// Path is the plugin executable.
	Path string
	Args []string
	// SHA256 pins the executable: when set, the file is hashed before
	// anything runs and a mismatch refuses the launch. Hex, any case.
	SHA256 string
	// Logger receives the plugin's log lines under Name. Nil discards.
	Logger hclog.Logger
	// Signer mints credentials for the plugin's workers. Nil refuses every
	// request.
	Signer CredentialSigner
	// MaxCredentialTTL caps what the plugin may ask for; zero means
	// DefaultMaxCredentialTTL.
	MaxCredentialTTL time.Duration
	// OnEvent receives the plugin's events, one at a time and in order,
	// from a goroutine of this plugin's own (the host channel's
	// dispatcher, internal/wire/hostchannel.go). A slow OnEvent
	// delays only this plugin's later events: the host channel keeps
	// reading, so the plugin's Publish and MintCredential go on. Events
	// that find EventQueue full are dropped and counted
	// (Plugin.DroppedEvents), with a warning.
	OnEvent func(shared.Event)
	// EventQueue is how many of the plugin's events may wait for OnEvent;
	// zero means DefaultEventQueue.
	EventQueue int
	// Env is added to the plugin's environment, after this process's own,
	// so it may override a variable such as PATH.
	Env []string
	// DropEnv names variables of this process's environment the plugin
	// must not inherit: the engine's signing secret above all. A plugin
	// that had it could sign credentials for any provisioner's workers,
	// and so could everything it starts (ssh, a ProxyCommand).
	DropEnv []string
	// StartTimeout bounds the handshake; zero means 30 seconds.
	StartTimeout time.Duration
	// OnStdout hears each line the plugin writes to stdout after the
	// handshake, which a plugin must not do (stdout.go). Nil logs each
	// as a warning under the provisioner's name.
	OnStdout func(line string)
	// Stderr receives a copy of the plugin's stderr as the plugin wrote
	// it, beside the log lines the host makes of it. Nil: none.
	Stderr io.Writer
}

// ExitStatus says how a plugin process ended.
type ExitStatus struct {
	// Code is the exit code, or -1 when a signal ended it.
	Code int
	// Signal names the signal that ended it, if one did.
	Signal string
	// Stderr holds the last lines the plugin wrote to stderr: a panic's
	// trace, or why it gave up.
	Stderr []string
}

func (e *ExitStatus) String() string {
	if e == nil {
		return "running"
	}
	if e.Signal != "" {
		return "killed by signal " + e.Signal
	}
	return "exited with status " + strconv.Itoa(e.Code)
}

// Plugin is a running provisioner plugin process.
type Plugin struct {
	name   string
	client *plugin.Client
	cmd    *exec.Cmd
	prov   *wire.Client
	stderr *tailWriter
	exited chan struct{}
	// guard is the Host the plugin talks to.
	guard *hostGuard
	// stopping is set once Kill begins: from then on the host channel's
	// end is the expected end of a plugin the engine let go, not news.
	stopping atomic.Bool

	mu   sync.Mutex // guards exit
	exit *ExitStatus
}

// Launch starts a plugin, completes the handshake, opens the host channel
// and returns once the plugin can be called. It does not configure it.
//
// The plugin speaks gRPC only, over a unix socket with mutual TLS. Its
// stderr becomes log lines under the provisioner's name. It gets SIGTERM
// if this process dies (on Linux), so an engine killed outright does not
// leave plugins behind.
//
// Launch alone does not know the provisioner's shapes, so the credentials
// it mints are bounded by their owner and lifetime only; a plugin started
// by LaunchBlock and configured (Launched.Configure) is also refused a
// shape no profile of the provisioner offers (hostGuard).
func Launch(ctx context.Context, cfg LaunchConfig) (*Plugin, error) {
	return launch(ctx, cfg, false)
}

// launch is Launch; with shapesFirst, the plugin's mints are refused
// until its shapes are known (Launched.Configure), and from then on held
// to them.
func launch(ctx context.Context, cfg LaunchConfig, shapesFirst bool) (*Plugin, error) {
	if cfg.Name == "" {
		return nil, errors.New("launch: the provisioner has no name")
	}
	logger := cfg.Logger
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	logger = wire.LimitLogger(logger.Named(cfg.Name))
	info, err := os.Stat(cfg.Path)
	if err != nil {
		return nil, fmt.Errorf("provisioner %q: no plugin at %s: %w", cfg.Name, cfg.Path, err)
	}
	if info.IsDir() || info.Mode()&0o111 == 0 {
		return nil, fmt.Errorf("provisioner %q: %s is not an executable file", cfg.Name, cfg.Path)
	}
	cmd := exec.Command(cfg.Path, cfg.Args...)
	if cfg.SHA256 != "" {
		// The file is opened once, hashed through that descriptor, and
		// the very same open file is what runs: it is handed to the child
		// as fd 3 and executed as /proc/self/fd/3. Hashing a path and
		// then executing the path again let a swapped symlink run
		// unpinned code in 6 launches of 60.
		f, err := openPinned(cfg.Path, cfg.SHA256)
		if err != nil {
			return nil, fmt.Errorf("provisioner %q: %w", cfg.Name, err)
		}
		defer f.Close() // the child has its own copy once started
		if why := writableByOthers(f, cfg.Path); why != "" {
			logger.Warn("a pinned plugin can be replaced by other users; the pin is checked at each launch, but make it writable by its owner only",
				"path", cfg.Path, "why", why)
		}
		cmd.Path = "/proc/self/fd/3"
		cmd.ExtraFiles = []*os.File{f}
	}
	cmd.Env = append(environWithout(os.Environ(), cfg.DropEnv), cfg.Env...)
	// The plugin logs at the engine's level unless told otherwise, so an
	// operator's one setting (-log-level) reaches every plugin; below
	// the engine's level its lines would be dropped on arrival anyway.
	if level := pluginLogLevel(cfg.Logger); level != "" && !hasVar(cmd.Env, wire.LogLevelEnv) {
		cmd.Env = append(cmd.Env, wire.LogLevelEnv+"="+level)
	}
	setParentDeathSignal(cmd)
	stderr := newTailWriter(20)
	var stderrCopy io.Writer = stderr
	if cfg.Stderr != nil {
		stderrCopy = io.MultiWriter(stderr, cfg.Stderr)
	}
	onStdout := cfg.OnStdout
	if onStdout == nil {
		onStdout = func(line string) {
			logger.Warn("the plugin wrote to stdout after the handshake; a plugin must log to stderr", "line", line)
		}
	}
	timeout := cfg.StartTimeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  wire.Handshake,
		VersionedPlugins: wire.PluginSets(nil),
		// go-plugin hands the runner a blank command carrying what it
		// adds for the handshake (the cookie, the client certificate);
		// those go onto ours. It also makes a directory for the plugin's
		// socket, which only a Kill would remove: a plugin that dies is
		// not killed, so the directory is dropped here and the plugin
		// picks its own.
		RunnerFunc: func(_ hclog.Logger, spec *exec.Cmd, socketDir string) (runner.Runner, error) {
			_ = os.Remove(socketDir)
			cmd.Env = append(cmd.Env, environWithout(spec.Env, []string{plugin.EnvUnixSocketDir})...)
			cmd.Stdin = spec.Stdin
			return newCmdRunner(cmd, onStdout)
		},
		SyncStdout:       &lineWriter{onLine: onStdout},
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		AutoMTLS:         true,
		Logger:           logger,
		Stderr:           stderrCopy,
		StartTimeout:     timeout,
		// cmd.Env already holds this process's environment with cfg.Env
		// after it; go-plugin would otherwise append the environment
		// again, after ours, and undo an override such as PATH.
		SkipHostEnv: true,
		// go-plugin accepts messages of up to 2 GB; see wire/limits.go.
		GRPCDialOptions: []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(wire.MaxMessageBytes))},
	})
	p := &Plugin{name: cfg.Name, client: client, cmd: cmd, stderr: stderr, exited: make(chan struct{})}

	rpcClient, err := client.Client()
	if err != nil {
		// Kill waits for the process and for its stderr to be read, so
		// the error can say how it ended and what it said last.
		client.Kill()
		return nil, launchError(cfg, err, stderr, exitStatus(cmd))
	}
	raw, err := rpcClient.Dispense(wire.PluginName)
	if err != nil {
		client.Kill()
		return nil, fmt.Errorf("provisioner %q: %s does not serve a provisioner: %w", cfg.Name, cfg.Path, err)
	}
	p.prov = raw.(*wire.Client)
	go p.watch()

	guard := &hostGuard{
		name: cfg.Name, signer: cfg.Signer, maxTTL: cfg.MaxCredentialTTL,
		onEvent: cfg.OnEvent, logger: logger, shapesFirst: shapesFirst,
	}
	p.guard = guard
	if guard.maxTTL <= 0 {
		guard.maxTTL = DefaultMaxCredentialTTL
	}
	onError := func(err error) {
		if p.stopping.Load() {
			logger.Debug("host channel closed", "error", err)
			return
		}
		logger.Warn("host channel closed", "error", err)
	}
	onDrop := func(ev shared.Event, dropped int64) {
		// At the 1st, 2nd, 4th, 8th… drop: a handler stuck for an hour
		// says so a few dozen times, not once an event.
		if dropped&(dropped-1) == 0 {
			logger.Warn("dropped an event of the plugin's: the engine's event handler is behind and the queue is full",
				"kind", ev.Kind, "worker", ev.Worker, "dropped_total", dropped, "queue", cfg.EventQueue)
		}
	}
	if cfg.EventQueue <= 0 {
		cfg.EventQueue = DefaultEventQueue
	}
	hc := wire.HostChannel{Name: cfg.Name, Host: guard, Queue: cfg.EventQueue, OnError: onError, OnDrop: onDrop}
	if err := p.prov.OpenHostChannel(ctx, hc); err != nil {
		p.Kill()
		return nil, fmt.Errorf("provisioner %q: opening the host channel: %w", cfg.Name, err)
	}
	return p, nil
}

// watch records how the process ended. go-plugin cancels the client's
// done context only after the process has been waited for, so reading
// the process state then is safe.
func (p *Plugin) watch() {
	<-p.prov.Exited()
	exit := exitStatus(p.cmd)
	if exit == nil {
		exit = &ExitStatus{Code: -1}
	}
	exit.Stderr = p.stderr.Lines()
	p.mu.Lock()
	p.exit = exit
	p.mu.Unlock()
	close(p.exited)
}

// Provisioner is the plugin, as a Provisioner. After the process exits,
// every call fails with ErrPluginGone.
func (p *Plugin) Provisioner() shared.Provisioner { return p.prov }

// Name is the provisioner's name.
func (p *Plugin) Name() string { return p.name }

// Pid is the plugin process's id.
func (p *Plugin) Pid() int {
	if p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// DroppedEvents is how many of the plugin's events were dropped because
// LaunchConfig.OnEvent was behind by a whole EventQueue.
func (p *Plugin) DroppedEvents() int64 { return p.prov.DroppedEvents() }

// Exited is closed when the plugin process has ended.
func (p *Plugin) Exited() <-chan struct{} { return p.exited }

// ExitStatus says how the process ended, or nil while it runs.
func (p *Plugin) ExitStatus() *ExitStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exit
}

// Stop shuts the provisioner down and ends the process: Shutdown with the
// context's deadline (30 seconds if it has none), so outstanding requests
// are cancelled, then go-plugin's kill. It returns what Shutdown
// cancelled, and Shutdown's error if it failed; the process is ended
// either way.
func (p *Plugin) Stop(ctx context.Context) (*shared.ShutdownResponse, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	deadline, _ := ctx.Deadline()
	resp, err := p.prov.Shutdown(ctx, &shared.ShutdownRequest{Deadline: deadline})
	p.Kill()
	return resp, err
}

// Kill ends the process without asking the provisioner to cancel
// anything, and waits for it to be gone and for the events it published
// to be handed to OnEvent: a stalled OnEvent stalls Kill, and nothing
// else.
func (p *Plugin) Kill() {
	p.stopping.Store(true)
	p.client.Kill()
	if p.prov != nil {
		<-p.exited
		p.prov.WaitHostChannel()
	}
}

// exitStatus is how cmd's process ended; nil if it has not been waited
// for.
func exitStatus(cmd *exec.Cmd) *ExitStatus {
	ps := cmd.ProcessState
	if ps == nil {
		return nil
	}
	exit := &ExitStatus{Code: ps.ExitCode()}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		exit.Signal = ws.Signal().String()
	}
	return exit
}

var incompatibleRe = regexp.MustCompile(`Plugin version: (\d+)`)

// launchError turns go-plugin's start-up failures into sentences that say
// what to do.
func launchError(cfg LaunchConfig, err error, stderr *tailWriter, exit *ExitStatus) error {
	msg := err.Error()
	tail := ""
	if lines := stderr.Lines(); len(lines) > 0 {
		tail = "; its stderr ended with: " + strings.Join(lines, " | ")
	}
	switch {
	case strings.Contains(msg, "Failed to read any lines from plugin's stdout"),
		strings.Contains(msg, "exited before we could connect"):
		// Say what the plugin did: its exit and its last words are
		// nearly always the reason (a missing file, a bad flag).
		how := "exited"
		if exit != nil {
			how = exit.String()
		}
		if tail == "" {
			tail = "; it wrote nothing to stderr"
			if exit != nil && exit.Code == 0 {
				tail += " (is it a provisioner plugin? a plugin prints its handshake line on stdout and keeps running)"
			}
		}
		return fmt.Errorf("provisioner %q: %s %s before the plugin handshake%s", cfg.Name, cfg.Path, how, tail)
	case strings.Contains(msg, "Unrecognized remote plugin message"):
		return fmt.Errorf("provisioner %q: %s wrote to stdout before the plugin handshake (%s); a plugin must keep stdout for the handshake line and log to stderr%s",
			cfg.Name, cfg.Path, firstLine(msg), tail)
	case strings.Contains(strings.ToLower(msg), "incompatible api version"):
		m := incompatibleRe.FindStringSubmatch(msg)
		advice := "rebuild the plugin against this host's SDK"
		if m != nil {
			if v, _ := strconv.Atoi(m[1]); v > wire.ProtocolVersion {
				advice = fmt.Sprintf("the plugin speaks protocol %d and this host %d: upgrade the host", v, wire.ProtocolVersion)
			} else {
				advice = fmt.Sprintf("the plugin speaks protocol %d and this host %d: upgrade the plugin", v, wire.ProtocolVersion)
			}
		}
		return fmt.Errorf("provisioner %q: %w: %s", cfg.Name, shared.ErrIncompatible, advice)
	}
	return fmt.Errorf("provisioner %q: starting %s: %w%s", cfg.Name, cfg.Path, err, tail)
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// openPinned opens the file a pin refers to and hashes it through the
// open descriptor; it returns the open file only if it matches, so a
// mismatch runs nothing at all.
func openPinned(path, want string) (*os.File, error) {
	want = strings.ToLower(strings.TrimSpace(want))
	wantSum, err := hex.DecodeString(want)
	if err != nil || len(wantSum) != sha256.Size {
		return nil, fmt.Errorf("%w: the pin %q is not 64 hex digits", shared.ErrChecksumMismatch, want)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("hashing %s: %w", path, err)
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		f.Close()
		return nil, fmt.Errorf("hashing %s: %w", path, err)
	}
	if got := h.Sum(nil); subtle.ConstantTimeCompare(got, wantSum) != 1 {
		f.Close()
		return nil, fmt.Errorf("%w: %s has sha256 %x but the configuration pins %s; if the binary was rebuilt on purpose, update the pin (sha256sum %s)",
			shared.ErrChecksumMismatch, path, got, want, path)
	}
	return f, nil
}

// writableByOthers says why users other than the file's owner could
// replace a pinned plugin: the file or its directory is writable by its
// group or by anyone. "" when neither is.
func writableByOthers(f *os.File, path string) string {
	if st, err := f.Stat(); err == nil && st.Mode().Perm()&0o022 != 0 {
		return fmt.Sprintf("the file's mode is %v", st.Mode().Perm())
	}
	dir := filepath.Dir(path)
	if st, err := os.Stat(dir); err == nil && st.Mode().Perm()&0o022 != 0 && st.Mode()&os.ModeSticky == 0 {
		return fmt.Sprintf("its directory %s has mode %v", dir, st.Mode().Perm())
	}
	return ""
}

// FileSHA256 returns the hex SHA-256 of a file, for writing a pin.
func FileSHA256(path string) (string, error) {
	sum, err := fileSHA256(path)
	return hex.EncodeToString(sum), err
}

func fileSHA256(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}

// hostGuard is the Host a plugin talks to. It is where the engine's rules
// for plugins live, so every engine gets them: a plugin may mint only for
// its own workers, never for longer than the cap, and, once its shapes
// are known, never for a machine larger than its largest shape in any
// dimension (cpus, gpus, ram_mb) nor with a label none of them has; and
// its events are stamped with its own name whatever it claims.
//
// The bound is per dimension, not per shape: a credential is what a
// worker may claim at most, and a plugin that mints a profile's own
// shape, as it should, is within it whatever its other profiles are.
type hostGuard struct {
	name    string
	signer  CredentialSigner
	maxTTL  time.Duration
	onEvent func(shared.Event)
	logger  hclog.Logger
	// shapesFirst refuses mints while bound is nil: a supervised plugin
	// has not yet listed its shapes.
	shapesFirst bool

	mu    sync.Mutex // guards bound
	bound *shapeBound
}

// shapeBound is the most a provisioner's shapes offer, per dimension.
type shapeBound struct {
	cpus, gpus int
	ramMB      int64
	// labels are every shape's labels and profile name.
	labels map[string]bool
	// profiles is how many shapes made it, for the refusal's message.
	profiles int
}

// limitTo holds the guard's mints to shapes from now on.
func (g *hostGuard) limitTo(shapes []shared.Shape) {
	b := &shapeBound{labels: map[string]bool{}, profiles: len(shapes)}
	for _, s := range shapes {
		b.cpus, b.gpus, b.ramMB = max(b.cpus, s.CPUs), max(b.gpus, s.GPUs), max(b.ramMB, s.RAMMB)
		b.labels[s.Profile] = true
		for _, l := range s.Labels {
			b.labels[l] = true
		}
	}
	g.mu.Lock()
	g.bound = b
	g.mu.Unlock()
}

// beyond says how req is larger than every shape b offers, or "" if it
// is within them.
func (b *shapeBound) beyond(req *shared.MintCredentialRequest) string {
	switch {
	case req.CPUs > b.cpus:
		return fmt.Sprintf("cpus %d, and its largest shape has %d", req.CPUs, b.cpus)
	case req.GPUs > b.gpus:
		return fmt.Sprintf("gpus %d, and its largest shape has %d", req.GPUs, b.gpus)
	case req.RAMMB > b.ramMB:
		return fmt.Sprintf("ram_mb %d, and its largest shape has %d", req.RAMMB, b.ramMB)
	}
	for _, l := range req.Labels {
		if !b.labels[l] {
			return fmt.Sprintf("label %q, which none of its shapes has", l)
		}
	}
	return ""
}

func (g *hostGuard) Publish(_ context.Context, ev shared.Event) error {
	// The host channel clipped the event's fields before it queued it.
	ev.Provisioner = g.name
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	if g.onEvent != nil {
		g.onEvent(ev)
	}
	return nil
}

func (g *hostGuard) MintCredential(_ context.Context, req *shared.MintCredentialRequest) (*shared.MintCredentialResponse, error) {
	prefix := g.name + "-"
	if !strings.HasPrefix(req.Worker, prefix) || len(req.Worker) == len(prefix) || !shared.ValidName(req.Worker) {
		g.logger.Warn("refused to mint a credential", "worker", req.Worker, "reason", "not this provisioner's worker")
		return nil, fmt.Errorf("%w: worker %q is not provisioner %q's (its name must start with %q)", shared.ErrPermissionDenied, req.Worker, g.name, prefix)
	}
	// The shape is what the engine will hold the worker to, so one that
	// says nothing (an older plugin) is refused rather than signed as
	// "anything goes".
	if req.CPUs < 1 || req.GPUs < 0 || req.RAMMB < 0 {
		g.logger.Warn("refused to mint a credential", "worker", req.Worker, "reason", "no shape")
		return nil, fmt.Errorf("%w: credential for worker %q names no shape (cpus %d, gpus %d, ram_mb %d): pass the profile's cpus, gpus, ram_mb and labels in MintCredentialRequest",
			shared.ErrInvalidArgument, req.Worker, req.CPUs, req.GPUs, req.RAMMB)
	}
	for _, l := range req.Labels {
		if !shared.ValidName(l) {
			return nil, fmt.Errorf("%w: credential for worker %q: label %q is not a valid name", shared.ErrInvalidArgument, req.Worker, l)
		}
	}
	g.mu.Lock()
	bound := g.bound
	g.mu.Unlock()
	if bound == nil && g.shapesFirst {
		g.logger.Warn("refused to mint a credential", "provisioner", g.name, "worker", req.Worker, "reason", "its shapes are not known yet")
		return nil, fmt.Errorf("%w: credential for worker %q: provisioner %q has not listed its shapes yet; mint once Configure has returned",
			shared.ErrNotConfigured, req.Worker, g.name)
	}
	if bound != nil {
		if why := bound.beyond(req); why != "" {
			g.logger.Warn("refused to mint a credential: no profile of the provisioner offers its shape", "provisioner", g.name, "worker", req.Worker,
				"cpus", req.CPUs, "gpus", req.GPUs, "ram_mb", req.RAMMB, "labels", req.Labels, "reason", why)
			return nil, fmt.Errorf("%w: credential for worker %q asks for %s (%d profile(s)): mint the shape of the profile the worker is started as",
				shared.ErrPermissionDenied, req.Worker, why, bound.profiles)
		}
	}
	if g.signer == nil {
		return nil, fmt.Errorf("%w: this host mints no credentials", shared.ErrPermissionDenied)
	}
	ttl := req.TTL
	if ttl <= 0 {
		ttl = DefaultCredentialTTL
	}
	ttl = min(ttl, g.maxTTL)
	// The provisioner is the guard's own name, never the plugin's say.
	claims := CredentialClaims{
		Worker: req.Worker, Provisioner: g.name,
		CPUs: req.CPUs, GPUs: req.GPUs, RAMMB: req.RAMMB, Labels: slices.Clone(req.Labels),
	}
	token, expires, err := g.signer.Sign(claims, ttl)
	if err != nil {
		return nil, err
	}
	g.logger.Debug("minted a credential", "worker", req.Worker, "expires", expires)
	return &shared.MintCredentialResponse{Token: token, Expires: expires}, nil
}

// tailWriter keeps the last lines written to it, so an exit can be
// explained by what the plugin said last.
type tailWriter struct {
	mu      sync.Mutex // guards lines and partial
	max     int
	lines   []string
	partial []byte
}

func newTailWriter(max int) *tailWriter { return &tailWriter{max: max} }

// maxTailLine bounds one remembered line; a plugin that writes a megabyte
// without a newline should not make the host keep it.
const maxTailLine = 1024

func (w *tailWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range b {
		if c == '\n' {
			w.push(string(w.partial))
			w.partial = w.partial[:0]
			continue
		}
		if len(w.partial) < maxTailLine {
			w.partial = append(w.partial, c)
		}
	}
	return len(b), nil
}

func (w *tailWriter) push(line string) {
	w.lines = append(w.lines, line)
	if len(w.lines) > w.max {
		w.lines = w.lines[len(w.lines)-w.max:]
	}
}

// Lines returns the remembered lines, oldest first.
func (w *tailWriter) Lines() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := append([]string(nil), w.lines...)
	if len(w.partial) > 0 {
		out = append(out, string(w.partial))
	}
	return out
}

// pluginLogLevel is the level a plugin should log at for logger, empty
// when logger says nothing (nil, or a logger without a level).
func pluginLogLevel(logger hclog.Logger) string {
	if logger == nil {
		return ""
	}
	switch l := logger.GetLevel(); l {
	case hclog.Trace, hclog.Debug, hclog.Info, hclog.Warn, hclog.Error:
		return l.String()
	case hclog.Off:
		return "off"
	}
	return ""
}

// hasVar reports whether env sets the variable name.
func hasVar(env []string, name string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, name+"=") {
			return true
		}
	}
	return false
}

// environWithout is env without the variables named in drop.
func environWithout(env, drop []string) []string {
	if len(drop) == 0 {
		return env
	}
	out := make([]string, 0, len(env))
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(drop, name) {
			out = append(out, kv)
		}
	}
	return out
}
