package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/engine/internal/supervise"
	"github.com/fluksio/provision/internal/testutil"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/shared/sharedtest"
	"github.com/fluksio/provision/worker"
)

// requested answers every demand entry "requested".
func requested(r *shared.ProvisionRequest) (*shared.ProvisionResponse, error) {
	resp := &shared.ProvisionResponse{}
	for range r.Demand {
		resp.Outcomes = append(resp.Outcomes, shared.DemandOutcome{Outcome: shared.OutcomeRequested, Profile: "small"})
	}
	return resp, nil
}

func TestPassNeverAsksATargetThatCannotCover(t *testing.T) {
	t.Parallel()
	logger, logs := testLogger(t)
	small := &sharedtest.Provisioner{Name: "small", ShapeList: []shared.Shape{{Profile: "small", CPUs: 4}}, OnProvision: requested}
	gpu := &sharedtest.Provisioner{Name: "gpu", ShapeList: []shared.Shape{{Profile: "v100", CPUs: 8, GPUs: 1, Labels: []string{"cuda"}}}, OnProvision: requested}
	p := newRouter(logger, newBareBooks(nil, host.NewSigner(testSecret), nil), []target{
		{Name: "small", P: small, Shapes: small.ShapeList},
		{Name: "gpu", P: gpu, Shapes: gpu.ShapeList},
	})
	p.Add(shared.Need{CPUs: 16})              // nobody
	p.Add(shared.Need{CPUs: 2, Label: "tpu"}) // nobody
	for range 3 {
		p.Pass(context.Background())
	}
	if d := append(small.LastDemand(), gpu.LastDemand()...); len(d) != 0 {
		t.Errorf("demand %+v sent for needs no shape covers", d)
	}
	if p.Served() {
		t.Error("Served() with nothing served")
	}
	un := p.Unserved()
	if len(un) != 2 || !strings.Contains(un[0], "no provisioner can start") {
		t.Errorf("Unserved() = %q", un)
	}
	if c := strings.Count(logs.String(), "no provisioner can start a machine"); c != 2 {
		t.Errorf("logged the uncovered needs %d times over three passes; want once each:\n%s", c, logs)
	}
}

func TestPassAsksOnlyCoveringTargets(t *testing.T) {
	t.Parallel()
	logger, logs := testLogger(t)
	small := &sharedtest.Provisioner{Name: "small", ShapeList: []shared.Shape{{Profile: "small", CPUs: 4}}, OnProvision: requested}
	gpu := &sharedtest.Provisioner{Name: "gpu", ShapeList: []shared.Shape{{Profile: "v100", CPUs: 8, GPUs: 1}}, OnProvision: requested}
	p := newRouter(logger, newBareBooks(nil, host.NewSigner(testSecret), nil), []target{
		{Name: "small", P: small, Shapes: small.ShapeList},
		{Name: "gpu", P: gpu, Shapes: gpu.ShapeList},
	})
	p.Add(shared.Need{CPUs: 1, GPUs: 1})
	p.Pass(context.Background())
	p.Pass(context.Background())
	// Every target is told its demand each pass, the one that cannot
	// cover the need an empty one.
	if small.ProvisionCalls() != 2 || gpu.ProvisionCalls() != 2 || len(small.LastDemand()) != 0 ||
		!slices.Equal(gpu.LastDemand(), []shared.Demand{{Need: shared.Need{CPUs: 1, GPUs: 1}, Count: 1}}) {
		t.Errorf("calls: small %d %+v, gpu %d %+v; want one each per pass, the need to gpu alone",
			small.ProvisionCalls(), small.LastDemand(), gpu.ProvisionCalls(), gpu.LastDemand())
	}
	if c := strings.Count(logs.String(), "asked for a machine"); c != 1 {
		t.Errorf("the same outcome logged %d times; want once:\n%s", c, logs)
	}
}

