package bench

// Measurement 10: the engine with 100, 1,000 and 10,000 workers attached.
// The real engine (bin/host-example) runs with the reference plugin, which
// "starts" machines by remembering them, so that ten thousand machines
// cost no cluster: the engine asks for them, the plugin records each one's
// job (worker_provisioned), and this harness attaches a worker for each
// over HTTP, with a credential signed under the engine's secret (set with
// secret_env), 64 at a time. Each worker long-polls GET /v1/work from the
// moment it is attached, takes the task it is given and keeps it, watching
// (GET /v1/watch) as a worker busy with long work does. The time GET
// /status takes is read with every worker holding a task and a long poll
// open; the engine's resident set then, and again once every watch has
// been answered at its period's end (20 s) and opened again: the steady
// state of workers that long-poll, which the rows report (the first,
// with the burst's garbage not yet collected or given back to the
// kernel, is in the notes). It reports attaches a second, the RSS, the
// /status time and each one's 10,000/1,000 ratio.
//
// The reference plugin names its machines "mem-PROFILE-%08x" from 1 up,
// with job 1000 + n; GET /status lists at most 1,000 outstanding, so the
// names past those are made here the same way, and an attach that names a
// machine the plugin did not record is refused (which the count checks).

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/sandboxtest"
)

// attachParallel is how many attaches are in flight at once.
const attachParallel = 64

type attachResult struct {
	n        int
	elapsed  time.Duration
	attached int
	// rssKB is the engine's resident set once every worker's watch has
	// been answered at its period's end and opened again: the steady
	// state of long-polling workers. burstRSSKB is the same right after
	// the last attach, with the burst's garbage not yet collected or
	// given back.
	rssKB, burstRSSKB int64
	// status is the median of three GET /status with every worker
	// polling.
	status time.Duration
	// heap, stacks and goroutines are the engine's own account of its
	// memory (its /metrics), read beside the RSS: they say where the
	// resident set of a held connection goes.
	heapKB, stackKB int64
	goroutines      int
	// idleKB is heap the collector freed and the runtime has not yet
	// given back to the kernel: resident, but nobody's.
	idleKB int64
	// page is the status page's first render in chromium: from the
	// navigation's start to the frame after the page drew GET /status
	// (the page's own performance mark).
	page time.Duration
}

func (a attachResult) rate() float64 { return float64(a.attached) / max(a.elapsed.Seconds(), 1e-9) }

