package slurm

import (
	"context"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// A burst of machines of one profile is one sbatch --array=0-(N-1): one
// submission, one RPC to slurmctld, however many machines. Each array task
// is one machine, with a worker name of its own (<base>-<task>) and a
// credential of its own, which the script picks by SLURM_ARRAY_TASK_ID.
//
// Rejected alternative: one sbatch per machine, which is what every
// pilot-job tool does (dask-jobqueue declined arrays, Parsl submits a
// block at a time). A thousand machines cost a thousand submissions, each
// an RPC that slurmctld serialises, and a site that watches submission
// rates sees a flood. The cost of arrays: a task's id is "<job>_<task>"
// and squeue may print a pending array as one line ("123_[4-9%2]"), so
// every reader of ids reads both forms; and the script holds every task's
// credential, readable by any task of the array (they all run as the same
// user, who could read them anyway).
//
// A cluster that refuses arrays (MaxArraySize=0, or sbatch rejects
// --array) gets one sbatch per machine instead, and Status says so.

// maxTaskIndex bounds an array task index read from squeue: far above any
// MaxArraySize (Slurm's own cap is 4,000,001), so a hostile line cannot
// make the expansion allocate without end.
const maxTaskIndex = 4_000_001

// maxExpand bounds how many task ids one squeue line may expand to.
const maxExpand = 100_000

// cutTaskID splits one array task, "<job>_<task>", the task written as
// Slurm writes it, without leading zeros (so that one task has one
// spelling) and at most 7 digits; ok is false for anything else. It was
// a regular expression, which at 10,000 rows a poll cycle was a tenth of
// the plugin's time (bench, measurement 13); it is called for every row.
func cutTaskID(s string) (job string, task int, ok bool) {
	job, t, found := strings.Cut(s, "_")
	if !found || !isDigits(job, 20) || !isDigits(t, 7) || (len(t) > 1 && t[0] == '0') {
		return "", 0, false
	}
	n, err := strconv.Atoi(t)
	return job, n, err == nil
}

// rangeIDRE is a pending array as squeue prints it without -r:
// "<job>_[<ranges>]" with ranges such as "4-9", "1,3,5-7" and an optional
// "%<max running>".
var rangeIDRE = regexp.MustCompile(`^([0-9]{1,20})_\[([0-9,\-]+)(?:%[0-9]{1,7})?\]$`)

// maxRangeID bounds the length of a range id read from squeue.
const maxRangeID = 4096

// isJobRef reports whether s names a job or one array task of it.
func isJobRef(s string) bool {
	if isJobID(s) {
		return true
	}
	_, _, ok := cutTaskID(s)
	return ok
}

// splitTask splits "<job>_<task>" into the job and the task; task is -1
// for a plain job id.
func splitTask(id string) (job string, task int) {
	j, n, ok := cutTaskID(id)
	if !ok {
		return id, -1
	}
	return j, n
}

// expandJobID returns the ids one squeue id stands for: itself for a job
// or a task, each task for a range. It is nil for anything else.
func expandJobID(id string) []string {
	if isJobRef(id) {
		return []string{id}
	}
	if len(id) > maxRangeID {
		return nil
	}
	m := rangeIDRE.FindStringSubmatch(id)
	if m == nil {
		return nil
	}
	var out []string
	for _, part := range strings.Split(m[2], ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err1 := strconv.Atoi(lo)
		b := a
		var err2 error
		if isRange {
			b, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || a < 0 || b < a || b > maxTaskIndex || len(out)+(b-a+1) > maxExpand {
			return nil
		}
		for i := a; i <= b; i++ {
			out = append(out, m[1]+"_"+strconv.Itoa(i))
		}
	}
	return out
}

// compactIDs writes task ids of one array as ranges, the way scancel
// takes them ("123_[4-9,12]"), and leaves other ids as they are, so that
// cancelling a burst is a short command line.
func compactIDs(ids []string) []string {
	tasks := map[string][]int{}
	var jobs []string
	var out []string
	for _, id := range ids {
		job, task := splitTask(id)
		if task < 0 {
			out = append(out, id)
			continue
		}
		if _, seen := tasks[job]; !seen {
			jobs = append(jobs, job)
		}
		tasks[job] = append(tasks[job], task)
	}
	for _, job := range jobs {
		ts := tasks[job]
		slices.Sort(ts)
		ts = slices.Compact(ts)
		if len(ts) == 1 {
			out = append(out, job+"_"+strconv.Itoa(ts[0]))
			continue
		}
		out = append(out, job+"_["+arraySpec(ts)+"]")
	}
	return out
}

// isScancelArg is what scancel may be given: a job, a task, or tasks of
// one array as compactIDs writes them.
func isScancelArg(s string) bool {
	return isJobRef(s) || rangeIDRE.MatchString(s)
}

// maxArraySizeRE finds MaxArraySize in scontrol show config.
var maxArraySizeRE = regexp.MustCompile(`(?m)^MaxArraySize\s*=\s*([0-9]+)\s*$`)

// readArraySize reads the cluster's MaxArraySize with scontrol show
// config. Array indexes run from 0 to MaxArraySize-1, so that is the most
// machines one sbatch may ask for; 0 or 1 means no arrays. A cluster whose
// setting cannot be read is taken to allow Slurm's default, 1001: the
// first sbatch says if it does not. Configure's adoption reads it once,
// before any submission may begin.
func (p *Provisioner) readArraySize(ctx context.Context) int {
	stdout, _, err := p.call(ctx, nil, "scontrol", "show", "config")
	if err != nil {
		return defaultMaxArraySize
	}
	p.mu.Lock()
	if m := clusterNameRE.FindSubmatch(stdout); m != nil {
		p.cluster = string(m[1])
	}
	p.maxJobs = parseMaxJobCount(stdout)
	p.mu.Unlock()
	if m := maxArraySizeRE.FindSubmatch(stdout); m != nil {
		if n, err := strconv.Atoi(string(m[1])); err == nil {
			return max(1, min(n, maxTaskIndex))
		}
	}
	return defaultMaxArraySize
}

// defaultMaxArraySize is Slurm's own default.
const defaultMaxArraySize = 1001
