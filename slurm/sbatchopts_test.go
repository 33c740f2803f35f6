package slurm

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/fluksio/provision/internal/sandboxtest"
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
		opts, err := parseSbatchLine(line)
		if err != nil {
			t.Errorf("%q: %v", line, err)
			continue
		}
		found := false
		for _, o := range opts {
			found = found || o.is("--job-name", 'J')
		}

		script := "#!/bin/sh\n#SBATCH " + line + "\ntrue\n"
		cmd := exec.Command("sbatch", "--parsable", "--hold", "--output=/dev/null")
		cmd.Env = append(os.Environ(), "SLURM_CONF="+env.SlurmConf)
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
}

func slurmCmd(env sandboxtest.Env, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "SLURM_CONF="+env.SlurmConf)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
