package conformance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/fluksio/provision/engine/hclconfig"
	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/wire"
	"github.com/fluksio/provision/shared"
)

// run is one pass of the checks over one plugin. Its fields are set by
// one check and read by the later ones, all from the caller's goroutine.
type run struct {
	cfg    Config
	report func(Result)
	ok     bool
	// stopped names the check whose failure makes the rest meaningless.
	stopped string

	plugin *host.Plugin
	p      shared.Provisioner
	events chan shared.Event
	out    *output
	kind   string
	// infoResp is Info's answer, nil if it failed.
	infoResp *shared.InfoResponse
	schema   *shared.Schema
	good     json.RawMessage
	// invalid is each Config.Invalid case decoded with the schema.
	invalid []json.RawMessage
	shapes  []shared.Shape
	// provisioned names the workers the provision check saw announced.
	provisioned []string
	// note is what a passing check has to say (set by its fn, taken by
	// check): that it was not run, and why.
	note string
}

// check runs one check and reports it. fn returns what it found wrong;
// fatal marks a check the rest cannot do without.
func (r *run) check(name string, fatal bool, fn func() problems) {
	if r.stopped != "" {
		r.ok = false
		r.report(Result{Check: name, Skipped: true, Detail: "not run: " + r.stopped + " failed"})
		return
	}
	start := time.Now()
	r.note = ""
	found := fn()
	res := Result{Check: name, Pass: len(found) == 0, Detail: found.String(), Seconds: time.Since(start).Seconds()}
	if res.Pass {
		res.Detail = r.note
	}
	if !res.Pass {
		r.ok = false
		if fatal {
			r.stopped = name
		}
	}
	r.report(res)
}

func (r *run) all(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	defer func() {
		if r.plugin != nil {
			r.plugin.Kill()
		}
	}()

	r.check(checkCookie, false, func() problems { return refusesWithoutCookie(ctx, r.cfg) })
	r.check(checkHandshake, true, func() problems { return r.launch(ctx) })
	r.check(checkInfo, false, func() problems { return r.info(ctx) })
	r.check(checkContract, false, r.contract)
	r.check(checkSchema, true, func() problems { return r.schemaOnce(ctx) })
	r.check(checkValidate, false, func() problems { return r.validate(ctx) })
	r.check(checkPreview, false, func() problems { return r.preview(ctx) })
	r.check(checkNotConfigured, false, func() problems {
		_, err := r.p.Provision(ctx, &shared.ProvisionRequest{Demand: []shared.Demand{{Need: shared.Need{CPUs: 1}, Count: 1}}})
		return wantReason(err, shared.ErrNotConfigured, "NOT_CONFIGURED", "Provision before Configure")
	})
	r.check(checkConfigure, true, func() problems { return r.configure(ctx) })
	r.check(checkShapes, false, func() problems { return r.shapesAndCovers(ctx) })
	r.check(checkProvision, false, func() problems { return r.provision(ctx) })
	r.check(checkSettled, false, func() problems { return r.settled() })
	r.check(checkReconcile, false, func() problems { return r.reconcile(ctx) })
	r.check(checkStatus, false, func() problems { return r.status(ctx) })
	r.check(checkShutdown, true, func() problems { return r.shutdown(ctx) })
	r.check(checkShutDownDetail, false, func() problems {
		_, err := r.p.Provision(ctx, &shared.ProvisionRequest{Demand: []shared.Demand{{Need: shared.Need{CPUs: 1}, Count: 1}}})
		return wantReason(err, shared.ErrShutdown, "SHUT_DOWN", "Provision after Shutdown")
	})
	r.check(checkController, false, r.controller)
	r.check(checkStdout, false, func() problems {
		if lines := r.out.stdoutLines(); len(lines) > 0 {
			return problems{fmt.Sprintf("%d line(s) on stdout after the handshake, the first: %q; stdout carries the handshake line only, log to stderr", len(lines), lines[0])}
		}
		return nil
	})
	r.check(checkLogLines, false, func() problems { return r.out.badLogLines() })

	// These start processes of their own, which need only a plugin that
	// starts at all.
	if r.stopped != checkHandshake {
		r.stopped = ""
	}
	r.check(checkSIGTERM, false, func() problems { return exitsOnSIGTERM(ctx, r.cfg) })
	r.check(checkParentDeath, false, func() problems { return exitsWhenOrphaned(ctx, r.cfg) })
	if r.schema == nil {
		r.stopped = checkSchema
	}
	r.check(checkBackoff, false, func() problems { return r.backsOff(ctx) })
}

