package worker

import (
	"bytes"
	"context"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
)

// credentialFor is a credential in the engine's v2 form
// (engine/host/credential.go) minted for cpus, gpus and ramMB, its MAC
// a stand-in: the worker only reads the shape, the engine verifies.
func credentialFor(cpus, gpus, ramMB string) string {
	payload := strings.Join([]string{"v2", "4102444800", "hpc", cpus, gpus, ramMB, "", "hpc-whole-0001"}, "\n")
	return base64.RawURLEncoding.EncodeToString([]byte(payload)) + "." + base64.RawURLEncoding.EncodeToString([]byte("mac"))
}

// TestWorkerOffersWhatTheJobGot: a real worker (Run) attaches to the
// test engine with what Slurm says its job got, as far as its
// credential allows, and runs as many one-CPU tasks at once as that:
//
//   - --size-from-job on a whole node: 16 CPUs (SLURM_CPUS_ON_NODE) for
//     --cpus 1, 3 GPUs (CUDA_VISIBLE_DEVICES) for --gpus 0, 8000 MB
//     (SLURM_MEM_PER_NODE) for no --ram-mb;
//   - without it, SLURM_CPUS_ON_NODE above --cpus still counts (an
//     OverSubscribe=EXCLUSIVE partition's node), memory and GPUs not;
//   - SLURM_GPUS_ON_NODE where CUDA_VISIBLE_DEVICES is not set;
//   - a credential minted for less keeps the worker to it, and says so;
//   - a variable absent leaves the flag's value.
func TestWorkerOffersWhatTheJobGot(t *testing.T) {
	whole := map[string]string{"SLURM_CPUS_ON_NODE": "16", "SLURM_MEM_PER_NODE": "8000", "CUDA_VISIBLE_DEVICES": "0,1,2", "SLURM_JOB_ID": "77"}
	for _, tc := range []struct {
		name       string
		args       []string
		env        map[string]string
		cred       string
		cpus, gpus int
		ram        int64
		note       string
	}{
		{"whole node", []string{"--cpus", "1", "--size-from-job"}, whole, credentialFor("16", "3", "8000"), 16, 3, 8000, ""},
		{"cpus alone", []string{"--cpus", "1"}, whole, credentialFor("16", "3", "8000"), 16, 0, 0, ""},
		{"gpus on node", []string{"--cpus", "1", "--size-from-job"}, map[string]string{"SLURM_GPUS_ON_NODE": "2"}, credentialFor("1", "2", "0"), 1, 2, 0, ""},
		{"credential caps", []string{"--cpus", "1", "--size-from-job"}, whole, credentialFor("4", "0", "0"), 4, 0, 0, "the job got 16 cpus; offering 4"},
		{"no variables", []string{"--cpus", "2", "--gpus", "1", "--ram-mb", "500", "--size-from-job"}, nil, credentialFor("16", "3", "8000"), 2, 1, 500, ""},
		{"credential unread", []string{"--cpus", "1", "--size-from-job"}, whole, testToken, 1, 0, 0, "cannot be read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEngine(t)
			e.token = tc.cred
			env := map[string]string{"TMPDIR": t.TempDir()}
			for k, v := range tc.env {
				env[k] = v
			}
			env[shared.WorkerTokenEnv] = tc.cred
			var logs syncBuffer
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			// A task for each CPU offered, of a second each: they run at
			// once when the worker counts its CPUs right.
			ids := make([]string, tc.cpus)
			for i := range ids {
				ids[i] = e.Add(Task{Requires: []string{FeatureCommand}, Command: []string{"sleep", "1"}, Need: Need{CPUs: 1}}, nil)
			}
			exited := make(chan int, 1)
			args := append([]string{"--url", e.URL(), "--max-idle", "1"}, tc.args...)
			start := time.Now()
			go func() { exited <- Run(ctx, args, func(k string) string { return env[k] }, &bytes.Buffer{}, &logs) }()
			e.waitFor(t, "every task's result", func(e *testEngine) bool {
				for _, id := range ids {
					if e.tasks[id].result == nil {
						return false
					}
				}
				return true
			})
			took := time.Since(start)
			e.mu.Lock()
			got := e.attached
			e.mu.Unlock()
			t.Logf("attached with %d cpus, %d gpus, %d MB; %d one-second tasks took %s", got.CPUs, got.GPUs, got.RAMMB, len(ids), took.Round(10*time.Millisecond))
			if got.CPUs != tc.cpus || got.GPUs != tc.gpus || got.RAMMB != tc.ram {
				t.Errorf("attached with %d cpus, %d gpus, %d MB; want %d, %d, %d\n%s", got.CPUs, got.GPUs, got.RAMMB, tc.cpus, tc.gpus, tc.ram, logs.String())
			}
			if took > 5*time.Second {
				t.Errorf("%d one-second tasks took %s; want them at once\n%s", len(ids), took, logs.String())
			}
			if tc.note != "" && !strings.Contains(logs.String(), tc.note) {
				t.Errorf("the log does not say %q:\n%s", tc.note, logs.String())
			}
			cancel()
			select {
			case <-exited:
			case <-time.After(30 * time.Second):
				t.Fatalf("the worker did not stop:\n%s", logs.String())
			}
		})
	}
}
