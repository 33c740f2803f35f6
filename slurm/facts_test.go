package slurm

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/fluksio/provision/slurm/internal/queue"
	"github.com/fluksio/provision/slurm/sbatch"
)

// TestParseShowConfig reads the start-up facts from what Slurm 24.11.5
// printed (testdata/slurm-versions/capture-rate-limit.sh): the same
// whether the ping at the end found the controller UP or, the bucket
// drained, DOWN with exit 1, since the configuration above it is the
// controller's answer. A failure that printed none is no facts.
func TestParseShowConfig(t *testing.T) {
	for _, name := range []string{"ratelimit-show-config.txt", "ratelimit-show-config-drained.txt"} {
		b, err := os.ReadFile(filepath.Join("testdata", "slurm-versions", "24.11.5", name))
		if err != nil {
			t.Fatal(err)
		}
		c, ok := queue.ParseFacts(b)
		if !ok {
			t.Fatalf("%s: no configuration found", name)
		}
		want := queue.Facts{Version: "24.11.5", Cluster: "sandbox", MaxArraySize: 10001, MaxJobCount: 50000}
		if c.Version != want.Version || c.Cluster != want.Cluster || c.MaxArraySize != want.MaxArraySize || c.MaxJobCount != want.MaxJobCount {
			t.Errorf("%s: %+v; want %+v", name, c, want)
		}
	}
	if _, ok := queue.ParseFacts([]byte("slurm_load_ctl_conf error: Unable to contact slurm controller (connect failure)\n")); ok {
		t.Error("a failure that printed no configuration was read as one")
	}
	c, ok := queue.ParseFacts([]byte("Configuration data as of 2026-12-02T10:00:00\nClusterName = c\n"))
	if !ok || c.MaxArraySize != -1 || arrayCap(c.MaxArraySize) != defaultMaxArraySize || c.MaxJobCount != queue.DefaultMaxJobCount {
		t.Errorf("a configuration without MaxArraySize and MaxJobCount: %+v, %v; want Slurm's defaults", c, ok)
	}
}

// TestFactsReadUntilRead: when scontrol show config fails at start, the
// facts are not guessed. Status says they are not yet known, a burst of
// 150 is one array of 100 (unknownFactsBurst, not Slurm's default 1001),
// and each poll cycle reads them again until a read succeeds; then the
// note is gone, the rest of a larger burst is one array of more than
// 100, and polls stop asking.
func TestFactsReadUntilRead(t *testing.T) {
	h := newHarness(t, "scontrol=fail,squeue=rows,sbatch=ok", func(c map[string]any) {
		c["max_workers"], c["max_pending"] = 500, 500
	})
	if !slicesContains(h.status(t).Notes, "not yet known") {
		t.Fatalf("Status notes %q do not say the facts are not yet known", h.status(t).Notes)
	}
	// Unread, each cycle asks again, even with nothing outstanding.
	h.p.poll.once(context.Background())
	h.p.poll.once(context.Background())
	if n := len(h.fake.callsTo("scontrol")); n != 2 {
		t.Fatalf("%d scontrol calls in 2 poll cycles with the facts unread; want 2", n)
	}
	if !slicesContains(h.status(t).Notes, "Unable to contact slurm controller") {
		t.Errorf("Status notes %q do not say why the facts are unknown", h.status(t).Notes)
	}
	h.provisionN(t, cpuNeed, 150)
	h.submitted(t)
	sb := h.fake.callsTo("sbatch")
	if len(sb) != 1 || !strings.Contains(sb[0].Stdin, "#SBATCH --array=0-99\n") {
		t.Fatalf("%d sbatch calls (first: %q); want one array of 100 (0-99)", len(sb), firstLine(sb))
	}
	// The array pending in the queue, as one row for all its tasks.
	job, _ := sbatch.SplitTask(h.status(t).Outstanding[0].Job)
	comment := regexp.MustCompile(`(?m)^#SBATCH --comment=(\S+)$`).FindStringSubmatch(sb[0].Stdin)[1]
	h.fake.setRows(t, job+"|PENDING|Priority|N/A|"+comment)
	h.fake.setSpec(t, "scontrol=ok,squeue=rows,sbatch=ok")
	h.p.poll.once(context.Background())
	if slicesContains(h.status(t).Notes, "not yet known") {
		t.Errorf("Status notes %q still say the facts are unknown after a read", h.status(t).Notes)
	}
	h.p.poll.once(context.Background())
	if n := len(h.fake.callsTo("scontrol")); n != 3 {
		t.Errorf("%d scontrol calls; want 3: none once the facts are read", n)
	}
	h.fake.forget(t)
	h.provisionN(t, cpuNeed, 350)
	h.submitted(t)
	sb = h.fake.callsTo("sbatch")
	m := regexp.MustCompile(`(?m)^#SBATCH --array=0-(\d+)$`).FindStringSubmatch(firstLine(sb))
	if last := 0; len(sb) != 1 || m == nil || func() bool { last, _ = strconv.Atoi(m[1]); return last < unknownFactsBurst }() {
		t.Errorf("%d sbatch calls (first: %q); want the rest, about 250, as one array past the 100 of unread facts", len(sb), firstLine(sb))
	}
}

func firstLine(calls []call) string {
	for _, c := range calls {
		for _, l := range strings.Split(c.Stdin, "\n") {
			if strings.HasPrefix(l, "#SBATCH --array") {
				return l
			}
		}
	}
	return ""
}
