package slurm

import (
	"bytes"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/sbatch"
)

// tokenVar carries the worker's credential. The environment, not argv:
// any user of a compute node can read every process's /proc/PID/cmdline,
// but only the job's owner can read its environ.
const tokenVar = shared.WorkerTokenEnv

// jobName is what every job of a provisioner is called, so that its jobs
// can be found with squeue --name.
func jobName(provisioner string) string { return "fluksio-" + provisioner }

// Option families the script derives from a profile. A profile whose own
// sbatch lines set any option of a family keeps its own, because Slurm
// rejects some mixes (--cpus-per-gpu with --cpus-per-task, --mem with
// --mem-per-cpu) and the site's lines know better.
var (
	cpuOptions = family{long: []string{"--cpus-per-task", "--cpus-per-gpu"}, short: "c"}
	memOptions = family{long: []string{"--mem", "--mem-per-cpu", "--mem-per-gpu"}}
	gpuOptions = family{long: []string{"--gres", "--gpus", "--gpus-per-node", "--gpus-per-task", "--gpus-per-socket"}, short: "G"}
	// A profile that sends its output somewhere itself keeps it there;
	// otherwise it goes to log_dir (joblog.go).
	outputOptions = family{long: []string{"--output"}, short: "o"}
	errorOptions  = family{long: []string{"--error"}, short: "e"}
	// deadlineOptions and signalOptions have no short forms.
	deadlineOptions = family{long: []string{"--deadline"}}
	signalOptions   = family{long: []string{"--signal"}}
)

// walltimeWarning is how many seconds before its time limit the worker is
// sent SIGTERM (--signal=B:TERM@60), so that it leaves the engine cleanly
// instead of being killed mid-node. Slurm may send it up to a minute
// earlier than asked.
const walltimeWarning = 60

type family struct {
	long  []string
	short string
}

// setIn reports whether any of opts is an option of the family,
// abbreviated or not.
func (f family) setIn(opts []sbatch.Opt) bool {
	for _, o := range opts {
		for _, l := range f.long {
			if o.Is(l, 0) {
				return true
			}
		}
		if f.short != "" && o.Short == f.short[0] {
			return true
		}
	}
	return false
}

// sbatchOpts is what the script and the profile's shape need of its own
// sbatch lines: which option families they set, their time limit and
// partitions. A profile of the configuration carries it, read once
// (Profile.opts); neither scriptFor nor Provision's match then parses a
// line.
type sbatchOpts struct {
	cpu, mem, gpu, output, error, deadline, signal bool
	// exclusive: the lines ask for --exclusive (in any of its forms).
	exclusive bool
	// limit is the lines' --time, when hasLimit; timeRaw the last --time
	// (or -t) as written.
	limit    time.Duration
	hasLimit bool
	timeRaw  string
	// partitions are the last --partition's, nil when none is set.
	partitions []string
}

// readOpts reads lines' options once.
func readOpts(lines []string) *sbatchOpts {
	all := sbatch.Opts(lines)
	o := &sbatchOpts{cpu: cpuOptions.setIn(all), mem: memOptions.setIn(all), gpu: gpuOptions.setIn(all),
		output: outputOptions.setIn(all), error: errorOptions.setIn(all), deadline: deadlineOptions.setIn(all),
		signal: signalOptions.setIn(all)}
	o.limit, o.hasLimit = sbatch.TimeLimit(lines)
	for _, opt := range all {
		switch {
		case (opt.Short == 't' || opt.Long == "--time") && opt.HasValue:
			o.timeRaw = strings.TrimSpace(opt.Value)
		case opt.Is("--partition", 'p'):
			o.partitions = strings.Split(opt.Value, ",")
		case opt.Is("--exclusive", 0):
			o.exclusive = true
		}
	}
	return o
}

// options is what the script needs of prof's sbatch lines: as read with
// the configuration, or read now for a profile made otherwise.
func (prof Profile) options() *sbatchOpts {
	if prof.opts != nil {
		return prof.opts
	}
	return readOpts(prof.Sbatch)
}

