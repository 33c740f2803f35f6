package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/shared"
)

// defaultProvisionTimeout bounds one Provision call unless
// Placer.ProvisionTimeout says otherwise. The contract says Provision
// returns at once; this is for a plugin that does not. Each target is
// asked on its own goroutine, so a stuck one delays only itself.
const defaultProvisionTimeout = 10 * time.Second

// passWait is how long a pass waits for the targets it asked before it
// goes on: long enough for a plugin that answers at once, as the contract
// asks, so that its outcome is logged in this pass. A target still
// answering after that keeps its round (and is not asked again until it
// ends) while the placer serves the rest.
const passWait = 100 * time.Millisecond

// Target is a provisioner as the placer sees it. Shapes are fetched once,
// when the target is set up, so that asking "could it fit this?" is a
// loop over a slice and never a call across the plugin boundary.
type Target struct {
	Name   string
	P      shared.Provisioner
	Shapes []shared.Shape
}

// covers reports whether any shape the target can start fits n.
func (t Target) covers(n shared.Need) bool {
	for _, s := range t.Shapes {
		if s.Fits(n) {
			return true
		}
	}
	return false
}

// Placer matches needs to workers. A need goes to an idle attached worker
// that fits it if there is one; if there is none, every provisioner that
// could start one is asked to. Nothing is ever taken away from a worker,
// and a worker has one task at a time.
//
// Pass does the work and is meant to be called by the run loop, every
// second or so and whenever Engine.Changed fires. The other methods are
// reports and may be called from anywhere.
type Placer struct {
	// ProvisionTimeout bounds one Provision call; set before the first
	// Pass. NewPlacer sets defaultProvisionTimeout.
	ProvisionTimeout time.Duration

	logger hclog.Logger
	engine *Engine

	// pass serialises Pass. It is held across provisioner calls, so
	// nothing but Pass may take it: the reports use mu alone.
	pass sync.Mutex

	// mu guards needs (and every field of every needState), targets,
	// nextTask and busy. It is never held while calling a provisioner or
	// the engine.
	mu       sync.Mutex
	needs    []*needState
	targets  []*targetState
	nextTask int
	// busy names the targets with a round of Provision calls under way.
	busy map[string]bool

	// rounds counts the goroutines asking targets; Close waits for them.
	rounds sync.WaitGroup

	// OnDeadline, if set, is told after each Provision call whether the
	// target answered within ProvisionTimeout (missed true if not), so
	// that a plugin that keeps missing deadlines can be restarted. Set it
	// before the first Pass.
	OnDeadline func(target string, missed bool)
}

type targetState struct {
	Target
	// down is set by SetDown: the plugin is restarting or has failed,
	// and asking it would only produce errors.
	down bool
}

type needState struct {
	id   string
	need shared.Need
	// task and worker are set while a task for the need is out.
	task, worker string
	served       bool
	result       Result
	// asked is the last outcome logged per target, so a pass logs only
	// what changed and an idle engine's log stays quiet.
	asked map[string]string
	// uncovered is set once "nothing covers this" has been logged.
	uncovered bool
	// failover is, per target, the last route around a backing-off
	// profile that was logged ("small -> cpu").
	failover map[string]string
}

// NewPlacer returns a Placer that hands tasks out through engine and asks
// targets for machines.
func NewPlacer(logger hclog.Logger, engine *Engine, targets []Target) *Placer {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	p := &Placer{ProvisionTimeout: defaultProvisionTimeout, logger: logger, engine: engine, busy: map[string]bool{}}
	for _, t := range targets {
		p.targets = append(p.targets, &targetState{Target: t})
	}
	return p
}

// Add records a need to be served and returns its id.
func (p *Placer) Add(n shared.Need) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	id := "need-" + strconv.Itoa(len(p.needs)+1)
	p.needs = append(p.needs, &needState{id: id, need: n, asked: map[string]string{}, failover: map[string]string{}})
	return id
}

// SetTarget adds a target, or replaces the one of the same name: after a
// plugin restarts it has a new client and possibly new shapes. Replacing
// a target clears its down mark.
func (p *Placer) SetTarget(t Target) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, ts := range p.targets {
		if ts.Name == t.Name {
			p.targets[i] = &targetState{Target: t}
			return
		}
	}
	p.targets = append(p.targets, &targetState{Target: t})
}

