package main

// A hang mode, for tests of a host that must not let one plugin stall
// the others: with TESTPLUGIN_HANG naming a provisioner (the name it is
// configured with), that provisioner's Provision and Reconcile never
// answer, as a plugin stuck on a dead file system would not. Every other
// provisioner, and every other call, behaves as usual.

import (
	"context"
	"os"
	"sync"

	"github.com/fluksio/provision/shared"
)

// hangEnv names the provisioner that hangs.
const hangEnv = "TESTPLUGIN_HANG"

type hanging struct {
	shared.Provisioner

	mu   sync.Mutex // guards hang
	hang bool
}

// withHang wraps p so that it hangs if TESTPLUGIN_HANG names it.
func withHang(p shared.Provisioner) shared.Provisioner {
	if os.Getenv(hangEnv) == "" {
		return p
	}
	return &hanging{Provisioner: p}
}

func (h *hanging) Configure(ctx context.Context, req *shared.ConfigureRequest) (*shared.ConfigureResponse, error) {
	h.mu.Lock()
	h.hang = req.Name == os.Getenv(hangEnv)
	h.mu.Unlock()
	return h.Provisioner.Configure(ctx, req)
}

// wait blocks for good if this provisioner hangs: it ignores its context,
// as a stuck plugin does.
func (h *hanging) wait() {
	h.mu.Lock()
	hang := h.hang
	h.mu.Unlock()
	if hang {
		select {}
	}
}

func (h *hanging) Provision(ctx context.Context, req *shared.ProvisionRequest) (*shared.ProvisionResponse, error) {
	h.wait()
	return h.Provisioner.Provision(ctx, req)
}

func (h *hanging) Reconcile(ctx context.Context, req *shared.ReconcileRequest) (*shared.ReconcileResponse, error) {
	h.wait()
	return h.Provisioner.Reconcile(ctx, req)
}
