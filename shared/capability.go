package shared

import (
	"slices"
	"strconv"
	"strings"
)

// Capability names something one side of the contract offers the other
// beyond the required methods. A plugin lists its own in
// InfoResponse.Capabilities, a host in the Hello of the host channel; the
// other side reads them with HasCapability, and ignores names it does not
// know. See provisioner.proto's InfoResponse and Hello.
type Capability string

const (
	// CapabilityBatchMint: the host answers MintCredentials, many
	// credentials in one round trip (contract 2.4). A host offers it.
	CapabilityBatchMint Capability = "batch_mint"
	// CapabilityReconcileDelta: the plugin takes a Reconcile by change
	// (ReconcileRequest.Delta, contract 2.4). A plugin offers it.
	CapabilityReconcileDelta Capability = "reconcile_delta"
	// CapabilityReachProbe: the plugin's Check runs the reach probe
	// when CheckRequest.Probe asks (contract 2.7).
	CapabilityReachProbe Capability = "reach_probe"
	// CapabilityReconfigure: a second Configure replaces the plugin's
	// settings in place, keeping its outstanding requests and attached
	// workers; one it refuses (error diagnostics) leaves the settings
	// as they were. An engine reloads such a plugin's block without a
	// new process. A plugin offers it.
	CapabilityReconfigure Capability = "reconfigure"
	// CapabilityWorkerSlots: the plugin's workers run as many tasks at
	// once as their machine holds (they attach naming the worker
	// protocol's feature "slots", as fluksio-worker does). A host then
	// asks it for machines by what they hold, not one a task: N
	// waiting one-CPU tasks are ceil(N/16) machines of a 16-CPU shape
	// (contract 2.8, a capability an older host ignores). A plugin
	// offers it.
	CapabilityWorkerSlots Capability = "worker_slots"
)

// contract24 is what a peer of contract 2.4 offers without saying so:
// it spoke before capabilities were declared, and its version was how it
// said them.
var contract24 = []Capability{CapabilityBatchMint, CapabilityReconcileDelta}

// HasCapability reports whether a peer that says contract and declares
// declared offers c. From contract 2.5 on only what it declares counts:
// a peer that declares nothing offers nothing. A peer of 2.4, which could
// not declare, offers the 2.4 set (CapabilityBatchMint for a host,
// CapabilityReconcileDelta for a plugin) and whatever it does declare; an
// older or unreadable version offers only what it declares.
//
// It is the one place a contract version is read to decide what a peer
// can do: no feature is gated on a version anywhere else.
func HasCapability(contract string, declared []Capability, c Capability) bool {
	if slices.Contains(declared, c) {
		return true
	}
	major, minor, ok := strings.Cut(contract, ".")
	if !ok || major != "2" {
		return false
	}
	n, err := strconv.Atoi(minor)
	return err == nil && n == 4 && slices.Contains(contract24, c)
}
