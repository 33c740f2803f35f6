package engine

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/shared/sharedtest"
	"github.com/fluksio/provision/worker"
)

// benchPool is a pool of workers that finish every task they are given
// by the next pass: the router's side of bench's dispatch measurement
// without HTTP, so that a pass's own cost can be read.
type benchPool struct {
	mu      sync.Mutex
	workers []WorkerInfo
	task    map[string]string // worker to its task's id
	done    map[string]bool   // task ids whose result is in
	ended   []string          // the same, for Reported
}

func newBenchPool(n int) *benchPool {
	p := &benchPool{task: map[string]string{}, done: map[string]bool{}}
	for i := range n {
		p.workers = append(p.workers, WorkerInfo{Name: fmt.Sprintf("w%03d", i), Provisioner: "mem", CPUs: 1, RAMMB: 1000,
			Features: []string{worker.FeatureCommand}})
	}
	return p
}

func (p *benchPool) IdleAndAttached() ([]WorkerInfo, map[string][]string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var idle []WorkerInfo
	var names []string
	for _, w := range p.workers {
		if p.task[w.Name] == "" {
			idle = append(idle, w)
		}
		names = append(names, w.Name)
	}
	return idle, map[string][]string{"mem": names}
}

func (p *benchPool) IdleWorkers() []WorkerInfo { idle, _ := p.IdleAndAttached(); return idle }

func (p *benchPool) Assign(w string, t Task) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.task[w] = t.ID
	return nil
}

// finishAll has every worker report its task.
func (p *benchPool) finishAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for w, id := range p.task {
		if id != "" {
			p.done[id] = true
			p.ended = append(p.ended, id)
			p.task[w] = ""
		}
	}
}

func (p *benchPool) TaskOutcome(w, id string) (Result, assignState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done[id] {
		delete(p.done, id)
		return Result{TaskID: id, Worker: w, At: time.Now(), run: &worker.ResultRequest{TaskID: id, State: worker.StateSucceeded}}, assignDone
	}
	return Result{}, assignPending
}

func (p *benchPool) CancelTask(string, string) bool { return false }

// Reported names the tasks finishAll ended since the last call.
func (p *benchPool) Reported() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := p.ended
	p.ended = nil
	return ids
}

// BenchmarkPassQueued is one router pass with 10,000 tasks waiting and
// 50 workers, each of which has finished the task the last pass gave it:
// what the engine spends between a result and the next task, at the
// queue's length. Pass asks the provisioners every time; Step, the run
// loop's, only when the demand may have risen, or every provisionEvery.
func BenchmarkPassQueued(b *testing.B) {
	b.Run("Pass", func(b *testing.B) { benchPass(b, (*router).Pass) })
	b.Run("Step", func(b *testing.B) { benchPass(b, (*router).Step) })
}

func benchPass(b *testing.B, pass func(*router, context.Context)) {
	const queued, workers = 10000, 50
	pool := newBenchPool(workers)
	// As the reference plugin at its max_workers: every machine it may
	// have is attached.
	prov := &sharedtest.Provisioner{ShapeList: []shared.Shape{{Profile: "small", CPUs: 1, RAMMB: 1000}},
		ProvisionF: func(_ context.Context, r *shared.ProvisionRequest) (*shared.ProvisionResponse, error) {
			resp := &shared.ProvisionResponse{}
			for range r.Demand {
				resp.Outcomes = append(resp.Outcomes, shared.DemandOutcome{Outcome: shared.OutcomeCapped, Profile: "small",
					Condition: shared.ConditionCap, Detail: "max_workers 50: 50 attached, 0 on their way"})
			}
			return resp, nil
		}}
	p := newRouter(nil, pool, []target{{Name: "mem", P: prov, Shapes: prov.ShapeList}})
	p.tasks = newTaskTable(TaskLimits{}, time.Now)
	// The queue holds its length to the end: a task for each one the
	// passes will hand out, all submitted first, as host-example does.
	for range queued + workers*(b.N+1) {
		rec, _, err := p.tasks.submit(TaskSpec{Need: shared.Need{CPUs: 1}, Command: []string{"true"}})
		if err != nil {
			b.Fatal(err)
		}
		p.addTask(rec, shared.Need{CPUs: 1})
	}
	ctx := context.Background()
	p.Pass(ctx)
	b.ResetTimer()
	for range b.N {
		pool.finishAll()
		pass(p, ctx)
	}
}
