package worker

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/fluksio/provision/shared"
)

// engineGoneAfter is how long the engine may be unreachable before the
// worker stops trying. Long enough to ride out an engine restart's
// listener gap, short enough that a job whose engine has gone for good
// gives its allocation back within seconds.
const engineGoneAfter = 10 * time.Second

// Config is everything a worker run depends on, gathered before it
// starts so that a bad flag or a missing credential fails at once.
type Config struct {
	url         *url.URL
	cpus, gpus  int
	ramMB       int64
	labels      []string
	artifactURL string
	maxIdle     time.Duration
	// endsAt is when the job must end, zero if not known (walltime.go).
	endsAt time.Time
	// engineCA and engineCertSHA256 say how to verify an https engine
	// (tls.go); empty means the system's roots.
	engineCA, engineCertSHA256 string

	token      string
	hostname   string
	slurmJobID string
	// slurmCPUs is SLURM_CPUS_ON_NODE: what the allocation actually got,
	// which may be more than --cpus asked for (and than cpus, where the
	// credential allows less), for the results.
	slurmCPUs string
	// sizeNotes say what the job got beyond what the worker offers
	// (jobsize.go), for the log at attach.
	sizeNotes []string

	// features are what the worker names at attach: FeatureCommand and
	// FeatureSlots for fluksio-worker (FeatureCommand alone with
	// --slots=false), FeaturePayload for a worker built on Serve.
	features []string
	// cudaDevices is the job's CUDA_VISIBLE_DEVICES, which a worker
	// with slots splits among its tasks.
	cudaDevices string
	// payload runs a payload task: Serve's run function; nil for
	// fluksio-worker.
	payload payloadFunc
	// environ is the environment a task's command inherits, less the
	// credential's variables (commandEnv): the process's own, whatever
	// getenv the settings above were read with.
	environ []string
	// probe makes the worker a reach probe (probe.go): it asks the
	// engine's /v1/probe, says what came back, and exits. probeAnswer,
	// from shared.ProbeAnswerEnv, is the value of the engine's run the
	// answer must carry; empty, any engine's answer is taken.
	probe       bool
	probeAnswer string
	// workDir is where task directories are made: $TMPDIR, else /tmp.
	workDir string

	// GoneAfter is how long the engine may be unreachable before the
	// worker gives up; RetryFirst its first pause between tries. ParseArgs
	// sets the defaults; tests shorten them.
	GoneAfter  time.Duration
	RetryFirst time.Duration
	// KillGrace is how long a command that is stopped (cancelled, timed
	// out, over a limit, or the worker leaving) has between SIGTERM and
	// SIGKILL to its process group: killGrace, unless a test shortens it.
	KillGrace time.Duration
	// WatchAfter is how long a task runs before the worker opens its
	// watch (GET /v1/watch): watchAfter, unless a test changes it.
	WatchAfter time.Duration
}

// watchAfter is the default Config.WatchAfter. A watch the worker ends
// when its task does is a request in flight that it gives up on, and
// HTTP/1.1 gives up on one by closing its connection: a task that ends
// within this costs the engine no watch and no new connection (for a
// task of `true`, they were two of its four requests and most of its
// CPU). The price is that a cancel or a leave reaches a task in its
// first moments this much later; the engine keeps either for the watch.
const watchAfter = 500 * time.Millisecond

// killGrace is the default Config.KillGrace: time for a command to
// write out what it holds after SIGTERM, short beside Slurm's 60 s
// between its walltime warning and the kill.
const killGrace = 10 * time.Second

// Main is the worker as a program (fluksio-worker, or host-example
// worker): the payload a provisioner's job runs. It attaches to the
// engine, runs tasks until it has been idle for --max-idle seconds,
// detaches and exits 0. SIGTERM (Slurm's walltime warning) or SIGINT
// makes it detach and exit 0 at once, and so does an engine that stops
// cleanly and says so (CodeLeave). It exits 1 when the engine refuses it
// or cannot be reached for engineGoneAfter: the job then shows as
// failed, which is what happened to it; 2 on a bad command line.
// First it closes its process to the commands it runs (protectProcess):
// they are the same user's, and its /proc/PID/environ holds the
// credential. prog is how its usage names the command
// ("fluksio-worker", or "host-example worker").
func Main(prog string, args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := protectProcess(); err != nil {
		fmt.Fprintf(stderr, "worker: could not close this process to its commands: %v\n", err)
		return 1
	}
	return runWorker(ctx, prog, args, os.Getenv, stdout, stderr, nil)
}

