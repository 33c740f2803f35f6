package host

import (
	"context"
	"strings"
	"sync"

	"github.com/hashicorp/hcl/v2"

	"github.com/fluksio/provision/shared"
)

// Validator validates provisioner blocks as Validate and Check do, with
// one plugin process per plugin binary (one path and pin) however many
// blocks name it: Info and Schema do not depend on a block, and
// ValidateConfig and Check need no Configure and change nothing in the
// plugin, so one process answers for every block. A file of 200 blocks
// costs one start, not 200.
//
// A plugin that did not start is not started again for the next block of
// the same binary: each such block gets the same diagnostic at its own
// range. One that exits after starting is started again for the next
// block that needs it.
//
// The zero value is ready to use; Close stops the plugins it started.
// Its methods may be called from several goroutines.
type Validator struct {
	// Env is added to the environment of each plugin it starts
	// (LaunchConfig.Env), such as shared.ProbeAnswerEnv for a probe; set it
	// before the first call.
	Env []string

	mu      sync.Mutex // guards plugins
	plugins map[pluginKey]*validatorPlugin
}

// pluginKey names a plugin binary: its path and its pin, as the block
// gives them (an unpinned and a pinned block of one path are two).
type pluginKey struct{ path, sha256 string }

// validatorPlugin is one started binary: l is set when it runs, failed
// when it did not start or could not say what it is.
type validatorPlugin struct {
	l      *launched
	failed func(*Block) hcl.Diagnostics
}

// Validate decodes b against its plugin's schema and asks the plugin to
// validate it, as the package's Validate does.
func (v *Validator) Validate(ctx context.Context, b *Block) hcl.Diagnostics {
	_, diags := v.resolve(ctx, b)
	return diags
}

// Check is Validate and then the plugin's preflight, as the package's
// Check does.
func (v *Validator) Check(ctx context.Context, b *Block, engineID string) ([]shared.Fact, hcl.Diagnostics) {
	l, diags := v.resolve(ctx, b)
	if diags.HasErrors() {
		return nil, diags
	}
	return check(ctx, l, engineID, diags, false)
}

// Probe is Check with the plugin's reach probe (contract 2.7,
// shared.CapabilityReachProbe): the one part of a check that submits a
// job, whose worker asks the engine's URL from a compute node whether it
// is reachable there. The caller serves the engine's probe answer where
// the engine listens (engine.File's ServeProbe) while it runs. A plugin
// that offers no probe is checked as by Check, with a warning saying so.
func (v *Validator) Probe(ctx context.Context, b *Block, engineID string) ([]shared.Fact, hcl.Diagnostics) {
	l, diags := v.resolve(ctx, b)
	if diags.HasErrors() {
		return nil, diags
	}
	return check(ctx, l, engineID, diags, true)
}

// Close stops every plugin the Validator started and waits for them to
// be gone. A Validator used again after Close starts its plugins anew.
func (v *Validator) Close() {
	v.mu.Lock()
	plugins := v.plugins
	v.plugins = nil
	v.mu.Unlock()
	for _, vp := range plugins {
		if vp.l != nil {
			vp.l.plugin.Kill()
		}
	}
}

// resolve is the package's resolve (without configure) over a shared
// plugin: l is b's own, its plugin the binary's.
func (v *Validator) resolve(ctx context.Context, b *Block) (*launched, hcl.Diagnostics) {
	if diags := findPlugin(b); diags != nil {
		return nil, diags
	}
	lctx, cancel := context.WithTimeout(ctx, launchTimeout(0))
	defer cancel()
	base, failed := v.plugin(lctx, b)
	if failed != nil {
		return nil, failed(b)
	}
	l := *base
	l.cfg = b
	return &l, fitBlock(lctx, &l, false)
}

// plugin returns b's binary's plugin, starting it if no block has yet, or
// if the one started has exited since.
func (v *Validator) plugin(ctx context.Context, b *Block) (*launched, func(*Block) hcl.Diagnostics) {
	key := pluginKey{b.Path, strings.ToLower(b.SHA256)}
	v.mu.Lock()
	defer v.mu.Unlock()
	if vp, ok := v.plugins[key]; ok {
		if vp.l == nil || !exited(vp.l.plugin) {
			return vp.l, vp.failed
		}
		vp.l.plugin.Kill()
	}
	l, failed := startPlugin(ctx, b, LaunchConfig{Env: v.Env}, false)
	if failed != nil && l != nil {
		l.plugin.Kill()
		l = nil
	}
	if v.plugins == nil {
		v.plugins = map[pluginKey]*validatorPlugin{}
	}
	v.plugins[key] = &validatorPlugin{l: l, failed: failed}
	return l, failed
}

func exited(p *Plugin) bool {
	select {
	case <-p.Exited():
		return true
	default:
		return false
	}
}
