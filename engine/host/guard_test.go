package host

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/internal/testutil"
	"github.com/fluksio/provision/shared"
)

func TestHostGuard(t *testing.T) {
	var claims []CredentialClaims
	signer := signerFunc(func(c CredentialClaims, ttl time.Duration) (string, time.Time, error) {
		claims = append(claims, c)
		return "signed:" + c.Worker, time.Unix(0, 0).Add(ttl), nil
	})
	var got []shared.Event
	g := &hostGuard{name: "hpc", signer: signer, maxTTL: 2 * time.Hour, onEvent: func(e shared.Event) { got = append(got, e) }, logger: nullLogger()}
	for _, tc := range []struct {
		worker string
		ok     bool
	}{
		{"hpc-cpu-0a1b2c3d", true},
		{"hpc-", false},
		{"hpc", false},
		{"hpcx-cpu-1", false},
		{"other-cpu-1", false},
		{"hpc-cpu-1;rm -rf /", false},
		{"hpc-cpu-1\n", false},
	} {
		_, err := g.MintCredential(context.Background(), &shared.MintCredentialRequest{Worker: tc.worker, TTL: time.Minute, CPUs: 1})
		if tc.ok != (err == nil) || (!tc.ok && !errors.Is(err, shared.ErrPermissionDenied)) {
			t.Errorf("mint %q: err %v, want ok=%v", tc.worker, err, tc.ok)
		}
	}
	r, err := g.MintCredential(context.Background(), &shared.MintCredentialRequest{Worker: "hpc-a-1", TTL: 100 * time.Hour, CPUs: 1})
	if err != nil || !r.Expires.Equal(time.Unix(0, 0).Add(2*time.Hour)) {
		t.Errorf("the TTL was not capped: %+v %v", r, err)
	}
	// No TTL: the default, not the cap.
	r, err = g.MintCredential(context.Background(), &shared.MintCredentialRequest{Worker: "hpc-a-2", CPUs: 1})
	if err != nil || !r.Expires.Equal(time.Unix(0, 0).Add(DefaultCredentialTTL)) {
		t.Errorf("no TTL: %+v %v; want %s", r, err, DefaultCredentialTTL)
	}
	// The credential binds the shape the plugin asked for and the
	// guard's own name as the provisioner.
	claims = nil
	if _, err := g.MintCredential(context.Background(), &shared.MintCredentialRequest{Worker: "hpc-gpu-1", TTL: time.Minute, CPUs: 4, GPUs: 1, RAMMB: 16000, Labels: []string{"cuda"}}); err != nil {
		t.Fatal(err)
	}
	want := CredentialClaims{Worker: "hpc-gpu-1", Provisioner: "hpc", CPUs: 4, GPUs: 1, RAMMB: 16000, Labels: []string{"cuda"}}
	if len(claims) != 1 || !reflect.DeepEqual(claims[0], want) {
		t.Errorf("signed %+v; want %+v", claims, want)
	}
	// A credential for no shape at all, or a label that could mean
	// something to a shell, is refused.
	for _, req := range []*shared.MintCredentialRequest{
		{Worker: "hpc-a-3", TTL: time.Minute},
		{Worker: "hpc-a-3", TTL: time.Minute, CPUs: 1, GPUs: -1},
		{Worker: "hpc-a-3", TTL: time.Minute, CPUs: 1, Labels: []string{"a b"}},
	} {
		if _, err := g.MintCredential(context.Background(), req); !errors.Is(err, shared.ErrInvalidArgument) {
			t.Errorf("mint %+v: err %v; want invalid argument", req, err)
		}
	}
	_ = g.Publish(context.Background(), shared.Event{Provisioner: "impostor", Kind: shared.EventWorkerProvisioned})
	if len(got) != 1 || got[0].Provisioner != "hpc" || got[0].Time.IsZero() {
		t.Errorf("event not stamped: %+v", got)
	}
}

type signerFunc func(CredentialClaims, time.Duration) (string, time.Time, error)

func (f signerFunc) Sign(c CredentialClaims, ttl time.Duration) (string, time.Time, error) {
	return f(c, ttl)
}

func nullLogger() hclog.Logger { return hclog.NewNullLogger() }

// TestHostGuardHoldsMintsToShapes: once the provisioner's shapes are
// known, a credential larger than its largest shape in any dimension, or
// with a label none of its shapes has, is refused with the provisioner's
// name in the log; a profile's own shape, and anything within the
// largest in every dimension, is signed. Before the shapes are known, a
// supervised plugin's mint is refused.
func TestHostGuardHoldsMintsToShapes(t *testing.T) {
	var signed int
	signer := signerFunc(func(c CredentialClaims, ttl time.Duration) (string, time.Time, error) {
		signed++
		return "signed:" + c.Worker, time.Unix(0, 0).Add(ttl), nil
	})
	logger, logs := testutil.Logger(t)
	g := &hostGuard{name: "hpc", signer: signer, maxTTL: time.Hour, logger: logger, shapesFirst: true}
	mint := func(cpus, gpus int, ram int64, labels ...string) error {
		_, err := g.MintCredential(context.Background(), &shared.MintCredentialRequest{Worker: "hpc-x-1", TTL: time.Minute,
			CPUs: cpus, GPUs: gpus, RAMMB: ram, Labels: labels})
		return err
	}
	if err := mint(1, 0, 1000); !errors.Is(err, shared.ErrNotConfigured) || signed != 0 {
		t.Fatalf("a mint before the shapes are known: %v, %d signed; want not configured, none", err, signed)
	}
	g.limitTo([]shared.Shape{
		{Profile: "small", CPUs: 1, RAMMB: 1000},
		{Profile: "gpu", CPUs: 4, GPUs: 1, RAMMB: 16000, Labels: []string{"cuda"}},
	})
	for _, tc := range []struct {
		cpus, gpus int
		ram        int64
		labels     []string
		ok         bool
	}{
		{1, 0, 1000, nil, true},
		{4, 1, 16000, []string{"cuda"}, true},
		{4, 1, 16000, []string{"gpu", "small"}, true}, // profile names are labels too
		{2, 0, 0, nil, true},                          // within the largest in every dimension
		{1 << 30, 1 << 30, 1000, nil, false},          // the attack's
		{5, 1, 16000, nil, false},
		{4, 2, 16000, nil, false},
		{4, 1, 16001, nil, false},
		{1, 0, 1000, []string{"a100"}, false},
	} {
		before := signed
		err := mint(tc.cpus, tc.gpus, tc.ram, tc.labels...)
		if tc.ok != (err == nil) || (!tc.ok && !errors.Is(err, shared.ErrPermissionDenied)) || (signed > before) != tc.ok {
			t.Errorf("mint cpus %d gpus %d ram_mb %d labels %v: err %v, signed %v; want ok=%v", tc.cpus, tc.gpus, tc.ram, tc.labels, err, signed > before, tc.ok)
		}
	}
	refusals := strings.Count(logs.String(), "no profile of the provisioner offers its shape")
	if refusals != 5 || strings.Count(logs.String(), "provisioner=hpc") != 6 {
		t.Errorf("the log has %d shape refusals; want 5, each naming provisioner hpc (and the one before the shapes):\n%s", refusals, logs.String())
	}
}