// launch starts the plugin through the handshake.
func (r *run) launch(ctx context.Context) problems {
	var err error
	r.out = &output{}
	r.plugin, err = launch(ctx, r.cfg, r.out, func(ev shared.Event) {
		// The checks only ever look at the first events; a full
		// channel must never block the plugin's event stream.
		select {
		case r.events <- ev:
		default:
		}
	})
	if err != nil {
		return problems{fmt.Sprintf("launch: %v", err)}
	}
	r.p = r.plugin.Provisioner()
	return nil
}

// info asks Info, which must name a kind and a version.
func (r *run) info(ctx context.Context) problems {
	var err error
	r.infoResp, err = r.p.Info(ctx, &shared.InfoRequest{})
	if err != nil {
		return problems{err.Error()}
	}
	r.kind = r.infoResp.Kind
	if r.infoResp.Kind == "" || r.infoResp.Version == "" {
		return problems{fmt.Sprintf("Info must name a kind and a version: %+v", r.infoResp)}
	}
	return nil
}

// contract checks that Info's contract is of this host's major version.
func (r *run) contract() problems {
	info := r.infoResp
	if info == nil {
		return problems{"Info failed"}
	}
	if major(info.ContractVersion) != major(shared.ContractVersion) {
		return problems{fmt.Sprintf("contract version %q, this host speaks %q (any %s.x)", info.ContractVersion, shared.ContractVersion, major(shared.ContractVersion))}
	}
	return nil
}

// schemaOnce asks Schema twice, which must answer the same usable
// schema, and decodes the good and the invalid configurations with it.
func (r *run) schemaOnce(ctx context.Context) problems {
	var found problems
	first, err := r.p.Schema(ctx, &shared.SchemaRequest{})
	if err != nil {
		return problems{err.Error()}
	}
	if err := first.Schema.Validate(); err != nil {
		return problems{fmt.Sprintf("the schema is not one a host can use: %v", err)}
	}
	r.schema = first.Schema
	again, err := r.p.Schema(ctx, &shared.SchemaRequest{})
	if err != nil || !reflect.DeepEqual(first.Schema, again.Schema) {
		found.add("Schema answered differently the second time (%v)", err)
	}
	var diags hcl.Diagnostics
	r.good, diags = decode(r.cfg.HCL, first.Schema)
	if diags.HasErrors() {
		return append(found, "the good configuration does not decode against the plugin's schema: "+diags.Error())
	}
	r.invalid = make([]json.RawMessage, len(r.cfg.Invalid))
	for i, inv := range r.cfg.Invalid {
		raw, diags := decode(inv.HCL, first.Schema)
		if diags.HasErrors() {
			return append(found, fmt.Sprintf("invalid case %d is rejected by the schema itself, so it tests nothing of the plugin: %s", i, diags.Error()))
		}
		r.invalid[i] = raw
	}
	return found
}

// validate checks that ValidateConfig passes the good configuration and
// reports each invalid one at its path.
func (r *run) validate(ctx context.Context) problems {
	var found problems
	v, err := r.p.ValidateConfig(ctx, &shared.ValidateConfigRequest{Name: r.cfg.Name, Config: r.good})
	if err != nil {
		return problems{err.Error()}
	}
	if v.Diagnostics.HasErrors() {
		found.add("the good configuration was rejected: %s", v.Diagnostics.Error())
	}
	for i, inv := range r.cfg.Invalid {
		v, err := r.p.ValidateConfig(ctx, &shared.ValidateConfigRequest{Name: r.cfg.Name, Config: r.invalid[i]})
		if err != nil {
			return append(found, err.Error())
		}
		if !hasPath(v.Diagnostics, inv.Path) {
			found.add("a broken configuration at %s was not reported there; got %q", strings.Join(inv.Path, "."), v.Diagnostics.Error())
		}
	}
	return found
}

