package main

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/shared"
)

// progress counts what run's story needs for its progress line and its
// summary, from the engine's hooks: machines asked for and in how many
// submissions, machines that attached and left, submissions that failed.
// The needs and tasks themselves are read from the engine when a line is
// drawn.
type progress struct {
	// mu guards every field below.
	mu sync.Mutex
	// requested and submissions add up the provisioners' bursts;
	// reached are the submissions that made a job, by the job's
	// submission (an array task's ARRAY_TASK counts as ARRAY), from the
	// provisioners' events: a burst whose sbatch never ran (the login
	// refused) is a submission that did not reach the scheduler.
	requested, submissions int
	reached                map[string]bool
	// failed counts machines a provisioner could not get.
	failed int
	// machines are the workers that ever attached; alive those attached
	// now, with their CPUs and when they attached.
	machines map[string]bool
	alive    map[string]aliveMachine
	// machineCPUSeconds adds up the CPUs of the machines that left, for
	// as long as each was attached; taskCPUSeconds the CPUs the ended
	// tasks' attempts took, for as long as each ran: their ratio is how
	// full the machines were.
	machineCPUSeconds, taskCPUSeconds float64
	// lastFailure is the last provisioning failure's words.
	lastFailure string
	// ends are the tasks ended as the progress line was last drawn, a
	// sample a draw, the oldest first: the rate is over the last
	// rateWindow of them.
	ends []endSample
}

// endSample is how many tasks had ended at a moment.
type endSample struct {
	at    time.Time
	ended int
}

// rateWindow is how far back the rate of tasks ending looks: long
// enough to smooth a burst, short enough to follow a change of pace.
const rateWindow = 30 * time.Second

// aliveMachine is an attached machine's CPUs and when it attached.
type aliveMachine struct {
	cpus int
	at   time.Time
}

func newProgress() *progress {
	return &progress{machines: map[string]bool{}, alive: map[string]aliveMachine{}, reached: map[string]bool{}}
}

func (p *progress) attach(w engine.WorkerInfo) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.machines[w.Name] = true
	p.alive[w.Name] = aliveMachine{cpus: w.CPUs, at: time.Now()}
}

func (p *progress) gone(w engine.WorkerInfo, _ string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if m, ok := p.alive[w.Name]; ok {
		p.machineCPUSeconds += float64(m.cpus) * time.Since(m.at).Seconds()
	}
	delete(p.alive, w.Name)
}