func TestPassSkipsErrorsAndDownTargets(t *testing.T) {
	t.Parallel()
	logger, logs := testLogger(t)
	broken := &sharedtest.Provisioner{Name: "broken", ShapeList: []shared.Shape{{Profile: "p", CPUs: 4}},
		OnProvision: func(*shared.ProvisionRequest) (*shared.ProvisionResponse, error) { return nil, shared.ErrPluginGone }}
	fine := &sharedtest.Provisioner{Name: "fine", ShapeList: []shared.Shape{{Profile: "p", CPUs: 4}}, OnProvision: requested}
	p := newRouter(logger, newBareBooks(nil, host.NewSigner(testSecret), nil), []target{
		{Name: "broken", P: broken, Shapes: broken.ShapeList},
		{Name: "fine", P: fine, Shapes: fine.ShapeList},
	})
	p.Add(shared.Need{CPUs: 2})
	p.Pass(context.Background())
	p.Pass(context.Background())
	if broken.ProvisionCalls() != 2 || fine.ProvisionCalls() != 2 {
		t.Errorf("calls: broken %d, fine %d; an error must not stop the others", broken.ProvisionCalls(), fine.ProvisionCalls())
	}
	// The need the broken one failed is asked of the next that covers it.
	if d := fine.LastDemand(); len(d) != 1 || d[0].Count != 1 || len(broken.LastDemand()) != 0 {
		t.Errorf("demand after an error: fine %+v, broken %+v; want the need moved to fine", d, broken.LastDemand())
	}
	if c := strings.Count(logs.String(), "could not ask for a machine"); c != 1 {
		t.Errorf("error logged %d times; want once per change:\n%s", c, logs)
	}

	p.asks.setDown("broken", true)
	p.Pass(context.Background())
	if broken.ProvisionCalls() != 2 {
		t.Error("a target marked down was asked")
	}
	p.asks.setDown("broken", false)
	p.Pass(context.Background())
	if broken.ProvisionCalls() != 3 {
		t.Error("a target marked up again was not asked")
	}
}