// preview checks the optional Preview (contract 2.2): a plugin without
// it answers UNIMPLEMENTED, and one with it answers an unknown profile
// with an error diagnostic, not a failed call. Check is not called: it
// reaches the real system, which a conformance run need not have.
func (r *run) preview(ctx context.Context) problems {
	pv, ok := r.p.(shared.Previewer)
	if !ok {
		return nil
	}
	prev, err := pv.Preview(ctx, &shared.PreviewRequest{Name: r.cfg.Name, Config: r.good, Profile: "no-such-profile-conformance"})
	switch {
	case errors.Is(err, shared.ErrUnimplemented):
		return nil
	case err != nil:
		return problems{"Preview of an unknown profile failed as a call, not with a diagnostic: " + err.Error()}
	case !prev.Diagnostics.HasErrors():
		return problems{"Preview of a profile the configuration does not have answered without an error diagnostic"}
	}
	return nil
}

// configure applies the good configuration, which must be accepted.
func (r *run) configure(ctx context.Context) problems {
	c, err := r.p.Configure(ctx, &shared.ConfigureRequest{Name: r.cfg.Name, Config: r.good})
	if err != nil {
		return problems{err.Error()}
	}
	if c.Diagnostics.HasErrors() {
		return problems{"Configure rejected the good configuration: " + c.Diagnostics.Error()}
	}
	return nil
}

// status checks that Status names the block, the kind and its profiles,
// and that what is outstanding is for one of them.
func (r *run) status(ctx context.Context) problems {
	var found problems
	st, err := r.p.Status(ctx, &shared.StatusRequest{})
	if err != nil {
		return problems{err.Error()}
	}
	if st.Name != r.cfg.Name || st.Kind != r.kind || len(st.Profiles) == 0 {
		found.add("Status = %+v, want name %q, kind %q and its profiles", st, r.cfg.Name, r.kind)
	}
	for _, o := range st.Outstanding {
		if !contains(st.Profiles, o.Profile) || o.Age < 0 {
			found.add("outstanding %+v is not for one of the profiles %v", o, st.Profiles)
		}
	}
	return found
}

// shutdown checks that Shutdown returns within its deadline.
func (r *run) shutdown(ctx context.Context) problems {
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if _, err := r.p.Shutdown(sctx, &shared.ShutdownRequest{}); err != nil {
		return problems{fmt.Sprintf("Shutdown: %v", err)}
	}
	if sctx.Err() != nil {
		return problems{"Shutdown did not return before its deadline"}
	}
	return nil
}

// controller checks that the process exits on GRPCController.Shutdown:
// go-plugin's Kill asks it first and waits up to 2 s for the process to
// leave before it sends SIGKILL.
func (r *run) controller() problems {
	start := time.Now()
	r.plugin.Kill()
	exit := r.plugin.ExitStatus()
	if exit == nil || exit.Signal != "" {
		return problems{fmt.Sprintf("the process was %s %.1fs after GRPCController.Shutdown: serve the plugin.GRPCController service and exit when it is called",
			exit, time.Since(start).Seconds())}
	}
	return nil
}

// wantReason checks that err is the sentinel want and carried the
// ErrorInfo reason that names it.
func wantReason(err, want error, reason, what string) problems {
	if !errors.Is(err, want) {
		return problems{fmt.Sprintf("%s: got %v, want a FAILED_PRECONDITION status with ErrorInfo{domain: %q, reason: %q}", what, err, "provision.fluksio", reason)}
	}
	if got := wire.ErrorReason(err); got != reason {
		return problems{fmt.Sprintf("%s: the status carried no ErrorInfo detail with reason %q (got %q), so a host cannot tell it from another failure of the same code; add google.rpc.ErrorInfo{domain: %q, reason: %q}",
			what, reason, got, "provision.fluksio", reason)}
	}
	return nil
}

