package sandboxtest

import (
	"strings"
	"testing"
	"time"
)

// CleanStopLimit is how long after an engine's clean exit Slurm may still
// list one of its jobs: each worker has detached and exited 0 before the
// engine returns, so what is left is Slurm's own bookkeeping of a batch
// script that has ended (slurmstepd's completion RPC and the epilog),
// well under a second on a healthy controller. A job still COMPLETING
// after it is one whose completion the controller did not answer in
// MessageTimeout, which slurmstepd retries 15 s later; sandbox/root.sh's
// sb_root_hosts records what made the newer Slurms' controllers do that.
// sandbox/demo.sh checks the same limit.
const CleanStopLimit = 2 * time.Second

// AssertCleanStop is the clean-stop promise as a user sees it in squeue:
// it polls for the jobs named jobName (the engine's "fluksio-NAME") until
// none is left, and fails the test, naming each job and its state, when
// one still is CleanStopLimit after exited (after says after what). It
// returns how long the queue took to drain.
func (e Env) AssertCleanStop(t testing.TB, jobName string, exited time.Time, after string) time.Duration {
	t.Helper()
	took, left := e.QueueDrain(t, jobName, exited, CleanStopLimit)
	if left != "" {
		t.Errorf("%s after %s squeue still holds of %s:\n%s", CleanStopLimit, after, jobName, left)
		return took
	}
	t.Logf("the queue is empty of %s %.2fs after %s", jobName, took.Seconds(), after)
	return took
}

// QueueDrain polls squeue for the jobs named jobName until none is left
// or limit has passed since since; it returns how long that took, and
// what squeue still held ("" when it emptied).
func (e Env) QueueDrain(t testing.TB, jobName string, since time.Time, limit time.Duration) (took time.Duration, left string) {
	t.Helper()
	for {
		q := strings.TrimSpace(e.Slurm(t, "squeue", "-h", "--name="+jobName, "-o", "%i %T"))
		took := time.Since(since)
		if q == "" || took > limit {
			return took, q
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// JobRecord is how Slurm's controller recorded a job (or one task of an
// array) that has ended: scontrol's JobState and ExitCode, and its
// whole line (scontrol -o show job) for the rest (ShowField).
type JobRecord struct {
	State, ExitCode string
	Line            string
}

// JobRecords is scontrol's record of each job of ids, by id; an array
// task's id is ARRAY_TASK, and any id of an array brings all its tasks
// (scontrol shows the whole array). The controller keeps a record
// MinJobAge (300 s in the sandbox) after the job ends.
func (e Env) JobRecords(t testing.TB, ids ...string) map[string]JobRecord {
	t.Helper()
	seen := map[string]bool{}
	recs := map[string]JobRecord{}
	for _, id := range ids {
		array, _, _ := strings.Cut(id, "_")
		if seen[array] {
			continue
		}
		seen[array] = true
		for _, line := range strings.Split(strings.TrimSpace(e.Slurm(t, "scontrol", "-o", "show", "job", array)), "\n") {
			id := ShowField(line, "JobId")
			if task := ShowField(line, "ArrayTaskId"); task != "" {
				id = ShowField(line, "ArrayJobId") + "_" + task
			}
			recs[id] = JobRecord{State: ShowField(line, "JobState"), ExitCode: ShowField(line, "ExitCode"), Line: line}
		}
	}
	return recs
}

// ShowField is the value of key=value in one line of scontrol -o show.
func ShowField(line, key string) string {
	for _, w := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(w, key+"="); ok {
			return v
		}
	}
	return ""
}
