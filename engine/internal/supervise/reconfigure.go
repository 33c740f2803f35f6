package supervise

import (
	"context"
	"encoding/json"

	"github.com/hashicorp/hcl/v2"

	"github.com/fluksio/provision/engine/hclconfig"
	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/shared"
)

// configure sends raw, block b decoded against the plugin's schema, to
// l's Configure with the engine's identity, and reads its shapes, to
// which l's mints are held from then on (host.Launched.Configure);
// diagnostics point into b.
func (s *Supervisor) configure(ctx context.Context, l *host.Launched, b *host.Block, raw json.RawMessage) ([]shared.Shape, hcl.Diagnostics) {
	return l.Configure(ctx, b, &shared.ConfigureRequest{Name: s.name, Config: raw,
		EngineID: s.opts.EngineID, CredentialEpoch: s.opts.CredentialEpoch, EngineAddress: s.opts.EngineAddress})
}

// Config is the schema of the running plugin and the JSON its block
// was decoded to when it was configured; nil before the first start.
func (s *Supervisor) Config() (*shared.Schema, json.RawMessage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.schema, s.config
}

// Reconfigure configures the running plugin again from b, a block of
// the same kind and name (a reload), in place: no new process, so what
// it asked for and what attached stay. The plugin must offer
// shared.CapabilityReconfigure, its path and pin must be as they are,
// and it must be running; a refusal (by the plugin or here) leaves it
// configured as it was, and the diagnostics point into b. On success
// the plugin's new shapes come back, and a restart from now on
// configures the new process from b. It holds no lock across the call.
func (s *Supervisor) Reconfigure(ctx context.Context, b *host.Block) ([]shared.Shape, hcl.Diagnostics) {
	s.mu.Lock()
	old, cur, schema, info, running := s.cfg, s.current, s.schema, s.info, s.phase == host.PhaseRunning && !s.stopping
	s.mu.Unlock()
	refuse := func(summary, detail string, at hcl.Range) ([]shared.Shape, hcl.Diagnostics) {
		return nil, hcl.Diagnostics{{Severity: hcl.DiagError, Summary: summary, Detail: detail, Subject: at.Ptr()}}
	}
	switch {
	case b.Kind != s.kind || b.Name != s.name:
		return refuse("Another provisioner", "Reconfigure takes a block of the same kind and name.", b.DefRange)
	case b.Path != old.Path:
		return refuse("Plugin path changed", "A reload cannot change a provisioner's plugin ("+old.Path+" to "+b.Path+"). Put it back, or restart the engine to change it.", b.PluginAt())
	case b.SHA256 != old.SHA256:
		return refuse("Plugin pin changed", "A reload cannot change a provisioner's sha256. Put it back, or restart the engine to change it.", b.SHA256Range)
	case !running || cur == nil || schema == nil:
		return refuse("Plugin not running", "Provisioner "+s.name+"'s plugin is not running now (it is restarting, failed or stopping), so it cannot be configured again. Reload again once /status shows it running.", b.DefRange)
	case !shared.HasCapability(info.ContractVersion, info.Capabilities, shared.CapabilityReconfigure):
		return refuse("Plugin cannot be configured again", "Provisioner "+s.name+"'s plugin does not take a second Configure (it does not offer the \"reconfigure\" capability). Put the block back as it was, or restart the engine to change it.", b.DefRange)
	}
	raw, diags := hclconfig.DecodeConfig(b.Body, schema, nil)
	if diags.HasErrors() {
		return nil, diags
	}
	shapes, more := s.configure(ctx, cur, b, raw)
	diags = append(diags, more...)
	if diags.HasErrors() {
		return nil, diags
	}
	s.mu.Lock()
	if s.current != cur {
		// The process restarted meanwhile, configured from the old
		// block: the new one applied to a process that is gone.
		s.mu.Unlock()
		return refuse("Plugin restarted", "Provisioner "+s.name+"'s plugin restarted while it was being configured again, and runs the old configuration. Reload again.", b.DefRange)
	}
	s.cfg, s.config = b, raw
	s.mu.Unlock()
	return shapes, diags
}
