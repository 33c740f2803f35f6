package slurm

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/shared"
)

// TestProfilesMeanWhatTheySay: an sbatch option that restates one of the
// profile's numbers must agree with it; one that contradicts it is an
// error at its line, naming both values and what to write; memory asked
// for under ram_mb = 0 is a warning.
func TestProfilesMeanWhatTheySay(t *testing.T) {
	for _, c := range []struct {
		cpus, gpus int
		ramMB      int64
		line       string
		severity   shared.Severity // 0: no diagnostic
		says       string
	}{
		{4, 0, 0, "--cpus-per-task=4", 0, ""},
		{4, 0, 0, "-c 4", 0, ""},
		{4, 0, 0, "-c8", shared.SeverityError, "asks Slurm for 8 CPUs a machine, but cpus = 4"},
		{4, 0, 0, "--cpus-per=2", shared.SeverityError, "set cpus = 2"},
		{8, 2, 0, "--cpus-per-gpu=4", 0, ""},
		{8, 2, 0, "--cpus-per-gpu=2", shared.SeverityError, "asks Slurm for 4 CPUs a machine, but cpus = 8"},
		{8, 0, 0, "--cpus-per-gpu=2", shared.SeverityError, "gpus = 0"},
		{1, 0, 500, "--mem=500M", 0, ""},
		{1, 0, 1024, "--mem=1G", 0, ""},
		{1, 0, 500, "--mem=1G", shared.SeverityError, "asks Slurm for 1024 MB a machine, but ram_mb = 500"},
		{1, 0, 500, "--mem=0", shared.SeverityError, "all of a node's memory"},
		{4, 0, 4096, "--mem-per-cpu=1G", 0, ""},
		{4, 0, 1000, "--mem-per-cpu=1G", shared.SeverityError, "4096 MB a machine (× cpus = 4), but ram_mb = 1000"},
		{1, 0, 0, "--mem=2G", shared.SeverityWarning, "Set ram_mb = 2048"},
		{1, 2, 0, "--gres=gpu:2", 0, ""},
		{1, 2, 0, "--gres=gpu:a100:2,lustre:1", 0, ""},
		{1, 1, 0, "--gres=gpu", 0, ""},
		{1, 1, 0, "--gres=gpu:2", shared.SeverityError, "asks Slurm for 2 GPUs a machine, but gpus = 1"},
		{1, 0, 0, "--gres=gpu:a100:2", shared.SeverityError, "set gpus = 2"},
		{1, 0, 0, "--gres=lustre:1", 0, ""},
		{1, 2, 0, "-G 2", 0, ""},
		{1, 2, 0, "--gpus=a100:1", shared.SeverityError, "1 GPUs a machine, but gpus = 2"},
		{1, 2, 0, "--gpus-per-node=4", shared.SeverityError, "4 GPUs a machine, but gpus = 2"},
		{1, 0, 0, "--partition=debug --mem=1G", shared.SeverityWarning, "ram_mb = 0"},
	} {
		cfg := baseConfig()
		cfg["profile"] = []any{map[string]any{"name": "p", "cpus": c.cpus, "gpus": c.gpus, "ram_mb": c.ramMB, "labels": nil,
			"sbatch": []string{"--partition=debug", c.line}, "prerun": nil}}
		_, diags := parseConfig("hpc", mustJSON(t, cfg))
		switch {
		case c.severity == 0 && len(diags) > 0:
			t.Errorf("cpus=%d gpus=%d ram_mb=%d %q: %v; want none", c.cpus, c.gpus, c.ramMB, c.line, diags)
		case c.severity != 0 && (len(diags) != 1 || diags[0].Severity != c.severity ||
			strings.Join(diags[0].Path, ".") != "profile.0.sbatch.1" || !strings.Contains(diags[0].Detail, c.says)):
			t.Errorf("cpus=%d gpus=%d ram_mb=%d %q: %v; want one %v at profile.0.sbatch.1 saying %q", c.cpus, c.gpus, c.ramMB, c.line, diags, c.severity, c.says)
		}
	}
}