// SetDown marks a target down (skipped by Pass) or up again.
func (p *Placer) SetDown(name string, down bool) {
	p.mu.Lock()
	changed := false
	for _, ts := range p.targets {
		if ts.Name == name && ts.down != down {
			ts.down, changed = down, true
		}
	}
	p.mu.Unlock()
	if changed {
		p.logger.Info("provisioner marked", "provisioner", name, "down", down)
	}
}

// Pass settles finished and lost tasks, gives waiting needs to idle
// workers, and asks for machines for the needs still waiting.
func (p *Placer) Pass(ctx context.Context) {
	p.pass.Lock()
	defer p.pass.Unlock()
	p.settle()
	waiting := p.match()
	p.provision(ctx, waiting)
}

// settle asks the engine about every task out and records what it says.
func (p *Placer) settle() {
	p.mu.Lock()
	var out []*needState
	type ref struct{ worker, task string }
	var refs []ref
	for _, ns := range p.needs {
		if ns.task != "" {
			out = append(out, ns)
			refs = append(refs, ref{ns.worker, ns.task})
		}
	}
	p.mu.Unlock()

	for i, ns := range out {
		res, state := p.engine.taskOutcome(refs[i].worker, refs[i].task)
		switch state {
		case taskDone:
			p.mu.Lock()
			ns.served, ns.result, ns.task = true, res, ""
			p.mu.Unlock()
			p.logger.Info("need served", "need", ns.id, "task", res.TaskID, "worker", res.Worker, "host", res.Hostname)
		case taskLost:
			p.mu.Lock()
			ns.task, ns.worker = "", ""
			p.mu.Unlock()
			// Its worker left without reporting. The need is as unserved
			// as it ever was, and this pass places it again.
			p.logger.Warn("task lost with its worker", "need", ns.id, "task", refs[i].task, "worker", refs[i].worker)
		}
	}
}

// match gives each waiting need the smallest idle worker that fits it and
// returns the needs left waiting.
func (p *Placer) match() []*needState {
	idle := p.engine.idleWorkers()

	type plan struct {
		ns     *needState
		worker string
		task   Task
	}
	var plans []plan
	var waiting []*needState
	taken := make([]bool, len(idle))

	p.mu.Lock()
	// The most demanding needs choose first, each taking the smallest
	// idle worker that fits it: a GPU worker that attaches while a GPU
	// need and a CPU need both wait goes to the GPU need. An idle worker
	// that fits a waiting need always gets it, even if another worker
	// asked for that need is on its way: capacity in hand beats capacity
	// in a queue.
	order := slices.Clone(p.needs)
	slices.SortStableFunc(order, func(a, b *needState) int {
		return cmp.Or(cmp.Compare(b.need.GPUs, a.need.GPUs), cmp.Compare(b.need.CPUs, a.need.CPUs), cmp.Compare(b.need.RAMMB, a.need.RAMMB))
	})
	for _, ns := range order {
		if ns.served || ns.task != "" {
			continue
		}
		found := false
		for i, w := range idle {
			if !taken[i] && w.shape().Fits(ns.need) {
				taken[i], found = true, true
				p.nextTask++
				t := Task{ID: "task-" + strconv.Itoa(p.nextTask), Need: toNeedJSON(ns.need)}
				plans = append(plans, plan{ns, w.Name, t})
				break
			}
		}
		if !found {
			waiting = append(waiting, ns)
		}
	}
	p.mu.Unlock()

	for _, pl := range plans {
		if err := p.engine.assign(pl.worker, pl.task); err != nil {
			// It left (or was given up on) since idleWorkers; try
			// elsewhere this very pass.
			waiting = append(waiting, pl.ns)
			continue
		}
		p.mu.Lock()
		pl.ns.task, pl.ns.worker = pl.task.ID, pl.worker
		p.mu.Unlock()
		p.logger.Info("task assigned", "need", pl.ns.id, "task", pl.task.ID, "worker", pl.worker)
	}
	return waiting
}

