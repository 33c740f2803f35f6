package main

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/shared"
)

// TestProgressCounts: the progress line and the summary's account of
// the machines, from the hooks an engine calls: 10 of 14 needs served
// by 5 machines from 2 submissions, one failure, one machine gone, the
// waiting ones by their reasons (a mismatch and a task too long among
// them).
func TestProgressCounts(t *testing.T) {
	p := newProgress()
	p.burst("hpc", shared.ProfileDemand{Profile: "cpu", Requested: 4, Submissions: 1})
	p.burst("hpc", shared.ProfileDemand{Profile: "cpu", Requested: 2, Submissions: 1})
	p.event(shared.Event{Kind: shared.EventWorkerProvisionFailed, Detail: "sbatch: error: Batch job submission failed"})
	// The first burst's array made jobs 41_0..41_3; the second never
	// reached the scheduler.
	for i := range 4 {
		p.event(shared.Event{Kind: shared.EventWorkerProvisioned, Provisioner: "hpc", Job: fmt.Sprintf("41_%d", i)})
	}
	for _, w := range []string{"a", "b", "c", "d", "e"} {
		p.attach(engine.WorkerInfo{Name: w})
	}
	p.gone(engine.WorkerInfo{Name: "a"}, "detached")
	var needs []engine.NeedStatus
	for range 10 {
		needs = append(needs, engine.NeedStatus{State: engine.NeedServed})
	}
	needs = append(needs, engine.NeedStatus{State: engine.NeedWaiting, Reason: engine.ReasonSiteLimit}, engine.NeedStatus{State: engine.NeedAssigned},
		engine.NeedStatus{State: engine.NeedWaiting, Reason: engine.ReasonMismatch}, engine.NeedStatus{State: engine.NeedWaiting, Reason: engine.ReasonTooLong})
	c := p.read(needs, nil)
	if got, want := c.line(), "progress: needs 10/14 served; machines 4 alive, 0 on the way; 1 of 2 submission(s) reached the scheduler; 1 failure(s); waiting: 1 site_limit, 1 mismatch, 1 too_long"; got != want {
		t.Errorf("line = %q\nwant   %q", got, want)
	}
	if got := c.machinesLine(); !strings.HasPrefix(got, "5 machine(s) from 1 submission(s) (1 more never reached the scheduler); 1 machine(s) could not be had (last: sbatch: error") {
		t.Errorf("machines = %q", got)
	}
}

// TestStoryProgressOnATerminal: on a terminal the progress line stays
// the last line, redrawn in place, and a story line goes above it.
func TestStoryProgressOnATerminal(t *testing.T) {
	var b strings.Builder
	s := &story{w: &b, terminal: true}
	s.progress("progress: 1")
	s.say("hello")
	s.progress("progress: 2")
	s.endProgress()
	got := b.String()
	if !strings.Contains(got, "\r\x1b[Kprogress: 1\r\x1b[K[") || !strings.Contains(got, "hello\nprogress: 1\r\x1b[Kprogress: 2\r\x1b[K") {
		t.Errorf("drawn %q", got)
	}
	var plain strings.Builder
	s = &story{w: &plain}
	s.progress("progress: 1")
	if strings.Contains(plain.String(), "\x1b") || !strings.HasSuffix(plain.String(), "] progress: 1\n") {
		t.Errorf("not a terminal: %q", plain.String())
	}
}

