package slurm

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden scripts in testdata")

// goldenToken has everything a shell would act on, so the golden files
// show the quoting.
const goldenToken = "tok'en$(id)`x`\"y\" z"

var scriptProfiles = []Profile{
	{Name: "tiny", CPUs: 1},
	{Name: "big", CPUs: 16, RAMMB: 64000, Labels: []string{"bigmem", "x86"},
		Sbatch: []string{"--partition=debug", "--time=04:00:00", "--account=proj-42"},
		Prerun: []string{"module load python/3.12", "source ~/venvs/fluksio/bin/activate"}},
	{Name: "gpu", CPUs: 8, GPUs: 2, RAMMB: 32000, Labels: []string{"cuda"}},
	{Name: "gpu-own", CPUs: 8, GPUs: 2, RAMMB: 32768,
		Sbatch: []string{"--gres=gpu:a100:2", "--mem-per-cpu=4G", "-c 8", "--partition=gpu"}},
}

var scriptConfigs = map[string]Config{
	"default": {
		Login:         Logins{Entries: []string{"alice@login.example.org"}},
		EngineURL:     "https://engine.example.org:8765",
		MaxIdle:       "5m",
		WorkerCommand: []string{"fluksio-worker"},
	},
	"custom": {
		Login:         Logins{Entries: []string{"alice@login.example.org"}},
		EngineURL:     "http://10.0.0.5:8765/?a=b&c=d",
		ArtifactURL:   "https://artifacts.example.org/store",
		MaxIdle:       "90s",
		WorkerCommand: []string{"/opt/fluksio env/bin/fluksio-worker", "--log-level=debug"},
	},
	// worker_command unset: the plugin's copy of the worker
	// (goldenShipped), checked by its sha256 before it runs.
	"shipped": {
		Login:     Logins{Entries: []string{"alice@login.example.org"}},
		EngineURL: "https://engine.example.org:8765",
		MaxIdle:   "5m",
	},
}

// goldenShipped is the shipped worker's copy in the golden scripts, in a
// home whose name needs quoting.
var goldenShipped = workerCopy{
	path: "/home/o'neil x/" + workerShipDir + "/" + workerProgram + "-0123456789abcdef",
	sum:  strings.Repeat("0123456789abcdef", 4),
}

// scriptProvisioner returns a configured Provisioner without going
// through Configure, so a script test needs no profile list or host.
func scriptProvisioner(t *testing.T, c Config) *Provisioner {
	t.Helper()
	c.Profiles = scriptProfiles
	c.fillDefaults()
	s := &settings{name: "hpc", Config: c}
	if diags := validate(s); diags.HasErrors() {
		t.Fatal(diags)
	}
	if err := s.identity("prod", "4f3c2b1a"); err != nil {
		t.Fatal(err)
	}
	p := New(nil)
	p.cfg = s
	if c.WorkerCommand == nil {
		p.files.shipped = goldenShipped
	}
	return p
}

func TestScriptGolden(t *testing.T) {
	for cname, c := range scriptConfigs {
		p := scriptProvisioner(t, c)
		for _, prof := range scriptProfiles {
			name := cname + "-" + prof.Name
			t.Run(name, func(t *testing.T) {
				got := p.sub.payload(prof, "hpc-"+prof.Name+"-0123abcd", goldenToken)
				path := filepath.Join("testdata", name+".sh")
				if *update {
					if err := os.WriteFile(path, got, 0o644); err != nil {
						t.Fatal(err)
					}
				}
				want, err := os.ReadFile(path)
				if err != nil {
					t.Fatalf("%v (run go test -update to write it)", err)
				}
				if !bytes.Equal(got, want) {
					t.Errorf("script differs from %s:\n--- got\n%s--- want\n%s", path, got, want)
				}
				checkScript(t, got)
			})
		}
	}
}

// checkScript checks what every script must be: valid bash, and every
// #SBATCH line before the first command, where sbatch stops reading them.
func checkScript(t *testing.T, script []byte) {
	t.Helper()
	cmd := exec.Command("bash", "-n")
	cmd.Stdin = bytes.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("bash -n: %v\n%s\n%s", err, out, script)
	}
	lines := strings.Split(string(script), "\n")
	if lines[0] != "#!/bin/bash" {
		t.Errorf("first line %q", lines[0])
	}
	commands := false
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "#SBATCH"):
			if commands {
				t.Errorf("#SBATCH line after the first command: %q", l)
			}
		case l != "" && !strings.HasPrefix(l, "#"):
			commands = true
		}
	}
}