// shapesAndCovers checks Shapes and, where the plugin offers it, Covers.
// Covers is deprecated (contract 2.5: no host calls it) and optional: a
// plugin may answer UNIMPLEMENTED, and one that answers must agree with
// its Shapes, for a caller that still asks.
func (r *run) shapesAndCovers(ctx context.Context) problems {
	var found problems
	sr, err := r.p.Shapes(ctx, &shared.ShapesRequest{})
	if err != nil {
		return problems{err.Error()}
	}
	r.shapes = sr.Shapes
	if len(r.shapes) == 0 {
		return problems{"a configured provisioner offers no shapes"}
	}
	// One ask tells whether the plugin offers Covers at all.
	covers := true
	//lint:ignore SA1019 Covers is checked for callers that still ask
	if _, err := r.p.Covers(ctx, &shared.CoversRequest{Need: shared.Need{CPUs: r.shapes[0].CPUs}}); errors.Is(err, shared.ErrUnimplemented) {
		covers = false
		r.note = "Covers is not offered (UNIMPLEMENTED): it is deprecated and optional since contract 2.5"
	}
	biggest := shared.Need{}
	for _, s := range r.shapes {
		for _, need := range []shared.Need{
			{CPUs: s.CPUs, GPUs: s.GPUs, RAMMB: s.RAMMB},
			{CPUs: s.CPUs, GPUs: s.GPUs, RAMMB: s.RAMMB, Label: s.Profile},
		} {
			if !covers {
				break
			}
			//lint:ignore SA1019 Covers is checked for callers that still ask
			c, err := r.p.Covers(ctx, &shared.CoversRequest{Need: need})
			if err != nil || !c.Covered {
				found.add("Shapes offers %+v but Covers(%+v) says %+v (%v); Covers is optional (deprecated since contract 2.5): agree with Shapes or answer UNIMPLEMENTED", s, need, c, err)
			}
		}
		for _, l := range s.Labels {
			//lint:ignore SA1019 a plugin that reads the label must honour it
			lr, err := r.p.Shapes(ctx, &shared.ShapesRequest{Label: l})
			if err != nil || !containsProfile(lr.Shapes, s.Profile) {
				found.add("Shapes(%q) leaves out %q, which carries that label", l, s.Profile)
			}
		}
		biggest.CPUs = max(biggest.CPUs, s.CPUs)
		biggest.GPUs = max(biggest.GPUs, s.GPUs)
	}
	biggest.CPUs++
	if !covers {
		return found
	}
	//lint:ignore SA1019 Covers is checked for callers that still ask
	if c, err := r.p.Covers(ctx, &shared.CoversRequest{Need: biggest}); err != nil || c.Covered {
		found.add("Covers(%+v), more than any shape, says %+v (%v)", biggest, c, err)
	}
	return found
}

