package main

import (
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/shared"
)

// TestStatusCommand runs host-example status against an engine with a
// real plugin (examples/testplugin) and a need that waits: what it
// prints is the engine's own /status, for a terminal; with the operator
// token from -token-env; and a wrong token is refused with what to do.
func TestStatusCommand(t *testing.T) {
	logger, _ := testLogger(t)
	const token = "0123456789abcdef-operator"
	op := newOperatorAuth(token, host.NewSigner(testSecret), logger)
	e := serveOperator(t, op, 0, "127.0.0.1:0", memoryProvisioner(t), engine.Hooks{})
	id := e.Add(shared.Need{CPUs: 64}, 0)

	t.Setenv("FLUKSIO_TEST_OPERATOR", token)
	var out, errOut strings.Builder
	var code int
	// The need's reason comes from the run loop's first pass.
	deadline := time.Now().Add(10 * time.Second)
	for {
		out.Reset()
		errOut.Reset()
		code = statusMain([]string{"-token-env", "FLUKSIO_TEST_OPERATOR", e.URL()}, &out, &errOut)
		if code != 0 || strings.Contains(out.String(), id+" (cpus=64)") || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code != 0 {
		t.Fatalf("exit %d: %s", code, &errOut)
	}
	t.Logf("status:\n%s", &out)
	for _, want := range []string{"engine test at " + strings.TrimSuffix(e.URL(), "/") + ",", "provisioners\n  slurm  memory", "workers: 0 attached, 0 busy, 0 idle", "needs: 1 waiting (1 ", id + " (cpus=64): waiting"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in:\n%s", want, &out)
		}
	}

	// Asked with a limit, it lists ten and counts the rest from the
	// engine's summary.
	for range 24 {
		e.Add(shared.Need{CPUs: 64}, 0)
	}
	out.Reset()
	if code := statusMain([]string{"-token-env", "FLUKSIO_TEST_OPERATOR", e.URL()}, &out, &errOut); code != 0 ||
		!strings.Contains(out.String(), "needs: 25 waiting (") || !strings.Contains(out.String(), "… and 15 more waiting") {
		t.Errorf("25 waiting: exit %d\n%s", code, &out)
	}

	t.Setenv("FLUKSIO_TEST_OPERATOR", token+"x")
	errOut.Reset()
	if code := statusMain([]string{"-token-env", "FLUKSIO_TEST_OPERATOR", e.URL()}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "401 Unauthorized: the operator's endpoints answer") {
		t.Errorf("a wrong token: exit %d, %q", code, &errOut)
	}
	if code := statusMain([]string{"ftp://x"}, &out, &errOut); code != 2 {
		t.Errorf("a bad URL: exit %d", code)
	}
}
