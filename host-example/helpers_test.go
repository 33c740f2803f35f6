package main

import (
	"bytes"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/testutil"
)

// lockedBuffer is a buffer goroutines write while the test reads it.
type lockedBuffer = testutil.Buffer

func testLogger(t *testing.T) (hclog.Logger, *lockedBuffer) { return testutil.Logger(t) }

// testSecret is a fixed secret, so that failures reproduce.
var testSecret = bytes.Repeat([]byte("0123456789abcdef"), 2)

// claims are what a test credential for worker binds: provisioner
// "slurm" and a roomy shape.
func claims(worker string) host.CredentialClaims {
	return host.CredentialClaims{Worker: worker, Provisioner: "slurm", CPUs: 4, GPUs: 1, RAMMB: 8000, Labels: []string{"gpu"}}
}