func (r *run) provision(ctx context.Context) problems {
	var found problems
	need := r.cfg.Need
	if need == (shared.Need{}) && len(r.shapes) > 0 {
		need = shared.Need{CPUs: r.shapes[0].CPUs, GPUs: r.shapes[0].GPUs, RAMMB: r.shapes[0].RAMMB}
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// Two machines that fit, and one need nothing fits: the answer comes
	// entry by entry, and the same demand again asks for nothing new.
	unfit := shared.Need{CPUs: 1 << 20}
	demand := &shared.ProvisionRequest{Demand: []shared.Demand{{Need: need, Count: 2}, {Need: unfit, Count: 1}}}
	resp, err := r.p.Provision(pctx, demand)
	if err != nil {
		return problems{fmt.Sprintf("Provision did not answer within 5s, or failed: %v", err)}
	}
	if len(resp.Outcomes) != 2 || resp.Outcomes[0].Outcome != shared.OutcomeRequested || resp.Outcomes[1].Outcome != shared.OutcomeNoFit {
		return problems{fmt.Sprintf("Provision(2 × %+v, 1 × %+v) = %+v, want requested then no_fit", need, unfit, resp)}
	}
	profile := resp.Outcomes[0].Profile
	if pd := profileDemand(resp, profile); pd.Wanted < 2 || pd.Requested+pd.OnTheWay < 2 {
		found.add("profile %s after asking for 2: %+v, want 2 wanted and 2 requested or on their way", profile, pd)
	}
	again, err := r.p.Provision(pctx, demand)
	if err != nil || len(again.Outcomes) != 2 || again.Outcomes[0].Outcome == shared.OutcomeRequested || profileDemand(again, profile).Requested != 0 {
		found.add("the same demand again = %+v (%v), want nothing new asked for", again, err)
	}
	timeout := time.NewTimer(r.cfg.EventTimeout)
	defer timeout.Stop()
	for seen := 1; seen <= 2; seen++ {
		select {
		case ev := <-r.events:
			if ev.Profile != profile || (ev.Kind != shared.EventWorkerProvisioned && ev.Kind != shared.EventWorkerProvisionFailed) {
				found.add("event %d after Provision is %+v", seen, ev)
			}
			if ev.Kind == shared.EventWorkerProvisioned && !strings.HasPrefix(ev.Worker, r.cfg.Name+"-") {
				found.add("worker %q is not named after its provisioner", ev.Worker)
			}
			if ev.Kind == shared.EventWorkerProvisioned {
				r.provisioned = append(r.provisioned, ev.Worker)
			}
			// Reporting a failure is honest, but it is not provisioning:
			// the check fails, and says what the plugin said.
			if ev.Kind == shared.EventWorkerProvisionFailed {
				found.add("Provision failed: worker_provision_failed for profile %s (worker %s): %s", ev.Profile, ev.Worker, ev.Detail)
			}
		case <-timeout.C:
			return append(found, fmt.Sprintf("%d of 2 worker_provisioned or worker_provision_failed events within %s of Provision", seen-1, r.cfg.EventTimeout))
		}
	}
	return found
}

func (r *run) reconcile(ctx context.Context) problems {
	var found problems
	before, err := r.p.Status(ctx, &shared.StatusRequest{})
	if err != nil {
		return problems{err.Error()}
	}
	for i := range 2 {
		rr, err := r.p.Reconcile(ctx, &shared.ReconcileRequest{Attached: []string{"somebody-else-1"}})
		if err != nil {
			return append(found, err.Error())
		}
		if len(rr.Arrived) != 0 {
			found.add("Reconcile %d forgot %v, which never attached", i, rr.Arrived)
		}
	}
	after, err := r.p.Status(ctx, &shared.StatusRequest{})
	if err != nil {
		return append(found, err.Error())
	}
	if len(before.Outstanding) != len(after.Outstanding) {
		// A machine that died meanwhile leaves the outstanding list by
		// itself: say that, by name, rather than blame Reconcile. Its
		// event may trail the Status that no longer lists it.
		failed := failuresWithin(r.events, time.Second)
		if len(failed) > 0 {
			return append(found, failed...)
		}
		found.add("Reconcile changed what is outstanding: %d before, %d after, with no worker_provision_failed to explain it; Reconcile with nothing new attached must forget nothing", len(before.Outstanding), len(after.Outstanding))
	}
	return found
}

// settleWindow is how long the check after Provision watches for the
// machines it asked for failing at once. A local process that cannot run
// fails within milliseconds; a cluster's failure is the backoff check's.
const settleWindow = 2 * time.Second

// settled watches the events after Provision for settleWindow: a
// worker_provision_failed in it is a machine that failed right after
// Provision, named with what the plugin said, so that it is not blamed
// on the next check (Reconcile would find one machine fewer).
func (r *run) settled() problems {
	return failuresWithin(r.events, settleWindow)
}

// failuresWithin reads events for d and describes each
// worker_provision_failed among them.
func failuresWithin(events <-chan shared.Event, d time.Duration) problems {
	var found problems
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case ev := <-events:
			if ev.Kind == shared.EventWorkerProvisionFailed {
				class := string(ev.Class)
				if class == "" {
					class = "unclassified"
				}
				found.add("worker %s (profile %s) failed right after Provision (worker_provision_failed, %s): %s", ev.Worker, ev.Profile, class, ev.Detail)
			}
		case <-timer.C:
			return found
		}
	}
}

