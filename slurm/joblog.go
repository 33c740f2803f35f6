package slurm

import (
	"context"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/internal/queue"
	"github.com/fluksio/provision/slurm/sbatch"
)

// Why a job failed. Every job's output goes to log_dir on the cluster
// (unless a profile sets --output itself), and a job that ends before its
// worker attaches is reported with its exit code, its reason, the output's
// path and its last lines, read over the same ssh connection, bounded in
// size and time. Only a failed job's output is read: a working job's is
// the worker's business (docs/design/slurm-job-log.md).

const (
	// defaultLogDir is log_dir when the configuration leaves it out,
	// under the login user's home: XDG's state directory, the place for
	// logs a program keeps for its user. %s is the provisioner's name, so
	// that two provisioners (or engines) do not mix their files.
	defaultLogDir = "~/.local/state/fluksio/%s"

	// tailBytes is how much of a failed job's output is read back, and
	// tailLines how many of its last lines are reported: enough for a
	// "command not found" or a Python traceback's last frame, not a page.
	tailBytes = 2048
	tailLines = 5
	// explainPerPoll caps the failed jobs explained per poll: a burst of
	// 64 tasks failing at once is one cause, and 64 ssh calls would say it
	// 64 times. The others are reported with their output's path.
	explainPerPoll = 2
)

// logDir is log_dir as configured, or its default.
func (s *settings) logDir() string {
	if s.LogDir != "" {
		return s.LogDir
	}
	return fmt.Sprintf(defaultLogDir, s.name)
}

// resolveLogDir is logDirScript's first line: $d is log_dir, resolved
// against the login user's home.
const resolveLogDir = `d=$1
case $d in "~") d=$HOME ;; "~/"*) d=$HOME/${d#"~/"} ;; /*) ;; *) d=$HOME/$d ;; esac`

// lookLogsScript says what log_dir holds as logsScript does, then its
// path; "fluksio-nodir" alone when it does not exist yet. It changes
// nothing.
const lookLogsScript = resolveLogDir + `
cd -- "$d" 2>/dev/null || { echo fluksio-nodir; exit 0; }
` + logsScript + `
pwd -P`

// logDirScript makes log_dir on the login node, goes over its logs as
// logsScript does ($2, $3, $4), and prints it as an absolute path, last.
// "~/" is the login user's home; a relative path is relative to it too,
// since that is where ssh starts. Slurm opens --output before the job
// runs, in a directory that must exist, or the job fails with no output
// at all.
const logDirScript = resolveLogDir + `
mkdir -p -m 700 -- "$d" && cd -- "$d" || exit 1
` + logsScript + `
pwd -P`

// The login node left as found. A job's log in log_dir is removed by
// its worker when the worker ends well (shared.JobLogEnv); what stays
// is of jobs that failed, were cancelled before their worker attached,
// or ran a worker that does not remove it. Of those, log_dir keeps the
// newest log_dir_keep, within logKeepBytes, and removes the rest when
// the provisioner starts, in logDirScript's one call; files other than
// job logs (JOBID.out, ARRAYID_TASK.out) are never touched. Not at
// shutdown: the workers the engine lets go are still ending then, their
// logs the newest, and would push out of the count the failed ones
// kept; a run's own failures wait for the next start. Rejected:
// removing a log as soon as its job is seen to end, which would take
// from explain the failed ones it reads, and cost an ssh call a job;
// and a job script that removes its own log after its worker, which
// would have to stop exec-ing the worker, and Slurm's signals
// (--signal=B:TERM) would then reach the shell, not the worker.
const (
	// logKeepDefault is log_dir_keep when the configuration leaves it
	// out, logKeepMax its bound.
	logKeepDefault = 100
	logKeepMax     = 100000
	// logKeepBytes bounds the bytes of the logs kept.
	logKeepBytes = 64 << 20
)

// logsScript goes over the job logs in the current directory, the
// newest first: with $2 "prune" it removes every one past the $3 newest
// or past $4 bytes in all; with "look" it removes none. It prints
// "fluksio-logs FOUND BYTES KEPT KEPTBYTES". It needs GNU find's
// -printf; without it, it finds nothing and removes nothing.
const logsScript = `find . -maxdepth 1 -type f -name '*.out' -printf '%T@ %s %f\n' 2>/dev/null | sort -rn | {
  n=0 b=0 kn=0 kb=0
  while read -r _ s f; do
    case ${f%.out} in ''|*[!0-9_]*) continue ;; esac
    n=$((n + 1)) b=$((b + s))
    if [ "$2" = prune ] && { [ "$n" -gt "$3" ] || [ "$b" -gt "$4" ]; }; then
      rm -f -- "$f"
    else
      kn=$((kn + 1)) kb=$((kb + s))
    fi
  done
  echo "fluksio-logs $n $b $kn $kb"
}`

// logKeep is log_dir_keep, or its default.
func (s *settings) logKeep() int {
	if s.LogDirKeep != nil {
		return *s.LogDirKeep
	}
	return logKeepDefault
}

// logCount is what logsScript found and kept.
type logCount struct {
	found, kept           int
	foundBytes, keptBytes int64
}

