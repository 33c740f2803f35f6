package main

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/fluksio/provision/internal/sandboxtest"
)

// attachedCPUsRe finds what a worker offered at attach in the story.
var attachedCPUsRe = regexp.MustCompile(`worker (\S+) attached from \S+ \(job (\S+), (\d+) cpus, (\d+) gpus`)

// TestE2EExclusiveWholeNode: on a private sandbox whose partition is
// OverSubscribe=EXCLUSIVE (a site that allocates whole nodes) and whose
// node has 16 CPUs, a profile asking for 1 CPU with exclusive = true is
// a machine of the whole node: its shape is the node's (sinfo), its job
// gets all 16 CPUs, its worker says so at attach, and 32 one-CPU tasks
// of `sleep 2` run 16 at a time on that one job (one at a time they
// would take 64 s).
func TestE2EExclusiveWholeNode(t *testing.T) {
	const cpus = 16
	env := sandboxtest.PrivateWith(t, "excl", sandboxtest.Options{Exclusive: true, CPUs: cpus})
	e := newE2EOn(t, "e2e-excl", env)
	cfg := e.writeConfig(t, fmt.Sprintf(`  max_workers = 1
  profile "one" {
    cpus      = 1
    exclusive = true
    sbatch    = ["--partition=%s", "--time=00:10:00"]
  }
`, e.env.Partition))
	var ids []string
	tasks := writeTaskFile(t, 2*cpus, func(i int) string {
		ids = append(ids, fmt.Sprintf("x%02d", i))
		return fmt.Sprintf(`{"id": "x%02d", "cpus": 1, "command": ["sleep", "2"]}`, i)
	})
	results := filepath.Join(t.TempDir(), "results")
	p := e.startEngine(t, "-config", cfg, "-v", "-tasks", tasks, "-results", results, "-timeout", "3m")
	code := p.wait(t, 4*time.Minute)
	exitedAt := time.Now()
	story := p.stdout.String()
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, story, p.stderr)
	}
	attached := attachedCPUsRe.FindAllStringSubmatch(story, -1)
	if len(attached) != 1 {
		t.Fatalf("%d workers attached; want 1\n%s", len(attached), story)
	}
	if n, _ := strconv.Atoi(attached[0][3]); n != cpus {
		t.Errorf("worker %s attached with %d cpus; want the node's %d\n%s", attached[0][1], n, cpus, story)
	}
	spans := spansOf(t, results, ids)
	jobs := map[string]bool{}
	first, last := spans[0].from, spans[0].to
	for _, s := range spans {
		jobs[s.job] = true
		first, last = minTime(first, s.from), maxTime(last, s.to)
	}
	most := mostAtOnce(spans, func(attemptSpan) bool { return true })
	t.Logf("attach line %q; %d job(s) ran the %d tasks, %d at once at most; makespan %s",
		attached[0][0], len(jobs), len(ids), most, last.Sub(first).Round(10*time.Millisecond))
	if len(jobs) != 1 || most != cpus {
		t.Errorf("%d job(s), %d tasks at once at most; want 1 job running %d at once\n%s", len(jobs), most, cpus, story)
	}
	e.assertCleanedUp(t, exitedAt)
}
