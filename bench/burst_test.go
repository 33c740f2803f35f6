package bench

// Measurement 4: a burst. A hundred profiles each need a machine at once:
// a hundred concurrent Provision calls, until all hundred submissions have
// answered; beside a hundred plain ssh sbatch processes started at once.
// The plugin runs under an ssh wrapper that keeps what ssh says on stderr,
// so refused sessions and fallbacks are counted even where the plugin
// hides them.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
)

const burstSize = 100

type burstResult struct {
	elapsed    time.Duration
	ok, failed int
	// sessionErrors are ssh's own complaints: refused sessions, broken
	// or refused connections. fallbacks are calls that found the master
	// busy being made and used a connection of their own.
	sessionErrors, fallbacks int
	samples                  []string
}

func (r burstResult) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.ok) / r.elapsed.Seconds()
}

var (
	sshFallback = regexp.MustCompile(`ControlSocket .* already exists, disabling multiplexing`)
	sshTrouble  = regexp.MustCompile(`(?i)^(ssh: |ssh_exchange_identification|kex_exchange_identification|mux_client_|muxclient|control socket connect|master hello|connection (closed|reset|refused|timed out)|.*session request failed|.*open refused|.*broken pipe|.*banner exchange)`)
)

// classify counts ssh's lines on stderr.
func classify(stderr string) (trouble, fallbacks int, samples []string) {
	for _, l := range strings.Split(stderr, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case l == "":
		case sshFallback.MatchString(l):
			fallbacks++
		case sshTrouble.MatchString(l):
			trouble++
			if len(samples) < 3 {
				samples = append(samples, l)
			}
		}
	}
	return trouble, fallbacks, samples
}

// burstRig is a configured plugin with one pending-only profile per
// member of the burst.
type burstRig struct {
	e    benchEnv
	name string
	p    *plug
	// log and errLog are the ssh wrapper's.
	log, errLog string
}

func newBurstRig(tb testing.TB, e benchEnv) *burstRig {
	tb.Helper()
	r := &burstRig{e: e, name: uniqueName("burst")}
	tb.Cleanup(func() { e.cancelJobs(tb, r.name) })
	dir, err := os.MkdirTemp("", "fxb-burst-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	r.errLog, r.log = filepath.Join(dir, "ssh.err"), filepath.Join(dir, "ssh.log")
	r.p = launch(tb, wrappedPlugin(tb, e, r.log, r.errLog), r.name, nil)
	r.p.configure(tb, e.slurmConfig(map[string]any{"multiplex": true, "max_sessions": 8}, e.pendingProfiles("p", burstSize)))
	return r
}

// labels are the names of n profiles made by pendingProfiles(prefix, n);
// a need with one as its label matches exactly that profile.
func labels(prefix string, n int) []string {
	width := max(len(fmt.Sprint(n-1)), 3)
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%0*d", prefix, width, i)
	}
	return out
}

