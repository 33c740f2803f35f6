package worker_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fluksio/provision/engine"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

// TestProbeWantsThisEngine: a probe worker told the value of the engine's
// run (shared.ProbeAnswerEnv) says "reached" of the engine's own answer
// (engine.ServeProbe) and exits 0; a server at the address answering 200
// "fluksio engine" with no value, or another run's value, is not reached:
// exit 1, and the line quotes what answered.
func TestProbeWantsThisEngine(t *testing.T) {
	squatter := func(body string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, body) }))
	}
	for _, tc := range []struct {
		name    string
		srv     *httptest.Server
		code    int
		says    string
		answers string
	}{
		{"the engine", httptest.NewServer(http.HandlerFunc(engine.ServeProbe)), 0, "probe: reached ", ""},
		{"a squatter", squatter(worker.ProbeAnswer + "\n"), 1, "probe: cannot reach ", `200 OK "fluksio engine", without this engine's value of the run`},
		{"another run", squatter(worker.ProbeLine(strings.Repeat("0", 32)) + "\n"), 1, "probe: cannot reach ", `"fluksio engine 000000`},
		{"not an engine", squatter("hello\x1b[2J\n"), 1, "probe: cannot reach ", `200 OK "hello\x1b[2J", not as an engine does`},
	} {
		defer tc.srv.Close()
		env := map[string]string{shared.ProbeAnswerEnv: engine.ProbeValue()}
		var stdout, stderr bytes.Buffer
		code := worker.Run(context.Background(), []string{"--url", tc.srv.URL, "--probe", "--cpus", "1"}, func(k string) string { return env[k] }, &stdout, &stderr)
		t.Logf("%s: exit %d: %s%s", tc.name, code, stdout.String(), stderr.String())
		if code != tc.code || !strings.HasPrefix(stdout.String(), tc.says) || !strings.Contains(stdout.String(), tc.answers) {
			t.Errorf("%s: exit %d, %q; want %d, %q and %q", tc.name, code, stdout.String(), tc.code, tc.says, tc.answers)
		}
	}
}
