package soak

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/worker"
)

// The workload's tasks: each reads its input and prints its digest
// (sha256sum), then sleeps its burst's work; the soak checks the digest
// printed against the one it wrote.
const (
	// inputName is the input's name in the task's directory.
	inputName = "in.bin"
	// taskRetries is each task's Retries: a machine lost under one task
	// that many times and once more within a soak is a pattern, not bad
	// luck, and the task then ends lost, which "no task lost" reports.
	taskRetries = 5
	// taskTimeout is how long a task's command may run beyond its work.
	taskTimeout = 2 * time.Minute
	// minInput and maxInput bound an input's size: a few KiB.
	minInput, maxInput = 1 << 10, 8 << 10
	// missingGrace is how long a task the books say an engine holds may
	// be missing from its /status, with its end not yet told, before it
	// counts as lost: the router forgets the oldest served needs in the
	// pass that serves them, and the TaskEnded hook writes the journal
	// just after that pass.
	missingGrace = 5 * time.Second
	// lostJobBound: an attempt told lost is shown lost by its job, when
	// its worker's leaving is not told, if squeue stops listing the job
	// within this of the loss (a worker refused by its engine exits
	// within its 10 s of retries; squeue is read every second).
	lostJobBound = 2 * time.Minute
)

// taskRequest is one task of POST /soak/tasks (soak/soakengine).
type taskRequest struct {
	ID             string      `json:"id"`
	Need           string      `json:"need"`
	Command        []string    `json:"command"`
	Inputs         []taskInput `json:"inputs"`
	Retries        int         `json:"retries"`
	TimeoutSeconds float64     `json:"timeout_seconds"`
}

type taskInput struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// request is n as POST /soak/tasks takes it: sha256sum of its input, then
// its work; a sha256sum that fails fails the task.
func (n *task) request() taskRequest {
	return taskRequest{
		ID:             n.id,
		Need:           n.shape,
		Command:        []string{"sh", "-c", fmt.Sprintf("sha256sum %s && sleep %d", inputName, int(n.work.Seconds()))},
		Inputs:         []taskInput{{Name: inputName, Path: n.input}},
		Retries:        taskRetries,
		TimeoutSeconds: (n.work + taskTimeout).Seconds(),
	}
}

// wantStdout is what n's command prints when it read its input whole.
func (n *task) wantStdout() string { return n.digest + "  " + inputName + "\n" }

// writeInput writes task k's input, minInput to maxInput bytes drawn
// from the seed and k (so every task's differs), under the soak's
// directory, and returns its path and sha256.
func (s *soak) writeInput(k int) (string, string) {
	r := rand.New(rand.NewPCG(s.plan.Seed, uint64(k)))
	b := make([]byte, minInput+r.IntN(maxInput-minInput+1))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	dir := filepath.Join(s.dir, "inputs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		s.t.Fatalf("the inputs' directory: %v", err)
	}
	p := filepath.Join(dir, fmt.Sprintf("t%d.bin", k))
	if err := os.WriteFile(p, b, 0o644); err != nil {
		s.t.Fatalf("writing an input: %v", err)
	}
	sum := sha256.Sum256(b)
	return p, hex.EncodeToString(sum[:])
}

// journalFile is one engine generation's -results file and how far the
// soak has read it (whole lines only).
type journalFile struct {
	path string
	off  int64
}

// journalLine is a line of a journal, as soakengine writes it.
type journalLine struct {
	Kind   string             `json:"kind"`
	At     time.Time          `json:"at"`
	Task   *engine.TaskResult `json:"task"`
	Again  bool               `json:"again"`
	Worker string             `json:"worker"`
	JobID  string             `json:"job_id"`
	Why    string             `json:"why"`
}

// lostAttempt is an attempt a task's result says was lost with its
// machine.
type lostAttempt struct {
	task    string
	attempt int
	gen     int
	engine.Attempt
}

// ingest reads what every journal has gained since the last call and
// records it. A dead engine's journal is whole: its last line was
// written before it died, in one write.
func (s *soak) ingest() {
	s.jmu.Lock()
	defer s.jmu.Unlock()
	for gen, j := range s.journals {
		if j == nil {
			continue
		}
		f, err := os.Open(j.path)
		if err != nil {
			continue // not written yet
		}
		f.Seek(j.off, io.SeekStart)
		b, _ := io.ReadAll(f)
		f.Close()
		end := bytes.LastIndexByte(b, '\n')
		if end < 0 {
			continue
		}
		j.off += int64(end + 1)
		s.mu.Lock()
		for _, line := range bytes.Split(b[:end], []byte("\n")) {
			var l journalLine
			if err := json.Unmarshal(line, &l); err != nil {
				s.violateLocked("every task's result recorded once and right", "engine generation %d's journal has a line that is not JSON (%v): %.200q", gen, err, line)
				continue
			}
			s.journalLocked(gen, l)
		}
		s.mu.Unlock()
	}
}

