package engine

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/shared"
)

// TestAdmission: a worker attaches only as the job its provisioner
// recorded, once; another provisioner's events change nothing; records
// and revocations are forgotten once no credential could still use them.
func TestAdmission(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	a := newAdmission(func() time.Time { return now })
	cred := host.Credential{CredentialClaims: claims("slurm-gpu-1")}
	refusal := func(d denial, _ string) denial { return d }
	if r := refusal(a.admit(cred, "7")); r != jobNotYet {
		t.Errorf("before any event: %v; want jobNotYet", r)
	}
	a.observe(shared.Event{Kind: shared.EventWorkerProvisioned, Provisioner: "slurm", Worker: "slurm-gpu-1", Job: "7"})
	if d, why := a.admit(cred, "7"); d != allowed {
		t.Errorf("as its recorded job: %v %s", d, why)
	}
	if r := refusal(a.admit(cred, "8")); r != jobMismatch {
		t.Errorf("as another job: %v; want jobMismatch", r)
	}
	other := host.Credential{CredentialClaims: host.CredentialClaims{Worker: "slurm-gpu-1", Provisioner: "squat", CPUs: 1}}
	if r := refusal(a.admit(other, "7")); r != jobMismatch {
		t.Errorf("another provisioner's credential for the name: %v; want jobMismatch", r)
	}
	if a.ownedBy("slurm-gpu-1", "squat") || !a.ownedBy("slurm-gpu-1", "slurm") {
		t.Error("ownedBy does not follow the record")
	}
	if revoke, err := a.observe(shared.Event{Kind: shared.EventWorkerCancelled, Provisioner: "squat", Worker: "slurm-gpu-1"}); revoke || !errors.Is(err, errOtherProvisioner) {
		t.Errorf("another provisioner's cancel: revoke %v, err %v", revoke, err)
	}
	if revoke, err := a.observe(shared.Event{Kind: shared.EventWorkerCancelled, Provisioner: "slurm", Worker: "slurm-gpu-1"}); !revoke || err != nil {
		t.Errorf("its own cancel: revoke %v, err %v", revoke, err)
	}
	if r := refusal(a.admit(cred, "7")); r != nameRevoked {
		t.Errorf("after the cancel: %v; want nameRevoked", r)
	}
	now = now.Add(host.DefaultMaxCredentialTTL + time.Second)
	a.sweep()
	if len(a.revoked) != 0 || len(a.jobs) != 0 {
		t.Errorf("after the longest credential's life: %d revocations, %d records kept", len(a.revoked), len(a.jobs))
	}
	if err := allows(claims("w"), 4, 1, 8000, []string{"gpu"}); err != nil {
		t.Errorf("exactly what was minted: %v", err)
	}
	if err := allows(claims("w"), 4, 1, 8000, []string{"a\nb"}); err == nil || strings.Contains(err.Error(), "a\nb") {
		t.Errorf("a label with a newline: %v; want a refusal that quotes it", err)
	}
}
