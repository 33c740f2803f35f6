package queue

import (
	"bufio"
	"bytes"
	"context"
	"strings"

	"github.com/fluksio/provision/slurm/sbatch"
)

// Reading the queue: this provisioner's jobs with one squeue, whatever
// their number, because every job is named Config.JobName and carries
// its worker in its comment; the states of chosen jobs with one RPC; and
// the counts that the limits and MaxJobCount are measured against.

const (
	// queueFormat is what squeue prints for each job: id, state, reason,
	// start time and comment. The comment is the one field that could
	// hold a '|': whatever follows the fourth is the comment, up to the
	// user (userField) where it is asked for.
	queueFormat = "%i|%T|%r|%S|%k"
	// commentFormat is the id and the comment, to find a worker's job.
	commentFormat = "%i|%k"
	// userField is the job's user, after the last '|': squeue filters
	// by user at the cost of an RPC (Jobs), the plugin for nothing.
	userField = "|%u"
)

// Job is one job as squeue printed it; Partial when a light poll asked
// for its state alone (States), its reason, start and comment then
// unknown.
type Job struct {
	ID, State, Reason, Start, Comment string
	Partial                           bool
}

// isState reports whether s is written as a job state is, ^[A-Z_]+$
// (by hand: a regular expression here cost a tenth of a poll cycle at
// 10,000 rows).
func isState(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if (c < 'A' || c > 'Z') && c != '_' {
			return false
		}
	}
	return true
}

// ParseJobs reads squeue's output in queueFormat. Lines that are not a
// job (a login banner, a warning) are skipped, and with user set (the
// format ended with userField), jobs of another user. Each line is one
// string, its fields pieces of it: at 10,000 rows a cycle, a slice of
// fields a line was a fifth of what a poll cycle allocated.
func ParseJobs(out []byte, user string) []Job {
	rows := make([]Job, 0, bytes.Count(out, []byte{'\n'})+1)
	for len(out) > 0 {
		raw, rest, _ := bytes.Cut(out, []byte{'\n'})
		out = rest
		raw = bytes.TrimSpace(raw)
		if user != "" {
			i := bytes.LastIndexByte(raw, '|')
			if i < 0 || string(raw[i+1:]) != user {
				continue
			}
			raw = raw[:i]
		}
		// The id, state, reason and start hold no '|'; whatever follows
		// the fourth is the comment.
		if bytes.Count(raw, []byte{'|'}) < 4 {
			continue
		}
		line := string(raw)
		id, line, _ := strings.Cut(line, "|")
		state, line, _ := strings.Cut(line, "|")
		reason, line, _ := strings.Cut(line, "|")
		start, comment, _ := strings.Cut(line, "|")
		if !isState(state) {
			continue
		}
		rows = appendJob(rows, Job{ID: id, State: state, Reason: reason, Start: start, Comment: strings.TrimSpace(comment)})
	}
	return rows
}

// appendJob appends row to rows, once for each task its id stands for:
// squeue -r prints each array task on a line of its own ("123_7");
// without it, or from an older squeue, a pending array is one line
// ("123_[4-9%2]"), which stands for each task.
func appendJob(rows []Job, row Job) []Job {
	if sbatch.IsJobRef(row.ID) {
		return append(rows, row)
	}
	for _, task := range sbatch.ExpandJobID(row.ID) {
		row.ID = task
		rows = append(rows, row)
	}
	return rows
}

// Jobs reads this provisioner's jobs with one squeue: with all, those
// that have ended too, else only those queued or running.
//
// --name alone lists every user's jobs of that name, and another
// account's engine may well call its provisioner "hpc" too: its jobs are
// not this one's to adopt, and scancel would refuse. squeue --me (or -u)
// would leave them out at the cost of a third RPC a poll (sdiag, 22.05 to
// 26.05: 3 against 2), the plugin's budget's largest item; so where the
// login names its user, squeue prints each job's user and the queue
// leaves out the others' (queueArgs).
func (q *Queue) Jobs(ctx context.Context, all bool) ([]Job, error) {
	// -r: one line per array task, so that a burst's machines are seen
	// one by one.
	args, user := q.pollArgs(all)
	stdout, stderr, err := q.Run(ctx, nil, args...)
	if err != nil {
		return nil, WithStderr(err, stderr)
	}
	return ParseJobs(stdout, user), nil
}

// pollArgs is Jobs' squeue and whose jobs to keep of what it prints.
func (q *Queue) pollArgs(all bool) ([]string, string) {
	args := []string{"squeue", "-h", "-r"}
	if all {
		args = append(args, "-t", "all")
	}
	return q.queueArgs(args, queueFormat)
}