// TestScriptRuns runs a script whose worker prints its token and argv, to
// show that every value arrives as written however it is quoted.
func TestScriptRuns(t *testing.T) {
	c := scriptConfigs["custom"]
	c.WorkerCommand = []string{"/bin/sh", "-c", `printf '%s\n' "$FLUKSIO_WORKER_TOKEN" "$0" "$@"`, "it's a worker"}
	p := scriptProvisioner(t, c)
	prof := Profile{Name: "run", CPUs: 3, GPUs: 1, RAMMB: 1024, Labels: []string{"a", "b.c"}, Prerun: []string{"PRERUN=1"}}
	script := p.sub.payload(prof, "hpc-run-0123abcd", goldenToken)
	checkScript(t, script)

	cmd := exec.Command("bash")
	cmd.Stdin = bytes.NewReader(script)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bash: %v\n%s", err, script)
	}
	want := strings.Join([]string{goldenToken, "it's a worker",
		"--url", "http://10.0.0.5:8765/?a=b&c=d", "--cpus", "3", "--gpus", "1", "--max-idle", "90",
		"--ram-mb", "1024", "--labels", "a,b.c", "--artifact-url", "https://artifacts.example.org/store"}, "\n") + "\n"
	if string(out) != want {
		t.Errorf("worker saw:\n%s\nwant:\n%s", out, want)
	}
}

func TestScriptResourceLines(t *testing.T) {
	p := scriptProvisioner(t, scriptConfigs["default"])
	tests := []struct {
		prof        Profile
		has, hasNot []string
	}{
		{Profile{Name: "a", CPUs: 4}, []string{"--cpus-per-task=4"}, []string{"--mem=", "--gres="}},
		{Profile{Name: "a", CPUs: 4, RAMMB: 100, GPUs: 1}, []string{"--cpus-per-task=4", "--mem=100M", "--gres=gpu:1"}, nil},
		{Profile{Name: "a", CPUs: 4, Sbatch: []string{"--cpus-per-task=2"}}, []string{"--cpus-per-task=2"}, []string{"--cpus-per-task=4"}},
		{Profile{Name: "a", CPUs: 4, Sbatch: []string{"-c2"}}, nil, []string{"--cpus-per-task=4"}},
		{Profile{Name: "a", CPUs: 4, GPUs: 1, Sbatch: []string{"--cpus-per-gpu=4"}}, []string{"--gres=gpu:1"}, []string{"--cpus-per-task="}},
		{Profile{Name: "a", CPUs: 1, RAMMB: 100, Sbatch: []string{"--mem-per-cpu=1G"}}, nil, []string{"--mem=100M"}},
		{Profile{Name: "a", CPUs: 1, RAMMB: 100, Sbatch: []string{"--mem 1G"}}, nil, []string{"--mem=100M"}},
		{Profile{Name: "a", CPUs: 1, RAMMB: 100, Sbatch: []string{"--mem-bind=local"}}, []string{"--mem=100M"}, nil},
		{Profile{Name: "a", CPUs: 1, GPUs: 2, Sbatch: []string{"-G 2"}}, nil, []string{"--gres=gpu:2"}},
		{Profile{Name: "a", CPUs: 1, GPUs: 2, Sbatch: []string{"--gpus-per-node=2"}}, nil, []string{"--gres=gpu:2"}},
		{Profile{Name: "a", CPUs: 1, GPUs: 2, Sbatch: []string{"--gpu-bind=closest"}}, []string{"--gres=gpu:2"}, nil},
		// Whole nodes: --exclusive, and all the node's memory.
		{Profile{Name: "a", CPUs: 1, Exclusive: true}, []string{"--exclusive\n", "--mem=0\n", "--cpus-per-task=1"}, []string{"--mem=1"}},
		{Profile{Name: "a", CPUs: 1, RAMMB: 100, Exclusive: true}, []string{"--exclusive\n", "--mem=0\n"}, []string{"--mem=100M"}},
		{Profile{Name: "a", CPUs: 1, Exclusive: true, Sbatch: []string{"--exclusive=user"}}, []string{"--exclusive=user"}, []string{"--exclusive\n"}},
		{Profile{Name: "a", CPUs: 1, Exclusive: true, Sbatch: []string{"--mem=2G"}}, []string{"--mem=2G"}, []string{"--mem=0"}},
		{Profile{Name: "a", CPUs: 1}, nil, []string{"--exclusive"}},
	}
	for _, tc := range tests {
		script := string(p.sub.payload(tc.prof, "hpc-a-0123abcd", "t"))
		// The worker is told to offer what its job got just when the
		// profile asks for whole nodes.
		if told := strings.Contains(script, " --size-from-job"); told != tc.prof.Exclusive {
			t.Errorf("%+v: --size-from-job on the worker's line is %v; want %v\n%s", tc.prof, told, tc.prof.Exclusive, script)
		}
		for _, s := range tc.has {
			if !strings.Contains(script, "#SBATCH "+s) {
				t.Errorf("%+v: no %q in\n%s", tc.prof, s, script)
			}
		}
		for _, s := range tc.hasNot {
			if strings.Contains(script, "#SBATCH "+s) {
				t.Errorf("%+v: %q in\n%s", tc.prof, s, script)
			}
		}
	}
}