// srunCommand starts one task per node of the allocation, each running
// nodeScript. --export=ALL because a profile's --export=NONE would
// otherwise keep the credentials from the tasks; --kill-on-bad-exit=0
// because one worker leaving must not end its siblings; and the step is
// given the job's CPUs per task and all its memory, since from Slurm
// 22.05 srun no longer takes --cpus-per-task from the job by itself.
func srunCommand(prof Profile, nodes int, command string) string {
	n := strconv.Itoa(nodes)
	return "srun --export=ALL --nodes=" + n + " --ntasks=" + n + " --ntasks-per-node=1 --kill-on-bad-exit=0" +
		` --cpus-per-task="${SLURM_CPUS_PER_TASK:-` + strconv.Itoa(prof.CPUs) + `}" --mem=0 /bin/bash -c ` +
		shellQuote(nodeScript(nodes, command))
}

// seconds rounds a duration up to whole seconds, so that a positive
// max_idle never becomes 0.
func seconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

// shellQuote returns s as one word for a POSIX shell: unchanged when it
// holds nothing a shell would act on, else in single quotes, inside which
// only the single quote itself needs escaping.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool { return !isShellSafe(r) }) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func isShellSafe(r rune) bool {
	return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || strings.ContainsRune("@%+=:,./_-", r)
}

// tokenMargin is added to a job's longest life for its credential: the
// worker's last report and detach happen after the time limit's SIGTERM.
const tokenMargin = 10 * time.Minute

// noLimitTTL is asked for when a profile sets no time limit: the engine
// caps it (12 hours by default), and a worker whose credential expires
// is refused and leaves. Such a profile should set --time.
const noLimitTTL = 7 * 24 * time.Hour

// credentialTTL is how long the credential of a job of prof submitted at
// at should live: token_ttl if set; else the job's longest life, its
// --begin's delay (begin.go), its wait in the queue
// (provision_timeout) and its time limit, plus tokenMargin; without a
// time limit, as long as the engine allows.
func (s *settings) credentialTTL(prof Profile, at time.Time) time.Duration {
	if s.tokenTTL > 0 {
		return s.tokenTTL
	}
	opts := prof.options()
	if !opts.hasLimit {
		return noLimitTTL
	}
	return s.beginDelayAt(prof, at) + s.provisionTimeout + opts.limit + tokenMargin
}

// payload is the batch script: a worker that dials the engine and stops
// when it has been idle for max_idle.
//
// It is the seam of this package. A cluster whose compute nodes cannot
// reach the engine needs a staged variant, and that variant is this method
// and nothing else.
//
// Every #SBATCH line comes before the first command, because sbatch stops
// reading directives there. Every value interpolated into a command is
// shell-quoted; the profile's sbatch and prerun lines go in verbatim,
// which is what they are for, and validation has made sure each stays on
// its own line.
func (su *submitter) payload(prof Profile, worker, token string) []byte {
	p := su.p
	return su.script(prof, p.settings().EngineURL, "", worker, nil, [][]string{{token}})
}

// script writes the batch script for tag's job: one allocation with
// tokens[0] when tasks is nil, else an array whose task tasks[i] is an
// allocation with tokens[i]. An allocation's tokens are its nodes'
// credentials, one per node (prof.Nodes, multinode.go).
//
// url is what the worker dials: engine_url, or the relay's address; pin,
// when set, is the SHA-256 of the certificate the worker must find there
// (the relay's own, relaytls.go).
func (su *submitter) script(prof Profile, url, pin, tag string, tasks []int, tokens [][]string) []byte {
	return su.scriptFor(prof, url, pin, tag, tasks, tokens, false)
}

// probeValueRE is a value of the engine's run as the host hands it to a
// probe (engine.ProbeValue): nothing the shell acts on.
var probeValueRE = regexp.MustCompile(`^[0-9a-f]{32}$`)

