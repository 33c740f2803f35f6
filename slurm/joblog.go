package slurm

import (
	"context"
	"fmt"
	"path"
	"strings"
	"time"
	"unicode"

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

// logDirScript makes log_dir on the login node and prints it as an
// absolute path. "~/" is the login user's home; a relative path is
// relative to it too, since that is where ssh starts. Slurm opens --output
// before the job runs, in a directory that must exist, or the job fails
// with no output at all.
const logDirScript = `d=$1
case $d in "~") d=$HOME ;; "~/"*) d=$HOME/${d#"~/"} ;; /*) ;; *) d=$HOME/$d ;; esac
mkdir -p -m 700 -- "$d" && cd -- "$d" && pwd -P`

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
	stdout, stderr, err := p.q.Run(ctx, nil, "sh", "-c", logDirScript, "sh", cfg.logDir())
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
