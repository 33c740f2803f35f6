package slurm

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/slurm/sbatch"
)

// TestSbatchReadsWhatValidationReads checks the parser against the real
// sbatch: each line goes into a script as "#SBATCH <line>", is submitted
// held, and what Slurm recorded as the job's name is read back with
// scontrol. Validation must find -J/--job-name exactly where sbatch
// honoured it. Before, validation read a line's first word only, and
// every line below that smuggles -J in was accepted.
func TestSbatchReadsWhatValidationReads(t *testing.T) {
	env := sandboxtest.Require(t)
	p := "--partition=" + env.Partition
	lines := []string{
		p + " -J smuggled",
		p + "\t-J smuggled",
		p + "\v-J smuggled",
		p + "\f--job-name=smuggled",
		p + " --job=smuggled",
		"-p " + env.Partition + " -J smuggled",
		"-vJ smuggled " + p,
		p + " # -J smuggled",
		p + " #-J smuggled",
		"--time=5 " + p,
		`--comment="a -J smuggled" ` + p,
	}
	nameRe := regexp.MustCompile(`JobName=(\S+)`)
	for _, line := range lines {
		opts, err := sbatch.ParseLine(line)
		if err != nil {
			t.Errorf("%q: %v", line, err)
			continue
		}
		found := false
		for _, o := range opts {
			found = found || o.Is("--job-name", 'J')
		}

		script := "#!/bin/sh\n#SBATCH " + line + "\ntrue\n"
		cmd := env.Command("sbatch", "--parsable", "--hold", "--output=/dev/null")
		cmd.Stdin = strings.NewReader(script)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("%q: sbatch: %v: %s", line, err, out)
			continue
		}
		job := strings.TrimSpace(string(out))
		job = job[strings.LastIndexByte(job, '\n')+1:]
		show, err := slurmCmd(env, "scontrol", "show", "job", job)
		slurmCmd(env, "scancel", job)
		if err != nil {
			t.Errorf("%q: %v", line, err)
			continue
		}
		m := nameRe.FindStringSubmatch(show)
		honoured := m != nil && m[1] == "smuggled"
		if honoured != found {
			t.Errorf("%q: sbatch set JobName=%v, validation found -J: %v", line, m, found)
		}
	}

	// A prerun line that looks like a directive is not one: the script
	// the provisioner writes ends the directives before the prerun lines.
	c := hostileBase("true")
	c["profile"].([]any)[0].(map[string]any)["prerun"] = []string{"#SBATCH -J smuggled"}
	c["profile"].([]any)[0].(map[string]any)["sbatch"] = []string{p}
	raw, _ := json.Marshal(c)
	prov, ok := configured(t, raw)
	if !ok {
		t.Fatal("refused")
	}
	prof := prov.settings().Profiles[0]
	show := submitHeld(t, env, string(prov.sub.payload(prof, "hard-"+prof.Name+"-00000000", "tok")))
	if m := nameRe.FindStringSubmatch(show); m == nil || m[1] != "fluksio-hard" {
		t.Errorf("a prerun line set the job's name: %v", m)
	}
}

// submitHeld submits script held and returns what scontrol shows of it.
func submitHeld(t *testing.T, env sandboxtest.Env, script string) string {
	t.Helper()
	cmd := env.Command("sbatch", "--parsable", "--hold", "--output=/dev/null", "--partition="+env.Partition)
	cmd.Stdin = strings.NewReader(script)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sbatch: %v: %s", err, out)
	}
	job := strings.TrimSpace(string(out))
	job = job[strings.LastIndexByte(job, '\n')+1:]
	show, err := slurmCmd(env, "scontrol", "show", "job", job)
	slurmCmd(env, "scancel", job)
	if err != nil {
		t.Fatal(err)
	}
	return show
}

func slurmCmd(env sandboxtest.Env, name string, args ...string) (string, error) {
	cmd := env.Command(name, args...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