func TestShellQuote(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", "''"},
		{"fluksio-worker", "fluksio-worker"},
		{"--url", "--url"},
		{"https://e.example.org:8765/x", "https://e.example.org:8765/x"},
		{"a,b.c", "a,b.c"},
		{"a b", "'a b'"},
		{"it's", `'it'\''s'`},
		{"$HOME", "'$HOME'"},
		{"~", "'~'"},
		{"*", "'*'"},
		{"a;b", "'a;b'"},
		{"http://h/?a=b&c=d", "'http://h/?a=b&c=d'"},
		{"%i %k", "'%i %k'"},
		{"ü", "'ü'"},
	}
	for _, tc := range tests {
		if got := shellQuote(tc.in); got != tc.want {
			t.Errorf("shellQuote(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}

	// Whatever the input, the shell reads back exactly it.
	nasty := []string{"", "'", "''", `\`, `"$(id)"`, "`id`", "a\tb", "!", "new\nline", "ü ñ", goldenToken}
	var words []string
	for _, s := range nasty {
		words = append(words, shellQuote(s))
	}
	out, err := exec.Command("bash", "-c", `printf '%s\0' `+strings.Join(words, " ")).Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00"); strings.Join(got, "|") != strings.Join(nasty, "|") {
		t.Errorf("bash read back %q, want %q", got, nasty)
	}
}

func TestScriptDeadlineAndSignal(t *testing.T) {
	p := scriptProvisioner(t, scriptConfigs["default"]) // provision_timeout 15m
	tests := []struct {
		sbatch           []string
		deadline, signal string // "" for none of ours
		walltime         int    // FLUKSIO_WALLTIME's seconds, 0 for none
	}{
		{nil, "", "B:TERM@60", 0},
		// A worker told its walltime leaves before it by itself: no
		// warning, which Slurm may send a minute early.
		{[]string{"--time=10"}, "now+1500seconds", "", 600},
		{[]string{"--time 10"}, "now+1500seconds", "", 600},
		{[]string{"-t 10:30"}, "now+1530seconds", "", 630},
		{[]string{"-t10"}, "now+1500seconds", "", 600},
		{[]string{"-vt 04:00:00"}, "now+15300seconds", "", 14400},
		{[]string{"--time=1-0"}, "now+87300seconds", "", 86400},
		{[]string{"--time=1", "--time=2"}, "now+1020seconds", "", 120},
		{[]string{"--time=2", "--time=UNLIMITED"}, "", "B:TERM@60", 0},
		{[]string{"--time=0"}, "", "B:TERM@60", 0},
		{[]string{"--time-min=10"}, "", "B:TERM@60", 0},
		{[]string{"--time=10", "--deadline=2030-01-01T00:00:00"}, "", "", 600},
		{[]string{"--time=10", "--signal=B:USR1@120"}, "now+1500seconds", "", 600},
	}
	for _, tc := range tests {
		b := p.sub.payload(Profile{Name: "a", CPUs: 1, Sbatch: tc.sbatch}, "hpc-a-0123abcd", "t")
		checkScript(t, b)
		script := string(b)
		wall := strings.Contains(script, "\nexport FLUKSIO_JOB_START=\"$(date +%s)\" FLUKSIO_WALLTIME="+strconv.Itoa(tc.walltime)+"\n")
		if tc.walltime > 0 && !wall || tc.walltime == 0 && strings.Contains(script, "FLUKSIO_WALLTIME") {
			t.Errorf("%q: want FLUKSIO_WALLTIME=%d exported (0: none):\n%s", tc.sbatch, tc.walltime, script)
		}
		for opt, want := range map[string]string{"--deadline": tc.deadline, "--signal": tc.signal} {
			ours := regexp.MustCompile(`(?m)^#SBATCH `+opt+`=(\S+)$`).FindAllStringSubmatch(script, -1)
			var got []string
			for _, m := range ours {
				if !slices.Contains(tc.sbatch, opt+"="+m[1]) {
					got = append(got, m[1])
				}
			}
			switch {
			case want == "" && len(got) != 0:
				t.Errorf("%q: %s=%v, want none of ours", tc.sbatch, opt, got)
			case want != "" && !slices.Equal(got, []string{want}):
				t.Errorf("%q: %s=%v, want %s", tc.sbatch, opt, got, want)
			}
		}
	}
}

// TestCredentialTTL: a credential lives as long as its job can, not a
// day: provision_timeout plus the profile's time limit plus a margin;
// token_ttl overrides; without a time limit the engine's cap decides.
func TestCredentialTTL(t *testing.T) {
	s := &settings{provisionTimeout: 15 * time.Minute}
	if got := s.credentialTTL(Profile{Sbatch: []string{"--time=01:00:00"}}, time.Now()); got != 15*time.Minute+time.Hour+tokenMargin {
		t.Errorf("with --time=01:00:00: %s", got)
	}
	if got := s.credentialTTL(Profile{Sbatch: []string{"-t 30"}}, time.Now()); got != 15*time.Minute+30*time.Minute+tokenMargin {
		t.Errorf("with -t 30: %s", got)
	}
	if got := s.credentialTTL(Profile{}, time.Now()); got != noLimitTTL {
		t.Errorf("without a time limit: %s", got)
	}
	s.tokenTTL = 2 * time.Hour
	if got := s.credentialTTL(Profile{Sbatch: []string{"--time=01:00:00"}}, time.Now()); got != 2*time.Hour {
		t.Errorf("token_ttl set: %s", got)
	}
}

// TestScriptPinsTheRelay: in relay mode the worker is given the relay's
// https address and the SHA-256 of the relay's certificate, which it
// verifies before it sends its credential (relaytls.go).
func TestScriptPinsTheRelay(t *testing.T) {
	c := scriptConfigs["custom"]
	c.WorkerCommand = []string{"/bin/sh", "-c", `printf '%s\n' "$@"`, "worker"}
	p := scriptProvisioner(t, c)
	prof := Profile{Name: "run", CPUs: 1}
	pin := strings.Repeat("ab", 32)
	script := p.sub.script(prof, "https://login1:7000", pin, "hpc-run-0123abcd", nil, [][]string{{goldenToken}})
	checkScript(t, script)
	cmd := exec.Command("bash")
	cmd.Stdin = bytes.NewReader(script)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bash: %v\n%s", err, script)
	}
	if !strings.HasPrefix(string(out), "--url\nhttps://login1:7000\n--engine-cert-sha256\n"+pin+"\n") {
		t.Errorf("worker saw:\n%s\nwant --url https://login1:7000 --engine-cert-sha256 %s first", out, pin)
	}
}

