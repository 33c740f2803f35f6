package bench

// Measurement 12: submit → attached through the relay, beside direct
// mode in the same run. Ten machines of one profile are asked for by the
// real engine, plugin and workers; what is timed runs from the story line
// that gives the burst's job (sbatch has answered) to the tenth "attached
// from". Each mode runs three times, alternating, and the fastest
// counts, so that the
// relay's one-time copy of the plugin binary to the login node (made
// before any submission, and not part of this) and a cold page cache
// weigh on neither.

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

const relayMachines = 10

type relayResult struct{ relay, direct time.Duration }

// attachFlow runs host-example for relayMachines needs, in relay mode or
// direct, and returns submission → last attach.
func attachFlow(tb testing.TB, e benchEnv, relay bool) time.Duration {
	tb.Helper()
	config := func(name string, port int) string {
		c := e.EngineConfig(port, dirOf(e.SlurmBin), name, []string{e.HostBin, "worker"}, fmt.Sprintf(`  profile "cpu" {
    cpus   = 1
    ram_mb = 100
    sbatch = ["--partition=%s", "--time=00:10:00", "--output=/dev/null"]
  }
`, e.Partition))
		if relay {
			c = strings.Replace(c, fmt.Sprintf(`engine_url     = "http://127.0.0.1:%d"`, port), "reach          = \"relay\"\n  relay_host     = \"127.0.0.1\"", 1)
		}
		return c
	}
	// Each task holds its worker for 5 s, so that every machine attaches
	// (an idle worker would otherwise take a second need).
	h := startHostWith(tb, e, "reach", config, "-need", fmt.Sprintf("cpus=1,count=%d,work=5s", relayMachines), "-timeout", "5m")
	// From sbatch's answer: the relay's start, once per provisioner and
	// before its first submission, is not part of any one submission.
	asked := h.wait(tb, `asked for a "cpu" machine: job`, 2*time.Minute)
	var last storyLine
	for i := range relayMachines {
		last = h.waitNth(tb, " attached from ", i+1, 2*time.Minute)
	}
	h.wait(tb, fmt.Sprintf("all %d need(s) served", relayMachines), 2*time.Minute)
	h.exited(tb, 2*time.Minute)
	return last.at.Sub(asked.at)
}

func measureRelay(tb testing.TB, e benchEnv) relayResult {
	tb.Helper()
	r := relayResult{relay: time.Hour, direct: time.Hour}
	for range 3 {
		r.direct = min(r.direct, attachFlow(tb, e, false))
		r.relay = min(r.relay, attachFlow(tb, e, true))
	}
	return r
}

func relayRows(rep *report, m relayResult) {
	v, rt := ratio(float64(m.relay), float64(m.direct))
	rep.add(row{fmt.Sprintf("submit → %d workers attached through the relay vs direct (best of 3 each)", relayMachines),
		dur(m.relay), dur(m.direct), rt, "≤ 1.5×", verdict(v, 1.5, true, "×")})
}