// provisionAll asks for one machine of each labelled profile at once (the
// whole demand: profiles asked for before and not named are given up) and
// waits for every new submission to answer. It returns the time from the
// calls to the last answer.
func provisionAll(tb testing.TB, p *plug, names []string, timeout time.Duration) (elapsed time.Duration, ok, failed int, detail string) {
	tb.Helper()
	from := p.rec.len()
	// One Provision with the whole demand, as the engine sends it: each
	// profile's submission then runs on a goroutine of its own, so the
	// hundred sbatch go out at once.
	req := &shared.ProvisionRequest{}
	for _, label := range names {
		req.Demand = append(req.Demand, shared.Demand{Need: shared.Need{CPUs: 1, Label: label}, Count: 1})
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	t0 := time.Now()
	resp, err := p.prov.Provision(ctx, req)
	if err != nil {
		tb.Fatalf("Provision: %v", err)
	}
	// The demand is the whole set of names; what was on its way already
	// is not asked for again, so only the new ones are waited for.
	n := 0
	for i, o := range resp.Outcomes {
		switch o.Outcome {
		case shared.OutcomeRequested, shared.OutcomeOutstanding:
		default:
			tb.Fatalf("Provision: %s: %s %s", names[i], o.Outcome, o.Detail)
		}
	}
	for _, pd := range resp.Profiles {
		n += pd.Requested
	}
	got, err := p.rec.waitN(from, n, timeout, submitted)
	if err != nil {
		tb.Fatalf("waiting for %d submissions: %v\nplugin log tail:\n%s", n, err, tail(p.logs.String(), 20))
	}
	var last time.Time
	for _, s := range got {
		if s.ev.Kind == shared.EventWorkerProvisioned {
			ok++
		} else {
			failed++
			if detail == "" {
				detail = s.ev.Detail
			}
		}
		if s.at.After(last) {
			last = s.at
		}
	}
	return last.Sub(t0), ok, failed, detail
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// burst provisions every profile at once; the rig is then left with
// burstSize requests outstanding.
func (r *burstRig) burst(tb testing.TB) burstResult {
	tb.Helper()
	var res burstResult
	var detail string
	res.elapsed, res.ok, res.failed, detail = provisionAll(tb, r.p, labels("p", burstSize), 3*time.Minute)
	if n := wrapperCalls(r.log, " sbatch"); n < burstSize {
		tb.Fatalf("the ssh wrapper logged %d sbatch calls for %d submissions: the plugin did not run it", n, burstSize)
	}
	b, _ := os.ReadFile(r.errLog)
	res.sessionErrors, res.fallbacks, res.samples = classify(string(b))
	if detail != "" {
		res.samples = append(res.samples, "failed: "+firstLine(detail))
	}
	return res
}

// rawBurst runs burstSize ssh sbatch processes, parallel at a time:
// plain ones all at once, or through a ControlMaster as many at a time as
// the plugin's max_sessions.
func rawBurst(tb testing.TB, e benchEnv, mux []string, parallel int) burstResult {
	return rawBurstN(tb, e, mux, parallel, burstSize)
}

// rawBurstN is rawBurst for n jobs.
func rawBurstN(tb testing.TB, e benchEnv, mux []string, parallel, n int) burstResult {
	tb.Helper()
	name := uniqueName("rawburst")
	tb.Cleanup(func() { e.cancelJobs(tb, name) })
	type outcome struct {
		ok     bool
		at     time.Time
		stderr string
	}
	outs := make([]outcome, n)
	scripts := make([][]byte, n)
	for i := range scripts {
		scripts[i] = baselineScript(name, fmt.Sprintf("%s-w%d", name, i), e.pendingSbatch())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute+time.Duration(n)*100*time.Millisecond)
	defer cancel()
	start := make(chan struct{})
	slots := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			slots <- struct{}{}
			defer func() { <-slots }()
			stdout, stderr, err := e.runSSH(ctx, e.sshArgv(mux, "sbatch", "--parsable"), scripts[i])
			_, isID := parseJobID(string(stdout))
			outs[i] = outcome{ok: err == nil && isID, at: time.Now(), stderr: string(stderr)}
		}()
	}
	t0 := time.Now()
	close(start)
	wg.Wait()
	var res burstResult
	var last time.Time
	var stderr strings.Builder
	for _, o := range outs {
		if o.ok {
			res.ok++
		} else {
			res.failed++
		}
		if o.at.After(last) {
			last = o.at
		}
		stderr.WriteString(o.stderr)
		stderr.WriteString("\n")
	}
	res.elapsed = last.Sub(t0)
	res.sessionErrors, res.fallbacks, res.samples = classify(stderr.String())
	return res
}

// BenchmarkBurst is one burst of a hundred per op, through the plugin and
// as a hundred plain ssh processes.
func BenchmarkBurst(b *testing.B) {
	e := setup(b)
	report := func(b *testing.B, rs []burstResult) {
		var ok, failed, trouble int
		var elapsed time.Duration
		for _, r := range rs {
			ok, failed, trouble, elapsed = ok+r.ok, failed+r.failed, trouble+r.sessionErrors, elapsed+r.elapsed
		}
		b.ReportMetric(float64(ok)/elapsed.Seconds(), "jobs/s")
		b.ReportMetric(float64(failed)/float64(len(rs)), "failed/burst")
		b.ReportMetric(float64(trouble)/float64(len(rs)), "ssh-errors/burst")
	}
	b.Run("plugin", func(b *testing.B) {
		var rs []burstResult
		for range b.N {
			b.StopTimer()
			r := newBurstRig(b, e)
			b.StartTimer()
			rs = append(rs, r.burst(b))
		}
		report(b, rs)
	})
	b.Run("plain-ssh", func(b *testing.B) {
		var rs []burstResult
		for range b.N {
			rs = append(rs, rawBurst(b, e, plainSSH, burstSize))
		}
		report(b, rs)
	})
	m := startMaster(b, e)
	b.Run("controlmaster-ssh-8", func(b *testing.B) {
		var rs []burstResult
		for range b.N {
			rs = append(rs, rawBurst(b, e, m.args(), 8))
		}
		report(b, rs)
	})
}
