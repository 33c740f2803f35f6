package slurm

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fluksio/provision/internal/testutil"
	"github.com/fluksio/provision/shared"
)

// TestShippedWorkerOthersCanWrite: with worker_command unset, a worker to
// ship of mode 0777 beside the plugin is refused at worker_command by
// validation, saying its path, its mode and chmod go-w PATH; at 0755 it
// passes, and with worker_command set it is not looked at.
func TestShippedWorkerOthersCanWrite(t *testing.T) {
	p := New(nil)
	p.files.workerDir = t.TempDir()
	worker := filepath.Join(p.files.workerDir, workerProgram+"-linux-amd64")
	if err := os.WriteFile(worker, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	validate := func(cfg map[string]any) shared.Diagnostics {
		t.Helper()
		resp, err := p.ValidateConfig(context.Background(), &shared.ValidateConfigRequest{Name: "hpc", Config: mustJSON(t, cfg)})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Diagnostics
	}
	shipped := baseConfig()
	delete(shipped, "worker_command")
	if d := validate(shipped); len(d) != 0 {
		t.Fatalf("a 0755 worker to ship: %v", d)
	}
	if err := os.Chmod(worker, 0o777); err != nil {
		t.Fatal(err)
	}
	d := validate(shipped)
	if len(d) != 1 || strings.Join(d[0].Path, ".") != "worker_command" || d[0].Summary != "Worker to ship others can write" ||
		!strings.Contains(d[0].Detail, worker+" is writable by group or others (mode 0777)") || !strings.Contains(d[0].Detail, "chmod go-w "+worker) {
		t.Errorf("a 0777 worker to ship: %v", d)
	}
	if d := validate(baseConfig()); len(d) != 0 {
		t.Errorf("with worker_command set, the worker to ship was looked at: %v", d)
	}
}

// TestBudgetDirSquatted: the RPC budget's directory made first by another
// user (uid 65534, where TMPDIR leads) is an error at max_rpc_rate in
// validation and at Configure, which configures nothing, each saying the
// path, the owner and the fix; no budget is kept elsewhere. A budget
// directory taken over after Configure fails the next command, which
// does not run (the fake ssh sees no squeue), with the same words.
func TestBudgetDirSquatted(t *testing.T) {
	dir := testutil.SquattedBudgetDir(t)
	says := func(what, text string) {
		t.Helper()
		for _, want := range []string{dir + " is owned by uid 65534, not this user (uid 0)", "rm -r " + dir} {
			if !strings.Contains(text, want) {
				t.Errorf("%s: %q does not say %q", what, text, want)
			}
		}
	}
	h := newUnconfigured(t, "squeue=ok")
	cfg := mustJSON(t, baseConfig())
	vresp, err := h.p.ValidateConfig(context.Background(), &shared.ValidateConfigRequest{Name: "hpc", Config: cfg})
	if err != nil || len(vresp.Diagnostics) != 1 || strings.Join(vresp.Diagnostics[0].Path, ".") != "max_rpc_rate" {
		t.Fatalf("ValidateConfig = %v, %v; want one error at max_rpc_rate", vresp, err)
	}
	says("ValidateConfig", vresp.Diagnostics[0].Detail)
	cresp, err := h.p.Configure(context.Background(), &shared.ConfigureRequest{Name: "hpc", Config: cfg, Host: h.host})
	if err != nil || !cresp.Diagnostics.HasErrors() || strings.Join(cresp.Diagnostics[0].Path, ".") != "max_rpc_rate" {
		t.Fatalf("Configure = %v, %v; want an error at max_rpc_rate", cresp, err)
	}
	says("Configure", cresp.Diagnostics[0].Detail)
	if h.p.settings() != nil {
		t.Fatal("Configure refused, yet configured")
	}

	if err := os.Chown(dir, 0, 0); err != nil {
		t.Fatal(err)
	}
	h.configure(t, nil)
	h.fake.forget(t)
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	_, _, err = h.p.q.Run(context.Background(), nil, "squeue", "-h", "--me")
	if err == nil {
		t.Fatal("squeue ran with the budget's directory another user's")
	}
	says("a command", err.Error())
	if n := len(h.fake.callsTo("squeue")); n != 0 {
		t.Errorf("%d squeue(s) ran unpaced", n)
	}
}

// TestProbeScriptCarriesTheValue: the probe's job runs its worker with
// the value of the engine's run the host gave the plugin
// (shared.ProbeAnswerEnv) in the worker's environment, as bash runs the
// script; a run's job does not carry it, nor does a probe given a value
// that is not 32 hex digits.
func TestProbeScriptCarriesTheValue(t *testing.T) {
	c := scriptConfigs["custom"]
	c.WorkerCommand = []string{"/bin/sh", "-c", `printf '%s\n' "${` + shared.ProbeAnswerEnv + `:-none}"`, "worker"}
	p := scriptProvisioner(t, c)
	prof := Profile{Name: "run", CPUs: 1}
	value := strings.Repeat("5a", 16)
	run := func(v string, probe bool) string {
		t.Helper()
		t.Setenv(shared.ProbeAnswerEnv, v)
		script := p.sub.scriptFor(prof, "http://engine:8470", "", "hpc-run-0123abcd", nil, [][]string{{goldenToken}}, probe)
		cmd := exec.Command("bash")
		cmd.Stdin = bytes.NewReader(script)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("bash: %v\n%s", err, script)
		}
		return strings.TrimSpace(string(out))
	}
	if got := run(value, true); got != value {
		t.Errorf("the probe's worker saw %q, want %q", got, value)
	}
	if got := run(value, false); got != "none" {
		t.Errorf("a run's worker saw %q, want none", got)
	}
	if got := run("$(touch /tmp/x)", true); got != "none" {
		t.Errorf("a probe given a value that is not hex saw %q, want none", got)
	}
}
