package slurm

import (
	"fmt"
	"reflect"
	"slices"

	"github.com/fluksio/provision/shared"
)

// A second Configure replaces the settings in place
// (shared.CapabilityReconfigure): an engine that reloads its
// configuration changes caps and profiles without a new process, so the
// requests outstanding and the workers attached stay where they are.
// What the ssh transport, the relay, the poller and the jobs' tags were
// built from cannot change under them: those attributes (fixedSettings)
// are compared, and a change is refused at its path, the old settings
// kept.

// fixedSettings are the attributes, by their names in the schema, that a
// second Configure may not change: the login and how it is reached (the
// transport is built once), how workers reach the engine (the relay runs
// from Configure), the poller's interval, and where jobs write their
// output (a job already submitted keeps its path).
var fixedSettings = []string{"login", "ssh_port", "ssh_key", "known_hosts", "ssh_config", "ssh_options",
	"multiplex", "max_sessions", "reach", "relay_listen", "relay_host", "relay_command", "poll_interval", "log_dir"}

// reconfigure applies next, a configuration already checked, in place of
// the current one: the attributes of fixedSettings must be as they are.
// A profile that is gone has its queued machines given up (scancel, as
// when the demand falls); its machines running stay, their workers the
// engine's to let go. A profile held as misconfigured is tried again:
// the new configuration is the fix the hold waited for. Counts,
// requests and attached workers of the profiles that stay are kept.
func (p *Provisioner) reconfigure(next *settings) (*shared.ConfigureResponse, error) {
	p.mu.Lock()
	cur := p.cfg
	if p.shut {
		p.mu.Unlock()
		return nil, shared.ErrShutdown
	}
	var diags shared.Diagnostics
	if next.name != cur.name || next.engineID != cur.engineID || next.epoch != cur.epoch {
		p.mu.Unlock()
		return nil, fmt.Errorf("%w: a second Configure must carry the same name, engine id and credential epoch", shared.ErrInvalidArgument)
	}
	for _, name := range fixedSettings {
		if !reflect.DeepEqual(fieldByTag(&cur.Config, name), fieldByTag(&next.Config, name)) {
			diags = append(diags, shared.Errorf([]string{name}, "Cannot change while running",
				"%s cannot change while the engine runs: the ssh connection, the relay and the poller were set up with it. Put it back, or restart the engine to change it.", name))
		}
	}
	if diags.HasErrors() {
		p.mu.Unlock()
		return &shared.ConfigureResponse{Diagnostics: diags}, nil
	}
	next.log = cur.log
	var gone []string
	for _, prof := range cur.Profiles {
		if !slices.ContainsFunc(next.Profiles, func(n Profile) bool { return n.Name == prof.Name }) {
			gone = append(gone, prof.Name)
		}
	}
	now := p.now()
	var cancels []jobRef
	for _, name := range gone {
		cancels = append(cancels, p.giveUpPendingLocked(name, maxCap, now)...)
		delete(p.holds.backoff, name)
	}
	var retried []string
	for name, b := range p.holds.backoff {
		if b.hold.kind == holdMisconfigured {
			delete(p.holds.backoff, name)
			retried = append(retried, name)
		}
	}
	p.cfg = next
	// The queue was built with the first configuration; its budget's
	// rate is the one attribute of it a reload changes.
	p.q.SetMaxRPCRate(next.maxRPCRate)
	p.startLocked(next, nil, cancels)
	p.mu.Unlock()
	slices.Sort(retried)
	next.log.Info("configured again", "profiles_removed", gone, "misconfigured_retried", retried, "pending_given_up", len(cancels))
	return &shared.ConfigureResponse{}, nil
}

// fieldByTag is the field of c whose JSON name is name, nil if none.
func fieldByTag(c *Config, name string) any {
	v := reflect.ValueOf(c).Elem()
	t := v.Type()
	for i := range t.NumField() {
		if tag := t.Field(i).Tag.Get("json"); tag == name {
			return v.Field(i).Interface()
		}
	}
	return nil
}
