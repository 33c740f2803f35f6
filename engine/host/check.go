package host

import (
	"context"
	"errors"
	"fmt"

	"github.com/hashicorp/hcl/v2"

	"github.com/fluksio/provision/engine/hclconfig"
	"github.com/fluksio/provision/shared"
)

// Check is Validate and then the plugin's preflight (shared.Checker): the
// configuration against the real system it names, read-only and bounded
// by ctx. Diagnostics carry the block's ranges, as Validate's do; facts
// are what the check learned. A plugin of a contract before 2.2, or one
// that offers no preflight, gets a warning saying so, not an error: its
// configuration is as valid as Validate says. A Validator does the same
// for many blocks with one process per plugin binary.
func Check(ctx context.Context, b *Block, engineID string) ([]shared.Fact, hcl.Diagnostics) {
	var v Validator
	defer v.Close()
	return v.Check(ctx, b, engineID)
}

// check runs l's plugin's preflight over l's block, whose validation gave
// diags.
func check(ctx context.Context, l *launched, engineID string, diags hcl.Diagnostics, probe bool) ([]shared.Fact, hcl.Diagnostics) {
	b := l.cfg
	checker, ok := l.plugin.Provisioner().(shared.Checker)
	if !ok {
		return nil, append(diags, noPreflight(b))
	}
	if probe && !shared.HasCapability(l.info.ContractVersion, l.info.Capabilities, shared.CapabilityReachProbe) {
		probe = false
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagWarning, Summary: "No reach probe for this kind",
			Detail:  fmt.Sprintf("The %q plugin does not offer a reach probe (contract 2.7's reach_probe); only its check ran.", b.Kind),
			Subject: b.KindRange.Ptr()})
	}
	resp, err := checker.Check(ctx, &shared.CheckRequest{Name: b.Name, Config: l.json, EngineID: engineID, Probe: probe})
	switch {
	case errors.Is(err, shared.ErrUnimplemented):
		return nil, append(diags, noPreflight(b))
	case err != nil:
		return nil, append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Preflight failed",
			Detail:  fmt.Sprintf("The %s plugin could not run its check: %v.", b.Kind, err),
			Subject: b.DefRange.Ptr()})
	}
	return resp.Facts, appendNew(diags, hclconfig.ConfigDiagnostics(b.Body, l.schema, resp.Diagnostics))
}

// appendNew appends to diags those of more it does not hold already: a
// plugin's check validates the configuration again, and its warnings
// are the ones its Validate gave, to be shown once.
func appendNew(diags, more hcl.Diagnostics) hcl.Diagnostics {
	type key struct {
		sev             hcl.DiagnosticSeverity
		summary, detail string
		at              hcl.Range
	}
	keyOf := func(d *hcl.Diagnostic) key {
		k := key{sev: d.Severity, summary: d.Summary, detail: d.Detail}
		if d.Subject != nil {
			k.at = *d.Subject
		}
		return k
	}
	seen := make(map[key]bool, len(diags))
	for _, d := range diags {
		seen[keyOf(d)] = true
	}
	for _, d := range more {
		if k := keyOf(d); !seen[k] {
			seen[k] = true
			diags = append(diags, d)
		}
	}
	return diags
}

func noPreflight(b *Block) *hcl.Diagnostic {
	return &hcl.Diagnostic{Severity: hcl.DiagWarning, Summary: "No preflight for this kind",
		Detail:  fmt.Sprintf("The %q plugin does not offer a check against its system (contract 2.2's Check); only the static validation above was done.", b.Kind),
		Subject: b.KindRange.Ptr()}
}

// Preview asks the plugin what it would submit for profile (shared.Previewer),
// without submitting or touching the network. An unknown profile, or any
// other problem, comes back as diagnostics.
func Preview(ctx context.Context, b *Block, profile string) (string, hcl.Diagnostics) {
	l, diags := resolve(ctx, b, LaunchConfig{}, false)
	if l != nil {
		defer l.plugin.Kill()
	}
	if diags.HasErrors() {
		return "", diags
	}
	previewer, ok := l.plugin.Provisioner().(shared.Previewer)
	var resp *shared.PreviewResponse
	var err error
	if ok {
		resp, err = previewer.Preview(ctx, &shared.PreviewRequest{Name: b.Name, Config: l.json, Profile: profile})
	}
	switch {
	case !ok || errors.Is(err, shared.ErrUnimplemented):
		return "", append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "No preview for this kind",
			Detail:  fmt.Sprintf("The %q plugin cannot show what it would submit (contract 2.2's Preview).", b.Kind),
			Subject: b.KindRange.Ptr()})
	case err != nil:
		return "", append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Preview failed",
			Detail: fmt.Sprintf("The %s plugin could not preview profile %q: %v.", b.Kind, profile, err), Subject: b.DefRange.Ptr()})
	}
	mapped := hclconfig.ConfigDiagnostics(b.Body, l.schema, resp.Diagnostics)
	for i, d := range resp.Diagnostics {
		// One about the request (an unknown profile) is about no line
		// of the block: its header says which block, not its whole body.
		if len(d.Path) == 0 {
			mapped[i].Subject = b.DefRange.Ptr()
		}
	}
	return resp.Text, append(diags, mapped...)
}
