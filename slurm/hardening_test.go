package slurm

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/fluksio/provision/internal/testutil"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/internal/queue"
)

// hostile is a list of values meant to break out of wherever they land:
// command substitution, quoting, comments, option injection, globbing,
// newlines and control characters.
var hostile = []string{
	`$(touch @MARK@)`,
	"`touch @MARK@`",
	`'; touch @MARK@; '`,
	`"; touch @MARK@; "`,
	`\'; touch @MARK@ #`,
	`a b`,
	`--url=http://evil.example`,
	`-oProxyCommand=touch @MARK@`,
	"x\ntouch @MARK@",
	"x\rtouch @MARK@",
	"x\x00y",
	`*`,
	`~root`,
	`$HOME`,
	`${IFS}touch${IFS}@MARK@`,
	`!!`,
	`%`,
	`é€😀`,
	`#`,
	`&& touch @MARK@`,
	`| touch @MARK@`,
	`> @MARK@`,
}

// configured returns a Provisioner holding a parsed configuration, or the
// diagnostics that refused it. Nothing runs ssh.
func configured(t testing.TB, raw []byte) (*Provisioner, bool) {
	t.Helper()
	s, diags := parseConfig("hard", raw)
	if diags.HasErrors() {
		for _, d := range diags {
			if d.Severity == 0 || d.Summary == "" {
				t.Fatalf("a refusal without a summary: %+v", d)
			}
		}
		return nil, false
	}
	if err := s.identity("", ""); err != nil {
		t.Fatal(err)
	}
	p := New(nil)
	p.mu.Lock()
	p.cfg = s
	p.mu.Unlock()
	return p, true
}