// journalLocked records one line of generation gen's journal. s.mu must
// be held.
func (s *soak) journalLocked(gen int, l journalLine) {
	switch l.Kind {
	case "gone":
		if s.gone[gen] == nil {
			s.gone[gen] = map[string]string{}
		}
		s.gone[gen][l.Worker] = l.Why
	case "lost":
		s.lostTold++
		if l.Again {
			s.again++
		}
	case "ended":
		if l.Task != nil {
			s.endedLocked(gen, l.At, l.Task)
		}
	}
}

// endedLocked checks a task's end as the TaskEnded hook told it: told
// once, of a task the soak submitted; succeeded, with its input's digest
// on its stdout, unless the soak withdrew it (then cancelled); every
// attempt but the last lost. s.mu must be held.
func (s *soak) endedLocked(gen int, at time.Time, res *engine.TaskResult) {
	const recorded, notLost, again = "every task's result recorded once and right", "no task lost", "a task run again only after its machine was lost"
	n := s.byID[res.ID]
	if n == nil {
		s.violateLocked(recorded, "engine generation %d told the end of task %q, which the soak never submitted", gen, res.ID)
		return
	}
	n.ends++
	if n.result != nil {
		s.violateLocked(recorded, "task %s's end was told %d times: %s by engine generation %d, then %s by generation %d", n.id, n.ends, n.result.State, n.resultGen, res.State, gen)
		return
	}
	n.result, n.resultGen = res, gen
	last := len(res.Attempts) - 1
	for i, a := range res.Attempts {
		if i < last && a.State != engine.TaskLostState {
			s.violateLocked(again, "task %s ran again (attempt %d of %d) after attempt %d on worker %s (job %s) ended %s, not lost", n.id, i+2, len(res.Attempts), i+1, a.Worker, a.JobID, a.State)
		}
		if a.State == engine.TaskLostState {
			s.lostAttempts = append(s.lostAttempts, lostAttempt{task: n.id, attempt: i + 1, gen: gen, Attempt: a})
		}
	}
	switch res.State {
	case worker.StateSucceeded:
		ended := res.Ended
		if ended.IsZero() {
			ended = at
		}
		n.servedAt = ended
		s.served = append(s.served, ended)
		switch {
		case n.withdrawn:
			s.violateLocked(recorded, "task %s succeeded (engine generation %d), though that engine said it was withdrawn", n.id, gen)
		case res.ExitCode == nil || *res.ExitCode != 0:
			s.violateLocked(recorded, "task %s succeeded with exit code %s", n.id, exitCode(res))
		case res.Stdout != n.wantStdout():
			s.violateLocked(recorded, "task %s succeeded, but its stdout is %q where its input's digest is %s", n.id, res.Stdout, n.digest)
		case last < 0 || res.Attempts[last].State != worker.StateSucceeded:
			s.violateLocked(recorded, "task %s succeeded, but its last attempt says otherwise: %+v", n.id, res.Attempts)
		}
	case worker.StateCancelled:
		// The soak's withdrawal may still be awaiting its answer; a
		// cancelled task not withdrawn then is checked again at the end
		// (checkTasks).
		if !n.withdrawn && !n.withdrawing {
			s.violateLocked(recorded, "task %s ended cancelled (engine generation %d: %s), though the soak never withdrew it", n.id, gen, res.Error)
		}
	case engine.TaskLostState:
		s.violateLocked(notLost, "task %s ended lost on engine generation %d: %s", n.id, gen, res.Error)
	default:
		s.violateLocked(recorded, "task %s ended %s (engine generation %d, exit code %s): %s; stderr %q", n.id, res.State, gen, exitCode(res), res.Error, res.Stderr)
	}
}

func exitCode(res *engine.TaskResult) string {
	if res.ExitCode == nil {
		return "none"
	}
	return fmt.Sprint(*res.ExitCode)
}