// PollCost is what a full poll costs slurmctld (RPCCost): 2 RPCs, 3 for
// a login that names no user.
func (q *Queue) PollCost() float64 {
	args, _ := q.pollArgs(true)
	return RPCCost(args)
}

// queueArgs ends an squeue's args with this provisioner's job name and
// format, and says whose jobs to keep of what it prints: the login's
// user, when it names one (format then ends with userField), else ""
// and squeue filters with --me.
func (q *Queue) queueArgs(args []string, format string) ([]string, string) {
	if q.cfg.User == "" {
		return append(args, "--me", "--name="+q.cfg.JobName, "-o", format), ""
	}
	return append(args, "--name="+q.cfg.JobName, "-o", format+userField), q.cfg.User
}

// ByComment maps the comment of each of this provisioner's queued or
// running jobs to its id (an array's own id for its tasks), with one
// squeue.
func (q *Queue) ByComment(ctx context.Context) (map[string]string, error) {
	args, user := q.queueArgs([]string{"squeue", "-h"}, commentFormat)
	stdout, stderr, err := q.Run(ctx, nil, args...)
	if err != nil {
		return nil, WithStderr(err, stderr)
	}
	ids := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(stdout))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if user != "" {
			i := strings.LastIndexByte(line, '|')
			if i < 0 || line[i+1:] != user {
				continue
			}
			line = line[:i]
		}
		id, comment, ok := strings.Cut(line, "|")
		if !ok {
			continue
		}
		// An array's tasks share its comment; the job is the array's.
		if all := sbatch.ExpandJobID(id); len(all) > 0 {
			job, _ := sbatch.SplitTask(all[0])
			ids[strings.TrimSpace(comment)] = job
		}
	}
	return ids, nil
}

// Lookup finds the job whose comment is comment: "" if the queue has
// none.
func (q *Queue) Lookup(ctx context.Context, comment string) (string, error) {
	ids, err := q.ByComment(ctx)
	if err != nil {
		return "", err
	}
	return ids[comment], nil
}

// States reads the state of each of ids, ended ones too, with one RPC
// (squeue --only-job-state, Slurm 24.05 and later): jobs with an id and
// a state only (Partial).
func (q *Queue) States(ctx context.Context, ids []string) ([]Job, error) {
	stdout, stderr, err := q.Run(ctx, nil, "squeue", "--only-job-state", "-h", "-r", "-t", "all", "-j", strings.Join(ids, ","), "-o", "%i|%T")
	if err != nil {
		return nil, WithStderr(err, stderr)
	}
	var rows []Job
	for out := stdout; len(out) > 0; {
		raw, rest, _ := bytes.Cut(out, []byte{'\n'})
		out = rest
		id, state, ok := strings.Cut(string(bytes.TrimSpace(raw)), "|")
		if !ok || !isState(state) {
			continue
		}
		rows = appendJob(rows, Job{ID: id, State: state, Partial: true})
	}
	return rows, nil
}

// State is job's state and pending reason, "" and "" once the queue no
// longer lists it, with one squeue.
func (q *Queue) State(ctx context.Context, job string) (state, reason string, err error) {
	stdout, stderr, err := q.Run(ctx, nil, "squeue", "-h", "-j", job, "-o", "%T|%r")
	if err != nil {
		return "", "", WithStderr(err, stderr)
	}
	state, reason, _ = strings.Cut(strings.TrimSpace(string(stdout)), "|")
	return state, reason, nil
}

// CountQueued counts the user's jobs and array tasks in the queue with
// one squeue --me (-r: a pending array's tasks one by one).
func (q *Queue) CountQueued(ctx context.Context) (int, error) {
	return q.countIDs(ctx, "squeue", "-h", "-r", "--me", "-o", "%i")
}

// CountAll counts every job and array task slurmctld holds, every
// user's and every state's: what MaxJobCount counts.
func (q *Queue) CountAll(ctx context.Context) (int, error) {
	return q.countIDs(ctx, "squeue", "-h", "-r", "-t", "all", "-o", "%i")
}

// countIDs runs an squeue that prints job ids, one a line, and counts
// the jobs and array tasks they stand for; a line that is not a job id
// (a login banner) is not a job.
func (q *Queue) countIDs(ctx context.Context, remote ...string) (int, error) {
	stdout, stderr, err := q.Run(ctx, nil, remote...)
	if err != nil {
		return 0, WithStderr(err, stderr)
	}
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(stdout))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		n += len(sbatch.ExpandJobID(strings.TrimSpace(sc.Text())))
	}
	return n, nil
}