// Run is Main with its environment and output passed in, so that tests
// can run several workers in one process. stdout is only for -h.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	return runWorker(ctx, "fluksio-worker", args, getenv, stdout, stderr, nil)
}

// runWorker is Main, Run and Serve: payload, when not nil, makes the worker
// one that runs payload tasks with it (FeaturePayload) rather than
// commands.
func runWorker(ctx context.Context, prog string, args []string, getenv func(string) string, stdout, stderr io.Writer, payload payloadFunc) int {
	logger := log.New(stderr, "worker: ", log.LstdFlags)
	cfg, err := parseArgs(prog, args, getenv, stdout, stderr)
	if err == nil && payload != nil {
		cfg.features, cfg.payload = []string{FeaturePayload}, payload
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if errors.Is(err, errUsage) {
		return 2
	}
	if err != nil {
		logger.Print(err)
		return 2
	}
	transport, err := workerTransport(cfg.engineCA, cfg.engineCertSHA256)
	if err != nil {
		logger.Print(err)
		return 2
	}
	if cfg.probe {
		return probeEngine(ctx, cfg, &http.Client{Transport: transport, Timeout: probeTimeout}, stdout)
	}
	code := NewClient(cfg, logger, &http.Client{Transport: transport}).Work(ctx)
	if code == 0 {
		removeJobLog(getenv, logger)
	}
	return code
}

// errUsage is a mistake on the command line that parseArgs has already
// reported, with the usage.
var errUsage = errors.New("usage")

// ParseArgs reads a worker's command line (shared.WorkerArgs) and its
// credential from getenv. -h writes the usage to stdout and returns
// flag.ErrHelp.
func ParseArgs(args []string, getenv func(string) string, stdout, stderr io.Writer) (Config, error) {
	return parseArgs("fluksio-worker", args, getenv, stdout, stderr)
}

func parseArgs(prog string, args []string, getenv func(string) string, stdout, stderr io.Writer) (Config, error) {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: "+prog+" --url URL --cpus N --gpus N --max-idle SECONDS [--ram-mb N] [--labels a,b] [--artifact-url URL] [--walltime SECONDS] [--size-from-job] [--engine-ca FILE | --engine-cert-sha256 HEX]\n"+
			"The credential is read from $%s.\n", shared.WorkerTokenEnv)
		fs.PrintDefaults()
	}
	var (
		rawURL  = fs.String("url", "", "the engine's `URL`")
		cpus    = fs.Int("cpus", 1, "CPUs this machine offers")
		gpus    = fs.Int("gpus", 0, "GPUs this machine offers")
		ramMB   = fs.Int64("ram-mb", 0, "memory this machine offers, in MB (0: not said)")
		labels  = fs.String("labels", "", "comma-separated `labels` this machine advertises")
		art     = fs.String("artifact-url", "", "where artifacts are fetched from (accepted from older provisioners; a task's inputs come from the engine)")
		maxIdle = fs.Float64("max-idle", 300, "leave after this many `seconds` without work")
		ca      = fs.String("engine-ca", "", "PEM `file` of the CA(s) to verify an https engine with, instead of the system's")
		pin     = fs.String("engine-cert-sha256", "", "verify an https engine by the SHA-256 of its certificate, in `hex`")
		wall    = fs.Int64("walltime", 0, "the job's time limit in `seconds` (0: $FLUKSIO_WALLTIME, else not known); the worker leaves before it")
		slots   = fs.Bool("slots", true, "run as many tasks at once as --cpus, --gpus and --ram-mb hold (false: one at a time)")
		fromJob = fs.Bool("size-from-job", false, "offer the memory and GPUs Slurm gave the job ($SLURM_MEM_PER_NODE, the devices of $CUDA_VISIBLE_DEVICES or $SLURM_GPUS_ON_NODE) where more than --ram-mb and --gpus, as for a whole node; CPUs are $SLURM_CPUS_ON_NODE where more than --cpus either way, and all within the credential")
		probe   = fs.Bool("probe", false, "only check that the engine answers at --url (GET /v1/probe), say so, and exit: 0 when it does, 1 when not; needs no credential")
	)
	// The flag package writes its usage before it returns; buffered, so
	// that help goes to stdout and a mistake to stderr.
	var buf bytes.Buffer
	fs.SetOutput(&buf)
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		stdout.Write(buf.Bytes())
		return Config{}, flag.ErrHelp
	case err != nil:
		stderr.Write(buf.Bytes())
		return Config{}, errUsage
	case fs.NArg() > 0:
		return Config{}, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	u, err := checkArgs(*rawURL, *cpus, *gpus, *ramMB, *maxIdle, *ca != "" || *pin != "")
	if err != nil {
		return Config{}, err
	}
	if *wall < 0 {
		return Config{}, errors.New("--walltime may not be negative")
	}
	token := strings.TrimSpace(getenv(shared.WorkerTokenEnv))
	if token == "" && !*probe {
		return Config{}, fmt.Errorf("no credential: $%s is not set (the provisioner that started this job sets it)", shared.WorkerTokenEnv)
	}
	workDir := getenv("TMPDIR")
	if workDir == "" {
		workDir = "/tmp"
	}
	host, err := os.Hostname()
	if err != nil {
		host = "unknown"
	}
	// What the job really got, where more than the flags (jobsize.go).
	size := sizeOf(*cpus, *gpus, *ramMB, *fromJob, getenv, token)
	cfg := Config{
		engineCA: *ca, engineCertSHA256: *pin,
		url: u, cpus: size.cpus, gpus: size.gpus, ramMB: size.ramMB, sizeNotes: size.notes, artifactURL: *art,
		maxIdle:     time.Duration(*maxIdle * float64(time.Second)),
		endsAt:      jobEnd(getenv, time.Duration(*wall)*time.Second, time.Now()),
		token:       token,
		hostname:    host,
		slurmJobID:  JobID(getenv),
		slurmCPUs:   getenv("SLURM_CPUS_ON_NODE"),
		features:    []string{FeatureCommand},
		cudaDevices: getenv("CUDA_VISIBLE_DEVICES"),
		environ:     os.Environ(),
		workDir:     workDir,
		GoneAfter:   engineGoneAfter,
		RetryFirst:  250 * time.Millisecond,
		KillGrace:   killGrace,
		WatchAfter:  watchAfter,
		probe:       *probe,
		probeAnswer: strings.TrimSpace(getenv(shared.ProbeAnswerEnv)),
	}
	if *slots {
		cfg.features = append(cfg.features, FeatureSlots)
	}
	for _, l := range strings.Split(*labels, ",") {
		if l = strings.TrimSpace(l); l != "" {
			cfg.labels = append(cfg.labels, l)
		}
	}
	return cfg, nil
}

// checkArgs checks the flags' values and returns the engine's URL.
func checkArgs(rawURL string, cpus, gpus int, ramMB int64, maxIdle float64, verifies bool) (*url.URL, error) {
	if rawURL == "" {
		return nil, errors.New("--url is required")
	}
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--url %q is not an http(s) URL", rawURL)
	}
	switch {
	case cpus < 1:
		return nil, errors.New("--cpus must be at least 1")
	case gpus < 0 || ramMB < 0:
		return nil, errors.New("--gpus and --ram-mb may not be negative")
	case !(maxIdle > 0):
		return nil, errors.New("--max-idle must be a positive number of seconds")
	case verifies && u.Scheme != "https":
		return nil, errors.New("--engine-ca and --engine-cert-sha256 need an https --url")
	}
	return u, nil
}