// TestBegin: a --begin relative to submission moves the deadline, the
// credential's lifetime and provision_timeout by its delay, and one that
// cannot fit in the credential's cap is an error at its line; the
// wall-clock forms are TestBeginForms', the relative ones
// sbatch.TestRelativeBegin's.
func TestBegin(t *testing.T) {
	s := &settings{provisionTimeout: 15 * time.Minute}
	prof := Profile{Name: "later", CPUs: 1, Sbatch: []string{"--time=00:10:00", "--begin=now+1hour"}}
	p := New(nil)
	p.cfg = s
	script := string(p.sub.script(prof, "http://e", "", "w", nil, [][]string{{"t"}}))
	if want := "#SBATCH --deadline=now+" + strconv.Itoa(int((time.Hour + 25*time.Minute).Seconds())) + "seconds\n"; !strings.Contains(script, want) {
		t.Errorf("the script has no %q:\n%s", want, script)
	}
	if ttl := s.credentialTTL(prof, time.Now()); ttl != time.Hour+25*time.Minute+tokenMargin {
		t.Errorf("credential TTL %s, want the begin's hour more", ttl)
	}
	// The attack's figure: a begin two days out validated, and its worker
	// could never attach (issue 24, item 7). Refused at its line, and so
	// is any begin that, with the queue wait and time limit, outlasts the
	// credential's cap or a shorter token_ttl.
	for _, c := range []struct {
		sbatch   []string
		tokenTTL string
		at       string // "" for no error
		says     string
	}{
		{[]string{"--time=01:00:00", "--begin=now+2days"}, "", "profile.0.sbatch.1", "must fit the credential's 12h cap"},
		{[]string{"--begin=now+2days", "--partition=debug"}, "", "profile.0.sbatch.0", "no --time"},
		{[]string{"--time=02:00:00", "--begin now+11hours"}, "", "profile.0.sbatch.1", "need it for 13h25m"},
		{[]string{"--time=02:00:00", "--begin=now+9hours"}, "", "", ""},
		{[]string{"--time=02:00:00", "--begin=now+1hour"}, "", "", ""},
		{[]string{"--time=12:00:00"}, "", "", ""}, // no begin: capped as before, not refused
		{[]string{"--time=00:10:00", "--begin=now+1hour"}, "30m", "profile.0.sbatch.1", "must fit token_ttl (30m)"},
		{[]string{"--begin=tomorrow", "--time=01:00:00"}, "", "profile.0.sbatch.0", "a time of day comes every day"},
	} {
		cfg := baseConfig()
		cfg["token_ttl"] = c.tokenTTL
		cfg["profile"] = []any{map[string]any{"name": "p", "cpus": 1, "gpus": 0, "ram_mb": 0, "labels": nil, "sbatch": c.sbatch, "prerun": nil}}
		_, diags := parseConfig("hpc", mustJSON(t, cfg))
		var errs shared.Diagnostics
		for _, d := range diags {
			if d.Severity == shared.SeverityError {
				errs = append(errs, d)
			}
		}
		switch {
		case c.at == "" && len(errs) != 0:
			t.Errorf("%q token_ttl %q: %v; want no error", c.sbatch, c.tokenTTL, errs)
		case c.at != "" && (len(errs) != 1 || strings.Join(errs[0].Path, ".") != c.at || !strings.Contains(errs[0].Detail, c.says)):
			t.Errorf("%q token_ttl %q: %v; want one error at %s saying %q", c.sbatch, c.tokenTTL, errs, c.at, c.says)
		}
	}
	if credentialCap != host.DefaultMaxCredentialTTL {
		t.Errorf("the plugin's credentialCap %s is not the engine's cap %s", credentialCap, host.DefaultMaxCredentialTTL)
	}

}