func measureAttach(tb testing.TB, e benchEnv, n int) attachResult {
	tb.Helper()
	secret := bytes.Repeat([]byte{0x5a}, 32)
	port := sandboxtest.FreePort(tb)
	dir, err := os.MkdirTemp("", "fxb-attach-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	cfg := filepath.Join(dir, "config.hcl")
	// A worker holds a connection while it polls: the cap is raised
	// above the count, as an operator of 10,000 workers would.
	body := fmt.Sprintf(`engine {
  listen          = "127.0.0.1:%d"
  secret_env      = "FLUKSIO_BENCH_SECRET"
  max_connections = %d
}
provisioner "memory" "mem" {
  plugin   = %q
  greeting = "hi"
}
`, port, n+1024, e.TestBin)
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		tb.Fatal(err)
	}
	// The router logs each task it hands out at debug, which the
	// bench counts.
	cmd := exec.Command(e.HostBin, "run", "-config", cfg, "-need", fmt.Sprintf("cpus=1,count=%d", n), "-linger", "10m", "-log-level", "debug")
	cmd.Env = append(os.Environ(), "FLUKSIO_BENCH_SECRET="+hex.EncodeToString(secret))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, stdout := &syncBuffer{}, &syncBuffer{}
	cmd.Stderr, cmd.Stdout = stderr, stdout
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})

	// The machines the plugin recorded: the first from GET /status, for
	// its profile's name, and the rest named as the plugin names them,
	// once the engine has logged the burst (the plugin publishes each
	// machine's job before its Provision returns).
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	type machine struct{ worker, job string }
	var profile string
	deadline := time.Now().Add(2 * time.Minute)
	for profile == "" || !strings.Contains(stderr.String(), "provisioner asked for machines") {
		if time.Now().After(deadline) {
			tb.Fatalf("the plugin did not record %d machines within two minutes\nengine stderr:\n%s", n, tail(stderr.String(), 20))
		}
		time.Sleep(200 * time.Millisecond)
		resp, err := http.Get(base + "/status")
		if err != nil {
			continue
		}
		var st struct {
			Provisioners []struct {
				Status *struct {
					Outstanding []struct{ Profile, Job, Worker string } `json:"outstanding"`
				} `json:"status"`
			} `json:"provisioners"`
		}
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err == nil && len(st.Provisioners) == 1 && st.Provisioners[0].Status != nil && len(st.Provisioners[0].Status.Outstanding) > 0 {
			o := st.Provisioners[0].Status.Outstanding[0]
			var k int
			if _, err := fmt.Sscanf(strings.TrimPrefix(o.Worker, "mem-"+o.Profile+"-"), "%x", &k); err != nil || o.Job != strconv.Itoa(1000+k) {
				tb.Fatalf("the reference plugin recorded %s (job %s); this harness names its machines mem-PROFILE-%%08x, job 1000 + n", o.Worker, o.Job)
			}
			profile = o.Profile
		}
	}
	machines := make([]machine, n)
	for i := range machines {
		machines[i] = machine{fmt.Sprintf("mem-%s-%08x", profile, i+1), strconv.Itoa(1001 + i)}
	}
	signer := host.NewSigner(secret)
	tokens := make([]string, len(machines))
	for i, m := range machines {
		tok, _, err := signer.Sign(host.CredentialClaims{Worker: m.worker, Provisioner: "mem", CPUs: 1, RAMMB: 1000}, time.Hour)
		if err != nil {
			tb.Fatal(err)
		}
		tokens[i] = tok
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: attachParallel}}
	// Each worker long-polls from the moment it is attached, as a real
	// one does, on a connection of its own: a task that comes is reported
	// done at once, and the worker polls again. The harness stops them
	// once it has read the engine.
	pollCtx, stopPolls := context.WithCancel(context.Background())
	pollClient := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n + 16}}
	var polls sync.WaitGroup
	defer func() {
		stopPolls()
		polls.Wait()
	}()
	var polling, renewed atomic.Int64
	var pollErr atomic.Value
	poll := func(i int, m machine, session string) {
		defer polls.Done()
		do := func(method, path string, body []byte) (int, []byte, error) {
			req, _ := http.NewRequestWithContext(pollCtx, method, base+path, bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+tokens[i])
			req.Header.Set("Fluksio-Session", session)
			resp, err := pollClient.Do(req)
			if err != nil {
				return 0, nil, err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			return resp.StatusCode, b, err
		}
		first := true
		for pollCtx.Err() == nil {
			if first {
				polling.Add(1)
				first = false
			}
			status, b, err := do(http.MethodGet, "/v1/work?wait=20", nil)
			switch {
			case pollCtx.Err() != nil:
				return
			case err != nil:
				pollErr.CompareAndSwap(nil, err)
				return
			case status == http.StatusOK:
				// A task: the worker keeps it, as one busy with long
				// work does, and watches (GET /v1/watch, also a long
				// poll) until the harness is done. Reporting it would
				// serve the needs with the first few hundred workers
				// and cancel the machines of the rest.
				for watches := 0; pollCtx.Err() == nil; watches++ {
					if watches == 1 {
						renewed.Add(1)
					}
					status, b, err := do(http.MethodGet, "/v1/watch", nil)
					switch {
					case pollCtx.Err() != nil:
						return
					case err != nil:
						pollErr.CompareAndSwap(nil, err)
						return
					case status != http.StatusNoContent:
						pollErr.CompareAndSwap(nil, fmt.Errorf("watch of %s: %d %s", m.worker, status, b))
						return
					}
				}
				return
			case status != http.StatusNoContent:
				pollErr.CompareAndSwap(nil, fmt.Errorf("poll of %s: %d %s", m.worker, status, b))
				return
			}
		}
	}
	var ok atomic.Int64
	var firstErr atomic.Value
	slots := make(chan struct{}, attachParallel)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i, m := range machines {
		wg.Add(1)
		slots <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			b, _ := json.Marshal(map[string]any{"hostname": "bench", "job_id": m.job, "cpus": 1})
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, base+"/v1/attach", bytes.NewReader(b))
			req.Header.Set("Authorization", "Bearer "+tokens[i])
			resp, err := client.Do(req)
			if err == nil {
				var a struct{ Session string }
				derr := json.NewDecoder(resp.Body).Decode(&a)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK && derr == nil && a.Session != "" {
					ok.Add(1)
					polls.Add(1)
					go poll(i, m, a.Session)
					return
				}
				err = fmt.Errorf("attach %s: %s", m.worker, resp.Status)
			}
			firstErr.CompareAndSwap(nil, err)
		}()
	}
	wg.Wait()
	res := attachResult{n: n, elapsed: time.Since(t0), attached: int(ok.Load())}
	if res.attached != len(machines) {
		tb.Fatalf("%d of %d workers attached; first error: %v", res.attached, len(machines), firstErr.Load())
	}
	for polling.Load() < int64(n) {
		if err := pollErr.Load(); err != nil {
			tb.Fatalf("a worker stopped polling: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Every worker with a task in hand, each with its watch open.
	for strings.Count(stderr.String(), "task assigned") < n {
		if err := pollErr.Load(); err != nil {
			tb.Fatalf("a worker stopped polling: %v", err)
		}
		if time.Now().After(deadline.Add(2 * time.Minute)) {
			tb.Fatalf("the engine did not hand out the %d tasks (%d)\n%s", n, strings.Count(stderr.String(), "task assigned"), tail(stderr.String(), 20))
		}
		time.Sleep(100 * time.Millisecond)
	}
	var times []time.Duration
	for range 3 {
		t := time.Now()
		resp, err := http.Get(base + "/status")
		if err != nil {
			tb.Fatal(err)
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			tb.Fatalf("GET /status with %d workers polling: %v %s", n, err, resp.Status)
		}
		times = append(times, time.Since(t))
	}
	slices.Sort(times)
	res.status = times[1]
	if res.burstRSSKB, err = rssKB(cmd.Process.Pid); err != nil {
		tb.Fatal(err)
	}
	// The steady state: every watch answered at the end of its period
	// (20 s) and opened again.
	for renewed.Load() < int64(n) {
		if err := pollErr.Load(); err != nil {
			tb.Fatalf("a worker stopped polling: %v", err)
		}
		if time.Now().After(deadline.Add(4 * time.Minute)) {
			tb.Fatalf("%d of %d workers renewed their watch", renewed.Load(), n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if res.rssKB, err = rssKB(cmd.Process.Pid); err != nil {
		tb.Fatal(err)
	}
	res.heapKB, res.stackKB, res.idleKB, res.goroutines = engineMemory(tb, base)
	res.page = measurePage(tb, base, n)
	if err := pollErr.Load(); err != nil {
		tb.Fatalf("a worker stopped polling: %v", err)
	}
	return res
}

// attachSizes are the counts of workers measurement 10 attaches.
var attachSizes = []int{100, 1000, 10000}

func attachRows(rep *report, rs []attachResult) {
	by := map[int]attachResult{}
	var sizes, rss, status, page []string
	for _, r := range rs {
		by[r.n] = r
		sizes = append(sizes, strconv.Itoa(r.n))
		rss = append(rss, fmt.Sprintf("%.1f MB", mb(r.rssKB)))
		status = append(status, dur(r.status))
		page = append(page, dur(r.page))
	}
	at := strings.Join(sizes, " / ")
	big, mid := by[10000], by[1000]
	grows := func(a, b float64) (string, string) {
		if a == 0 || b == 0 {
			return "—", "—"
		}
		v, s := ratio(a, b)
		return s, verdict(v, 12, true, "×")
	}
	rt, gv := grows(float64(big.rssKB), float64(mid.rssKB))
	rep.add(row{fmt.Sprintf("engine RSS with %s workers attached and long-polling, each watch renewed once (host-example, reference plugin)", at), strings.Join(rss, " / "), "1,000", rt, "10,000/1,000 ≤ 12×", gv})
	if big.n > 0 {
		rep.add(row{"engine RSS with 10,000 workers attached and long-polling", fmt.Sprintf("%.1f MB", mb(big.rssKB)), "—", "—", "≤ 100 MB", verdict(mb(big.rssKB), 100, true, "MB")})
	}
	if mid.n > 0 {
		rep.add(row{"engine with 1000 workers attached (host-example, reference plugin): RSS", fmt.Sprintf("%.1f MB", mb(mid.rssKB)), "—", "—", "≤ 100 MB", verdict(mb(mid.rssKB), 100, true, "MB")})
	}
	for _, r := range rs {
		rep.add(row{fmt.Sprintf("engine attach handling, %d credentialed attaches %d at a time", r.n, attachParallel),
			fmt.Sprintf("%.0f/s (%s)", r.rate(), dur(r.elapsed)), "—", "—", "≥ 2000/s", verdict(r.rate(), 2000, false, "/s")})
	}
	for _, r := range rs {
		rep.note("Attach, %d workers: the engine's RSS %.1f MB right after the last attach; %.1f MB once every worker's watch was answered at its period's end and opened again (the rows' figure), of which its Go heap in use %.1f MB, freed heap not yet returned to the kernel %.1f MB and goroutine stacks %.1f MB (%d goroutines): %.1f KB of RSS a worker.",
			r.n, mb(r.burstRSSKB), mb(r.rssKB), mb(r.heapKB), mb(r.idleKB), mb(r.stackKB), r.goroutines, float64(r.rssKB)/float64(r.n))
	}
	rt, gv = grows(float64(big.status), float64(mid.status))
	rep.add(row{fmt.Sprintf("GET /status with %s workers polling (median of 3)", at), strings.Join(status, " / "), "1,000", rt, "10,000/1,000 ≤ 12×", gv})
	if big.n > 0 {
		rep.add(row{"GET /status with 10,000 workers polling", dur(big.status), "—", "—", "≤ 100 ms", verdict(ms(big.status), 100, true, "ms")})
	}
	rt, gv = grows(float64(big.page), float64(mid.page))
	rep.add(row{fmt.Sprintf("status page's first render in chromium (chromedp), %s workers: navigation to the frame after /status is drawn", at), strings.Join(page, " / "), "1,000", rt, "10,000/1,000 ≤ 12×", gv})
	if big.n > 0 {
		rep.add(row{"status page's first render in chromium, 10,000 workers", dur(big.page), "—", "—", "≤ 2 s", verdict(ms(big.page), 2000, true, "ms")})
	}
}

// engineMemory reads the Go runtime's figures from the engine's /metrics
// (open on loopback): heap in use, goroutine stacks and idle heap not
// yet released, in KB, and the number of goroutines.
func engineMemory(tb testing.TB, base string) (heapKB, stackKB, idleKB int64, goroutines int) {
	tb.Helper()
	const heap, stack, idle, released, gs = "go_memstats_heap_inuse_bytes", "go_memstats_stack_inuse_bytes",
		"go_memstats_heap_idle_bytes", "go_memstats_heap_released_bytes", "go_goroutines"
	v, err := sandboxtest.Metrics(http.DefaultClient, base+"/metrics", heap, stack, idle, released, gs)
	if err != nil {
		tb.Fatal(err)
	}
	if len(v) != 5 {
		tb.Fatalf("the engine's /metrics lacks some of %s, %s, %s, %s and %s: %v", heap, stack, idle, released, gs, v)
	}
	return int64(v[heap] / 1024), int64(v[stack] / 1024), int64((v[idle] - v[released]) / 1024), int(v[gs])
}

// maxPageWorkers is the status page's MAX_ROWS (host-example/web/app.js).
const maxPageWorkers = 100

// measurePage loads the status page in headless chromium and reads how
// long, from the navigation's start, the page took to show GET /status:
// the time of its "fluksio-status-shown" mark, which it sets in the frame
// after the one that drew the first answer. The count of workers it shows
// must be n, and its table at most maxPageWorkers rows.
func measurePage(tb testing.TB, base string, n int) time.Duration {
	tb.Helper()
	ctx := sandboxtest.Browser(tb)
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/")); err != nil {
		tb.Fatalf("loading the status page: %v", err)
	}
	const read = `JSON.stringify({shown: (performance.getEntriesByName("fluksio-status-shown")[0] || {startTime: 0}).startTime,
  count: Number(document.getElementById("workers-summary").dataset.count || -1),
  rows: document.querySelectorAll("#workers tbody tr").length})`
	deadline := time.Now().Add(time.Minute)
	for {
		raw, err := chromedp.Run(ctx, chromedp.Evaluate[string](read))
		if err != nil {
			tb.Fatalf("reading the status page: %v", err)
		}
		var v struct {
			Shown float64 `json:"shown"`
			Count int     `json:"count"`
			Rows  int     `json:"rows"`
		}
		if err := json.Unmarshal([]byte(raw), &v); err != nil {
			tb.Fatal(err)
		}
		if v.Shown > 0 {
			// Closed now, not when the benchmark ends: a page left open
			// asks for /status every 2 s and would load the next size.
			_ = chromedp.Cancel(ctx)
			// The page counts them all and lists a bounded few: the
			// time above holds only while the table does not grow with n.
			if v.Count != n || v.Rows != min(n, maxPageWorkers) {
				tb.Fatalf("the status page counts %d workers attached and lists %d; want %d and %d", v.Count, v.Rows, n, min(n, maxPageWorkers))
			}
			return time.Duration(v.Shown * float64(time.Millisecond))
		}
		if time.Now().After(deadline) {
			tb.Fatalf("the status page did not show /status within a minute (%s)", raw)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
