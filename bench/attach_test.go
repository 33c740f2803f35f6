package bench

// Measurement 10: the engine with a thousand workers attached. The real
// engine (bin/host-example) runs with the reference plugin, which "starts"
// machines by remembering them, so that a thousand machines cost no
// cluster: the engine asks for a thousand, the plugin records each one's
// job (worker_provisioned), and this harness attaches a worker for each
// over HTTP, with a credential signed under the engine's secret (set with
// secret_env), 64 at a time. It reports how many attaches a second the
// engine handled and its resident set with the thousand attached.

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/shared/host"
)

const (
	attachWorkers  = 1000
	attachParallel = 64
)

type attachResult struct {
	elapsed  time.Duration
	attached int
	rssKB    int64
}

func (a attachResult) rate() float64 { return float64(a.attached) / max(a.elapsed.Seconds(), 1e-9) }

func measureAttach(tb testing.TB, e benchEnv) attachResult {
	tb.Helper()
	secret := bytes.Repeat([]byte{0x5a}, 32)
	port := sandboxtest.FreePort(tb)
	dir, err := os.MkdirTemp("", "fxb-attach-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	cfg := filepath.Join(dir, "config.hcl")
	body := fmt.Sprintf(`engine {
  listen     = "127.0.0.1:%d"
  secret_env = "FLUKSIO_BENCH_SECRET"
}
provisioner "memory" "mem" {
  plugin   = %q
  greeting = "hi"
}
`, port, e.TestBin)
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(e.HostBin, "run", "-config", cfg, "-need", fmt.Sprintf("cpus=1,count=%d", attachWorkers))
	cmd.Env = append(os.Environ(), "FLUKSIO_BENCH_SECRET="+hex.EncodeToString(secret))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
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

	// The thousand machines the plugin recorded, from GET /status.
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	type machine struct{ worker, job string }
	var machines []machine
	deadline := time.Now().Add(time.Minute)
	for len(machines) < attachWorkers {
		if time.Now().After(deadline) {
			tb.Fatalf("the plugin did not record %d machines within a minute (%d)\nengine stderr:\n%s", attachWorkers, len(machines), tail(stderr.String(), 20))
		}
		time.Sleep(200 * time.Millisecond)
		resp, err := http.Get(base + "/status")
		if err != nil {
			continue
		}
		var st struct {
			Provisioners []struct {
				Status *struct {
					Outstanding []struct{ Job, Worker string } `json:"outstanding"`
				} `json:"status"`
			} `json:"provisioners"`
		}
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err != nil || len(st.Provisioners) != 1 || st.Provisioners[0].Status == nil {
			continue
		}
		machines = machines[:0]
		for _, o := range st.Provisioners[0].Status.Outstanding {
			machines = append(machines, machine{o.Worker, o.Job})
		}
	}

	// The plugin publishes each machine's job before its Provision
	// returns, and the engine logs the burst once it has: from then on
	// every job is recorded, and what is timed is the attaches alone.
	for !strings.Contains(stderr.String(), "provisioner asked for machines") {
		if time.Now().After(deadline) {
			tb.Fatalf("the engine never logged the burst\n%s", tail(stderr.String(), 20))
		}
		time.Sleep(50 * time.Millisecond)
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
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					ok.Add(1)
					return
				}
				err = fmt.Errorf("attach %s: %s", m.worker, resp.Status)
			}
			firstErr.CompareAndSwap(nil, err)
		}()
	}
	wg.Wait()
	res := attachResult{elapsed: time.Since(t0), attached: int(ok.Load())}
	if res.attached != len(machines) {
		tb.Fatalf("%d of %d workers attached; first error: %v", res.attached, len(machines), firstErr.Load())
	}
	if res.rssKB, err = rssKB(cmd.Process.Pid); err != nil {
		tb.Fatal(err)
	}
	return res
}

func attachRows(rep *report, a attachResult) {
	rep.add(row{fmt.Sprintf("engine with %d workers attached (host-example, reference plugin): RSS", attachWorkers),
		fmt.Sprintf("%.1f MB", mb(a.rssKB)), "—", "—", "≤ 100 MB", verdict(mb(a.rssKB), 100, true, "MB")})
	rep.add(row{fmt.Sprintf("engine attach handling, %d credentialed attaches %d at a time", attachWorkers, attachParallel),
		fmt.Sprintf("%.0f/s (%s)", a.rate(), dur(a.elapsed)), "—", "—", "≥ 500/s", verdict(a.rate(), 500, false, "/s")})
}
