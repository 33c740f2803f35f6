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
	// requested and submissions add up the provisioners' bursts.
	requested, submissions int
	// failed counts machines a provisioner could not get.
	failed int
	// machines are the workers that ever attached; alive those attached
	// now.
	machines map[string]bool
	alive    map[string]bool
	// lastFailure is the last provisioning failure's words.
	lastFailure string
}

func newProgress() *progress {
	return &progress{machines: map[string]bool{}, alive: map[string]bool{}}
}

func (p *progress) attach(w engine.WorkerInfo) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.machines[w.Name] = true
	p.alive[w.Name] = true
}

func (p *progress) gone(w engine.WorkerInfo, _ string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.alive, w.Name)
}

func (p *progress) burst(_ string, pd shared.ProfileDemand) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requested += pd.Requested
	p.submissions += pd.Submissions
}

func (p *progress) event(ev shared.Event) {
	if ev.Kind != shared.EventWorkerProvisionFailed {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failed++
	p.lastFailure = ev.Detail
}

// counts is the progress at one moment.
type counts struct {
	needs, served            int
	tasks, ended             int
	machines, alive, pending int
	requested, submissions   int
	failed                   int
	lastFailure              string
	waitingWhy               map[engine.WaitReason]int
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
	c.machines, c.alive = len(p.machines), len(p.alive)
	c.requested, c.submissions, c.failed, c.lastFailure = p.requested, p.submissions, p.failed, p.lastFailure
	// Asked for and neither arrived nor failed: on its way.
	c.pending = max(0, c.requested-c.machines-c.failed)
	return c
}

// line is the progress line.
func (c counts) line() string {
	var parts []string
	if c.tasks > 0 {
		parts = append(parts, fmt.Sprintf("tasks %d/%d ended", c.ended, c.tasks))
	} else if c.needs > 0 {
		parts = append(parts, fmt.Sprintf("needs %d/%d served", c.served, c.needs))
	}
	parts = append(parts,
		fmt.Sprintf("machines %d alive, %d on the way", c.alive, c.pending),
		fmt.Sprintf("%d submission(s)", c.submissions),
		fmt.Sprintf("%d failure(s)", c.failed))
	line := "progress: " + strings.Join(parts, "; ")
	if w := c.waiting(); w != "" {
		line += "; waiting: " + w
	}
	return line
}

// waiting says why needs wait, by reason: "3 capped, 2 queued".
func (c counts) waiting() string {
	var parts []string
	for _, r := range []engine.WaitReason{engine.ReasonQueued, engine.ReasonCapped, engine.ReasonSiteLimit, engine.ReasonThrottled,
		engine.ReasonClusterFull, engine.ReasonLoginNeeded, engine.ReasonBackingOff, engine.ReasonMisconfigured,
		engine.ReasonProvisionerDown, engine.ReasonError, engine.ReasonNoFit, engine.ReasonNotAsked} {
		if n := c.waitingWhy[r]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, r))
		}
	}
	return strings.Join(parts, ", ")
}

// machinesLine is the summary's account of the machines: how many served
// how much, from how many submissions, and what failed.
func (c counts) machinesLine() string {
	s := fmt.Sprintf("%d machine(s) from %d submission(s)", c.machines, c.submissions)
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
