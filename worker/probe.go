package worker

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// ProbePath is where an engine answers a reach probe: a worker started
// with --probe asks it, from a compute node, whether the engine's URL is
// reachable there, before any worker needs it to be (validate -check
// -probe). It needs no credential and tells nothing: the answer starts
// with ProbeAnswer.
const ProbePath = "/v1/probe"

// ProbeAnswer starts the body of an engine's answer at ProbePath, which
// tells it from another server at the same address; the value of the
// engine's run follows it after a space (ProbeLine), which tells this
// engine from anything else that answers so.
const ProbeAnswer = "fluksio engine"

// ProbeLine is the first line of the answer of an engine whose run has
// value.
func ProbeLine(value string) string { return ProbeAnswer + " " + value }

// probeTimeout bounds the probe's one request: a compute node that
// cannot reach the engine often learns it only from a timeout.
const probeTimeout = 10 * time.Second

// probeEngine asks the engine's ProbePath once and prints one line that
// begins "probe: reached" or "probe: cannot reach", which the provisioner
// reads from the job's output. It exits 0 when the engine answered.
func probeEngine(ctx context.Context, cfg Config, client *http.Client, stdout io.Writer) int {
	target := cfg.url.JoinPath(ProbePath).String()
	start := time.Now()
	fail := func(format string, args ...any) int {
		fmt.Fprintf(stdout, "probe: cannot reach %s from %s: %s\n", cfg.url, cfg.hostname, fmt.Sprintf(format, args...))
		return 1
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return fail("%v", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return fail("%v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	first, _, _ := strings.Cut(string(body), "\n")
	said := fmt.Sprintf("%.80q", strings.TrimSpace(first))
	switch {
	case resp.StatusCode != http.StatusOK || !strings.HasPrefix(first, ProbeAnswer):
		return fail("%s answered %s %s, not as an engine does (another server at that address?)", target, resp.Status, said)
	case cfg.probeAnswer != "" && strings.TrimSpace(first) != ProbeLine(cfg.probeAnswer):
		return fail("%s answered %s %s, without this engine's value of the run: another engine, or a server posing as one, holds that address", target, resp.Status, said)
	}
	fmt.Fprintf(stdout, "probe: reached %s from %s in %s\n", cfg.url, cfg.hostname, time.Since(start).Round(time.Millisecond))
	return 0
}
