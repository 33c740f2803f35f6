package bench

// Measurement 9: a burst of 1,000 machines of one profile, asked for with
// one Provision, until every machine's worker_provisioned has come back:
// the number of sbatch calls the plugin ran (its ssh wrapper counts them)
// against ⌈1000/MaxArraySize⌉, the time against a per-job sbatch loop
// through a ControlMaster (what dask-jobqueue and Parsl do), measured in
// the same run, and the plugin's RSS with the thousand outstanding.

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
)

const arrayBurst = 1000

type arrayResult struct {
	elapsed     time.Duration
	sbatchCalls int
	maxArray    int
	rssKB       int64
	heapKB      int64 // the live heap the plugin reports, beside rssKB
	loop        burstResult
	// squeuePerCycle is the squeue calls the plugin made per poll cycle
	// with the thousand outstanding.
	squeuePerCycle float64
	// rawArray is one sbatch --array=0-999 of a script of the plugin's
	// size through the plugin's own ControlMaster, from the call to its
	// job id (P9b's baseline); rawBytes is that script's size.
	rawArray time.Duration
	rawBytes int
	// burstCalls are the cluster commands the plugin ran over ssh
	// between the Provision and the last job id, in order: where P9b's
	// time goes beside the sbatch.
	burstCalls []string
	// startup is Configure until its reads on the login node were done;
	// timeline is when each of the burst's calls began, from the
	// Provision, and when its last job id came back.
	startup  time.Duration
	timeline string
}

var maxArrayRE = regexp.MustCompile(`(?m)^MaxArraySize\s*=\s*([0-9]+)`)

