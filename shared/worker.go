package shared

import (
	"strconv"
	"strings"
	"time"
)

// The worker contract: how a provisioner starts the engine's worker on a
// machine it got. A provisioner runs WorkerCommand (from its
// configuration) followed by WorkerArgs.Argv(), with the worker's
// credential in the environment variable WorkerTokenEnv and nowhere else.
// The worker (worker) parses exactly these flags; a test
// there round-trips Argv through its parser, so the two cannot drift.
// Plugins in other languages follow the same list, documented in
// docs/worker-protocol.md.
//
// The credential is never a flag, because any user of a compute node can
// read every process's /proc/PID/cmdline, while only the job's owner can
// read its environ. Design record: docs/design/shared-worker-credential.md.

// WorkerTokenEnv carries the worker's credential.
const WorkerTokenEnv = "FLUKSIO_WORKER_TOKEN"

// ProbeAnswerEnv carries the value of the engine's run that a reach
// probe must find in the answer (validate -check -probe): the host sets
// it in the plugin's environment, the plugin in the probe worker's, and
// the worker reports reaching the engine only when the answer at its
// probe path is "fluksio engine VALUE". Another server holding the
// engine's address (a squatter answering 200) does not know the value.
// In the environment, not argv, for the reason the credential is.
const ProbeAnswerEnv = "FLUKSIO_PROBE_ANSWER"

// JobLogEnv names the job's own output file (stdout and stderr), where
// the provisioner chose it: a worker that ends cleanly (exit 0) removes
// it, so that a cluster's log directory keeps the logs of jobs that
// failed, which the provisioner reads back, and not of every job that
// served. A worker that fails leaves it. Only a regular file named
// *.out is removed; a worker that does not know the variable leaves
// every log, and the provisioner's own cap on the directory applies.
const JobLogEnv = "FLUKSIO_JOB_LOG"

// WorkerArgs is the worker's command line past its command.
type WorkerArgs struct {
	// URL is what the worker dials: the engine's address, or a relay's.
	URL string
	// EngineCertSHA256, when set, is the SHA-256 (hex) of the certificate
	// the worker must find at an https URL; EngineCA a PEM file of CAs
	// to verify it with instead of the system's.
	EngineCertSHA256 string
	EngineCA         string
	// What the machine offers, as the provisioner asked for it.
	CPUs, GPUs int
	RAMMB      int64
	Labels     []string
	// MaxIdle is how long the worker waits for work before it leaves;
	// whole seconds on the command line, at least one.
	MaxIdle     time.Duration
	ArtifactURL string
	// Probe makes the worker a reach probe (--probe): it asks the
	// engine's URL whether it answers, says so, and exits, with no
	// credential.
	Probe bool
	// SizeFromJob tells the worker to offer what Slurm gave its job
	// (--size-from-job: SLURM_CPUS_ON_NODE, SLURM_MEM_PER_NODE and the
	// job's GPUs) where that is more than CPUs, GPUs and RAMMB, within
	// its credential: a whole node's job.
	SizeFromJob bool
}

// Argv is the flags, each value its own word: a provisioner that builds a
// shell line quotes each word itself.
func (a WorkerArgs) Argv() []string {
	argv := []string{"--url", a.URL}
	if a.Probe {
		argv = append(argv, "--probe")
	}
	if a.EngineCertSHA256 != "" {
		argv = append(argv, "--engine-cert-sha256", a.EngineCertSHA256)
	}
	if a.EngineCA != "" {
		argv = append(argv, "--engine-ca", a.EngineCA)
	}
	// Rounded up: a worker never leaves sooner than it was asked to stay.
	idle := max(1, int64((a.MaxIdle+time.Second-1)/time.Second))
	argv = append(argv,
		"--cpus", strconv.Itoa(a.CPUs),
		"--gpus", strconv.Itoa(a.GPUs),
		"--max-idle", strconv.FormatInt(idle, 10),
	)
	if a.RAMMB > 0 {
		argv = append(argv, "--ram-mb", strconv.FormatInt(a.RAMMB, 10))
	}
	if a.SizeFromJob {
		argv = append(argv, "--size-from-job")
	}
	if len(a.Labels) > 0 {
		argv = append(argv, "--labels", strings.Join(a.Labels, ","))
	}
	if a.ArtifactURL != "" {
		argv = append(argv, "--artifact-url", a.ArtifactURL)
	}
	return argv
}
