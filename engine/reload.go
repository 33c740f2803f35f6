package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/hcl/v2"

	"github.com/fluksio/provision/engine/hclconfig"
	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/engine/internal/supervise"
	"github.com/fluksio/provision/shared"
)

// A reload applies a changed configuration file to a running engine, as
// nomad-autoscaler and Prometheus do on SIGHUP: the new file is read and
// checked whole before anything changes, and one that cannot be applied
// is refused with its diagnostics, the running configuration kept.
//
// What it can change: a provisioner's plugin settings (its caps, its
// profiles), in place, when its plugin takes a second Configure
// (shared.CapabilityReconfigure); provisioners added (launched) and
// removed (their workers let go, their plugin shut down once they have
// left). What it cannot: the engine block (its listener, TLS pair,
// secret and the rest are set up once), and a provisioner's kind, plugin
// or sha256. Machines and attached workers of whatever stays are kept.
//
// A reload is a diff of the old configuration and the new, a list of
// typed changes (Change), each logged as one line.

// ChangeKind is what one change of a reload is.
type ChangeKind int

const (
	// ChangeEngine is an attribute of the engine block changed; a
	// reload cannot apply it and is refused.
	ChangeEngine ChangeKind = iota + 1
	// ChangeProvisionerAdded and ChangeProvisionerRemoved are a whole
	// provisioner block added or removed.
	ChangeProvisionerAdded
	ChangeProvisionerRemoved
	// ChangePlugin is a provisioner's kind, plugin or sha256 changed; a
	// reload cannot apply it and is refused.
	ChangePlugin
	// ChangeBlockAdded and ChangeBlockRemoved are a nested block of a
	// provisioner (a profile) added or removed.
	ChangeBlockAdded
	ChangeBlockRemoved
	// ChangeSetting is an attribute of a provisioner, or of one of its
	// nested blocks, changed.
	ChangeSetting
)

var changeKindNames = [...]string{ChangeEngine: "engine", ChangeProvisionerAdded: "provisioner added",
	ChangeProvisionerRemoved: "provisioner removed", ChangePlugin: "plugin", ChangeBlockAdded: "block added",
	ChangeBlockRemoved: "block removed", ChangeSetting: "setting"}

// String is the kind's name, for logs.
func (k ChangeKind) String() string {
	if k > 0 && int(k) < len(changeKindNames) {
		return changeKindNames[k]
	}
	return "unknown"
}

// Change is one difference between two configurations.
type Change struct {
	Kind ChangeKind
	// Provisioner is the provisioner block's name; empty for the engine
	// block.
	Provisioner string
	// BlockType and Block are the nested block the change is in, or is
	// ("profile", "gpu"); empty for the provisioner's own attributes.
	BlockType, Block string
	// Attribute is the attribute changed (ChangeEngine, ChangePlugin,
	// ChangeSetting).
	Attribute string
	// Old and New are its values as written in JSON; "(sensitive)" for
	// an attribute the plugin's schema marks sensitive.
	Old, New string
}

// String is the change in one line: "max_workers of sandbox/cpu 2 →
// 4", "profile gpu added to sandbox".
func (c Change) String() string {
	owner := c.Provisioner
	if c.Block != "" {
		owner += "/" + c.Block
	}
	switch c.Kind {
	case ChangeEngine:
		return fmt.Sprintf("%s of the engine %s → %s", c.Attribute, c.Old, c.New)
	case ChangeProvisionerAdded:
		return fmt.Sprintf("provisioner %s added", c.Provisioner)
	case ChangeProvisionerRemoved:
		return fmt.Sprintf("provisioner %s removed", c.Provisioner)
	case ChangeBlockAdded:
		return fmt.Sprintf("%s %s added to %s", c.BlockType, c.Block, c.Provisioner)
	case ChangeBlockRemoved:
		return fmt.Sprintf("%s %s removed from %s", c.BlockType, c.Block, c.Provisioner)
	}
	return fmt.Sprintf("%s of %s %s → %s", c.Attribute, owner, c.Old, c.New)
}

// refused reports whether a reload cannot apply the change.
func (c Change) refused() bool { return c.Kind == ChangeEngine || c.Kind == ChangePlugin }

