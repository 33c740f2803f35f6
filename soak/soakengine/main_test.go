package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/fluksio/provision/engine/host"
)

// TestEngineSecret: the secret in secret_env's variable is the engine's,
// which a restarted engine needs to accept its workers again, and the
// variable is unset once read; one too short is an error naming the
// variable; without one the run makes its own.
func TestEngineSecret(t *testing.T) {
	const name = "SOAKENGINE_TEST_SECRET"
	want := strings.Repeat("k", host.MinSecretLen)
	t.Setenv(name, want)
	got, err := engineSecret(name)
	if err != nil || string(got) != want {
		t.Errorf("engineSecret = %q, %v; want the variable's secret", got, err)
	}
	if v, set := os.LookupEnv(name); set {
		t.Errorf("%s is still set (%q) after it was read", name, v)
	}

	t.Setenv(name, "short")
	if _, err := engineSecret(name); err == nil || !strings.Contains(err.Error(), name) {
		t.Errorf("a short secret: %v; want an error naming %s", err, name)
	}

	a, errA := engineSecret("")
	b, errB := engineSecret("")
	if errA != nil || errB != nil || len(a) != host.MinSecretLen || bytes.Equal(a, b) {
		t.Errorf("without a variable: %x, %x (%v, %v); want two random secrets of %d bytes", a, b, errA, errB, host.MinSecretLen)
	}
}