// taskEnded adds up the CPU-seconds r's attempts took.
func (p *progress) taskEnded(r engine.TaskResult) {
	var sum float64
	for _, a := range r.Attempts {
		if !a.Started.IsZero() && a.Ended.After(a.Started) {
			sum += float64(max(1, a.CPUs)) * a.Ended.Sub(a.Started).Seconds()
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.taskCPUSeconds += sum
}

func (p *progress) burst(_ string, pd shared.ProfileDemand) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requested += pd.Requested
	p.submissions += pd.Submissions
}

func (p *progress) event(ev shared.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch ev.Kind {
	case shared.EventWorkerProvisioned:
		if ev.Job != "" && len(p.reached) < maxReached {
			array, _, _ := strings.Cut(ev.Job, "_")
			p.reached[ev.Provisioner+"\x00"+array] = true
		}
	case shared.EventWorkerProvisionFailed:
		p.failed++
		p.lastFailure = ev.Detail
	}
}

// maxReached bounds the submissions counted as reaching the scheduler:
// past it, a run of that many bursts says so as "at least".
const maxReached = 100000

// counts is the progress at one moment.
type counts struct {
	needs, served            int
	tasks, ended             int
	machines, alive, pending int
	requested, submissions   int
	reached                  int
	failed                   int
	lastFailure              string
	// cpus are the alive machines' CPUs; full is the task CPU-seconds
	// over the machine CPU-seconds so far, -1 before any.
	cpus       int
	full       float64
	waitingWhy map[engine.WaitReason]int
	// byState is the tasks by state, from the engine's counts; nil
	// when read from a list of needs.
	byState *engine.TaskCounts
	// rate is tasks ended a second over the last rateWindow; zero
	// before two samples.
	rate float64
}

// readCounts is read from the engine's counts rather than a list of its
// needs: what the progress line draws every second, whatever the
// queue's length.
func (p *progress) readCounts(tc engine.TaskCounts, nc engine.NeedCounts, tasks *taskRun, now time.Time) counts {
	c := counts{waitingWhy: nc.ByReason, needs: nc.Waiting + nc.Assigned + nc.Served + nc.Forgotten, served: nc.Served + nc.Forgotten}
	if c.waitingWhy == nil {
		c.waitingWhy = map[engine.WaitReason]int{}
	}
	if tasks != nil {
		tasks.mu.Lock()
		c.tasks, c.ended = tasks.total, len(tasks.ended)
		tasks.mu.Unlock()
		c.byState = &tc
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ends = append(p.ends, endSample{at: now, ended: c.ended})
	for len(p.ends) > 2 && now.Sub(p.ends[1].at) >= rateWindow {
		p.ends = p.ends[1:]
	}
	if first := p.ends[0]; now.Sub(first.at) > 0 {
		c.rate = float64(c.ended-first.ended) / now.Sub(first.at).Seconds()
	}
	p.readMachinesLocked(&c)
	return c
}

// read takes the progress at this moment, with the engine's needs (a
// task is a need too) and the run's tasks.
func (p *progress) read(needs []engine.NeedStatus, tasks *taskRun) counts {
	c := counts{waitingWhy: map[engine.WaitReason]int{}}
	for _, n := range needs {
		c.needs++
		switch n.State {
		case engine.NeedServed:
			c.served++
		case engine.NeedWaiting:
			c.waitingWhy[n.Reason]++
		}
	}
	if tasks != nil {
		tasks.mu.Lock()
		c.tasks, c.ended = tasks.total, len(tasks.ended)
		tasks.mu.Unlock()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.readMachinesLocked(&c)
	return c
}

// readMachinesLocked adds the machines' counts to c. p.mu must be held.
func (p *progress) readMachinesLocked(c *counts) {
	c.machines, c.alive = len(p.machines), len(p.alive)
	machineSeconds := p.machineCPUSeconds
	for _, m := range p.alive {
		c.cpus += m.cpus
		machineSeconds += float64(m.cpus) * time.Since(m.at).Seconds()
	}
	c.full = -1
	if machineSeconds > 0 && p.taskCPUSeconds > 0 {
		c.full = min(1, p.taskCPUSeconds/machineSeconds)
	}
	c.requested, c.submissions, c.failed, c.lastFailure = p.requested, p.submissions, p.failed, p.lastFailure
	c.reached = len(p.reached)
	// Asked for and neither arrived nor failed: on its way.
	c.pending = max(0, c.requested-c.machines-c.failed)
}

// line is the progress line.
func (c counts) line() string {
	var parts []string
	if c.tasks > 0 {
		parts = append(parts, fmt.Sprintf("tasks %d/%d ended", c.ended, c.tasks)+c.taskStates())
		if s := c.byState; s != nil {
			parts = append(parts, fmt.Sprintf("%d running, %d waiting", s.Running, s.Waiting))
		}
		if c.rate > 0 {
			pace := fmt.Sprintf("%.1f tasks/s", c.rate)
			if left := c.tasks - c.ended; left > 0 {
				pace += ", about " + roundETA(time.Duration(float64(left)/c.rate*float64(time.Second))) + " left"
			}
			parts = append(parts, pace)
		}
	} else if c.needs > 0 {
		parts = append(parts, fmt.Sprintf("needs %d/%d served", c.served, c.needs))
	}
	machines := fmt.Sprintf("machines %d alive", c.alive)
	if s := c.byState; s != nil && c.cpus > 0 {
		machines += fmt.Sprintf(" (%d/%d CPUs busy)", min(s.RunningCPUs, c.cpus), c.cpus)
	}
	parts = append(parts,
		machines+fmt.Sprintf(", %d on the way", c.pending),
		fmt.Sprintf("%d of %d submission(s) reached the scheduler", min(c.reached, c.submissions), c.submissions),
		fmt.Sprintf("%d failure(s)", c.failed))
	line := "progress: " + strings.Join(parts, "; ")
	if w := c.waiting(); w != "" {
		line += "; waiting: " + w
	}
	return line
}

// taskStates is how the ended tasks ended, in brackets, when one did
// not succeed: "(500 succeeded, 12 failed)"; empty when all succeeded.
func (c counts) taskStates() string {
	s := c.byState
	if s == nil || s.Failed+s.Cancelled+s.TimedOut+s.Lost == 0 {
		return ""
	}
	parts := []string{fmt.Sprintf("%d succeeded", s.Succeeded)}
	for _, x := range []struct {
		n    int
		what string
	}{{s.Failed, "failed"}, {s.TimedOut, "timed out"}, {s.Cancelled, "cancelled"}, {s.Lost, "lost"}} {
		if x.n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", x.n, x.what))
		}
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// roundETA rounds an estimate to what is worth reading: seconds under
// two minutes, else minutes, else hours and minutes.
func roundETA(d time.Duration) string {
	switch {
	case d < 2*time.Minute:
		return d.Round(time.Second).String()
	case d < 2*time.Hour:
		return d.Round(time.Minute).String()
	}
	return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
}

// waiting says why needs wait, by reason: "3 queued for a machine, 2
// queued in the scheduler".
func (c counts) waiting() string {
	var parts []string
	for _, r := range []engine.WaitReason{engine.ReasonQueued, engine.ReasonCapped, engine.ReasonSiteLimit, engine.ReasonThrottled,
		engine.ReasonClusterFull, engine.ReasonLoginNeeded, engine.ReasonBackingOff, engine.ReasonMisconfigured,
		engine.ReasonProvisionerDown, engine.ReasonError, engine.ReasonMismatch, engine.ReasonNoFit, engine.ReasonTooLong, engine.ReasonNotAsked} {
		if n := c.waitingWhy[r]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, reasonWords(r)))
		}
	}
	return strings.Join(parts, ", ")
}

// reasonWords is a wait reason as the terminal and the page say it: the
// expected backlog under a cap is "queued for a machine", not a warning;
// the others are the engine's words.
func reasonWords(r engine.WaitReason) string {
	switch r {
	case engine.ReasonCapped:
		return "queued for a machine"
	case engine.ReasonQueued:
		return "queued in the scheduler"
	}
	return string(r)
}

// machinesLine is the summary's account of the machines: how many served
// how much, from how many submissions, and what failed.
func (c counts) machinesLine() string {
	s := fmt.Sprintf("%d machine(s) from %d submission(s)", c.machines, min(c.reached, c.submissions))
	if c.reached < c.submissions {
		s += fmt.Sprintf(" (%d more never reached the scheduler)", c.submissions-c.reached)
	}
	if c.full >= 0 {
		s += fmt.Sprintf(", %.0f%% full (the tasks' CPU-seconds over the machines')", 100*c.full)
	}
	if c.failed > 0 {
		s += fmt.Sprintf("; %d machine(s) could not be had (last: %s)", c.failed, truncateWords(c.lastFailure, 200))
	}
	return s
}

func truncateWords(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// progressEvery is how often the progress line is told when the story
// is not a terminal (a log): often enough to see a run move, rarely
// enough not to drown the story.
const progressEvery = 10 * time.Second

// redrawEvery is how often it is redrawn in place on a terminal.
const redrawEvery = time.Second