// ConfigVersion is which configuration an engine runs: its generation
// (1 at start, one more per reload applied) and its digest (File.Digest).
type ConfigVersion struct {
	Generation int    `json:"generation"`
	Digest     string `json:"digest"`
}

// configVersion is the engine's ConfigVersion, read by GET /status while
// a reload may change it.
type configVersion struct {
	mu sync.Mutex // guards v
	v  ConfigVersion
}

func (c *configVersion) set(gen int, digest string) {
	c.mu.Lock()
	c.v = ConfigVersion{Generation: gen, Digest: digest}
	c.mu.Unlock()
}

func (c *configVersion) get() ConfigVersion {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.v
}

// Reloaded is a reload applied: the configuration the engine now runs and
// what changed, in file order.
type Reloaded struct {
	ConfigVersion
	Changes []Change
}

// Config is the configuration the engine runs, as GET /status shows it.
func (e *Engine) Config() ConfigVersion { return e.version.get() }

// Reload applies to, a configuration read by LoadConfig, in place of
// from, the one the engine runs, between Start and Stop. It checks the
// whole of to first (the engine block unchanged, each changed
// provisioner's block decoded against its plugin's schema) and then
// applies: provisioners added are launched, those changed are
// configured again in place, those removed have their workers let go (a
// busy one finishes its task) and their plugin shut down once they have
// left; the engine's hold on a changed provisioner's profiles is
// lifted, so a profile held as misconfigured is tried again. Anything
// refused, before or while applying, comes back as diagnostics against
// to's file, and what was applied of it is put back: the engine runs
// from as before, and its generation stays. Applied, the generation is
// one more and each change is logged, one line each.
func (e *Engine) Reload(ctx context.Context, from, to *File) (Reloaded, hcl.Diagnostics) {
	stopping := hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Reload not applied", Detail: "The engine is stopping."}}
	select {
	case e.reloads <- struct{}{}:
	case <-ctx.Done():
		return Reloaded{}, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Reload not applied", Detail: "Another reload was under way when this one's time ran out."}}
	case <-e.halted:
		return Reloaded{}, stopping
	}
	if isClosed(e.halted) {
		// Stop began; it takes the token once this reload gives it back.
		<-e.reloads
		return Reloaded{}, stopping
	}
	defer func() { <-e.reloads }()
	if e.ln == nil {
		return Reloaded{}, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Reload not applied", Detail: "The engine has not started; reload it once it runs."}}
	}
	plan, diags := e.planReload(from, to)
	if diags.HasErrors() {
		e.logger.Error("configuration reload refused; the running configuration is kept", "file", to.Path, "digest", to.Digest, "errors", len(diags.Errs()))
		return Reloaded{}, diags
	}
	if diags = e.applyReload(ctx, plan); diags.HasErrors() {
		e.logger.Error("configuration reload refused while applying it; the running configuration is kept", "file", to.Path, "errors", len(diags.Errs()))
		return Reloaded{}, diags
	}
	v := e.version.get()
	v.Generation++
	v.Digest = to.Digest
	e.version.set(v.Generation, v.Digest)
	e.logger.Info("configuration reloaded", "generation", v.Generation, "digest", v.Digest, "changes", len(plan.changes))
	for _, c := range plan.changes {
		e.logger.Info(c.String())
	}
	e.poke()
	return Reloaded{ConfigVersion: v, Changes: plan.changes}, diags
}

// reloadPlan is what a reload does, checked and not yet applied.
type reloadPlan struct {
	changes []Change
	// added are the blocks to launch, removed the provisioners to let
	// go, changed the blocks to configure again with the blocks they
	// replace (for a rollback).
	added   []*host.Block
	removed []string
	changed []changedBlock
}

type changedBlock struct {
	from, to *host.Block
	sup      *supervise.Supervisor
}