// scriptFor is script; probe makes its worker a reach probe (probe.go)
// rather than one that attaches.
func (su *submitter) scriptFor(prof Profile, url, pin, tag string, tasks []int, tokens [][]string, probe bool) []byte {
	p := su.p
	cfg := p.settings()
	opts := prof.options()
	worker := tag
	nodes := max(1, prof.Nodes)
	walltime, knowsWalltime := opts.limit, opts.hasLimit
	var b bytes.Buffer
	line := func(parts ...string) {
		b.WriteString(strings.Join(parts, ""))
		b.WriteByte('\n')
	}

	line("#!/bin/bash")
	su.directives(line, cfg, prof, opts, worker, tasks)
	line()

	// sbatch reads directives up to the first line that is neither blank
	// nor a comment. This no-op is that line, so that a prerun line that
	// starts with #SBATCH is a comment to sbatch too, not an option.
	line(": end of sbatch directives")
	if knowsWalltime {
		// The job's start, before the prerun lines take their time, and
		// its time limit: the worker reckons its end from them where
		// Slurm does not say (SLURM_JOB_END_TIME, from 23.02). In the
		// environment, which a worker of an earlier release ignores,
		// not on its command line, which it would refuse.
		line(`export FLUKSIO_JOB_START="$(date +%s)" FLUKSIO_WALLTIME=`, strconv.FormatInt(int64(walltime/time.Second), 10))
	}
	for _, s := range prof.Prerun {
		line(s)
	}

	// The credential is the worker's alone: it is set for the exec that
	// becomes the worker, so no prerun command (nor anything they start)
	// inherits it. In the environment, not argv: any user of a compute
	// node can read every process's /proc/PID/cmdline, but only the job's
	// owner can read its environ.
	command := su.workerCommand(line, cfg, prof, url, pin, probe)
	// start is what runs the allocation with its credentials: the worker
	// itself, or for several nodes srun with the credentials exported for
	// its tasks to pick from (multinode.go).
	// A probe's worker is told the value of the engine's run its answer
	// must carry (shared.ProbeAnswerEnv), which the host gave this
	// plugin; in the environment, as the credential is.
	var probeEnv string
	if v := os.Getenv(shared.ProbeAnswerEnv); probe && probeValueRE.MatchString(v) {
		probeEnv = shared.ProbeAnswerEnv + "=" + v + " "
	}
	logEnv := su.p.files.jobLogEnv(cfg, opts, nodes, tasks != nil)
	start := func(tokens []string) string {
		if nodes == 1 {
			return probeEnv + tokenVar + "=" + shellQuote(tokens[0]) + " " + logEnv + "exec " + command
		}
		var vars []string
		for i, t := range tokens {
			vars = append(vars, tokenVarOf(i)+"="+shellQuote(t))
		}
		return "export " + strings.Join(vars, " ") + "; exec " + srunCommand(prof, nodes, command)
	}
	if tasks == nil {
		line(start(tokens[0]))
		return b.Bytes()
	}
	line(`case "${SLURM_ARRAY_TASK_ID:-}" in`)
	for i, t := range tasks {
		line(strconv.Itoa(t), ") ", start(tokens[i]), " ;;")
	}
	line(`*) echo "fluksio: no credential for array task '${SLURM_ARRAY_TASK_ID:-}'" >&2; exit 1 ;;`)
	line("esac")
	return b.Bytes()
}