// backsOff starts a fresh plugin with the failing configuration, asks it
// for one machine, waits for that machine's failure and asks again: the
// answer must be BACKING_OFF, asking for nothing, and Status must list
// the profile as backing off. A plugin that asks again at once starts a
// storm of doomed machines.
func (r *run) backsOff(ctx context.Context) problems {
	cfg := r.cfg
	if cfg.Failing == "" {
		r.note = "not run: give a configuration whose machines fail at once (-failing FILE, Config.Failing)"
		return nil
	}
	raw, diags := decode(cfg.Failing, r.schema)
	if diags.HasErrors() {
		return problems{"the failing configuration does not decode against the plugin's schema: " + diags.Error()}
	}
	events := make(chan shared.Event, 64)
	plugin, err := launch(ctx, cfg, &output{}, func(ev shared.Event) {
		select {
		case events <- ev:
		default:
		}
	})
	if err != nil {
		return problems{fmt.Sprintf("launch: %v", err)}
	}
	defer plugin.Kill()
	p := plugin.Provisioner()
	defer func() {
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_, _ = p.Shutdown(sctx, &shared.ShutdownRequest{})
	}()
	if c, err := p.Configure(ctx, &shared.ConfigureRequest{Name: cfg.Name, Config: raw}); err != nil || c.Diagnostics.HasErrors() {
		return problems{fmt.Sprintf("Configure rejected the failing configuration (%v): %s; it must be valid, only its machines fail", err, diagsText(c))}
	}
	sr, err := p.Shapes(ctx, &shared.ShapesRequest{})
	if err != nil || len(sr.Shapes) == 0 {
		return problems{fmt.Sprintf("Shapes with the failing configuration: %+v (%v)", sr, err)}
	}
	s := sr.Shapes[0]
	demand := &shared.ProvisionRequest{Demand: []shared.Demand{{Need: shared.Need{CPUs: s.CPUs, GPUs: s.GPUs, RAMMB: s.RAMMB}, Count: 1}}}
	ask := func() (*shared.ProvisionResponse, error) {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return p.Provision(pctx, demand)
	}
	first, err := ask()
	if err != nil || len(first.Outcomes) != 1 {
		return problems{fmt.Sprintf("Provision with the failing configuration: %+v (%v)", first, err)}
	}
	profile := first.Outcomes[0].Profile
	if first.Outcomes[0].Outcome == shared.OutcomeBackingOff {
		return nil
	}
	failed, ok := failureOf(events, profile, cfg.EventTimeout)
	if !ok {
		return problems{fmt.Sprintf("no worker_provision_failed for profile %s within %s of Provision with the failing configuration; give one whose machines fail at once", profile, cfg.EventTimeout)}
	}
	var found problems
	again, err := ask()
	switch {
	case err != nil || len(again.Outcomes) != 1:
		return problems{fmt.Sprintf("Provision after the failure: %+v (%v)", again, err)}
	case again.Outcomes[0].Outcome != shared.OutcomeBackingOff || profileDemand(again, profile).Requested > 0:
		found.add("asked again right after worker %s of profile %s failed (%s), the plugin answered %s and asked for %d machine(s); back the profile off: answer BACKING_OFF until a time that grows with each failure in a row, and list it in Status.backing_off",
			failed.Worker, profile, failed.Detail, again.Outcomes[0].Outcome, profileDemand(again, profile).Requested)
	}
	return append(found, listsBackingOff(ctx, p, profile)...)
}

// failureOf waits up to timeout for the worker_provision_failed of a
// machine of profile.
func failureOf(events <-chan shared.Event, profile string, timeout time.Duration) (shared.Event, bool) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case ev := <-events:
			if ev.Kind == shared.EventWorkerProvisionFailed && ev.Profile == profile {
				return ev, true
			}
		case <-t.C:
			return shared.Event{}, false
		}
	}
}

// listsBackingOff checks that Status lists profile as backing off.
func listsBackingOff(ctx context.Context, p shared.Provisioner, profile string) problems {
	st, err := p.Status(ctx, &shared.StatusRequest{})
	if err != nil {
		return problems{"Status: " + err.Error()}
	}
	for _, b := range st.BackingOff {
		if b.Profile == profile {
			return nil
		}
	}
	return problems{fmt.Sprintf("Status.backing_off does not list profile %s after its machine failed: %+v", profile, st.BackingOff)}
}

func diagsText(c *shared.ConfigureResponse) string {
	if c == nil {
		return ""
	}
	return c.Diagnostics.Error()
}

// launch starts the plugin as a host does, with its stdout and stderr
// recorded in out, at debug level so there is more log to check.
func launch(ctx context.Context, cfg Config, out *output, onEvent func(shared.Event)) (*host.Plugin, error) {
	env := append([]string{logLevelEnv + "=debug"}, cfg.Env...)
	return host.Launch(ctx, host.LaunchConfig{
		Name: cfg.Name, Path: cfg.Binary, Args: cfg.Args, Env: env, Logger: cfg.Logger,
		Signer: fakeSigner{}, OnEvent: onEvent, StartTimeout: 20 * time.Second,
		OnStdout: out.addStdout, Stderr: out,
	})
}

