package shared

import "testing"

// TestHasCapability: what a peer declares counts whatever its version; a
// peer of 2.4 that declares nothing offers the 2.4 set; a peer of 2.3, or
// of 2.5 and later, that declares nothing offers nothing.
func TestHasCapability(t *testing.T) {
	for _, tc := range []struct {
		contract string
		declared []Capability
		c        Capability
		want     bool
	}{
		{"2.3", nil, CapabilityBatchMint, false},
		{"2.3", []Capability{CapabilityBatchMint}, CapabilityBatchMint, true},
		{"2.3", []Capability{CapabilityBatchMint}, CapabilityReconcileDelta, false},
		{"2.4", nil, CapabilityBatchMint, true},
		{"2.4", nil, CapabilityReconcileDelta, true},
		{"2.4", []Capability{"c"}, CapabilityReconcileDelta, true},
		{"2.4", nil, "something_new", false},
		{"2.5", nil, CapabilityBatchMint, false},
		{"2.5", nil, CapabilityReconcileDelta, false},
		{"2.5", []Capability{CapabilityReconcileDelta}, CapabilityReconcileDelta, true},
		{"2.10", nil, CapabilityBatchMint, false},
		{"", nil, CapabilityBatchMint, false},
		{"", []Capability{CapabilityBatchMint}, CapabilityBatchMint, true},
		{"3.4", nil, CapabilityBatchMint, false},
		{"2", nil, CapabilityBatchMint, false},
		{"x.y", nil, CapabilityBatchMint, false},
	} {
		if got := HasCapability(tc.contract, tc.declared, tc.c); got != tc.want {
			t.Errorf("HasCapability(%q, %v, %s) = %v; want %v", tc.contract, tc.declared, tc.c, got, tc.want)
		}
	}
}