// directives writes the script's #SBATCH lines for worker's job: its
// name and tag, the array of tasks, the nodes, what the profile's numbers
// ask for and the deadline, output and signal the provisioner adds
// unless the profile's own lines (opts, read once) set them, and then
// the profile's own lines.
func (su *submitter) directives(line func(...string), cfg *settings, prof Profile, opts *sbatchOpts, worker string, tasks []int) {
	line("#SBATCH --job-name=", jobName(cfg.name))
	// The tag (tag.go) says whose job this is, and names its worker, so
	// that a submission whose answer was lost can still be found.
	line("#SBATCH --comment=", cfg.comment(worker))
	if tasks != nil {
		// Not from the profile: validation reserves --array (reservedOption).
		line("#SBATCH --array=", sbatch.ArraySpec(tasks))
	}
	nodes := max(1, prof.Nodes)
	if nodes > 1 {
		// Reserved too: one task per node, each a worker.
		line("#SBATCH --nodes=", strconv.Itoa(nodes))
		line("#SBATCH --ntasks-per-node=1")
	}
	// The profile's numbers are what matching promised, so the scheduler
	// is asked for them unless the profile's own lines already do.
	if !opts.cpu {
		line("#SBATCH --cpus-per-task=", strconv.Itoa(prof.CPUs))
	}
	// A whole node's job is given all its CPUs and GPUs but only the
	// memory it asks for: --mem=0 is all of the node's.
	if prof.Exclusive && !opts.exclusive {
		line("#SBATCH --exclusive")
	}
	switch {
	case opts.mem:
	case prof.Exclusive:
		line("#SBATCH --mem=0")
	case prof.RAMMB > 0:
		line("#SBATCH --mem=", strconv.FormatInt(prof.RAMMB, 10), "M")
	}
	if prof.GPUs > 0 && !opts.gpu {
		line("#SBATCH --gres=gpu:", strconv.Itoa(prof.GPUs))
	}
	// A job that has not started within provision_timeout can no longer
	// end by this deadline, and Slurm removes it (state DEADLINE) even if
	// nobody is left to cancel it. Without a time limit there is no end to
	// compute; see the package documentation.
	// A --begin moves the deadline by its delay, worked out now for one
	// at a wall-clock time (begin.go).
	if opts.hasLimit && !opts.deadline {
		delay := cfg.beginDelayAt(prof, su.p.now())
		line("#SBATCH --deadline=now+", strconv.FormatInt(seconds(delay+cfg.provisionTimeout+opts.limit), 10), "seconds")
	}
	// Output to log_dir, one file per job (or array task), stdout and
	// stderr together: what a failed job said is then in one place the
	// plugin knows, and can read back (joblog.go).
	if dir := su.p.files.outputDir(cfg); dir != "" {
		if !opts.output {
			line("#SBATCH --output=", outputPattern(dir, tasks != nil))
		}
		// A profile that sends its output elsewhere gets its errors
		// there too, as sbatch does when --error is not given.
		if !opts.error && !opts.output {
			line("#SBATCH --error=", outputPattern(dir, tasks != nil))
		}
	}
	// B: signals only the batch shell, which the script replaces with the
	// worker (exec), so the worker alone hears it. A worker that is told
	// its walltime leaves before it by itself and needs no warning, which
	// Slurm may send a minute early: a job of a few minutes would lose
	// most of them to it.
	if !opts.signal && !opts.hasLimit {
		line("#SBATCH --signal=B:TERM@", strconv.Itoa(walltimeWarning))
	}
	for _, s := range prof.Sbatch {
		line("#SBATCH ", s)
	}
}

// workerCommand is the worker's command line, each word shell-quoted:
// worker_command, or the plugin's shipped copy; then the worker's
// arguments (url, pin, the profile's figures, and probe for a reach
// probe). With worker_command unset, the worker is the plugin's copy on
// the login node (ship.go), checked by its sha256 first: it writes that
// guard, and a copy that is missing or replaced is refused, with a line
// in the job's output.
func (su *submitter) workerCommand(line func(...string), cfg *settings, prof Profile, url, pin string, probe bool) string {
	program := cfg.WorkerCommand
	if program == nil {
		ship := su.p.files.workerCopyFor()
		program = []string{ship.path}
		line(workerGuard(ship))
	}
	var argv []string
	for _, w := range program {
		argv = append(argv, shellQuote(w))
	}
	wargs := shared.WorkerArgs{URL: url, EngineCertSHA256: pin, CPUs: prof.CPUs, GPUs: prof.GPUs, RAMMB: prof.RAMMB,
		Labels: prof.Labels, MaxIdle: cfg.maxIdle, ArtifactURL: cfg.ArtifactURL, Probe: probe,
		SizeFromJob: prof.Exclusive && !probe}
	for _, w := range wargs.Argv() {
		argv = append(argv, shellQuote(w))
	}
	return strings.Join(argv, " ")
}