// attachWorker attaches a worker straight through the handler.
func attachWorker(t *testing.T, e *books, s *host.Signer, name, body string) string {
	t.Helper()
	// Minted for exactly what the worker claims, and recorded as its
	// provisioner's, as a real provisioner's worker would be.
	var req worker.AttachRequest
	if err := json.Unmarshal([]byte(body), &req); err != nil {
		t.Fatal(err)
	}
	c := host.CredentialClaims{Worker: name, Provisioner: testProvisioner, CPUs: req.CPUs, GPUs: req.GPUs, RAMMB: req.RAMMB, Labels: req.Labels}
	token, _, err := s.Sign(c, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	provisioned(e, name, req.JobID)
	if rec := do(t, e, "POST", "/v1/attach", token, body); rec.Code != 200 {
		t.Fatalf("attach %s: %d %s", name, rec.Code, rec.Body)
	}
	return token
}

func TestPassPrefersAnIdleWorker(t *testing.T) {
	t.Parallel()
	signer := host.NewSigner(testSecret)
	e := newBareBooks(nil, signer, nil)
	prov := &sharedtest.Provisioner{Name: "hpc", ShapeList: []shared.Shape{{Profile: "big", CPUs: 64, GPUs: 4, Labels: []string{"gpu"}}}, OnProvision: requested}
	p := newRouter(nil, e, []target{{Name: "hpc", P: prov, Shapes: prov.ShapeList}})

	attachWorker(t, e, signer, "big", `{"cpus":32,"gpus":2,"labels":["gpu"]}`)
	smallTok := attachWorker(t, e, signer, "small", `{"cpus":4,"gpus":1,"labels":["gpu"]}`)
	attachWorker(t, e, signer, "nolabel", `{"cpus":4,"gpus":1}`)
	gpuNeed := p.Add(shared.Need{CPUs: 2, GPUs: 1, Label: "gpu"})
	p.Add(shared.Need{CPUs: 2, GPUs: 1, Label: "gpu"})
	p.Add(shared.Need{CPUs: 2, GPUs: 1, Label: "gpu"}) // no third gpu worker
	p.Pass(context.Background())

	needs := p.Needs()
	if needs[0].Worker != "small" || needs[1].Worker != "big" || needs[2].State != NeedWaiting {
		t.Fatalf("assignments %+v; want small, big, then waiting", needs)
	}
	if d := prov.LastDemand(); prov.ProvisionCalls() != 1 || len(d) != 1 || d[0].Count != 1 {
		t.Errorf("Provision called %d times with %+v; want once, for the need left over", prov.ProvisionCalls(), d)
	}

	// The small worker leaves without reporting: the task is lost and
	// the need waits again.
	do(t, e, "POST", "/v1/detach", smallTok, "")
	p.Pass(context.Background())
	for _, st := range p.Needs() {
		if st.ID == gpuNeed && st.State != NeedWaiting {
			t.Errorf("need of a departed worker is %s; want waiting", st.State)
		}
	}
}

func TestSetTargetReplaces(t *testing.T) {
	t.Parallel()
	old := &sharedtest.Provisioner{ShapeList: []shared.Shape{{CPUs: 1}}, OnProvision: requested}
	fresh := &sharedtest.Provisioner{ShapeList: []shared.Shape{{CPUs: 1}}, OnProvision: requested}
	p := newRouter(nil, newBareBooks(nil, host.NewSigner(testSecret), nil), []target{{Name: "a", P: old, Shapes: old.ShapeList}})
	p.asks.setDown("a", true)
	p.asks.setTarget(target{Name: "a", P: fresh, Shapes: fresh.ShapeList})
	p.Add(shared.Need{CPUs: 1})
	p.Pass(context.Background())
	if old.ProvisionCalls() != 0 || fresh.ProvisionCalls() != 1 {
		t.Errorf("calls: old %d, fresh %d; want the replacement asked, and up", old.ProvisionCalls(), fresh.ProvisionCalls())
	}
}

// TestPassSendsTheWholeDemand: forty needs of one shape and two of
// another are two demand entries, counted, and the next pass sends the
// same demand again (level-triggered), not an increment.
func TestPassSendsTheWholeDemand(t *testing.T) {
	t.Parallel()
	prov := &sharedtest.Provisioner{Name: "hpc", ShapeList: []shared.Shape{{Profile: "cpu", CPUs: 4}, {Profile: "gpu", CPUs: 8, GPUs: 1}}, OnProvision: requested}
	p := newRouter(nil, newBareBooks(nil, host.NewSigner(testSecret), nil), []target{{Name: "hpc", P: prov, Shapes: prov.ShapeList}})
	for range 40 {
		p.Add(shared.Need{CPUs: 1})
	}
	p.Add(shared.Need{CPUs: 1, GPUs: 1})
	p.Add(shared.Need{CPUs: 1, GPUs: 1})
	want := []shared.Demand{{Need: shared.Need{CPUs: 1, GPUs: 1}, Count: 2}, {Need: shared.Need{CPUs: 1}, Count: 40}}
	for pass := 1; pass <= 2; pass++ {
		p.Pass(context.Background())
		got := slices.Clone(prov.LastDemand())
		slices.SortFunc(got, func(a, b shared.Demand) int { return a.Count - b.Count })
		if !slices.Equal(got, want) {
			t.Errorf("pass %d: demand %+v; want %+v", pass, got, want)
		}
	}
}

// TestHungPluginDelaysOnlyItself runs two real plugin processes, one of
// which never answers Provision or Reconcile (TESTPLUGIN_HANG), with the
// placer and reconciler wired as the run command wires them. A worker of
// the healthy provisioner that attaches must get its task within a bound
// far below what the hung one costs, and the hung plugin must be shown as
// wedged in the supervisor's status and restarted.
func TestHungPluginDelaysOnlyItself(t *testing.T) {
	bin := testutil.BuildTestPlugin(t)
	t.Setenv("TESTPLUGIN_HANG", "hung")

	cfgPath := filepath.Join(t.TempDir(), "engine.hcl")
	body := "engine {\n  listen = \"127.0.0.1:0\"\n}\n"
	for _, name := range []string{"hung", "good"} {
		body += fmt.Sprintf("provisioner \"memory\" %q {\n  plugin = %q\n  greeting = \"hi\"\n}\n", name, bin)
	}
	if err := os.WriteFile(cfgPath, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, diags := LoadConfig(cfgPath)
	if diags.HasErrors() {
		t.Fatal(diags)
	}

	logger, logs := testLogger(t)
	signer := host.NewSigner(testSecret)
	engine := newBareBooks(nil, signer, nil)
	placer := newRouter(logger.Named("placer"), engine, nil)
	placer.asks.provisionTimeout = 2 * time.Second
	sups := map[string]*supervise.Supervisor{}
	placer.asks.onDeadline = func(name string, missed bool) { sups[name].Deadline("Provision", missed) }
	var list []*supervise.Supervisor
	for _, pc := range cfg.Provisioners {
		name := pc.Name
		s := supervise.New(pc, logger.Named(name), supervise.Options{Logger: logger.Named("plugin"), Signer: signer})
		s.WedgeAfter = 2
		s.ReconcileTimeout = 2 * time.Second
		s.OnUp = func(c supervise.Configured) {
			placer.asks.setTarget(target{Name: c.Name, P: c.Provisioner, Shapes: c.Shapes})
			placer.asks.setDown(name, false)
		}
		s.OnDown = func(string) { placer.asks.setDown(name, true) }
		sups[name] = s
		list = append(list, s)
	}
	for _, s := range list {
		if d := s.Start(context.Background()); d.HasErrors() {
			t.Fatal(d)
		}
	}

	// The run loop, as Engine.Run has it: a pass every 100 ms, a reconcile
	// every 300 ms. It is stopped and waited for before the plugins.
	ctx, cancel := context.WithCancel(context.Background())
	loopDone := make(chan struct{})
	defer func() {
		cancel()
		<-loopDone
		for _, s := range list {
			sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, _ = s.Shutdown(sctx)
			scancel()
		}
		placer.Close()
	}()
	for range 3 {
		placer.Add(shared.Need{CPUs: 1})
	}
	go func() {
		defer close(loopDone)
		pass := time.NewTicker(100 * time.Millisecond)
		defer pass.Stop()
		recTick := time.NewTicker(300 * time.Millisecond)
		defer recTick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-pass.C:
				placer.Pass(ctx)
			case <-recTick.C:
				for _, s := range list {
					s.Reconcile(ctx, engine.attachedBy(s.Name()))
				}
			}
		}
	}()

	// Let the hung plugin be asked (and hang) first.
	deadline := time.Now().Add(5 * time.Second)
	for !placer.asks.busyWith("hung") {
		if time.Now().After(deadline) {
			t.Fatalf("the hung provisioner was never asked\n%s", logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	attached := time.Now()
	attachWorker(t, engine, signer, "good-small-00000001", `{"cpus":1,"ram_mb":1000}`)
	var took time.Duration
	for {
		took = time.Since(attached)
		if slices.ContainsFunc(placer.Needs(), func(n NeedStatus) bool { return n.Worker == "good-small-00000001" }) {
			break
		}
		if took > 10*time.Second {
			t.Fatalf("the healthy provisioner's idle worker had no task %s after attaching\n%s", took, logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("idle worker of the healthy provisioner got its task %s after attaching (hang deadline %s)", took.Round(time.Millisecond), placer.asks.provisionTimeout)
	if took > time.Second {
		t.Errorf("the idle worker waited %s for its task; want under 1s while the other plugin hangs", took)
	}

	// The hung plugin misses its deadlines: wedged, killed, restarted.
	deadline = time.Now().Add(30 * time.Second)
	for {
		st := sups["hung"].Status(context.Background())
		if strings.Contains(st.Process, "wedged") && strings.Contains(st.Process, "restarts: 1") {
			t.Logf("hung provisioner: %s", st.Process)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the hung plugin was not marked wedged and restarted within 30s: %q\n%s", st.Process, logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st := sups["good"].Status(context.Background()); st.Process != "running" {
		t.Errorf("the healthy provisioner is %q; want running, untouched", st.Process)
	}
}

// TestDemandLeavesOutWhatIdleWorkersCover: a worker that attached after
// the pass matched workers to needs is idle and takes a need on the next
// pass, so the demand told to the provisioner leaves that need out, and
// names the worker as attached. Counting it asked for a machine in one
// pass and gave one up in the next (TestE2EBurstOneSubmission saw it).
func TestDemandLeavesOutWhatIdleWorkersCover(t *testing.T) {
	t.Parallel()
	signer := host.NewSigner(testSecret)
	e := newBareBooks(nil, signer, nil)
	prov := &sharedtest.Provisioner{Name: "hpc", ShapeList: []shared.Shape{{Profile: "cpu", CPUs: 4}}, OnProvision: requested}
	p := newRouter(nil, e, []target{{Name: testProvisioner, P: prov, Shapes: prov.ShapeList}})
	p.Add(shared.Need{CPUs: 1})
	p.Add(shared.Need{CPUs: 1})
	attachWorker(t, e, signer, "slurm-cpu-1", `{"cpus":4,"job_id":"1"}`)
	// As a pass would after match had looked and found no idle worker.
	p.mu.Lock()
	waiting := slices.Clone(p.needs)
	p.mu.Unlock()
	p.asks.provision(context.Background(), waiting)
	p.Close()
	if d := prov.LastDemand(); len(d) != 1 || d[0].Count != 1 {
		t.Errorf("demand %+v; want one machine, the idle worker covering the other need", d)
	}
}

// TestPassLogsOutcomesNotTheirWording: a provisioner whose detail changes
// every pass (an age, a count) while its outcome stays the same is logged
// once, not once a pass; a change of outcome is logged at once.
func TestPassLogsOutcomesNotTheirWording(t *testing.T) {
	t.Parallel()
	logger, logs := testLogger(t)
	var mu sync.Mutex
	pass, outcome := 0, shared.OutcomeOutstanding
	chatty := &sharedtest.Provisioner{Name: "chatty", ShapeList: []shared.Shape{{Profile: "small", CPUs: 4}},
		OnProvision: func(r *shared.ProvisionRequest) (*shared.ProvisionResponse, error) {
			mu.Lock()
			defer mu.Unlock()
			pass++
			resp := &shared.ProvisionResponse{}
			for range r.Demand {
				resp.Outcomes = append(resp.Outcomes, shared.DemandOutcome{Outcome: outcome, Profile: "small",
					Detail: fmt.Sprintf("job 7 was asked for %ds ago", pass)})
			}
			return resp, nil
		}}
	p := newRouter(logger, newBareBooks(nil, host.NewSigner(testSecret), nil), []target{{Name: "chatty", P: chatty, Shapes: chatty.ShapeList}})
	p.Add(shared.Need{CPUs: 1})
	for range 10 {
		p.Pass(context.Background())
	}
	if c := strings.Count(logs.String(), "asked for a machine"); c != 1 {
		t.Errorf("10 passes with the same outcome and a new detail each: %d lines; want 1:\n%s", c, logs)
	}
	mu.Lock()
	outcome = shared.OutcomeCapped
	mu.Unlock()
	p.Pass(context.Background())
	if c := strings.Count(logs.String(), "outcome=capped"); c != 1 {
		t.Errorf("a new outcome was logged %d times; want 1:\n%s", c, logs)
	}
}

// TestPassFailsOverABackingOffProfile: a need whose profile backs off is
// asked next pass for the next fitting shape of the same target, and says
// so; once every shape of that target backs off, it is asked of the next
// covering target.
func TestPassFailsOverABackingOffProfile(t *testing.T) {
	t.Parallel()
	logger, _ := testLogger(t)
	var mu sync.Mutex
	cpuBacksOff := false
	shapes := []shared.Shape{{Profile: "small", CPUs: 2}, {Profile: "cpu", CPUs: 8}}
	flaky := &sharedtest.Provisioner{Name: "flaky", ShapeList: shapes,
		OnProvision: func(r *shared.ProvisionRequest) (*shared.ProvisionResponse, error) {
			mu.Lock()
			defer mu.Unlock()
			resp := &shared.ProvisionResponse{}
			for _, d := range r.Demand {
				o := shared.DemandOutcome{Outcome: shared.OutcomeBackingOff, Profile: "small"}
				if d.Need.CPUs > 2 {
					o.Profile = "cpu"
					if !cpuBacksOff {
						o.Outcome = shared.OutcomeRequested
					}
				}
				resp.Outcomes = append(resp.Outcomes, o)
			}
			return resp, nil
		}}
	other := &sharedtest.Provisioner{Name: "other", ShapeList: []shared.Shape{{Profile: "p", CPUs: 4}}, OnProvision: requested}
	p := newRouter(logger, newBareBooks(nil, host.NewSigner(testSecret), nil), []target{
		{Name: "flaky", P: flaky, Shapes: flaky.ShapeList},
		{Name: "other", P: other, Shapes: other.ShapeList},
	})
	p.Add(shared.Need{CPUs: 1})
	p.Pass(context.Background())
	if d := flaky.LastDemand(); len(d) != 1 || d[0].Need.CPUs != 1 {
		t.Fatalf("first pass asked flaky for %+v; want the need as it is", d)
	}
	p.Pass(context.Background())
	if d := flaky.LastDemand(); len(d) != 1 || d[0].Need.CPUs != 8 {
		t.Fatalf("after small backed off, flaky was asked for %+v; want the need at cpu's size (8 CPUs)", d)
	}
	if st := p.Needs(); len(st) != 1 || !strings.Contains(st[0].Detail, "failed over (small -> cpu): requested cpu") {
		t.Errorf("the need says %+v; want it to name the route around small", st)
	}
	if len(other.LastDemand()) != 0 {
		t.Errorf("other was asked for %+v while flaky had a shape left", other.LastDemand())
	}

	mu.Lock()
	cpuBacksOff = true
	mu.Unlock()
	p.Pass(context.Background()) // cpu backs off too: flaky has nothing left
	p.Pass(context.Background())
	if d := other.LastDemand(); len(d) != 1 || d[0].Need.CPUs != 1 {
		t.Errorf("with every shape of flaky backing off, other was asked for %+v; want the need as it is", d)
	}
	if d := flaky.LastDemand(); len(d) != 0 {
		t.Errorf("flaky is still asked for %+v with every shape backing off", d)
	}
}

// TestPassGivesASmallNeedTheWorkerABigOneCannotUse: the most demanding
// needs choose first, and once no idle worker fits one, the needs like
// it skip the scan; a smaller need after them still gets the worker
// that fits it, in the same pass.
func TestPassGivesASmallNeedTheWorkerABigOneCannotUse(t *testing.T) {
	t.Parallel()
	signer := host.NewSigner(testSecret)
	e := newBareBooks(nil, signer, nil)
	prov := &sharedtest.Provisioner{Name: "hpc", ShapeList: []shared.Shape{{Profile: "big", CPUs: 64, GPUs: 4}}, OnProvision: requested}
	p := newRouter(nil, e, []target{{Name: "hpc", P: prov, Shapes: prov.ShapeList}})
	attachWorker(t, e, signer, "cpu-only", `{"cpus":4}`)
	for range 3 {
		p.Add(shared.Need{CPUs: 2, GPUs: 1}) // no GPU worker: each waits
	}
	small := p.Add(shared.Need{CPUs: 2})
	p.Pass(context.Background())
	for _, st := range p.Needs() {
		switch {
		case st.ID == small && st.Worker != "cpu-only":
			t.Errorf("the CPU need is %s on %q; want it on cpu-only in the first pass", st.State, st.Worker)
		case st.ID != small && st.State != NeedWaiting:
			t.Errorf("a GPU need is %s; want waiting", st.State)
		}
	}
}

// TestRouterAsksWhatFits: the router turns needs nobody serves into
// demand on the provisioners that cover them, and says, typed, why each
// need waits. One provisioner (a stand-in for a plugin) has a small
// profile only: the need it fits is asked for and waits queued; the one
// nothing fits waits for no fit, and is asked of nobody.
func TestRouterAsksWhatFits(t *testing.T) {
	books := newBareBooks(nil, host.NewSigner(testSecret), nil)
	defer books.Close()
	hpc := &sharedtest.Provisioner{
		Name:      "hpc",
		ShapeList: []shared.Shape{{Profile: "small", CPUs: 4}},
		OnProvision: func(r *shared.ProvisionRequest) (*shared.ProvisionResponse, error) {
			resp := &shared.ProvisionResponse{}
			for range r.Demand {
				resp.Outcomes = append(resp.Outcomes, shared.DemandOutcome{Outcome: shared.OutcomeRequested, Profile: "small"})
			}
			return resp, nil
		},
	}
	r := newRouter(nil, books, []target{{Name: "hpc", P: hpc, Shapes: hpc.ShapeList}})
	defer r.Close()
	r.AddWork(shared.Need{CPUs: 2}, 0)
	r.AddWork(shared.Need{CPUs: 64}, time.Second)
	r.Pass(context.Background())
	var got []string
	for _, n := range r.Needs() {
		got = append(got, fmt.Sprint(n.ID, " ", n.Spec, " ", n.State, " ", n.Reason))
	}
	want := []string{"need-1 cpus=2 waiting queued", "need-2 cpus=64 waiting no_fit"}
	if !slices.Equal(got, want) {
		t.Errorf("needs %q, want %q", got, want)
	}
	if asked := fmt.Sprint(hpc.LastDemand()); asked != "[{{2 0 0  0s} 1}]" {
		t.Errorf("asked of hpc: %s, want [{{2 0 0  0s} 1}]", asked)
	}
}

// TestPassCutShortKeepsTheAnswer: a pass whose context ends while a
// provisioner is being asked (the run is over) records nothing for its
// needs: each keeps the provisioner's last answer, here "login needed",
// not the cut's "context deadline exceeded".
func TestPassCutShortKeepsTheAnswer(t *testing.T) {
	t.Parallel()
	logger, logs := testLogger(t)
	block := make(chan struct{})
	prov := &sharedtest.Provisioner{Name: "hpc", ShapeList: []shared.Shape{{Profile: "small", CPUs: 4}}}
	prov.ProvisionF = func(ctx context.Context, r *shared.ProvisionRequest) (*shared.ProvisionResponse, error) {
		select {
		case <-block:
			<-ctx.Done()
			return nil, ctx.Err()
		default:
		}
		resp := &shared.ProvisionResponse{}
		for range r.Demand {
			resp.Outcomes = append(resp.Outcomes, shared.DemandOutcome{Outcome: shared.OutcomeCapped, Condition: shared.ConditionLoginNeeded,
				Profile: "small", Detail: "login needed: the login node refused the login (Permission denied (publickey).)"})
		}
		return resp, nil
	}
	p := newRouter(logger, newBareBooks(nil, host.NewSigner(testSecret), nil), []target{{Name: "hpc", P: prov, Shapes: prov.ShapeList}})
	p.Add(shared.Need{CPUs: 2})
	p.Pass(context.Background())
	close(block)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	p.Pass(ctx)
	un := p.Unserved()
	if len(un) != 1 || !strings.Contains(un[0], "Permission denied (publickey)") || strings.Contains(un[0], "deadline") {
		t.Errorf("Unserved() after a pass cut short = %q, want the provisioner's last answer", un)
	}
	if strings.Contains(logs.String(), "could not ask for a machine") {
		t.Errorf("the cut was logged as the provisioner's error:\n%s", logs)
	}
}