// planReload diffs from and to and checks that to can be applied.
func (e *Engine) planReload(from, to *File) (*reloadPlan, hcl.Diagnostics) {
	plan := &reloadPlan{}
	var diags hcl.Diagnostics
	for _, c := range diffEngine(from.Engine, to.Engine) {
		plan.changes = append(plan.changes, c)
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Cannot reload the engine block",
			Detail: fmt.Sprintf("%s: the engine block is read once, at start (its listener, TLS pair and secret are set up then). Put %s back as it was, or restart the engine to change it.",
				c, c.Attribute),
			Subject: engineAttrRange(to, c.Attribute)})
	}
	old := map[string]*host.Block{}
	for _, b := range from.Provisioners {
		old[b.Name] = b
	}
	kept := map[string]bool{}
	for _, b := range to.Provisioners {
		ob := old[b.Name]
		if ob == nil {
			plan.changes = append(plan.changes, Change{Kind: ChangeProvisionerAdded, Provisioner: b.Name})
			plan.added = append(plan.added, b)
			continue
		}
		kept[b.Name] = true
		if cs, d := diffPlugin(ob, b); len(cs) > 0 {
			plan.changes = append(plan.changes, cs...)
			diags = append(diags, d...)
			continue
		}
		sup := e.fleet.get(b.Name)
		if sup == nil {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Provisioner not running",
				Detail: fmt.Sprintf("Provisioner %q is not among the engine's; reload again, or restart the engine.", b.Name), Subject: b.NameRange.Ptr()})
			continue
		}
		schema, oldJSON := sup.Config()
		if schema == nil {
			diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Plugin not running",
				Detail: fmt.Sprintf("Provisioner %q's plugin has not been configured yet, so its block cannot be checked. Reload again once /status shows it running.", b.Name), Subject: b.DefRange.Ptr()})
			continue
		}
		newJSON, d := hclconfig.DecodeConfig(b.Body, schema, nil)
		diags = append(diags, d...)
		if d.HasErrors() {
			continue
		}
		if cs := diffBody(b.Name, schema, oldJSON, newJSON); len(cs) > 0 {
			plan.changes = append(plan.changes, cs...)
			plan.changed = append(plan.changed, changedBlock{from: ob, to: b, sup: sup})
		}
	}
	for _, b := range from.Provisioners {
		if !kept[b.Name] {
			plan.changes = append(plan.changes, Change{Kind: ChangeProvisionerRemoved, Provisioner: b.Name})
			plan.removed = append(plan.removed, b.Name)
		}
	}
	return plan, diags
}

// applyReload applies a checked plan: launches, then configures again,
// then lets go. A launch or a Configure refused undoes what was done
// before it.
func (e *Engine) applyReload(ctx context.Context, plan *reloadPlan) hcl.Diagnostics {
	var started []*supervise.Supervisor
	undoStarts := func() {
		// The reload's own deadline may be what failed it: the undoing
		// has a minute of its own.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		for _, s := range started {
			e.fleet.remove(s.Name())
			e.router.asks.removeTarget(s.Name())
			if _, err := s.Shutdown(uctx); err != nil {
				e.logger.Error("a provisioner launched by a refused reload did not shut down cleanly", "provisioner", s.Name(), "error", err)
			}
		}
	}
	for _, b := range plan.added {
		s, l := e.fleet.newSupervisor(b)
		e.fleet.add(s, l)
		started = append(started, s)
		e.books.wanted([]ownedProfile{{b.Name, ""}})
		if d := s.Start(ctx); d.HasErrors() {
			undoStarts()
			return d
		}
	}
	type done struct {
		c         changedBlock
		oldShapes []shared.Shape
	}
	var configured []done
	for _, c := range plan.changed {
		oldShapes := e.router.asks.shapesOf(c.to.Name)
		shapes, d := c.sup.Reconfigure(ctx, c.to)
		if d.HasErrors() {
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			for _, dc := range slices.Backward(configured) {
				if shapes, back := dc.c.sup.Reconfigure(uctx, dc.c.from); back.HasErrors() {
					e.logger.Error("a provisioner configured by a refused reload could not be put back", "provisioner", dc.c.to.Name, "error", back.Error())
				} else {
					e.retarget(dc.c.sup, shapes)
				}
			}
			undoStarts()
			return d
		}
		e.retarget(c.sup, shapes)
		configured = append(configured, done{c, oldShapes})
	}
	for _, dc := range configured {
		name := dc.c.to.Name
		now := e.router.asks.shapesOf(name)
		var gone, back []ownedProfile
		for _, s := range dc.oldShapes {
			if !slices.ContainsFunc(now, func(n shared.Shape) bool { return n.Profile == s.Profile }) {
				gone = append(gone, ownedProfile{name, s.Profile})
			}
		}
		for _, s := range now {
			back = append(back, ownedProfile{name, s.Profile})
		}
		e.books.wanted(back)
		if n := e.books.letGo(gone); n > 0 {
			e.logger.Info("workers of removed profiles let go: each leaves once its task is done", "provisioner", name, "workers", n)
		}
		lifted := e.router.holds.forget(name)
		e.router.demandMoved()
		if len(lifted) > 0 {
			e.logger.Info("profiles no longer held back: the reload may have fixed them", "provisioner", name, "profiles", lifted)
		}
	}
	for _, name := range plan.removed {
		s := e.fleet.remove(name)
		if s == nil {
			continue
		}
		e.router.asks.removeTarget(name)
		e.router.holds.forget(name)
		e.router.demandMoved()
		n := e.books.letGo([]ownedProfile{{name, ""}})
		e.logger.Info("provisioner removed: its workers are let go, and its plugin shut down once they have left", "provisioner", name, "workers", n)
		e.fleet.retire(s, e.books)
	}
	return nil
}

