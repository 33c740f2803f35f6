// Package soak is `make soak`: faults together, for a long time. A seeded
// schedule of bursts (the workload: command tasks, each on an input whose
// digest it prints) and of faults (the nemesis) runs against the
// sandbox's real Slurm for SOAK (default 3m), on two provisioners (one
// direct, one relay), while invariants are checked every second from what
// the user's system shows: squeue, the engine's /status and /metrics,
// /proc, and the journal the engine's hooks write of each task's end.
// Same seed, same schedule. The workload keeps the
// caps full from the start, so the resource invariants, which compare the
// second fifth of the run with the last, see the same load in both. The
// report goes to docs/soak.md.
//
// Design records: docs/design/soak-engine-process.md.
package soak

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"
)

// The soak's caps and timings, in its config; the invariants read them.
// The direct provisioner has maxWorkers and maxPending, the relay one
// relayMaxWorkers and relayMaxPending.
const (
	maxWorkers       = 40
	maxPending       = 10
	relayMaxWorkers  = 10
	relayMaxPending  = 5
	pollInterval     = 2 * time.Second
	provisionTimeout = 90 * time.Second
	maxIdle          = 20 * time.Second
	// drainFor is how long after SOAK the workload may take to finish
	// before what still waits is withdrawn (the workflow is over).
	drainFor = time.Minute
	// livenessBound: a task must succeed this soon after a fault ends
	// while tasks wait.
	livenessBound = 3 * time.Minute
	// orphanBound: a plugin seen without its engine for longer than
	// this is an orphan (its own shutdown is bounded by 3 s).
	orphanBound = 15 * time.Second
)

// faultKind is one kind of fault the nemesis injects.
type faultKind string

const (
	faultPluginKill     faultKind = "plugin SIGKILL"
	faultEngineKill     faultKind = "engine SIGKILL + restart"
	faultEngineTerm     faultKind = "engine SIGTERM + restart"
	faultEngineTermKill faultKind = "engine SIGKILL during its SIGTERM stop + restart"
	faultSSHDStop       faultKind = "login sshd stopped"
	faultSSHSlow        faultKind = "ssh slow (proxy latency)"
	faultCtldRestart    faultKind = "slurmctld restarted"
	faultSlurmdKill     faultKind = "slurmd SIGKILL + restart"
	faultScancel        faultKind = "job scancelled by hand"
	faultWorkerKill     faultKind = "worker SIGKILL in its job"
	faultDemandDrop     faultKind = "a burst's demand dropped to 0"
)

// faultWeights are the kinds and how often each is drawn: the first ones
// of the priority list more often.
var faultWeights = []struct {
	kind   faultKind
	weight int
}{
	{faultPluginKill, 3}, {faultEngineKill, 3}, {faultEngineTerm, 2}, {faultEngineTermKill, 1},
	{faultSSHDStop, 2}, {faultSSHSlow, 2},
	{faultCtldRestart, 1}, {faultSlurmdKill, 1},
	{faultScancel, 2}, {faultWorkerKill, 2}, {faultDemandDrop, 2},
}

// fault is one planned fault: when (from the start), what, for how long
// (sshd stopped, ssh slowed), how slow, and the seed of its run-time
// choices.
type fault struct {
	At      time.Duration
	Kind    faultKind
	For     time.Duration
	Latency time.Duration
	Pick    uint64
}

func (f fault) String() string {
	s := fmt.Sprintf("%6.1fs %s", f.At.Seconds(), f.Kind)
	if f.For > 0 {
		s += fmt.Sprintf(" for %s", f.For)
	}
	if f.Latency > 0 {
		s += fmt.Sprintf(" (+%s)", f.Latency)
	}
	return s
}

// burst is one planned burst of tasks: count tasks of one profile's
// shape, each work long.
type burst struct {
	At    time.Duration
	Count int
	Shape string // the need without its work: cpus=1 or cpus=2
	Work  time.Duration
}

func (b burst) String() string {
	return fmt.Sprintf("%6.1fs %3d x %s, %s each", b.At.Seconds(), b.Count, b.Shape, b.Work)
}

// plan is the whole seeded schedule.
type plan struct {
	Seed   uint64
	Faults []fault
	Bursts []burst
}

// shapes are the needs' shapes, one per profile of the soak's config:
// cpus=1 and cpus=2 of the direct provisioner, cpus=3 of the relay one.
var shapes = []string{"cpus=1", "cpus=2", "cpus=3"}

// fill are the bursts the plan opens with: more needs than each
// provisioner's max_workers, of the longest work, so that both are at
// their caps within the first fifth (see the package doc).
var fill = []burst{
	{At: 0, Count: maxWorkers * 3 / 2, Shape: "cpus=1", Work: 20 * time.Second},
	{At: 0, Count: relayMaxWorkers * 3 / 2, Shape: "cpus=3", Work: 20 * time.Second},
}

// newPlan draws the schedule for a run of length d from seed. Faults come
// every 8 to 25 s after the first 15 s and stop 10 s before the end, so
// that the last one's recovery is inside the run; after the fill bursts,
// bursts every 4 to 12 s, of 1 to 200 needs (log-uniform, so small bursts
// are common and a big one rare; on average about what the two
// provisioners' workers get through with the faults among them, so the
// backlog does not grow through the run), tasks of 1 to 20 s.
func newPlan(seed uint64, d time.Duration) plan {
	r := rand.New(rand.NewPCG(seed, 0x50a4))
	p := plan{Seed: seed}
	total := 0
	for _, w := range faultWeights {
		total += w.weight
	}
	for at := 15 * time.Second; at < d-10*time.Second; at += time.Duration(8+r.IntN(18)) * time.Second {
		n := r.IntN(total)
		var kind faultKind
		for _, w := range faultWeights {
			if n < w.weight {
				kind = w.kind
				break
			}
			n -= w.weight
		}
		f := fault{At: at, Kind: kind, Pick: r.Uint64()}
		switch kind {
		case faultSSHDStop:
			f.For = time.Duration(5+r.IntN(26)) * time.Second
		case faultSSHSlow:
			f.For = time.Duration(10+r.IntN(21)) * time.Second
			f.Latency = time.Duration(200+r.IntN(1801)) * time.Millisecond
		}
		p.Faults = append(p.Faults, f)
	}
	p.Bursts = append(p.Bursts, fill...)
	for at := 4 * time.Second; at < d; at += time.Duration(4+r.IntN(9)) * time.Second {
		// Log-uniform on [1, 200], squared toward the small end.
		u := r.Float64()
		count := int(math.Round(math.Exp(u * u * math.Log(200))))
		p.Bursts = append(p.Bursts, burst{
			At:    at,
			Count: max(1, min(200, count)),
			Shape: shapes[r.IntN(len(shapes))],
			Work:  time.Duration(1+r.IntN(20)) * time.Second,
		})
	}
	return p
}

// String is the schedule as printed and reported.
func (p plan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d\nfaults:\n", p.Seed)
	for _, f := range p.Faults {
		fmt.Fprintf(&b, "  %s\n", f)
	}
	fmt.Fprintf(&b, "bursts:\n")
	for _, bu := range p.Bursts {
		fmt.Fprintf(&b, "  %s\n", bu)
	}
	return b.String()
}

// Digest is a short hash of the schedule: two runs with the same seed and
// SOAK print the same one.
func (p plan) Digest() string {
	sum := sha256.Sum256([]byte(p.String()))
	return hex.EncodeToString(sum[:6])
}
