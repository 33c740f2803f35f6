package engine

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/shared/sharedtest"
)

// TestRouterWithdraw: a withdrawn need leaves the books and the next
// pass tells its provisioner the smaller demand (which is how what was
// queued for it gets cancelled); needs under way or served stay.
func TestRouterWithdraw(t *testing.T) {
	t.Parallel()
	hpc := &sharedtest.Provisioner{Name: "hpc", ShapeList: []shared.Shape{{Profile: "p", CPUs: 4}}, OnProvision: requested}
	p := newRouter(nil, newBareBooks(nil, host.NewSigner(testSecret), nil), []target{{Name: "hpc", P: hpc, Shapes: hpc.ShapeList}})
	var ids []string
	for range 4 {
		ids = append(ids, p.Add(shared.Need{CPUs: 1}))
	}
	p.Pass(context.Background())
	p.Close()
	if d := hpc.LastDemand(); !slices.Equal(d, []shared.Demand{{Need: shared.Need{CPUs: 1}, Count: 4}}) {
		t.Fatalf("demand before withdrawing: %+v, want 4 x cpus=1", d)
	}
	// ids[2] is under way on a worker, ids[3] served.
	p.mu.Lock()
	p.reserveLocked(p.needs[2], WorkerInfo{Name: "w1"})
	p.needs[3].served = true
	p.mu.Unlock()

	for _, tc := range []struct {
		id   string
		want error
	}{
		{ids[0], nil},
		{ids[0], ErrNoSuchNeed},
		{ids[2], ErrNeedUnderWay},
		{ids[3], ErrNeedServed},
		{"need-99", ErrNoSuchNeed},
	} {
		if err := p.Withdraw(tc.id); !errors.Is(err, tc.want) {
			t.Errorf("Withdraw(%s) = %v, want %v", tc.id, err, tc.want)
		}
	}
	if got := p.Withdrawn(); got != 1 {
		t.Errorf("Withdrawn = %d, want 1", got)
	}
	var left []string
	for _, st := range p.Needs() {
		left = append(left, st.ID)
	}
	if !slices.Equal(left, []string{ids[1], ids[2], ids[3]}) {
		t.Errorf("needs after withdrawing %s: %v", ids[0], left)
	}
	// The task under way is settled with the stand-in pool: lost, so
	// need 3 waits again beside need 2. Its worker never attached, so
	// no departure reported it: the pass asks about it as it asks about
	// every task out once a provisionEvery.
	p.walked = time.Time{}
	p.Pass(context.Background())
	p.Close()
	if d := hpc.LastDemand(); !slices.Equal(d, []shared.Demand{{Need: shared.Need{CPUs: 1}, Count: 2}}) {
		t.Errorf("demand after withdrawing one of four (one served): %+v, want 2 x cpus=1", d)
	}
	if err := p.Withdraw(ids[1]); err != nil {
		t.Fatal(err)
	}
	p.Pass(context.Background())
	p.Close()
	if d := hpc.LastDemand(); !slices.Equal(d, []shared.Demand{{Need: shared.Need{CPUs: 1}, Count: 1}}) {
		t.Errorf("demand: %+v, want 1 x cpus=1", d)
	}
}
