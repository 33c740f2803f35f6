package slurm_test

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/shared/conformance"
)

// hclString quotes s for HCL. Go's %q agrees with HCL for the printable
// ASCII these values are made of.
func hclString(s string) string { return fmt.Sprintf("%q", s) }

func hclList(ss ...string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = hclString(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// TestIntegrationConformance runs the SDK's conformance kit against the
// real plugin binary and the sandbox: its Provision really submits, and
// its Shutdown must cancel what it submitted.
func TestIntegrationConformance(t *testing.T) {
	env := sandboxtest.Require(t)
	name := "conf-" + randHex(3)
	t.Cleanup(func() {
		if _, err := slurm(env, "scancel", "--name=fluksio-"+name); err != nil {
			t.Error(err)
		}
		waitQueueEmpty(t, env, name)
	})
	w := newWorker(t)

	// body is a provisioner block's body with the given overrides: each
	// replaces the attribute of its name, at the top level or in the
	// profile block.
	body := func(top, prof map[string]string) string {
		attrs := map[string]string{
			"login":          hclString(env.Login),
			"ssh_port":       fmt.Sprint(env.Port),
			"ssh_key":        hclString(env.Key),
			"known_hosts":    hclString(env.KnownHosts),
			"engine_url":     hclString(engineURL),
			"max_idle":       hclString("2m"),
			"submit_timeout": hclString("20s"),
			"worker_command": hclList(w.script),
		}
		profAttrs := map[string]string{
			"cpus":   "1",
			"ram_mb": "100",
			"labels": hclList("cuda"),
			"sbatch": hclList("--partition="+env.Partition, "--time=00:05:00", w.outputOption()),
		}
		for k, v := range top {
			attrs[k] = v
		}
		for k, v := range prof {
			profAttrs[k] = v
		}
		var b strings.Builder
		for _, k := range sortedKeys(attrs) {
			fmt.Fprintf(&b, "%s = %s\n", k, attrs[k])
		}
		b.WriteString("profile \"small\" {\n")
		for _, k := range sortedKeys(profAttrs) {
			fmt.Fprintf(&b, "  %s = %s\n", k, profAttrs[k])
		}
		b.WriteString("}\n")
		return b.String()
	}

	conformance.Run(t, conformance.Config{
		Binary:       sandboxtest.Binary(t, "plugin", "provisioner-slurm"),
		Name:         name,
		HCL:          body(nil, nil),
		EventTimeout: 45 * time.Second,
		// sbatch refuses a partition that does not exist: the profile
		// must back off.
		Failing: body(nil, map[string]string{"sbatch": hclList("--partition=no-such-partition", "--time=00:05:00")}),
		Invalid: []conformance.Invalid{
			{HCL: body(nil, map[string]string{"sbatch": hclList("--partition="+env.Partition, "--job-name=x")}),
				Path: []string{"profile", "0", "sbatch", "1"}},
			{HCL: body(map[string]string{"engine_url": hclString("not a url")}, nil),
				Path: []string{"engine_url"}},
			{HCL: body(map[string]string{"ssh_options": hclList("BatchMode=no")}, nil),
				Path: []string{"ssh_options", "0"}},
			{HCL: body(nil, map[string]string{"labels": hclList("cuda", "has space")}),
				Path: []string{"profile", "0", "labels", "1"}},
			{HCL: body(map[string]string{"login": hclString("-oProxyCommand=sh")}, nil),
				Path: []string{"login"}},
		},
	})

	// The kit's Provision really submitted, and its Shutdown cancelled
	// the jobs rather than leaving them: with -t all, the finished job is
	// still listed, as CANCELLED.
	if t.Failed() {
		return
	}
	poll(t, "the kit's job to be CANCELLED", jobTimeout, func() (bool, string) {
		out, err := slurm(env, "squeue", "-h", "-t", "all", "--name=fluksio-"+name, "-o", "%T")
		if err != nil {
			return false, err.Error()
		}
		// The kit asks for two machines: one array of two tasks, which
		// squeue may list as one record or two.
		states := strings.Fields(out)
		for _, st := range states {
			if st != "CANCELLED" {
				return false, out
			}
		}
		return len(states) >= 1, out
	})
}

// TestIntegrationConformanceChecker runs the checker binary, as an
// author without Go would, against the real plugin and the sandbox: every
// check passes, and what its Provision submitted is cancelled by its
// Shutdown.
func TestIntegrationConformanceChecker(t *testing.T) {
	env := sandboxtest.Require(t)
	name := "chk-" + randHex(3)
	t.Cleanup(func() {
		if _, err := slurm(env, "scancel", "--name=fluksio-"+name); err != nil {
			t.Error(err)
		}
		waitQueueEmpty(t, env, name)
	})
	w := newWorker(t)
	body := fmt.Sprintf(`login          = %s
ssh_port       = %d
ssh_key        = %s
known_hosts    = %s
engine_url     = %s
max_idle       = "2m"
submit_timeout = "20s"
worker_command = %s
profile "small" {
  cpus   = 1
  ram_mb = 100
  sbatch = %s
}
`, hclString(env.Login), env.Port, hclString(env.Key), hclString(env.KnownHosts), hclString(engineURL),
		hclList(w.script), hclList("--partition="+env.Partition, "--time=00:05:00", w.outputOption()))
	dir := t.TempDir()
	write := func(file, body string) string {
		path := filepath.Join(dir, file)
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	config := write("slurm.hcl", body)
	partition := hclList("--partition="+env.Partition, "--time=00:05:00", w.outputOption())
	// A diagnostic checked from a file, as an author in any language
	// checks theirs, and a profile sbatch refuses, for the backoff check.
	invalid := write("url.hcl", "# path: engine_url\n"+strings.Replace(body, hclString(engineURL), hclString("not a url"), 1))
	failing := write("failing.hcl", strings.Replace(body, partition, hclList("--partition=no-such-partition", "--time=00:05:00"), 1))
	checker := sandboxtest.Binary(t, "shared/conformance/provisioner-conformance", "provisioner-conformance")
	cmd := exec.Command(checker, "-plugin", sandboxtest.Binary(t, "plugin", "provisioner-slurm"),
		"-config", config, "-name", name, "-event-timeout", "45s", "-invalid", invalid, "-failing", failing)
	out, err := cmd.CombinedOutput()
	t.Logf("checker:\n%s", out)
	if err != nil {
		t.Fatalf("the checker failed the Slurm plugin: %v", err)
	}
	if n := strings.Count(string(out), "PASS  "); n != len(conformance.Checks) || strings.Contains(string(out), "not run") {
		t.Errorf("%d checks passed, want %d, all run", n, len(conformance.Checks))
	}
	poll(t, "the checker's jobs to be CANCELLED", jobTimeout, func() (bool, string) {
		out, err := slurm(env, "squeue", "-h", "-t", "all", "--name=fluksio-"+name, "-o", "%T")
		if err != nil {
			return false, err.Error()
		}
		states := strings.Fields(out)
		for _, st := range states {
			if st != "CANCELLED" {
				return false, out
			}
		}
		return len(states) >= 1, out
	})
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }
