package engine

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/shared/sharedtest"
)

// TestFitErrorWords: what no shape holds is said with the longest time
// and the largest shape on offer, in the words the tasks file's check
// prints; what one shape holds is no error.
func TestFitErrorWords(t *testing.T) {
	t.Parallel()
	short := shared.Shape{Profile: "short", CPUs: 1, Lifetime: time.Minute, LifetimeFrom: "--time=00:01:00"}
	small := shared.Shape{Profile: "small", CPUs: 2, Lifetime: 5 * time.Minute, LifetimeFrom: "--time=00:05:00"}
	long := shared.Shape{Profile: "long", CPUs: 1, Lifetime: time.Hour, LifetimeFrom: "partition debug's DefaultTime=01:00:00"}
	free := shared.Shape{Profile: "free", CPUs: 1, LifetimeFrom: shared.LifetimeUnlimited}
	old := shared.Shape{Profile: "old", CPUs: 1} // a plugin before 2.8
	one := func(ss ...shared.Shape) []namedShape {
		var out []namedShape
		for _, s := range ss {
			out = append(out, namedShape{"hpc", s})
		}
		return out
	}
	tests := []struct {
		name    string
		shapes  []namedShape
		need    shared.Need
		runFor  time.Duration
		words   string
		tooLong bool
	}{
		{"the issue's words", one(short, small), shared.Need{CPUs: 1}, 10 * time.Minute,
			"timeout 10m is longer than any profile's jobs: the longest is small (5m, --time=00:05:00)", true},
		{"held with the margin", one(short, small), shared.Need{CPUs: 1}, 4*time.Minute + 45*time.Second, "", false},
		{"the margin tips it", one(short, small), shared.Need{CPUs: 1}, 4*time.Minute + 50*time.Second,
			"timeout 4m50s and the worker's 15s end margin are longer than any profile's jobs: the longest is small (5m, --time=00:05:00)", true},
		{"long enough but too small", one(small, long), shared.Need{CPUs: 2}, 10 * time.Minute,
			"timeout 10m is longer than the jobs of any profile that holds cpus=2: the longest is small (5m, --time=00:05:00)", true},
		{"larger than any", one(short, small), shared.Need{CPUs: 64}, time.Minute,
			"needs cpus=64, more than any profile's machines: the largest is small (2 cpus, 5m, --time=00:05:00)", false},
		{"a label none carries", one(short, small), shared.Need{CPUs: 1, Label: "tpu"}, 0,
			"needs label tpu, which no profile's machines carry", false},
		{"an unlimited profile holds anything", one(short, free), shared.Need{CPUs: 1}, 100 * time.Hour, "", false},
		{"a plugin that does not say holds anything", one(short, old), shared.Need{CPUs: 1}, 100 * time.Hour, "", false},
		{"no timeout", one(short), shared.Need{CPUs: 1}, 0, "", false},
		{"several provisioners", []namedShape{{"a", short}, {"b", small}}, shared.Need{CPUs: 1}, time.Hour,
			"timeout 1h is longer than any profile's jobs: the longest is small of b (5m, --time=00:05:00)", true},
		{"no shapes to judge by", nil, shared.Need{CPUs: 1}, time.Hour, "", false},
	}
	for _, tc := range tests {
		n := tc.need
		n.Lifetime = lifetimeFor(tc.runFor)
		err := fitError(tc.shapes, n, "timeout", tc.runFor)
		if tc.words == "" {
			if err != nil {
				t.Errorf("%s: %v, want none", tc.name, err)
			}
			continue
		}
		var fe *FitError
		if !errors.As(err, &fe) || !errors.Is(err, ErrNothingHolds) || err.Error() != tc.words || fe.TooLong != tc.tooLong {
			t.Errorf("%s:\n got %v (%T)\nwant %s (too long %v)", tc.name, err, err, tc.words, tc.tooLong)
		}
	}
}

// TestRouterAsksForALongEnoughProfile: a need whose work outlasts the
// smallest profile's jobs is asked for with its lifetime, so that the
// provisioner's match (Shape.Fits, as the Slurm plugin's) chooses the
// profile that lasts it; a need no profile lasts is asked of nobody and
// waits too_long, saying the longest there is.
func TestRouterAsksForALongEnoughProfile(t *testing.T) {
	t.Parallel()
	shapes := []shared.Shape{
		{Profile: "short", CPUs: 1, Lifetime: time.Minute, LifetimeFrom: "--time=00:01:00"},
		{Profile: "small", CPUs: 1, Lifetime: 5 * time.Minute, LifetimeFrom: "--time=00:05:00"},
	}
	hpc := &sharedtest.Provisioner{Name: "hpc", ShapeList: shapes, OnProvision: requested}
	books := newBareBooks(nil, host.NewSigner(testSecret), nil)
	defer books.Close()
	r := newRouter(nil, books, []target{{Name: "hpc", P: hpc, Shapes: shapes}})
	defer r.Close()
	r.AddWork(shared.Need{CPUs: 1}, 2*time.Minute)
	tooLong := r.AddWork(shared.Need{CPUs: 1}, 10*time.Minute)
	r.Pass(context.Background())
	demand := hpc.LastDemand()
	if len(demand) != 1 || demand[0].Count != 1 || demand[0].Need.Lifetime != 2*time.Minute+15*time.Second {
		t.Fatalf("demand %+v; want one machine lasting 2m15s", demand)
	}
	if prof, _ := profileFor(shapes, demand[0].Need); prof != "small" {
		t.Errorf("the demand's need matches profile %q; want small", prof)
	}
	for _, st := range r.Needs() {
		if st.ID != tooLong {
			continue
		}
		want := "waiting; nothing is asked for it: work 10m is longer than any profile's jobs: the longest is small (5m, --time=00:05:00)"
		if st.Reason != ReasonTooLong || st.Detail != want {
			t.Errorf("the 10-minute need: %s %q; want too_long %q", st.Reason, st.Detail, want)
		}
	}
	// /status's summary and its filter say the same reason as the list.
	ans := r.needsWhere(needQuery{states: map[string]bool{string(ReasonTooLong): true}, limit: 10})
	if ans.summary.ByReason[ReasonTooLong] != 1 || ans.matched != 1 || len(ans.list) != 1 || ans.list[0].ID != tooLong {
		t.Errorf("?state=too_long matched %d (%d listed), the summary counts %v; want the 10-minute need, once", ans.matched, len(ans.list), ans.summary.ByReason)
	}
}

// TestRouterMismatchRoutesElsewhere: a worker of profile "a" that
// attaches smaller than its profile says cannot take the need asked of
// "a": a mismatch. The next passes ask the provisioner's other profile
// that holds the need ("b", pinned by its name), not "a"; with no such
// profile, nothing is asked, and the need waits mismatch, saying why.
func TestRouterMismatchRoutesElsewhere(t *testing.T) {
	t.Parallel()
	for _, other := range []bool{true, false} {
		shapes := []shared.Shape{{Profile: "a", CPUs: 2}}
		if other {
			shapes = append(shapes, shared.Shape{Profile: "b", CPUs: 4})
		}
		var mu sync.Mutex
		answer := func(r *shared.ProvisionRequest) (*shared.ProvisionResponse, error) {
			resp := &shared.ProvisionResponse{}
			for _, d := range r.Demand {
				prof, _ := profileFor(shapes, d.Need)
				resp.Outcomes = append(resp.Outcomes, shared.DemandOutcome{Outcome: shared.OutcomeRequested, Profile: prof})
			}
			return resp, nil
		}
		prov := &sharedtest.Provisioner{Name: testProvisioner, ShapeList: shapes, OnProvision: answer}
		signer := host.NewSigner(testSecret)
		books := newBareBooks(nil, signer, nil)
		var told []Mismatch
		r := newRouter(nil, books, []target{{Name: testProvisioner, P: prov, Shapes: shapes}})
		r.onMismatch = func(m Mismatch) {
			mu.Lock()
			told = append(told, m)
			mu.Unlock()
		}
		id := r.Add(shared.Need{CPUs: 2})
		r.Pass(context.Background())
		if d := prov.LastDemand(); len(d) != 1 || d[0].Need.Label != "" {
			t.Fatalf("first pass asked %+v; want the need as it is", d)
		}
		// Its machine arrives with one CPU, not the profile's two.
		token, _, err := signer.Sign(host.CredentialClaims{Worker: "slurm-a-1", Provisioner: testProvisioner, CPUs: 1}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		books.ObserveEvent(shared.Event{Kind: shared.EventWorkerProvisioned, Provisioner: testProvisioner, Profile: "a", Worker: "slurm-a-1", Job: "7"})
		if rec := do(t, books, "POST", "/v1/attach", token, `{"cpus":1,"job_id":"7"}`); rec.Code != 200 {
			t.Fatalf("attach: %d %s", rec.Code, rec.Body)
		}
		r.Pass(context.Background())
		r.Pass(context.Background())
		mu.Lock()
		if len(told) != 1 || told[0].Cause != MismatchSize || told[0].Profile != "a" || told[0].Task != id || told[0].Count != 1 {
			t.Errorf("other profile %v: told %+v; want one size mismatch of a", other, told)
		}
		mu.Unlock()
		d := prov.LastDemand()
		var st NeedStatus
		for _, n := range r.Needs() {
			if n.ID == id {
				st = n
			}
		}
		switch {
		case other && (len(d) != 1 || d[0].Need.Label != "b"):
			t.Errorf("with profile b: asked %+v; want the need pinned to b", d)
		case !other && len(d) != 0:
			t.Errorf("with no other profile: asked %+v; want nothing", d)
		case !other && (st.Reason != ReasonMismatch || !strings.Contains(st.Detail, "attached with cpus=1, which does not fit cpus=2")):
			t.Errorf("with no other profile: the need waits %s %q; want mismatch, saying why", st.Reason, st.Detail)
		}
		if !other {
			// Past the hold, with three such needs waiting: one machine
			// of a at a time.
			r.Add(shared.Need{CPUs: 2})
			r.Add(shared.Need{CPUs: 2})
			r.mu.Lock()
			for _, m := range r.mismatches.m {
				m.Until = time.Now().Add(-time.Second)
			}
			r.mu.Unlock()
			r.Pass(context.Background())
			if d := prov.LastDemand(); len(d) != 1 || d[0].Count != 1 {
				t.Errorf("past the hold, three needs waiting: asked %+v; want one machine", d)
			}
		}
		r.Close()
		books.Close()
	}
}
