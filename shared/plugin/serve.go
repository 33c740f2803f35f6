package plugin

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"

	"github.com/fluksio/provision/internal/buildinfo"
	"github.com/fluksio/provision/internal/wire"
	"github.com/fluksio/provision/shared"
)

// LogLevelEnv names the environment variable a host sets to choose how
// much a plugin logs (engine/host sets it to the level of the logger it
// is given) ("trace", "debug", "info", "warn", "error"). The
// default is info: the pipe to the host should not carry trace lines
// nobody asked for.
const LogLevelEnv = wire.LogLevelEnv

// orphanShutdownTimeout bounds the Shutdown a plugin runs when its host
// has died or asked it to stop with a signal. It is short because the
// operator is usually watching, and anything it fails to cancel is found
// again when an engine next starts.
const orphanShutdownTimeout = 3 * time.Second

// parentPollInterval is how often a plugin checks that its host is alive.
var parentPollInterval = 500 * time.Millisecond

// Serve runs a provisioner plugin: it builds the logger, answers the
// handshake, serves the contract over gRPC and returns when the host is
// done with it. A plugin's main is one call:
//
//	func main() { plugin.Serve(mykind.New) }
//
// The factory's logger writes JSON lines to stderr, which the host logs
// under the provisioner's name; stdout's first line is the handshake, and
// nothing else may write to it.
//
// A plugin whose host dies, or that receives SIGTERM or SIGINT, shuts the
// provisioner down and exits, so it never outlives its engine. Run by
// hand (no handshake cookie), it answers --version and --help, and
// otherwise says what it is and exits 1.
func Serve(factory func(hclog.Logger) shared.Provisioner, opts ...Option) {
	if os.Getenv(wire.Handshake.MagicCookieKey) != wire.Handshake.MagicCookieValue {
		os.Exit(byHand(os.Args, factory, opts, os.Stdout, os.Stderr))
	}
	logger := hclog.New(&hclog.LoggerOptions{
		Level:      hclog.LevelFromString(os.Getenv(LogLevelEnv)),
		Output:     os.Stderr,
		JSONFormat: true,
	})
	if logger.GetLevel() == hclog.NoLevel {
		logger.SetLevel(hclog.Info)
	}
	impl := factory(logger)

	// A host that dies closes the other end of this process's stderr,
	// and Go kills a program whose write to a broken stdout or stderr
	// fails, with SIGPIPE, unless the program asks for that signal. The
	// way out when the host dies is leave, below, which cancels what was
	// asked for: the first log line on that way must not end it. Asking
	// for SIGPIPE makes such writes fail with EPIPE instead; a handler,
	// unlike SIG_IGN, is not inherited by the commands the plugin runs.
	brokenPipe := make(chan os.Signal, 1)
	signal.Notify(brokenPipe, syscall.SIGPIPE)
	defer signal.Stop(brokenPipe)

	var once sync.Once
	leave := func(why string) {
		once.Do(func() {
			logger.Warn("shutting down", "reason", why)
			ctx, cancel := context.WithTimeout(context.Background(), orphanShutdownTimeout)
			defer cancel()
			if _, err := impl.Shutdown(ctx, &shared.ShutdownRequest{Deadline: time.Now().Add(orphanShutdownTimeout)}); err != nil {
				logger.Error("shutdown failed", "error", err)
			}
			os.Exit(0)
		})
	}
	stop := watchParent(leave)
	defer stop()
	stopProfiles := heapProfilesOnSignal(os.Getenv(HeapProfileDirEnv), logger)
	defer stopProfiles()

	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig:  wire.Handshake,
		VersionedPlugins: wire.PluginSets(impl),
		GRPCServer:       goplugin.DefaultGRPCServer,
		Logger:           logger,
	})
}

// An Option changes what Serve does.
type Option func(*options)

type options struct {
	usage string
}

// WithUsage adds text to what the binary prints when it is run by hand
// with --help, such as other modes its main handles before calling Serve.
func WithUsage(text string) Option {
	return func(o *options) { o.usage = text }
}

// byHand is the binary run by a person: go-plugin alone would print that
// it is a plugin and exit 1, which tells nobody which plugin, which
// version, or what to do with it.
func byHand(args []string, factory func(hclog.Logger) shared.Provisioner, opts []Option, stdout, stderr io.Writer) int {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	prog := "provisioner"
	if len(args) > 0 {
		prog = filepath.Base(args[0])
	}
	info, err := factory(hclog.NewNullLogger()).Info(context.Background(), &shared.InfoRequest{})
	if err != nil {
		fmt.Fprintf(stderr, "%s: a provisioner plugin whose Info fails: %v\n", prog, err)
		return 1
	}
	what := fmt.Sprintf("kind %q, plugin version %s, contract %s", info.Kind, info.Version, info.ContractVersion)
	help := func(w io.Writer) {
		fmt.Fprintf(w, `%[1]s is a provisioner plugin (%[2]s).

An engine runs it, not a person: the engine launches it and speaks the
Provisioner contract to it over gRPC (HashiCorp go-plugin). To use it,
name it in a provisioner block of the engine's configuration,

  provisioner %[3]q "NAME" {
    plugin = "/path/to/%[1]s"   # or put it in the engine's plugin_dir
    ...
  }

and check that configuration with the engine's own validation (the
example engine's is "host-example validate [-check] FILE").

usage:
  %[1]s --version   print the version and the build's revision
  %[1]s --help      print this
`, prog, what, info.Kind)
		if o.usage != "" {
			fmt.Fprint(w, o.usage)
		}
	}
	if len(args) < 2 {
		help(stderr)
		return 1
	}
	switch args[1] {
	case "-version", "--version", "version":
		fmt.Fprintln(stdout, buildinfo.Read().Line(prog, fmt.Sprintf("(kind %s, plugin %s, contract %s)", info.Kind, info.Version, info.ContractVersion)))
		return 0
	case "-h", "-help", "--help", "help":
		help(stdout)
		return 0
	}
	fmt.Fprintf(stderr, "%s: unknown argument %q\n\n", prog, args[1])
	help(stderr)
	return 2
}

// watchParent calls leave when the process that started this one exits
// (this process is then adopted by another, so its parent id changes) or
// when a terminating signal arrives. go-plugin swallows SIGINT, because a
// Ctrl-C in the host's terminal reaches the whole group; the host is
// expected to stop its plugins itself then, so SIGINT is only acted on
// once the parent is gone.
func watchParent(leave func(string)) (stop func()) {
	parent := os.Getppid()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(parentPollInterval)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case s := <-sigs:
				leave("received " + s.String())
				return
			case <-tick.C:
				if os.Getppid() != parent {
					leave("the host process is gone")
					return
				}
			}
		}
	}()
	return func() {
		signal.Stop(sigs)
		close(done)
		wg.Wait()
	}
}