// provision asks every target that is up and covers a waiting need for a
// machine. Each target is asked once per need per pass; it is the
// provisioner's business not to ask its cluster twice (one outstanding
// request per profile), not the placer's. Each target is asked on a
// goroutine of its own, and the pass waits at most passWait for them: a
// target that hangs delays only itself, and is not asked again while its
// round lasts.
func (p *Placer) provision(ctx context.Context, waiting []*needState) {
	p.mu.Lock()
	targets := make([]targetState, 0, len(p.targets))
	for _, ts := range p.targets {
		targets = append(targets, *ts)
	}
	p.mu.Unlock()

	rounds := map[string][]*needState{}
	for _, ns := range waiting {
		asked := 0
		for _, t := range targets {
			if !t.covers(ns.need) {
				continue
			}
			asked++
			if t.down {
				p.noteOutcome(ns, t.Name, "down", nil)
				continue
			}
			rounds[t.Name] = append(rounds[t.Name], ns)
		}
		if asked == 0 {
			p.mu.Lock()
			first := !ns.uncovered
			ns.uncovered = true
			p.mu.Unlock()
			if first {
				p.logger.Warn("no provisioner can start a machine for this need", "need", ns.id, "spec", formatNeed(ns.need))
			}
		}
	}

	var started sync.WaitGroup
	for _, t := range targets {
		needs := rounds[t.Name]
		if len(needs) == 0 {
			continue
		}
		p.mu.Lock()
		if p.busy[t.Name] {
			p.mu.Unlock()
			continue
		}
		p.busy[t.Name] = true
		p.mu.Unlock()
		started.Add(1)
		p.rounds.Add(1)
		go func() {
			defer p.rounds.Done()
			defer started.Done()
			p.askTarget(ctx, t.Target, needs)
			p.mu.Lock()
			delete(p.busy, t.Name)
			p.mu.Unlock()
		}()
	}
	done := make(chan struct{})
	go func() {
		started.Wait()
		close(done)
	}()
	timer := time.NewTimer(passWait)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
	case <-ctx.Done():
	}
}

// askTarget asks one target for a machine for each of needs, in turn. A
// call that misses its deadline ends the round: the next need would only
// wait as long again.
//
// A provisioner answers with its smallest fitting profile. When that
// profile is backing off after failed submissions, the need is asked for
// again as the next fitting shape, so that a larger profile that works
// serves it instead of the need waiting on the broken one; and every
// other provisioner that covers the need is asked in its own round.
func (p *Placer) askTarget(ctx context.Context, t Target, needs []*needState) {
	for _, ns := range needs {
		need := ns.need
		tried := map[string]bool{}
		var skipped []string
		var resp *shared.ProvisionResponse
		var err error
		for range len(t.Shapes) + 1 {
			callCtx, cancel := context.WithTimeout(ctx, p.ProvisionTimeout)
			resp, err = t.P.Provision(callCtx, &shared.ProvisionRequest{Need: need})
			missed := callCtx.Err() == context.DeadlineExceeded && ctx.Err() == nil
			cancel()
			if p.OnDeadline != nil {
				p.OnDeadline(t.Name, missed)
			}
			if missed {
				p.noteOutcome(ns, t.Name, fmt.Sprintf("error: no answer within %s", p.ProvisionTimeout), []any{"error", err})
				return
			}
			if err != nil || resp == nil || resp.Outcome != shared.OutcomeBackingOff || resp.Profile == "" {
				break
			}
			tried[resp.Profile] = true
			next, ok := nextShape(t.Shapes, ns.need, tried)
			if !ok {
				break
			}
			tried[next.Profile] = true
			skipped = append(skipped, resp.Profile)
			// The smallest profile that fits the next shape is the next
			// shape's own profile, unless one that fits it is tried
			// already; then the next pass round tries the one after.
			need = shared.Need{CPUs: max(need.CPUs, next.CPUs), GPUs: max(need.GPUs, next.GPUs),
				RAMMB: max(need.RAMMB, next.RAMMB), Label: ns.need.Label}
		}
		if err != nil {
			p.noteOutcome(ns, t.Name, "error: "+err.Error(), []any{"error", err})
			continue
		}
		if resp == nil {
			p.noteOutcome(ns, t.Name, "error: empty response", nil)
			continue
		}
		desc := resp.Outcome.String()
		if resp.Profile != "" {
			desc += " " + resp.Profile
		}
		if resp.Detail != "" {
			desc += ": " + resp.Detail
		}
		if len(skipped) > 0 {
			desc = fmt.Sprintf("failed over from %s (backing off) to: %s", strings.Join(skipped, ", "), desc)
			// Logged once per change of route, not each pass.
			route := strings.Join(skipped, ", ") + " -> " + resp.Profile
			p.mu.Lock()
			changed := ns.failover[t.Name] != route
			ns.failover[t.Name] = route
			p.mu.Unlock()
			if changed {
				p.logger.Warn("profile backing off; asking for the next fitting profile instead", "need", ns.id, "provisioner", t.Name,
					"failed_over_from", strings.Join(skipped, ", "), "profile", resp.Profile)
			}
		}
		p.noteOutcome(ns, t.Name, desc, []any{"outcome", resp.Outcome.String(), "profile", resp.Profile, "detail", resp.Detail})
	}
}

