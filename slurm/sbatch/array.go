package sbatch

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Job ids as sbatch, squeue and scancel write them: a job is digits
// ("123"); an array task is "<job>_<task>" ("123_7"); squeue may print a
// pending array as one line ("123_[4-9%2]"), so every reader of ids reads
// both forms.

// IsJobID reports whether s is a Slurm job id: digits, and not so many
// that it is something else.
func IsJobID(s string) bool { return isDigits(s, 20) }

// isDigits reports whether s is 1 to n decimal digits.
func isDigits(s string, n int) bool {
	if s == "" || len(s) > n {
		return false
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// MaxTaskIndex bounds an array task index read from squeue: far above any
// MaxArraySize (Slurm's own cap is 4,000,001), so a hostile line cannot
// make the expansion allocate without end.
const MaxTaskIndex = 4_000_001

// maxExpand bounds how many task ids one squeue line may expand to.
const maxExpand = 100_000

// cutTaskID splits one array task, "<job>_<task>", the task written as
// Slurm writes it, without leading zeros (so that one task has one
// spelling) and at most 7 digits; ok is false for anything else. It is
// called for every row of every poll, so it is written by hand rather
// than as a regular expression.
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

// IsJobRef reports whether s names a job or one array task of it.
func IsJobRef(s string) bool {
	if IsJobID(s) {
		return true
	}
	_, _, ok := cutTaskID(s)
	return ok
}

// SplitTask splits "<job>_<task>" into the job and the task; task is -1
// for a plain job id (or anything else, returned as job).
func SplitTask(id string) (job string, task int) {
	j, n, ok := cutTaskID(id)
	if !ok {
		return id, -1
	}
	return j, n
}

// ExpandJobID returns the ids one squeue id stands for: itself for a job
// or a task, each task for a range ("123_[4-9%2]", as squeue prints a
// pending array without -r). It is nil for anything else, and for a range
// of more than maxExpand tasks.
func ExpandJobID(id string) []string {
	if IsJobRef(id) {
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
		if err1 != nil || err2 != nil || a < 0 || b < a || b > MaxTaskIndex || len(out)+(b-a+1) > maxExpand {
			return nil
		}
		for i := a; i <= b; i++ {
			out = append(out, m[1]+"_"+strconv.Itoa(i))
		}
	}
	return out
}

// CompactIDs writes task ids of one array as ranges, the way scancel
// takes them ("123_[4-9,12]"), and leaves other ids as they are, so that
// cancelling a burst is a short command line.
func CompactIDs(ids []string) []string {
	tasks := map[string][]int{}
	var jobs []string
	var out []string
	for _, id := range ids {
		job, task := SplitTask(id)
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
		out = append(out, job+"_["+ArraySpec(ts)+"]")
	}
	return out
}

// IsScancelArg is what scancel may be given: a job, a task, or tasks of
// one array as CompactIDs writes them.
func IsScancelArg(s string) bool {
	return IsJobRef(s) || rangeIDRE.MatchString(s)
}

// ArraySpec writes tasks as --array takes them: ranges of consecutive
// indexes, comma-separated ("0-39", "0,2-5"). The tasks are in order.
func ArraySpec(tasks []int) string {
	var parts []string
	for i := 0; i < len(tasks); {
		j := i
		for j+1 < len(tasks) && tasks[j+1] == tasks[j]+1 {
			j++
		}
		if i == j {
			parts = append(parts, strconv.Itoa(tasks[i]))
		} else {
			parts = append(parts, strconv.Itoa(tasks[i])+"-"+strconv.Itoa(tasks[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}