// TestHostileValuesNeverChangeTheScript puts each hostile value into each
// field that reaches the batch script, one at a time. Either validation
// refuses it, or the generated script, run by bash with a stand-in worker,
// passes exactly the configured argv and does nothing else. prerun is left
// out on purpose: its lines are shell the operator wrote, by design.
func TestHostileValuesNeverChangeTheScript(t *testing.T) {
	testutil.LookPath(t, "bash")
	dir := t.TempDir()
	standIn := filepath.Join(dir, "worker")
	if err := os.WriteFile(standIn, []byte("#!/bin/sh\nfor a in \"$@\"; do printf '%s\\0' \"$a\"; done > \"$ARGV_OUT\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}

	fields := []struct {
		name string
		set  func(c map[string]any, v string)
	}{
		{"engine_url", func(c map[string]any, v string) { c["engine_url"] = "http://e.test/" + v }},
		{"artifact_url", func(c map[string]any, v string) { c["artifact_url"] = "https://a.test/" + v }},
		{"worker_command", func(c map[string]any, v string) { c["worker_command"] = []string{standIn, v} }},
		{"profile name", func(c map[string]any, v string) { hostileProfile(c)["name"] = v }},
		{"labels", func(c map[string]any, v string) { hostileProfile(c)["labels"] = []string{"ok", v} }},
		{"sbatch", func(c map[string]any, v string) { hostileProfile(c)["sbatch"] = []string{"--comment-not=" + v} }},
		{"sbatch bare", func(c map[string]any, v string) { hostileProfile(c)["sbatch"] = []string{v} }},
		{"login", func(c map[string]any, v string) { c["login"] = "u@" + v }},
		{"ssh_options", func(c map[string]any, v string) { c["ssh_options"] = []string{"ConnectTimeout=" + v} }},
	}
	accepted, refused := 0, 0
	for _, f := range fields {
		for _, h := range hostile {
			mark := filepath.Join(dir, "pwned")
			v := strings.ReplaceAll(h, "@MARK@", mark)
			c := hostileBase(standIn)
			f.set(c, v)
			raw, _ := json.Marshal(c)
			p, ok := configured(t, raw)
			if !ok {
				refused++
				continue
			}
			accepted++
			cfg := p.settings()
			prof := cfg.Profiles[0]
			token := "tok'en;$(id)`id`"
			script := p.sub.payload(prof, "hard-"+prof.Name+"-0a1b2c3d", token)

			argvOut := filepath.Join(dir, "argv")
			os.Remove(argvOut)
			cmd := exec.Command("bash", "-c", string(script))
			cmd.Env = []string{"ARGV_OUT=" + argvOut, "PATH=/usr/bin:/bin"}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Errorf("%s = %q: the script failed: %v\n%s\n%s", f.name, v, err, out, script)
				continue
			}
			if _, err := os.Stat(mark); err == nil {
				t.Fatalf("%s = %q: the script ran an injected command\n%s", f.name, v, script)
			}
			got, err := os.ReadFile(argvOut)
			if err != nil {
				t.Errorf("%s = %q: the stand-in worker did not run: %v\n%s", f.name, v, err, script)
				continue
			}
			want := expectedArgv(cfg, prof)
			if gotArgv := strings.Split(strings.TrimSuffix(string(got), "\x00"), "\x00"); !reflect.DeepEqual(gotArgv, want) {
				t.Errorf("%s = %q: the worker got\n %q\nwant\n %q", f.name, v, gotArgv, want)
			}
			// The script as a whole must parse with every #SBATCH line
			// before the first command.
			seenCommand := false
			for _, l := range strings.Split(string(script), "\n") {
				switch {
				case strings.HasPrefix(l, "#SBATCH"):
					if seenCommand {
						t.Errorf("%s = %q: an #SBATCH line after a command:\n%s", f.name, v, script)
					}
				case l != "" && !strings.HasPrefix(l, "#"):
					seenCommand = true
				}
			}
			// The login and ssh options never reach the script.
			if f.name == "login" || f.name == "ssh_options" {
				if strings.Contains(string(script), v) && v != "" && v != "%" && v != "#" && v != "*" {
					t.Errorf("%s = %q reached the script", f.name, v)
				}
			}
		}
	}
	t.Logf("%d hostile configurations refused by validation, %d accepted and proven inert", refused, accepted)
	if accepted == 0 {
		t.Fatal("every case was refused, so nothing was proven about the script")
	}
}

func hostileBase(worker string) map[string]any {
	return map[string]any{
		"login":          "u@login.test",
		"engine_url":     "http://engine.test:8470",
		"worker_command": []string{worker},
		"profile": []any{map[string]any{
			"name": "p", "cpus": 2, "gpus": 1, "ram_mb": 100, "labels": []string{"l"},
			"sbatch": []string{"--partition=x"},
		}},
	}
}

func hostileProfile(c map[string]any) map[string]any { return c["profile"].([]any)[0].(map[string]any) }

// expectedArgv is what the worker must receive for a profile: the
// configured command's arguments and the provisioner's flags, verbatim.
func expectedArgv(cfg *settings, prof Profile) []string {
	want := append([]string{}, cfg.WorkerCommand[1:]...)
	want = append(want, "--url", cfg.EngineURL, "--cpus", itoa(prof.CPUs), "--gpus", itoa(prof.GPUs),
		"--max-idle", "300")
	if prof.RAMMB > 0 {
		want = append(want, "--ram-mb", itoa(int(prof.RAMMB)))
	}
	if len(prof.Labels) > 0 {
		want = append(want, "--labels", strings.Join(prof.Labels, ","))
	}
	if cfg.ArtifactURL != "" {
		want = append(want, "--artifact-url", cfg.ArtifactURL)
	}
	return want
}

func itoa(i int) string {
	b, _ := json.Marshal(i)
	return string(b)
}

func TestSSHArgsNeverWeakenHostKeyChecking(t *testing.T) {
	// Both routes by which a configuration could turn checking off are
	// refused: ssh_options as written, and an ssh_config file, read with
	// ssh -G as ssh itself would.
	for _, weak := range [][]string{{"StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null"}, {"StrictHostKeyChecking=accept-new"}} {
		c := hostileBase("w")
		c["ssh_options"] = weak
		raw, _ := json.Marshal(c)
		if _, ok := configured(t, raw); ok {
			t.Errorf("ssh_options %q were accepted", weak)
		}
	}
	testutil.LookPath(t, "ssh")
	dir := t.TempDir()
	weakFile := filepath.Join(dir, "weak_config")
	os.WriteFile(weakFile, []byte("Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"), 0o600)
	c := hostileBase("w")
	c["ssh_config"] = weakFile
	raw, _ := json.Marshal(c)
	resp, err := New(nil).ValidateConfig(context.Background(), &shared.ValidateConfigRequest{Name: "hard", Config: raw})
	if err != nil || !resp.Diagnostics.HasErrors() || strings.Join(resp.Diagnostics[0].Path, ".") != "ssh_config" ||
		!strings.Contains(resp.Diagnostics[0].Detail, "stricthostkeychecking false") {
		t.Errorf("an ssh_config that turns checking off: %+v, %v", resp, err)
	}
	// The same file is harmless with known_hosts, whose settings win.
	c["known_hosts"] = filepath.Join(dir, "known_hosts")
	if err := os.WriteFile(c["known_hosts"].(string), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	raw, _ = json.Marshal(c)
	if resp, err := New(nil).ValidateConfig(context.Background(), &shared.ValidateConfigRequest{Name: "hard", Config: raw}); err != nil || resp.Diagnostics.HasErrors() {
		t.Errorf("with known_hosts: %+v, %v", resp, err)
	}

	for _, opts := range [][]string{nil, {"ConnectTimeout=5"}} {
		for _, kh := range []string{"", "/k/known_hosts"} {
			c := hostileBase("w")
			c["ssh_options"], c["known_hosts"] = opts, kh
			raw, _ := json.Marshal(c)
			p, ok := configured(t, raw)
			if !ok {
				t.Fatal("the base configuration was refused")
			}
			args := strings.Join(sshArgs(t, p.settings(), "squeue"), " ")
			for _, bad := range []string{"StrictHostKeyChecking=no", "StrictHostKeyChecking=accept-new", "UserKnownHostsFile=/dev/null", "CheckHostIP=no"} {
				if strings.Contains(args, bad) {
					t.Errorf("ssh argv %q contains %s", args, bad)
				}
			}
			if kh != "" && !strings.Contains(args, "StrictHostKeyChecking=yes") {
				t.Errorf("with known_hosts, ssh argv %q does not insist on the key", args)
			}
		}
	}
}

// FuzzParseJobID: whatever sbatch prints, parsing never panics, and what
// it accepts is a job id and nothing else.
func FuzzParseJobID(f *testing.F) {
	for _, s := range []string{"4\n", "7;sandbox\n", "Submitted batch job 17\n", "", "\n\n12\n", "12;", "-1", "99999999999999999999", "1 2", "4\r\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := queue.ParseJobID(s)
		if err != nil {
			return
		}
		if id == "" || strings.Trim(id, "0123456789") != "" {
			t.Fatalf("queue.ParseJobID(%q) = %q", s, id)
		}
	})
}

// FuzzConfigAndScript: any JSON either is refused with diagnostics or
// yields a script whose #SBATCH lines all come first, one per line, and
// whose exec line is the last.
func FuzzConfigAndScript(f *testing.F) {
	seed, _ := json.Marshal(hostileBase("fluksio-worker"))
	f.Add(seed, "tok")
	f.Add([]byte(`{"login":"a@b","engine_url":"http://x","profile":[{"name":"a","sbatch":["--x=1\n"]}]}`), "t")
	f.Add([]byte(`{"profile":[{"name":"a b"}]}`), "")
	f.Add([]byte(`{"login":"-oProxyCommand=x","engine_url":"http://x","profile":[{"name":"a","labels":["$(x)"]}]}`), "'")
	f.Add([]byte(`null`), "")
	f.Fuzz(func(t *testing.T, raw []byte, token string) {
		p, ok := configured(t, raw)
		if !ok {
			return
		}
		cfg := p.settings()
		for _, prof := range cfg.Profiles {
			script := string(p.sub.payload(prof, "hard-"+prof.Name+"-00000000", token))
			lines := strings.Split(strings.TrimSuffix(script, "\n"), "\n")
			// The last command is the exec with the credential in front;
			// the quoted credential may span lines, nothing else may.
			execLine := "\n" + tokenVar + "=" + shellQuote(token) + " exec "
			i := strings.LastIndex(script, execLine)
			if lines[0] != "#!/bin/bash" || i < 0 || strings.Contains(strings.TrimSuffix(script[i+len(execLine):], "\n"), "\n") {
				t.Fatalf("script shape:\n%s", script)
			}
			lines = strings.Split(script[:i], "\n")
			seenCommand := false
			for _, l := range lines[1:] {
				if strings.HasPrefix(l, "#SBATCH") && seenCommand {
					t.Fatalf("#SBATCH after a command:\n%s", script)
				}
				if l != "" && !strings.HasPrefix(l, "#") {
					seenCommand = true
				}
			}
			// The credential is set on the exec line alone, so that no
			// prerun command inherits it.
			if strings.Count(script, tokenVar+"=") != 1 || strings.Contains(script, "export "+tokenVar) {
				t.Fatalf("the token is not the exec line's alone:\n%s", script)
			}
		}
	})
}

// TestPrerunCannotAddDirectives: sbatch reads #SBATCH lines up to the
// first line that is not blank or a comment, so a prerun line that starts
// with #SBATCH would be an option if nothing came before it. The script
// puts a no-op command first. TestSbatchReadsWhatValidationReads submits
// such a script to the real sbatch.
func TestPrerunCannotAddDirectives(t *testing.T) {
	c := hostileBase("w")
	c["profile"].([]any)[0].(map[string]any)["prerun"] = []string{"#SBATCH --array=1-100", "echo hi"}
	raw, _ := json.Marshal(c)
	p, ok := configured(t, raw)
	if !ok {
		t.Fatal("refused")
	}
	prof := p.settings().Profiles[0]
	script := string(p.sub.payload(prof, "hard-"+prof.Name+"-00000000", "tok"))
	// sbatch's rule: directives end at the first line that is not blank
	// and does not start with '#'.
	for _, l := range strings.Split(script, "\n")[1:] {
		if strings.TrimSpace(l) != "" && !strings.HasPrefix(l, "#") {
			break
		}
		if strings.Contains(l, "--array") {
			t.Fatalf("sbatch would read the prerun line %q as a directive:\n%s", l, script)
		}
	}
}