// retarget tells the router a reconfigured provisioner's new shapes.
func (e *Engine) retarget(s *supervise.Supervisor, shapes []shared.Shape) {
	if p := s.Provisioner(); p != nil {
		// The same plugin, reconfigured: its capabilities stand.
		e.router.asks.setTarget(target{Name: s.Name(), P: p, Shapes: shapes, Packs: e.router.asks.packs(s.Name())})
	}
}

// diffEngine is the attributes of the engine block that differ.
func diffEngine(from, to EngineBlock) []Change {
	var out []Change
	a, b := reflect.ValueOf(from), reflect.ValueOf(to)
	t := a.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("hcl"), ",")
		if name == "" || !f.IsExported() {
			continue
		}
		if x, y := a.Field(i).Interface(), b.Field(i).Interface(); !reflect.DeepEqual(x, y) {
			out = append(out, Change{Kind: ChangeEngine, Attribute: name, Old: jsonText(x), New: jsonText(y)})
		}
	}
	return out
}

// diffPlugin is a provisioner's kind, plugin and sha256 that differ, with
// a diagnostic each: a reload cannot change them.
func diffPlugin(from, to *host.Block) ([]Change, hcl.Diagnostics) {
	var out []Change
	var diags hcl.Diagnostics
	for _, d := range []struct {
		attr     string
		old, new string
		at       hcl.Range
	}{{"kind", from.Kind, to.Kind, to.KindRange}, {"plugin", from.Path, to.Path, to.PluginRange}, {"sha256", from.SHA256, to.SHA256, to.SHA256Range}} {
		if d.old == d.new {
			continue
		}
		c := Change{Kind: ChangePlugin, Provisioner: to.Name, Attribute: d.attr, Old: jsonText(d.old), New: jsonText(d.new)}
		out = append(out, c)
		at := d.at
		if at.Filename == "" {
			at = to.DefRange
		}
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Cannot reload a provisioner's plugin",
			Detail: fmt.Sprintf("%s: a running provisioner keeps its plugin. Put %s back, or restart the engine to change it (or give the block a new name: a reload adds it and removes the old one).",
				c, d.attr),
			Subject: at.Ptr()})
	}
	return out, diags
}

// diffBody is the differences between two of provisioner's blocks as
// decoded against schema (hclconfig.DecodeConfig): its attributes, and
// its nested blocks matched by their labels (or their place, for a
// block type without labels), added, removed or with attributes changed.
func diffBody(provisioner string, schema *shared.Schema, from, to json.RawMessage) []Change {
	var a, b map[string]any
	if json.Unmarshal(from, &a) != nil || json.Unmarshal(to, &b) != nil || schema == nil {
		if bytes.Equal(from, to) {
			return nil
		}
		return []Change{{Kind: ChangeSetting, Provisioner: provisioner, Attribute: "(the block)", Old: "(unreadable)", New: "(changed)"}}
	}
	out := diffAttrs(Change{Provisioner: provisioner}, schema.Attributes, a, b)
	for _, bt := range schema.Blocks {
		olds, news := blocksByKey(bt, a[bt.Name]), blocksByKey(bt, b[bt.Name])
		for _, k := range news.order {
			o, ok := olds.m[k]
			if !ok {
				out = append(out, Change{Kind: ChangeBlockAdded, Provisioner: provisioner, BlockType: bt.Name, Block: k})
				continue
			}
			var attrs []shared.Attribute
			if bt.Body != nil {
				attrs = bt.Body.Attributes
			}
			out = append(out, diffAttrs(Change{Provisioner: provisioner, BlockType: bt.Name, Block: k}, attrs, o, news.m[k])...)
		}
		for _, k := range olds.order {
			if _, ok := news.m[k]; !ok {
				out = append(out, Change{Kind: ChangeBlockRemoved, Provisioner: provisioner, BlockType: bt.Name, Block: k})
			}
		}
	}
	return out
}

