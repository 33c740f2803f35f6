package main

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/internal/testutil"
)

// A memory run is host-example run without Slurm: its provisioner is
// examples/testplugin (a real plugin subprocess that records each
// machine it is asked for and starts none), and the test starts a real
// fluksio-worker process for each machine recorded, with a credential
// signed by the engine's secret, as a job's payload would. What runs
// between the engine and its workers is real (the plugin, the worker
// protocol, the tasks' commands); Slurm is not there to slow a run of
// thousands of tasks or to keep it from queueing them all.

// memSecretEnv holds the engine's secret in a memory run.
const memSecretEnv = "FLUKSIO_MEM_SECRET"

// memRun is one memory run: the engine's process and the workers the
// test started for it.
type memRun struct {
	p       *engineProc
	base    string
	dir     string
	results string
	// machines is the pool's size (the plugin's max_workers).
	machines int

	// mu guards workers.
	mu      sync.Mutex
	workers []*exec.Cmd
	done    []chan struct{}
}

// startMemRun runs host-example run with a pool of machines, the tasks
// file tasks (none when empty; their results go under a directory of
// the test's) and args.
func startMemRun(t *testing.T, machines int, tasks string, args ...string) *memRun {
	t.Helper()
	hostBin := sandboxtest.Binary(t, "host-example", "host-example")
	plugin := testutil.BuildTestPlugin(t)
	port := sandboxtest.FreePort(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.hcl")
	body := fmt.Sprintf(`engine {
  listen     = "127.0.0.1:%d"
  secret_env = %q
}
provisioner "memory" "mem" {
  plugin      = %q
  greeting    = "hi"
  max_workers = %d
}
`, port, memSecretEnv, plugin, machines)
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	r := &memRun{base: fmt.Sprintf("http://127.0.0.1:%d", port), dir: dir, results: filepath.Join(dir, "results"), machines: machines}
	if tasks != "" {
		args = append([]string{"-tasks", tasks, "-results", r.results}, args...)
	}
	p := &engineProc{stdout: &storyWriter{}, stderr: &lockedBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(hostBin, append([]string{"run", "-config", cfg}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	p.cmd.Env = append(os.Environ(), memSecretEnv+"="+hex.EncodeToString(testSecret))
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p.cmd.WaitDelay = 10 * time.Second
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	r.p = p
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(60 * time.Second):
				t.Logf("killing engine pid %d and its process group", p.cmd.Process.Pid)
				syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
				<-p.done
			}
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		for i, d := range r.done {
			select {
			case <-d:
			case <-time.After(30 * time.Second):
				t.Logf("worker pid %d still running 30 s after the engine stopped; killing it", r.workers[i].Process.Pid)
				r.workers[i].Process.Kill()
				<-d
			}
		}
	})
	poll(t, 60*time.Second, "the engine to answer GET /health", func() bool {
		if p.exited() {
			t.Fatalf("the engine exited early\nstdout:\n%s\nstderr:\n%s", p.stdout, p.stderr)
		}
		resp, err := http.Get(r.base + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return r
}

// machinesAsked waits for the plugin to have recorded every machine of
// the pool, and returns them by worker name, with their jobs.
func (r *memRun) machinesAsked(t *testing.T) map[string]string {
	t.Helper()
	machines := map[string]string{}
	poll(t, 60*time.Second, fmt.Sprintf("the plugin to record %d machines", r.machines), func() bool {
		var st struct {
			Provisioners []struct {
				Status *struct {
					Outstanding []struct {
						Job    string `json:"job"`
						Worker string `json:"worker"`
					} `json:"outstanding"`
				} `json:"status"`
			} `json:"provisioners"`
		}
		if err := getJSON(r.base+"/status?limit=0", &st); err != nil {
			return false
		}
		for _, p := range st.Provisioners {
			if p.Status != nil {
				for _, o := range p.Status.Outstanding {
					machines[o.Worker] = o.Job
				}
			}
		}
		return len(machines) >= r.machines
	})
	return machines
}

// startWorkers starts a real fluksio-worker for each machine the plugin
// recorded, as its job would: its credential in the environment, its
// job's id in SLURM_JOB_ID.
func (r *memRun) startWorkers(t *testing.T) {
	t.Helper()
	bin := sandboxtest.Binary(t, "worker/fluksio-worker", "fluksio-worker")
	signer := host.NewSigner(testSecret)
	work := filepath.Join(r.dir, "work")
	if err := os.MkdirAll(work, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, job := range r.machinesAsked(t) {
		tok, _, err := signer.Sign(host.CredentialClaims{Worker: name, Provisioner: "mem", CPUs: 1, RAMMB: 1000}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "--url", r.base, "--cpus", "1", "--gpus", "0", "--max-idle", "600")
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "TMPDIR=" + work, "SLURM_JOB_ID=" + job, "FLUKSIO_WORKER_TOKEN=" + tok}
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		log, err := os.Create(filepath.Join(r.dir, name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		log.Close()
		d := make(chan struct{})
		go func() {
			cmd.Wait()
			close(d)
		}()
		r.mu.Lock()
		r.workers, r.done = append(r.workers, cmd), append(r.done, d)
		r.mu.Unlock()
	}
}

// getJSON decodes GET u into v, as the engine's operator on this
// machine.
func getJSON(u string, v any) error {
	resp, err := http.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// writeTaskFile writes a tasks file of n tasks, line(i) each.
func writeTaskFile(t *testing.T, n int, line func(i int) string) string {
	t.Helper()
	var b strings.Builder
	for i := range n {
		b.WriteString(line(i))
		b.WriteByte('\n')
	}
	p := filepath.Join(t.TempDir(), "tasks.jsonl")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
