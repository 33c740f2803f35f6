package supervise

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/testutil"
	"github.com/fluksio/provision/shared"
)

// TestSupervisedPluginMintsWithinItsShapes, with the attack's figure: a
// real plugin, supervised as an engine runs it, asks for credentials of
// 2^30 cpus and gpus (testplugin's bigmint: machines 1 and 3 of four),
// one alone and one in a batch. Both are refused, the plugin hears
// permission denied and reports the machine failed, and the log names
// the plugin and the worker; machines 2 and 4, minted the small
// profile's shape alone and in the same batch, are signed.
func TestSupervisedPluginMintsWithinItsShapes(t *testing.T) {
	t.Parallel()
	b, diags := parseBlock(t, fmt.Sprintf("provisioner \"memory\" \"mem\" {\n  plugin = %q\n  greeting = \"hi\"\n}\n", testPlugin(t)))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	real := host.NewSigner(host.RandomSecret())
	var mu sync.Mutex // guards signed
	var signed []host.CredentialClaims
	signer := signerFunc(func(c host.CredentialClaims, ttl time.Duration) (string, time.Time, error) {
		mu.Lock()
		signed = append(signed, c)
		mu.Unlock()
		return real.Sign(c, ttl)
	})
	logger, logs := testutil.Logger(t)
	events := make(chan shared.Event, 16)
	s := New(b, nullLogger(), Options{Signer: signer, Logger: logger, Env: []string{"TESTPLUGIN_ABUSE=bigmint"},
		OnEvent: func(ev shared.Event) { events <- ev }})
	u := newUpDown(s)
	if diags := s.Start(context.Background()); diags.HasErrors() {
		t.Fatal(diags)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	u.waitFor(t, 10*time.Second, "started", func(ups, _ int) bool { return ups == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.Provisioner().Provision(ctx, &shared.ProvisionRequest{Demand: []shared.Demand{{Need: shared.Need{CPUs: 1}, Count: 4}}}); err != nil {
		t.Fatal(err)
	}
	got := map[string]shared.Event{}
	for len(got) < 4 {
		select {
		case ev := <-events:
			got[ev.Worker] = ev
		case <-ctx.Done():
			t.Fatalf("%d of 4 machines' events within 10 s: %+v", len(got), got)
		}
	}
	for i := 1; i <= 4; i++ {
		w := fmt.Sprintf("mem-small-%08x", i)
		ev := got[w]
		if i%2 == 1 {
			if ev.Kind != shared.EventWorkerProvisionFailed || !strings.Contains(ev.Detail, "permission denied") || !strings.Contains(ev.Detail, "cpus 1073741824") {
				t.Errorf("machine %d (2^30 cpus): %s %q; want worker_provision_failed, permission denied for cpus 1073741824", i, ev.Kind, ev.Detail)
			}
			if line := logLine(logs.String(), w); !strings.Contains(line, "no profile of the provisioner offers its shape") || !strings.Contains(line, "provisioner=mem") {
				t.Errorf("machine %d's refusal is not logged with the plugin's name: %q", i, line)
			}
		} else if ev.Kind != shared.EventWorkerProvisioned {
			t.Errorf("machine %d (the small profile's shape): %s %q; want worker_provisioned", i, ev.Kind, ev.Detail)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(signed) != 2 || signed[0].CPUs != 1 || signed[1].CPUs != 1 {
		t.Errorf("signed %+v; want the two machines of the small profile's shape", signed)
	}
}

// logLine is the first line of logs that mentions s.
func logLine(logs, s string) string {
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}
