package slurm

import (
	"bytes"
	"strconv"
	"strings"
	"time"
)

// tokenVar carries the worker's credential. The environment, not argv:
// any user of a compute node can read every process's /proc/PID/cmdline,
// but only the job's owner can read its environ.
const tokenVar = "FLUKSIO_WORKER_TOKEN"

// jobName is what every job of a provisioner is called, so that its jobs
// can be found with squeue --name.
func jobName(provisioner string) string { return "fluksio-" + provisioner }

// jobComment marks a job with its worker, so that a submission whose
// answer was lost can still be found and cancelled.
func jobComment(worker string) string { return "fluksio:" + worker }

// Option families the script derives from a profile. A profile whose own
// sbatch lines set any option of a family keeps its own, because Slurm
// rejects some mixes (--cpus-per-gpu with --cpus-per-task, --mem with
// --mem-per-cpu) and the site's lines know better.
var (
	cpuOptions = family{long: []string{"--cpus-per-task", "--cpus-per-gpu"}, short: "c"}
	memOptions = family{long: []string{"--mem", "--mem-per-cpu", "--mem-per-gpu"}}
	gpuOptions = family{long: []string{"--gres", "--gpus", "--gpus-per-node", "--gpus-per-task", "--gpus-per-socket"}, short: "G"}
)

type family struct {
	long  []string
	short string
}

// setBy reports whether any of the sbatch lines sets an option of the
// family, abbreviated or not.
func (f family) setBy(lines []string) bool {
	for _, line := range lines {
		long, short := optionNames(line)
		for _, o := range f.long {
			if long != "" && strings.HasPrefix(o, long) {
				return true
			}
		}
		if f.short != "" && strings.ContainsAny(short, f.short) {
			return true
		}
	}
	return false
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
func (p *Provisioner) payload(prof Profile, worker, token string) []byte {
	cfg := p.settings()
	var b bytes.Buffer
	line := func(parts ...string) {
		b.WriteString(strings.Join(parts, ""))
		b.WriteByte('\n')
	}

	line("#!/bin/bash")
	line("#SBATCH --job-name=", jobName(cfg.name))
	line("#SBATCH --comment=", jobComment(worker))
	// The profile's numbers are what matching promised, so the scheduler
	// is asked for them unless the profile's own lines already do.
	if !cpuOptions.setBy(prof.Sbatch) {
		line("#SBATCH --cpus-per-task=", strconv.Itoa(prof.CPUs))
	}
	if prof.RAMMB > 0 && !memOptions.setBy(prof.Sbatch) {
		line("#SBATCH --mem=", strconv.FormatInt(prof.RAMMB, 10), "M")
	}
	if prof.GPUs > 0 && !gpuOptions.setBy(prof.Sbatch) {
		line("#SBATCH --gres=gpu:", strconv.Itoa(prof.GPUs))
	}
	for _, s := range prof.Sbatch {
		line("#SBATCH ", s)
	}
	line()

	line("export ", tokenVar, "=", shellQuote(token))
	for _, s := range prof.Prerun {
		line(s)
	}

	argv := []string{"exec"}
	for _, w := range cfg.WorkerCommand {
		argv = append(argv, shellQuote(w))
	}
	argv = append(argv,
		"--url", shellQuote(cfg.EngineURL),
		"--cpus", strconv.Itoa(prof.CPUs),
		"--gpus", strconv.Itoa(prof.GPUs),
		"--max-idle", strconv.FormatInt(seconds(cfg.maxIdle), 10),
	)
	if prof.RAMMB > 0 {
		argv = append(argv, "--ram-mb", strconv.FormatInt(prof.RAMMB, 10))
	}
	if len(prof.Labels) > 0 {
		argv = append(argv, "--labels", shellQuote(strings.Join(prof.Labels, ",")))
	}
	if cfg.ArtifactURL != "" {
		argv = append(argv, "--artifact-url", shellQuote(cfg.ArtifactURL))
	}
	line(strings.Join(argv, " "))
	return b.Bytes()
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