// readLogCount reads logsScript's line from out; ok is false when there
// is none.
func readLogCount(out string) (c logCount, ok bool) {
	for _, l := range strings.Split(out, "\n") {
		if n, _ := fmt.Sscanf(strings.TrimSpace(l), "fluksio-logs %d %d %d %d", &c.found, &c.foundBytes, &c.kept, &c.keptBytes); n == 4 {
			return c, true
		}
	}
	return logCount{}, false
}

// saidLogs logs what logsScript removed, if anything.
func (lf *loginFiles) saidLogs(cfg *settings, dir, out string) {
	if c, ok := readLogCount(out); ok && c.found > c.kept {
		cfg.log.Info("removed job logs from log_dir past what it keeps", "log_dir", dir, "removed", c.found-c.kept,
			"removed_bytes", c.foundBytes-c.keptBytes, "kept", c.kept, "kept_bytes", c.keptBytes, "log_dir_keep", cfg.logKeep())
	}
}

// validLogDir reports whether dir can go into an #SBATCH line as it is:
// sbatch splits those lines at white space and reads quotes, backslashes
// and '#' itself, and '%' starts one of its file name patterns.
func validLogDir(dir string) bool {
	return dir != "" && !strings.ContainsFunc(dir, func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsControl(r) || strings.ContainsRune(`"'\#%`, r)
	})
}

// outputPattern is --output for a job in dir: one file per job, or per
// array task, named by its id as squeue shows it (4242, 4242_3).
func outputPattern(dir string, array bool) string {
	if array {
		return dir + "/%A_%a.out"
	}
	return dir + "/%j.out"
}

// explainScript prints what Slurm still knows of job $1 and the last
// tailBytes of the file $2 (or of the job's StdOut, when $2 is empty),
// separated by a line of its own. The controller forgets a finished job
// after MinJobAge (300 s by default, often less on a busy cluster), and
// then scontrol says only "Invalid job id specified"; accounting
// (slurmdbd) still has it, so sacct's row stands in, after a line of its
// own. Where there is no accounting, sacct fails and scontrol's words
// stay.
const explainScript = `info=$(scontrol show job "$1" 2>&1)
case $info in
*JobState=*) printf '%s\n' "$info" ;;
*)
  a=$(sacct -n -X -P -o jobid,state,exitcode,reason -j "$1" 2>/dev/null | head -n 1)
  if [ -n "$a" ]; then echo "--- fluksio: sacct"; printf '%s\n' "$a"; else printf '%s\n' "$info"; fi ;;
esac
echo "--- fluksio: output"
f=$2
if [ -z "$f" ]; then f=$(printf '%s\n' "$info" | sed -n 's/^ *StdOut=//p' | head -n 1); fi
echo "$f"
[ -n "$f" ] && tail -c ` + "2048" + ` -- "$f" 2>&1
true`

// sacctMark starts sacct's row in explainScript's output.
const sacctMark = "--- fluksio: sacct\n"

// quoteTail is what explain quotes of the last tailBytes of a job's
// output: its last lines, redacted of secrets and credentials. A tail of
// tailBytes was cut by tail -c, anywhere in its first line, perhaps
// inside a credential whose rest no pattern would know: that line goes.
func quoteTail(tail string, secrets []string) string {
	if len(tail) >= tailBytes {
		_, tail, _ = strings.Cut(tail, "\n")
	}
	return lastLines(newRedactor(secrets).scrub(tail), tailLines)
}

// field is the value of key (such as "ExitCode=") in scontrol's output.
func field(info, key string) string {
	i := strings.Index(info, " "+key)
	if i < 0 {
		if !strings.HasPrefix(info, key) {
			return ""
		}
		i = -1
	}
	v := info[i+1+len(key):]
	if j := strings.IndexAny(v, " \n"); j >= 0 {
		v = v[:j]
	}
	return v
}

// exitCode reads scontrol's ExitCode=code:signal: "2", or "0 (signal 9)".
func exitCode(v string) string {
	code, sig, _ := strings.Cut(v, ":")
	if sig != "" && sig != "0" {
		return code + " (signal " + sig + ")"
	}
	return code
}

// lastLines is the last n non-empty lines of s, each cleaned of control
// characters (a job's output may hold anything), joined with " | ".
func lastLines(s string, n int) string {
	var out []string
	s = ansiEscape.ReplaceAllString(s, "")
	for _, l := range strings.Split(s, "\n") {
		l = strings.TrimSpace(strings.Map(func(r rune) rune {
			if unicode.IsControl(r) {
				return -1
			}
			return r
		}, l))
		if l != "" {
			out = append(out, l)
		}
	}
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return truncateTo(strings.Join(out, " | "), 600)
}