// nextShape is the first of shapes, in the provisioner's match order,
// that fits n and whose profile has not been tried.
func nextShape(shapes []shared.Shape, n shared.Need, tried map[string]bool) (shared.Shape, bool) {
	for _, s := range shapes {
		if !tried[s.Profile] && s.Fits(n) {
			return s, true
		}
	}
	return shared.Shape{}, false
}

// busyWith reports whether a round of Provision calls to target is under
// way.
func (p *Placer) busyWith(target string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.busy[target]
}

// Close waits for the rounds of Provision calls still under way, each
// bounded by ProvisionTimeout.
func (p *Placer) Close() {
	p.rounds.Wait()
}

// noteOutcome records what a target said about a need and logs it if it
// differs from what it said last time.
func (p *Placer) noteOutcome(ns *needState, target, desc string, kv []any) {
	p.mu.Lock()
	changed := ns.asked[target] != desc
	ns.asked[target] = desc
	p.mu.Unlock()
	if !changed {
		return
	}
	args := append([]any{"need", ns.id, "provisioner", target}, kv...)
	switch {
	case desc == "down":
		p.logger.Info("skipping provisioner that is down", args...)
	case strings.HasPrefix(desc, "error: "):
		p.logger.Error("could not ask for a machine", args...)
	default:
		p.logger.Info("asked for a machine", args...)
	}
}

// Served reports whether every need has been served. With no needs, it
// is trivially true.
func (p *Placer) Served() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ns := range p.needs {
		if !ns.served {
			return false
		}
	}
	return true
}

// Unserved describes each need not yet served, one line each, for a
// person wondering why the engine is still waiting.
func (p *Placer) Unserved() []string {
	var lines []string
	for _, st := range p.Needs() {
		if st.State != needServed {
			lines = append(lines, fmt.Sprintf("%s (%s): %s", st.ID, st.Spec, st.Detail))
		}
	}
	return lines
}

// Where a need stands.
const (
	needWaiting  = "waiting"
	needAssigned = "assigned"
	needServed   = "served"
)

// NeedStatus is one need as GET /status shows it.
type NeedStatus struct {
	ID string `json:"id"`
	// Spec is the need as -need takes it.
	Spec  string   `json:"spec"`
	Need  needJSON `json:"need"`
	State string   `json:"state"`
	// Worker and Task are set while assigned and once served.
	Worker string `json:"worker,omitempty"`
	Task   string `json:"task,omitempty"`
	// Detail says what the need is waiting for, or what served it.
	Detail string  `json:"detail"`
	Result *Result `json:"result,omitempty"`
}