// TestScriptReadsOptionsOnceAtConfiguration: a configured profile carries
// its sbatch lines' options, read when the configuration was, and its
// script is built from them without reading the lines again; a profile
// made otherwise has its lines read when its script is.
func TestScriptReadsOptionsOnceAtConfiguration(t *testing.T) {
	c := baseConfig()
	c["profile"] = []any{map[string]any{"name": "cpu", "cpus": 4, "sbatch": []string{"--partition=debug --deadline=2030-01-01T00:00:00", "-t 30"}}}
	s, diags := parseConfig("hpc", mustJSON(t, c))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	prof := s.Profiles[0]
	if prof.opts == nil || !prof.opts.deadline || prof.opts.cpu || !prof.opts.hasLimit || prof.opts.limit != 30*time.Minute {
		t.Fatalf("the configured profile's options: %+v; want --deadline and a 30-minute limit", prof.opts)
	}
	p := scriptProvisioner(t, scriptConfigs["default"])
	// Lines the options were not read from: the script follows the
	// options read at configuration, so it reads no line of them.
	prof.Sbatch = []string{"--time=10"}
	script := string(p.sub.payload(prof, "hpc-cpu-0123abcd", "t"))
	if strings.Contains(script, "--deadline=now+") || !strings.Contains(script, "FLUKSIO_WALLTIME=1800") {
		t.Errorf("the script of a configured profile read its lines again:\n%s", script)
	}
	// Nor does its shape, which Provision and Covers match by.
	if sh := prof.shape(nil); sh.Lifetime != 30*time.Minute || sh.LifetimeFrom != "--time=30" {
		t.Errorf("the shape of a configured profile: %s from %q; want 30m from --time=30, as read at configuration", sh.Lifetime, sh.LifetimeFrom)
	}
	prof.opts = nil
	script = string(p.sub.payload(prof, "hpc-cpu-0123abcd", "t"))
	if !strings.Contains(script, "--deadline=now+") || !strings.Contains(script, "FLUKSIO_WALLTIME=600") {
		t.Errorf("the script of a profile made otherwise did not read its lines:\n%s", script)
	}
}
