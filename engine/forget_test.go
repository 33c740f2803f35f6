package engine

import (
	"testing"

	"github.com/fluksio/provision/shared"
)

// TestRouterForgetsOldServedNeeds: the router lists the last keep served
// needs and every need not yet served, whatever its age; ids keep
// counting; Forgotten counts what it dropped.
func TestRouterForgetsOldServedNeeds(t *testing.T) {
	r := newRouter(nil, nil, nil)
	for range 10 {
		r.Add(shared.Need{CPUs: 1})
	}
	r.mu.Lock()
	for i, ns := range r.needs {
		// Needs 1, 2, 4, 5, ... served; 3 and 6 still waiting.
		ns.served = i != 2 && i != 5
	}
	r.forgetServedLocked(3)
	r.mu.Unlock()
	var ids []string
	for _, st := range r.Needs() {
		ids = append(ids, st.ID+":"+string(st.State))
	}
	want := []string{"need-3:waiting", "need-6:waiting", "need-8:served", "need-9:served", "need-10:served"}
	if len(ids) != len(want) {
		t.Fatalf("needs %v, want %v", ids, want)
	}
	for i := range want {
		if ids[i] != want[i] {
			t.Fatalf("needs %v, want %v", ids, want)
		}
	}
	if got := r.needCounts().Forgotten; got != 5 {
		t.Errorf("%d needs forgotten, want 5", got)
	}
	if id := r.Add(shared.Need{CPUs: 1}); id != "need-11" {
		t.Errorf("the next id is %s, want need-11", id)
	}
	if r.Served() {
		t.Error("Served with needs 3 and 6 waiting")
	}
}