// checkTasks checks, once every engine has exited and every journal is
// read, what only the whole run shows: every task ended, was withdrawn,
// or waits with a reason at the end; a task ended cancelled only if it
// was withdrawn; and every attempt told lost lost its machine: its
// worker is not listed attached by a /status its engine answered after
// the loss, and either its worker's leaving was told (WorkerGone) or
// squeue stopped listing its job within lostJobBound.
func (s *soak) checkTasks() {
	s.mu.Lock()
	defer s.mu.Unlock()
	lastGen := len(s.journals) - 1
	for _, n := range s.tasks {
		switch {
		case n.result != nil && n.result.State == worker.StateCancelled && !n.withdrawn:
			s.violateLocked("every task's result recorded once and right", "task %s ended cancelled, though the soak never withdrew it", n.id)
		case n.result != nil || n.withdrawn:
		case n.gen == 0:
			s.violateLocked("no task lost", "task %s (%s) was never submitted", n.id, n.spec)
		case n.gen != lastGen:
			s.violateLocked("no task lost", "task %s (%s) was held by engine generation %d, which died without telling its end, and was never submitted again", n.id, n.spec, n.gen)
		case n.state != "waiting" || n.reason == "":
			s.violateLocked("no task lost", "task %s (%s) neither ended nor was withdrawn, and does not wait with a reason at the end: %q, %q", n.id, n.spec, n.state, n.reason)
		}
	}
	for _, la := range s.lostAttempts {
		if seen, ok := s.listed[la.gen][la.Worker]; ok && seen.After(la.Ended.Add(2*time.Second)) {
			s.violateLocked("a task run again only after its machine was lost", "task %s's attempt %d was told lost with worker %s at %s, yet /status listed that worker attached at %s",
				la.task, la.attempt, la.Worker, la.Ended.Sub(s.start).Round(100*time.Millisecond), seen.Sub(s.start).Round(100*time.Millisecond))
		}
		_, gone := s.gone[la.gen][la.Worker]
		end, ended := s.queueGone[la.JobID]
		if !gone && !(ended && end.Before(la.Ended.Add(lostJobBound))) {
			s.violateLocked("a task run again only after its machine was lost", "task %s's attempt %d was told lost with worker %s (job %s), but neither did the worker leave its engine's books nor its job end within %s",
				la.task, la.attempt, la.Worker, la.JobID, lostJobBound)
		}
	}
}

// taskReport is the report's section on the tasks, and checks the need
// rule's last part: a task not served has a reason. s.mu must be held.
func (s *soak) taskReport(b *strings.Builder) {
	var succeeded, withdrawn, waitingEnd, other, retried, submittedAgain int
	reasons := map[string]int{}
	for _, n := range s.tasks {
		switch {
		case n.result != nil && n.result.State == worker.StateSucceeded:
			succeeded++
			if len(n.result.Attempts) > 1 {
				retried++
			}
		case n.withdrawn:
			withdrawn++
		case n.result != nil:
			other++
			reasons["ended "+string(n.result.State)]++
		default:
			waitingEnd++
			reasons[orDash(n.state)+": "+orDash(n.reason)]++
			if n.reason == "" {
				s.violateLocked("every need served or failed with a reason, none lost", "task %s (%s) was never served and has no reason (state %q)", n.id, n.spec, n.state)
			}
		}
		if n.adds > 1 {
			submittedAgain++
		}
	}
	fmt.Fprintf(b, "### Tasks\n\n%d tasks in %d bursts, each `sha256sum %s && sleep WORK` on an input of its own (%d to %d bytes): "+
		"%d succeeded, each with its input's digest on its stdout; %d withdrawn while they waited (%d by demand-drop faults, %d when the workflow ended after the drain); %d not succeeded (%s).\n\n",
		len(s.tasks), len(s.plan.Bursts), inputName, minInput, maxInput, succeeded, withdrawn, withdrawn-s.withdrawnAtEnd, s.withdrawnAtEnd, waitingEnd+other, reasonList(reasons))
	fmt.Fprintf(b, "%d submissions in all: %d tasks submitted again to a restarted engine (which keeps nothing of the last one's). "+
		"%d attempts told lost with their machines (TaskLost), %d of them run again; %d succeeded tasks ran more than once on one engine.\n\n",
		s.submissions, submittedAgain, s.lostTold, s.again, retried)
	// How each attempt told lost was shown lost.
	var byScancel, byJob, byGone int
	whys := map[string]int{}
	for _, la := range s.lostAttempts {
		why, gone := s.gone[la.gen][la.Worker]
		end, ended := s.queueGone[la.JobID]
		switch {
		case s.scancelled[la.JobID]:
			byScancel++
		case ended && end.Before(la.Ended.Add(lostJobBound)):
			byJob++
		case gone:
			byGone++
		}
		if gone {
			whys[why]++
		}
	}
	if len(s.lostAttempts) > 0 {
		var ws []string
		for w, k := range whys {
			ws = append(ws, fmt.Sprintf("%d %s", k, w))
		}
		sort.Strings(ws)
		fmt.Fprintf(b, "The %d lost attempts in the results: %d on a job the nemesis scancelled, %d more whose job ended within %s, %d more whose worker left the books with the job still listed; the workers' leaving as the engine told it: %s.\n\n",
			len(s.lostAttempts), byScancel, byJob, lostJobBound, byGone, strings.Join(ws, "; "))
	}
}