// Needs reports every need, in the order they were added.
func (p *Placer) Needs() []NeedStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]NeedStatus, 0, len(p.needs))
	for _, ns := range p.needs {
		st := NeedStatus{ID: ns.id, Spec: formatNeed(ns.need), Need: toNeedJSON(ns.need), Worker: ns.worker, Task: ns.task}
		switch {
		case ns.served:
			res := ns.result
			st.State, st.Result = needServed, &res
			st.Worker, st.Task = res.Worker, res.TaskID
			st.Detail = fmt.Sprintf("served by %s on %s", res.Worker, res.Hostname)
		case ns.task != "":
			st.State = needAssigned
			st.Detail = fmt.Sprintf("running as %s on %s", ns.task, ns.worker)
		default:
			st.State = needWaiting
			st.Detail = p.waitingDetailLocked(ns)
		}
		out = append(out, st)
	}
	return out
}

// waitingDetailLocked says what a waiting need waits for. p.mu must be
// held.
func (p *Placer) waitingDetailLocked(ns *needState) string {
	var asked []string
	for _, ts := range p.targets {
		if desc, ok := ns.asked[ts.Name]; ok && ts.covers(ns.need) {
			asked = append(asked, ts.Name+" "+desc)
		}
	}
	if len(asked) > 0 {
		return "waiting for a worker; " + strings.Join(asked, "; ")
	}
	for _, ts := range p.targets {
		if ts.covers(ns.need) {
			return "waiting for a worker; no provisioner asked yet"
		}
	}
	return "waiting; no provisioner can start a machine this big"
}

// parseNeed reads a need as -need takes it:
//
//	cpus=N[,gpus=N][,ram_mb=N][,label=L]
//
// in any order. cpus defaults to 1 and may not be less; the others default
// to zero (no constraint) and empty (any machine).
func parseNeed(s string) (shared.Need, error) {
	const form = "cpus=N[,gpus=N][,ram_mb=N][,label=L]"
	n := shared.Need{CPUs: 1}
	if strings.TrimSpace(s) == "" {
		return shared.Need{}, fmt.Errorf("empty need; write %s", form)
	}
	seen := map[string]bool{}
	for _, item := range strings.Split(s, ",") {
		key, value, ok := strings.Cut(strings.TrimSpace(item), "=")
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		if !ok || key == "" {
			return shared.Need{}, fmt.Errorf("need %q: %q is not key=value; write %s", s, item, form)
		}
		if seen[key] {
			return shared.Need{}, fmt.Errorf("need %q: %s is given twice", s, key)
		}
		seen[key] = true
		switch key {
		case "label":
			if value == "" {
				return shared.Need{}, fmt.Errorf("need %q: label is empty; leave it out to take any machine", s)
			}
			n.Label = value
		case "cpus", "gpus", "ram_mb":
			v, err := strconv.ParseInt(value, 10, 32)
			if err != nil || v < 0 {
				return shared.Need{}, fmt.Errorf("need %q: %s=%q is not a whole number of at least 0", s, key, value)
			}
			switch key {
			case "cpus":
				if v < 1 {
					return shared.Need{}, fmt.Errorf("need %q: cpus must be at least 1", s)
				}
				n.CPUs = int(v)
			case "gpus":
				n.GPUs = int(v)
			case "ram_mb":
				n.RAMMB = v
			}
		default:
			return shared.Need{}, fmt.Errorf("need %q: unknown key %q; write %s", s, key, form)
		}
	}
	return n, nil
}

// formatNeed writes a need the way parseNeed reads it, leaving out what
// is at its default.
func formatNeed(n shared.Need) string {
	parts := []string{"cpus=" + strconv.Itoa(n.CPUs)}
	if n.GPUs != 0 {
		parts = append(parts, "gpus="+strconv.Itoa(n.GPUs))
	}
	if n.RAMMB != 0 {
		parts = append(parts, "ram_mb="+strconv.FormatInt(n.RAMMB, 10))
	}
	if n.Label != "" {
		parts = append(parts, "label="+n.Label)
	}
	return strings.Join(parts, ",")
}

// needList collects repeated -need flags: fs.Var(&needs, "need", ...).
type needList []shared.Need

func (l *needList) String() string {
	parts := make([]string, len(*l))
	for i, n := range *l {
		parts[i] = formatNeed(n)
	}
	return strings.Join(parts, " ")
}

func (l *needList) Set(s string) error {
	n, err := parseNeed(s)
	if err != nil {
		return err
	}
	*l = append(*l, n)
	return nil
}