// ensureLogDir makes log_dir on the login node once per process and
// returns its absolute path; the script's --output names it. A profile
// that sets its own --output needs none, but one call per process is
// cheaper than deciding.
func (lf *loginFiles) ensureLogDir(ctx context.Context, cfg *settings) (string, error) {
	p := lf.p
	resolved := func() string {
		p.mu.Lock()
		defer p.mu.Unlock()
		return lf.logDirAbs
	}
	if dir := resolved(); dir != "" {
		return dir, nil
	}
	select {
	case lf.makingLogDir <- struct{}{}:
		defer func() { <-lf.makingLogDir }()
	case <-ctx.Done():
		return "", fmt.Errorf("log_dir %s: waiting for it to be made: %w", cfg.logDir(), ctx.Err())
	}
	// Made while this call waited for its turn.
	if dir := resolved(); dir != "" {
		return dir, nil
	}
	mode := "prune"
	if lf.lookOnly {
		mode = "look"
	}
	stdout, stderr, err := p.q.Run(ctx, nil, "sh", "-c", logDirScript, "sh", cfg.logDir(), mode, strconv.Itoa(cfg.logKeep()), strconv.Itoa(logKeepBytes))
	if err != nil {
		return "", fmt.Errorf("log_dir %s: cannot create it on the login node: %w", cfg.logDir(), queue.WithStderr(err, stderr))
	}
	lines := strings.Split(strings.TrimSpace(string(stdout)), "\n")
	dir := strings.TrimSpace(lines[len(lines)-1])
	if !path.IsAbs(dir) || !validLogDir(dir) {
		return "", fmt.Errorf("log_dir %s: the login node gave %q as its path, which cannot be used", cfg.logDir(), truncateTo(dir, 200))
	}
	p.mu.Lock()
	lf.logDirAbs = dir
	p.mu.Unlock()
	lf.saidLogs(cfg, dir, string(stdout))
	return dir, nil
}

// outputDir is the directory the script sends output to: log_dir as the
// login node resolved it, or, before it has (a preview), as configured.
func (lf *loginFiles) outputDir(cfg *settings) string {
	p := lf.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if lf.logDirAbs != "" {
		return lf.logDirAbs
	}
	return cfg.logDir()
}

// jobLogEnv is the assignment of shared.JobLogEnv the script puts
// before its worker, with a space after it: the job's own file in
// log_dir, named from Slurm's variables as outputPattern names it. It
// is empty when the file is not the provisioner's to name (the profile
// sets --output), when log_dir is not yet resolved (a preview), and for
// a job of several nodes, whose one file serves workers that end apart.
func (lf *loginFiles) jobLogEnv(cfg *settings, opts *sbatchOpts, nodes int, array bool) string {
	dir := lf.outputDir(cfg)
	if opts.output || nodes > 1 || !path.IsAbs(dir) {
		return ""
	}
	name := `"${SLURM_JOB_ID}.out"`
	if array {
		name = `"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}.out"`
	}
	return shared.JobLogEnv + "=" + shellQuote(dir) + "/" + name + " "
}

// outputOf is where job (an id as squeue shows it) wrote its output when
// its profile left --output to log_dir; empty when unknown.
func (lf *loginFiles) outputOf(prof Profile, job string) string {
	p := lf.p
	p.mu.Lock()
	dir := lf.logDirAbs
	p.mu.Unlock()
	if dir == "" || prof.options().output || !sbatch.IsJobRef(job) {
		return ""
	}
	return dir + "/" + job + ".out"
}

// explain asks the cluster why job ended before its worker attached: its
// exit code and reason as scontrol has them (sacct, once the controller
// has forgotten the job), and the last lines of its output, redacted of
// credentials (redactor; secrets are those the job's script held).
// It is one ssh call, bounded by submit_timeout; what it cannot learn it
// leaves out. The answer is meant to be appended to an event.
func (lf *loginFiles) explain(ctx context.Context, prof Profile, job string, secrets []string) string {
	p := lf.p
	known := lf.outputOf(prof, job)
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	stdout, _, err := p.q.Run(ctx, nil, "sh", "-c", explainScript, "sh", job, known)
	if err != nil {
		if known != "" {
			return "output " + known
		}
		return ""
	}
	info, rest, _ := strings.Cut(string(stdout), "--- fluksio: output\n")
	file, tail, _ := strings.Cut(rest, "\n")
	var parts []string
	if _, row, ok := strings.Cut(info, sacctMark); ok {
		// jobid|state|exitcode|reason, as accounting keeps it.
		f := strings.Split(strings.TrimSpace(row), "|")
		if len(f) == 4 {
			parts = append(parts, "state "+f[1]+" (from sacct: the controller no longer knows the job)")
			if f[2] != "" {
				parts = append(parts, "exit code "+exitCode(f[2]))
			}
			if f[3] != "" && f[3] != "None" {
				parts = append(parts, "reason "+f[3])
			}
		}
	} else {
		if code := field(info, "ExitCode="); code != "" {
			parts = append(parts, "exit code "+exitCode(code))
		}
		if reason := field(info, "Reason="); reason != "" && reason != "None" {
			parts = append(parts, "reason "+reason)
		}
	}
	if file = strings.TrimSpace(file); file != "" {
		parts = append(parts, "output "+file)
	}
	if last := quoteTail(tail, secrets); last != "" {
		parts = append(parts, "its last lines: "+last)
	}
	return strings.Join(parts, ", ")
}