func measureArray(tb testing.TB, e benchEnv) arrayResult {
	tb.Helper()
	name := uniqueName("array")
	tb.Cleanup(func() { e.cancelJobs(tb, name) })
	dir, err := os.MkdirTemp("", "fxb-array-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	log, errLog := dir+"/ssh.log", dir+"/ssh.err"
	p := launch(tb, wrappedPlugin(tb, e, log, errLog), name, nil)
	tc := time.Now()
	p.configure(tb, e.slurmConfig(map[string]any{"multiplex": true, "max_workers": arrayBurst, "max_pending": arrayBurst, "poll_interval": pollInterval.String()},
		[]map[string]any{profile("arr", 1, 0, 0, nil, e.pendingSbatch())}))

	var res arrayResult
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// P9b is a burst to a plugin that is up, as an engine's bursts come
	// after its start: Configure's reads on the login node (the ssh
	// master and scontrol, the queue, sacctmgr, log_dir) are done before
	// it begins. How long they took is a note.
	waitStarted(tb, ctx, p)
	res.startup = time.Since(tc)
	if out, err := e.slurmLocal(ctx, "scontrol", "show", "config"); err == nil {
		if m := maxArrayRE.FindStringSubmatch(out); m != nil {
			res.maxArray, _ = strconv.Atoi(m[1])
		}
	}
	from := p.rec.len()
	logBefore, _ := os.ReadFile(log)
	t0 := time.Now()
	// The engine asks again on every pass; so does this, until the whole
	// thousand is on its way (one submission per MaxArraySize tasks).
	deadline := time.Now().Add(4 * time.Minute)
	for {
		resp, err := p.prov.Provision(ctx, &shared.ProvisionRequest{Demand: []shared.Demand{{Need: shared.Need{Label: "arr"}, Count: arrayBurst}}})
		if err != nil {
			tb.Fatalf("Provision: %v", err)
		}
		if pd := resp.Profiles; len(pd) == 1 && pd[0].OnTheWay >= arrayBurst {
			break
		}
		if time.Now().After(deadline) {
			tb.Fatalf("the thousand were not on their way within 4 minutes: %+v", resp.Profiles)
		}
		time.Sleep(200 * time.Millisecond)
	}
	got, err := p.rec.waitN(from, arrayBurst, 4*time.Minute, submitted)
	if err != nil {
		tb.Fatalf("waiting for %d submissions: %v\nplugin log tail:\n%s", arrayBurst, err, tail(p.logs.String(), 20))
	}
	var last time.Time
	for _, s := range got {
		if s.ev.Kind != shared.EventWorkerProvisioned {
			tb.Fatalf("a machine failed: %s", s.ev.Detail)
		}
		if s.at.After(last) {
			last = s.at
		}
	}
	res.elapsed = last.Sub(t0)
	if b, err := os.ReadFile(log); err == nil && len(b) >= len(logBefore) {
		for _, l := range strings.Split(strings.TrimSpace(string(b[len(logBefore):])), "\n") {
			if _, remote, ok := strings.Cut(l, " -- "+e.Login+" "); ok {
				l = remote
			}
			res.burstCalls = append(res.burstCalls, truncateCall(l))
		}
	}
	res.timeline = timeline(log+".t", t0, last)
	res.sbatchCalls = wrapperCalls(log, " sbatch")
	if pid := p.pl.Pid(); pid > 0 {
		res.rssKB, _ = rssKB(pid)
		res.heapKB = liveHeapKB(tb, p.prov)
	}
	if q, err := e.queued(name); err != nil || q < arrayBurst {
		tb.Fatalf("squeue lists %d of the %d machines (%v)", q, arrayBurst, err)
	}
	// P9b's baseline: the same thousand as one raw sbatch --array through
	// the plugin's own ControlMaster, while it is up.
	res.rawArray, res.rawBytes = rawArray(tb, e, log, name+"raw")
	// The poller over a window of whole cycles, the thousand outstanding.
	before := wrapperCalls(log, " squeue")
	time.Sleep(pollCycles * pollInterval)
	res.squeuePerCycle = float64(wrapperCalls(log, " squeue")-before) / pollCycles
	e.cancelJobs(tb, name)

	// The per-job loop: one sbatch at a time through a ControlMaster.
	res.loop = rawBurstN(tb, e, startMaster(tb, e).args(), 1, arrayBurst)
	if res.loop.ok != arrayBurst {
		tb.Fatalf("the per-job loop submitted %d of %d", res.loop.ok, arrayBurst)
	}
	return res
}

var controlPathRE = regexp.MustCompile(`ControlPath=(\S+)`)

// rawArray submits one array of arrayBurst tasks, a script shaped as the
// plugin's (a case of one credential a task), with ssh through the
// ControlMaster the plugin's calls in log used, and returns how long the
// call took to give the job id back and the script's size. All the
// array's tasks must be in squeue after it.
func rawArray(tb testing.TB, e benchEnv, log, name string) (time.Duration, int) {
	tb.Helper()
	tb.Cleanup(func() { e.cancelJobs(tb, name) })
	b, _ := os.ReadFile(log)
	var sock string
	for _, m := range controlPathRE.FindAllStringSubmatch(string(b), -1) {
		if m[1] != "none" {
			sock = m[1]
		}
	}
	if sock == "" {
		tb.Fatal("the plugin's ssh calls name no ControlPath: it does not multiplex, so there is no ControlMaster to share")
	}
	mux := []string{"-o", "ControlMaster=no", "-o", "ControlPath=" + sock}
	var script strings.Builder
	script.WriteString("#!/bin/bash\n")
	fmt.Fprintf(&script, "#SBATCH --job-name=fluksio-%s\n#SBATCH --comment=fluksio:%s\n#SBATCH --cpus-per-task=1\n#SBATCH --array=0-%d\n", name, name, arrayBurst-1)
	for _, a := range e.pendingSbatch() {
		fmt.Fprintf(&script, "#SBATCH %s\n", a)
	}
	script.WriteString(`case "${SLURM_ARRAY_TASK_ID:-}" in` + "\n")
	for i := range arrayBurst {
		fmt.Fprintf(&script, "%d) FLUKSIO_WORKER_TOKEN='tok-%s' exec /bin/true --url http://127.0.0.1:9/ --name %s-arr-%08x --cpus 1 --gpus 0 --max-idle 60 ;;\n", i, randHex(16), name, i)
	}
	script.WriteString("*) exit 1 ;;\nesac\n")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t0 := time.Now()
	if _, err := e.sbatch(ctx, mux, []byte(script.String())); err != nil {
		tb.Fatalf("the raw sbatch --array through the plugin's ControlMaster: %v", err)
	}
	took := time.Since(t0)
	if q, err := e.queued(name); err != nil || q < arrayBurst {
		tb.Fatalf("squeue lists %d of the raw array's %d tasks (%v)", q, arrayBurst, err)
	}
	return took, script.Len()
}

// startupCommands are what the Slurm plugin runs on the login node when
// it is configured, before any burst: scontrol (MaxArraySize, over the
// ssh master it makes), squeue (adoption), sacctmgr (the accounting
// limits) and sh (log_dir).
var startupCommands = []string{"scontrol", "squeue", "sacctmgr", "sh"}

// waitStarted waits until the plugin's Status counts every one of
// startupCommands as done.
func waitStarted(tb testing.TB, ctx context.Context, p *plug) {
	tb.Helper()
	for {
		st, err := p.prov.Status(ctx, &shared.StatusRequest{})
		if err != nil {
			tb.Fatalf("Status: %v", err)
		}
		done := map[string]bool{}
		if st.Counters != nil {
			for _, c := range st.Counters.Commands {
				done[c.Command] = c.Calls > 0
			}
		}
		all := true
		for _, c := range startupCommands {
			all = all && done[c]
		}
		if all {
			return
		}
		select {
		case <-ctx.Done():
			tb.Fatalf("the plugin's start-up commands (%s) were not all done: %v", strings.Join(startupCommands, ", "), done)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// timeline reads the wrapper's start times (file, "<unix seconds> <call>")
// from t0 on, as "+12 ms squeue, +40 ms sbatch; last job id +95 ms".
func timeline(file string, t0, last time.Time) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return ""
	}
	var parts []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		ts, call, ok := strings.Cut(l, " ")
		f, err := strconv.ParseFloat(ts, 64)
		if !ok || err != nil {
			continue
		}
		at := time.Unix(0, int64(f*1e9))
		if at.Before(t0) {
			continue
		}
		// "<login> <command> <args…>": the command names the call.
		f2 := strings.Fields(call)
		word := "?"
		if len(f2) > 1 {
			word = f2[1]
		}
		parts = append(parts, fmt.Sprintf("+%s %s", dur(at.Sub(t0)), word))
	}
	return fmt.Sprintf("%s; last job id +%s", strings.Join(parts, ", "), dur(last.Sub(t0)))
}

func truncateCall(s string) string {
	if len(s) > 60 {
		return s[:60] + "…"
	}
	return s
}

// arrayRows are the table's rows for measurement 9.
func arrayRows(rep *report, a arrayResult) {
	limit := 1
	if a.maxArray > 0 {
		limit = (arrayBurst + a.maxArray - 1) / a.maxArray
	}
	calls := "PASS"
	if a.sbatchCalls > limit {
		calls = fmt.Sprintf("MISS (%d over)", a.sbatchCalls-limit)
	}
	rep.add(row{fmt.Sprintf("%d machines of one profile asked for → all in squeue: sbatch calls (MaxArraySize %d)", arrayBurst, a.maxArray),
		strconv.Itoa(a.sbatchCalls), fmt.Sprintf("%d (per-job loop)", a.loop.ok), "—", fmt.Sprintf("≤ %d", limit), calls})
	v, rt := ratio(float64(a.elapsed), float64(a.loop.elapsed))
	rep.add(row{fmt.Sprintf("%d machines → every job id back: plugin (one array) vs a per-job sbatch loop through a ControlMaster", arrayBurst),
		dur(a.elapsed), dur(a.loop.elapsed), rt, "≤ 0.05×", verdict(v, 0.05, true, "×")})
	if a.rawArray > 0 {
		v, rt := ratio(float64(a.elapsed), float64(a.rawArray))
		rep.note("P9b: between the Provision and the last job id the plugin ran %d commands over ssh: %s. Each call's start from the Provision: %s. The burst is asked of a plugin that is up: its start-up reads on the login node (the ssh master with scontrol, then the queue, sacctmgr and log_dir side by side) took %s from Configure, which a burst at Configure would pay as well.",
			len(a.burstCalls), strings.Join(a.burstCalls, " | "), a.timeline, dur(a.startup))
		rep.add(row{fmt.Sprintf("P9b: %d machines of one profile asked for → all in squeue: plugin (Provision → every job id, credentials minted in batches) vs one raw sbatch --array=0-%d of a %d-byte script through the plugin's ControlMaster", arrayBurst, arrayBurst-1, a.rawBytes),
			dur(a.elapsed), dur(a.rawArray), rt, "≤ 3×", verdict(v, 3, true, "×")})
	}
	rep.add(row{fmt.Sprintf("squeue calls per poll cycle, %d array tasks outstanding (poll_interval %s, %d cycles)", arrayBurst, pollInterval, pollCycles),
		fmt.Sprintf("%.1f", a.squeuePerCycle), "—", "—", "1 per cycle", verdict(a.squeuePerCycle, 1+1.0/pollCycles, true, "calls")})
	rep.add(row{fmt.Sprintf("plugin RSS with %d machines outstanding", arrayBurst),
		memStr(a.rssKB, a.heapKB), "—", "—", "≤ 40 MB", verdict(mb(a.rssKB), 40, true, "MB")})
}