// diffAttrs is the attributes of attrs whose values differ between a and
// b, each a ChangeSetting at where.
func diffAttrs(where Change, attrs []shared.Attribute, a, b map[string]any) []Change {
	var out []Change
	for _, at := range attrs {
		x, y := a[at.Name], b[at.Name]
		if reflect.DeepEqual(x, y) {
			continue
		}
		c := where
		c.Kind, c.Attribute, c.Old, c.New = ChangeSetting, at.Name, jsonText(x), jsonText(y)
		if at.Sensitive {
			c.Old, c.New = "(sensitive)", "(sensitive)"
		}
		out = append(out, c)
	}
	return out
}

// keyedBlocks are the blocks of one type, by key, and the keys in order.
type keyedBlocks struct {
	m     map[string]map[string]any
	order []string
}

// blocksByKey keys the decoded blocks of type bt (a JSON list of
// objects) by their labels joined with "/", or by their place ("#1")
// when the type has none.
func blocksByKey(bt shared.BlockType, v any) keyedBlocks {
	kb := keyedBlocks{m: map[string]map[string]any{}}
	list, _ := v.([]any)
	for i, item := range list {
		obj, _ := item.(map[string]any)
		if obj == nil {
			continue
		}
		key := fmt.Sprintf("#%d", i+1)
		if len(bt.Labels) > 0 {
			parts := make([]string, len(bt.Labels))
			for j, l := range bt.Labels {
				parts[j], _ = obj[l].(string)
			}
			key = strings.Join(parts, "/")
		}
		if _, dup := kb.m[key]; dup {
			continue
		}
		kb.m[key] = obj
		kb.order = append(kb.order, key)
	}
	return kb
}

// jsonText is v in JSON, as a change shows it; null for nothing.
func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// engineAttrRange is where the engine block of f sets attr, else the
// block's header, else nil.
func engineAttrRange(f *File, attr string) *hcl.Range {
	file := f.Files[f.Path]
	if file == nil {
		return nil
	}
	content, _, _ := file.Body.PartialContent(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{{Type: "engine"}}})
	if len(content.Blocks) == 0 {
		return nil
	}
	block := content.Blocks[0]
	attrs, _ := block.Body.JustAttributes()
	if a := attrs[attr]; a != nil {
		return a.Expr.Range().Ptr()
	}
	return block.DefRange.Ptr()
}

// retire shuts s down once the books hold none of its workers (each
// was let go and leaves after its task), and takes it out of the fleet;
// when the engine stops first, shutdown shuts it down with the others.
// Its goroutine is the fleet's, waited for by shutdown.
func (f *fleet) retire(s *supervise.Supervisor, books *books) {
	f.mu.Lock()
	f.retiring = append(f.retiring, s)
	f.retirements.Add(1)
	f.mu.Unlock()
	go func() {
		defer f.retirements.Done()
		// A poll with a deadline (the engine's stop), not an event: a
		// removal is rare and its workers leave over seconds.
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for books.countOf(s.Name()) > 0 {
			select {
			case <-tick.C:
			case <-f.stopping:
				return
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		r, err := s.Shutdown(ctx)
		if err != nil {
			// It stays among the retiring: the engine's stop reports it.
			f.logger.Error("removed provisioner's shutdown failed", "provisioner", s.Name(), "error", err)
			return
		}
		var cancelled []string
		if r != nil {
			cancelled = r.Cancelled
		}
		f.logger.Info("removed provisioner shut down", "provisioner", s.Name(), "cancelled", cancelled)
		f.mu.Lock()
		f.retiring = slices.DeleteFunc(f.retiring, func(x *supervise.Supervisor) bool { return x == s })
		f.mu.Unlock()
	}()
}