// TestProgressTasksLine: a run of tasks' progress line, from the
// engine's counts: how many ended (and how, once one did not succeed),
// running and waiting, the pace over the last rateWindow and the time
// left at it, and the backlog under a cap said as queued for a machine.
func TestProgressTasksLine(t *testing.T) {
	p := newProgress()
	run := newTaskRun(testResults(t, filepath.Join(t.TempDir(), "results")), &story{w: io.Discard})
	run.total = 1000
	t0 := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	nc := engine.NeedCounts{Waiting: 900, Assigned: 16, ByReason: map[engine.WaitReason]int{engine.ReasonCapped: 900}}
	if got := p.readCounts(engine.TaskCounts{Submitted: 1000, Waiting: 984, Running: 16}, nc, run, t0).line(); strings.Contains(got, "/s") {
		t.Errorf("a pace from one sample: %q", got)
	}
	for i := range 500 {
		run.ended[fmt.Sprint(i)] = engine.TaskResult{}
	}
	tc := engine.TaskCounts{Submitted: 1000, Waiting: 484, Running: 16, Succeeded: 488, Failed: 12}
	got := p.readCounts(tc, nc, run, t0.Add(10*time.Second)).line()
	want := "progress: tasks 500/1000 ended (488 succeeded, 12 failed); 16 running, 484 waiting; 50.0 tasks/s, about 10s left; " +
		"machines 0 alive, 0 on the way; 0 of 0 submission(s) reached the scheduler; 0 failure(s); waiting: 900 queued for a machine"
	if got != want {
		t.Errorf("line = %q\nwant   %q", got, want)
	}
}

// TestStoryTellsAMismatch: the story says which machine could not take
// which task, why, and until when its profile is not asked for such
// tasks.
func TestStoryTellsAMismatch(t *testing.T) {
	var b strings.Builder
	d := &daemon{story: newStory(&b), progress: newProgress()}
	until := time.Date(2026, 12, 7, 17, 0, 0, 0, time.Local)
	d.hooks(false).Mismatch(engine.Mismatch{Provisioner: "hpc", Profile: "p1", Worker: "hpc-p1-1", Task: "t1",
		Cause: engine.MismatchFeatures, Detail: "its worker hpc-p1-1 lacks payload, which the task requires (it offers command)", Until: until, Count: 1})
	want := `hpc: worker hpc-p1-1 ("p1") cannot take task t1: its worker hpc-p1-1 lacks payload, which the task requires (it offers command); asking for no other "p1" machine for such tasks before 17:00:00, then one at a time`
	if !strings.Contains(b.String(), want) {
		t.Errorf("story %q\nlacks %q", b.String(), want)
	}
}

// TestProgressSaysHowFull: with machines of 8 and 4 CPUs attached and
// tasks taking 9 of their CPUs, the progress line says "(9/12 CPUs
// busy)"; the summary's machines say how full they were: tasks' CPU-
// seconds over the machines' (here, one task of 2 CPUs for 3 s on a
// machine of 4 CPUs attached 6 s ago: about 25%), nothing before a task
// ended.
func TestProgressSaysHowFull(t *testing.T) {
	p := newProgress()
	p.attach(engine.WorkerInfo{Name: "w8", CPUs: 8})
	p.attach(engine.WorkerInfo{Name: "w4", CPUs: 4})
	run := newTaskRun(testResults(t, filepath.Join(t.TempDir(), "results")), &story{w: io.Discard})
	run.total = 20
	got := p.readCounts(engine.TaskCounts{Submitted: 20, Running: 5, RunningCPUs: 9, Waiting: 15}, engine.NeedCounts{}, run, time.Now()).line()
	if !strings.Contains(got, "machines 2 alive (9/12 CPUs busy), 0 on the way") {
		t.Errorf("line = %q; want the CPUs busy of the alive machines", got)
	}
	if m := p.read(nil, nil).machinesLine(); strings.Contains(m, "full") {
		t.Errorf("before any task ended: %q; want no fullness", m)
	}
	p.gone(engine.WorkerInfo{Name: "w8"}, "detached")
	p.mu.Lock()
	p.machineCPUSeconds = 0 // w8 counts for nothing here
	p.alive["w4"] = aliveMachine{cpus: 4, at: time.Now().Add(-6 * time.Second)}
	p.mu.Unlock()
	now := time.Now()
	p.taskEnded(engine.TaskResult{Attempts: []engine.Attempt{{CPUs: 2, Started: now.Add(-3 * time.Second), Ended: now}}})
	if m := p.read(nil, nil).machinesLine(); !strings.Contains(m, "2 machine(s) from 0 submission(s), 25% full (the tasks' CPU-seconds over the machines')") {
		t.Errorf("machines line = %q; want 25%% full", m)
	}
}