// logLevelEnv is shared/plugin.LogLevelEnv, which this package may not
// import (a host need not link the plugin SDK).
const logLevelEnv = wire.LogLevelEnv

// output is what a plugin wrote besides the handshake.
type output struct {
	mu      sync.Mutex // guards everything below
	stdout  []string
	stderr  []string
	partial []byte
}

func (o *output) addStdout(line string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.stdout = append(o.stdout, line)
}

// Write takes the plugin's raw stderr and keeps its first lines.
func (o *output) Write(b []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, c := range b {
		if c != '\n' {
			if len(o.partial) < 4096 {
				o.partial = append(o.partial, c)
			}
			continue
		}
		if len(o.stderr) < 10000 {
			o.stderr = append(o.stderr, string(o.partial))
		}
		o.partial = o.partial[:0]
	}
	return len(b), nil
}

func (o *output) stdoutLines() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.stdout...)
}

// hostTimeFormat is the one @timestamp layout go-plugin's host reads;
// a line whose timestamp is in any other is shown as unparsed text.
const hostTimeFormat = "2006-01-02T15:04:05.000000Z07:00"

// badLogLines checks each stderr line as go-plugin's host reads it: a
// JSON object with "@level" (trace, debug, info, warn, error) and
// "@message" strings, and "@timestamp", if present, in hostTimeFormat.
// Anything else reaches the operator as a debug line of raw text, which
// a host at its default level never shows.
func (o *output) badLogLines() problems {
	o.mu.Lock()
	lines := append([]string(nil), o.stderr...)
	o.mu.Unlock()
	var found problems
	bad := 0
	for _, line := range lines {
		why := logLineProblem(line)
		if why == "" {
			continue
		}
		bad++
		if len(found) < 3 {
			found.add("%s: %.200q", why, line)
		}
	}
	if bad > 0 {
		found = append(problems{fmt.Sprintf("%d of %d stderr lines are not log lines the host parses; write one JSON object a line with \"@level\", \"@message\" and \"@timestamp\" (%s)", bad, len(lines), hostTimeFormat)}, found...)
	}
	return found
}

func logLineProblem(line string) string {
	var m map[string]any
	if err := json.Unmarshal([]byte(line), &m); err != nil {
		return "not a JSON object"
	}
	level, ok := m["@level"].(string)
	switch {
	case !ok:
		return `no "@level" string`
	case !contains([]string{"trace", "debug", "info", "warn", "error"}, level):
		return fmt.Sprintf("level %q is none of trace, debug, info, warn, error", level)
	}
	if _, ok := m["@message"].(string); !ok {
		return `no "@message" string`
	}
	if ts, present := m["@timestamp"]; present {
		s, ok := ts.(string)
		if _, err := time.Parse(hostTimeFormat, s); !ok || err != nil {
			return fmt.Sprintf(`"@timestamp" %v is not in the layout %s`, ts, hostTimeFormat)
		}
	}
	return ""
}

func decode(body string, schema *shared.Schema) (json.RawMessage, hcl.Diagnostics) {
	f, diags := hclsyntax.ParseConfig([]byte(body), "conformance.hcl", hcl.InitialPos)
	if diags.HasErrors() {
		return nil, diags
	}
	return hclconfig.DecodeConfig(f.Body, schema, nil)
}

func hasPath(diags shared.Diagnostics, path []string) bool {
	for _, d := range diags {
		// slices.Equal: the whole configuration's path may come as nil
		// or as an empty list.
		if d.Severity == shared.SeverityError && slices.Equal(d.Path, path) {
			return true
		}
	}
	return false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func containsProfile(shapes []shared.Shape, profile string) bool {
	for _, s := range shapes {
		if s.Profile == profile {
			return true
		}
	}
	return false
}

func major(v string) string {
	m, _, _ := strings.Cut(v, ".")
	return m
}

type fakeSigner struct{}

func (fakeSigner) Sign(_ host.CredentialClaims, ttl time.Duration) (string, time.Time, error) {
	return "conformance-credential", time.Now().Add(ttl), nil
}

// profileDemand is r's entry for profile, zero if there is none.
func profileDemand(r *shared.ProvisionResponse, profile string) shared.ProfileDemand {
	for _, p := range r.Profiles {
		if p.Profile == profile {
			return p
		}
	}
	return shared.ProfileDemand{}
}
