package slurm

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/internal/testutil"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/sbatch"
)

func TestSchemaIsValid(t *testing.T) {
	s := schema()
	if err := s.Validate("plugin", "sha256"); err != nil {
		t.Fatal(err)
	}
	for _, a := range s.Attributes {
		if a.Description == "" {
			t.Errorf("attribute %s has no description", a.Name)
		}
	}
	for _, a := range s.Blocks[0].Body.Attributes {
		if a.Description == "" {
			t.Errorf("profile attribute %s has no description", a.Name)
		}
	}
}

func TestDecodeFillsDefaults(t *testing.T) {
	raw := `{"login":"u@h","engine_url":"http://e:1","profile":[{"name":"a"},{"name":"b","cpus":null,"labels":null}]}`
	s, diags := parseConfig("hpc", json.RawMessage(raw))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	if s.maxIdle != 5*time.Minute || s.provisionTimeout != 15*time.Minute || s.submitTimeout != 30*time.Second || s.tokenTTL != 0 {
		t.Errorf("durations = %s %s %s %s", s.maxIdle, s.provisionTimeout, s.submitTimeout, s.tokenTTL)
	}
	if s.pollInterval != 30*time.Second || s.attachTimeout != 10*time.Minute {
		t.Errorf("poll_interval %s, attach_timeout %s", s.pollInterval, s.attachTimeout)
	}
	// Absent is nil, not a default: the plugin ships its own worker.
	if s.WorkerCommand != nil {
		t.Errorf("worker_command = %q, want nil (shipped)", s.WorkerCommand)
	}
	for _, p := range s.Profiles {
		if p.CPUs != 1 || p.GPUs != 0 || p.RAMMB != 0 {
			t.Errorf("profile %+v lacks defaults", p)
		}
	}
}

// TestValidation checks each rule: a valid base configuration with one
// change must give exactly one error, at the path given.
func TestValidation(t *testing.T) {
	prof := func(c map[string]any, i int) map[string]any { return c["profile"].([]any)[i].(map[string]any) }
	set := func(k string, v any) func(map[string]any) { return func(c map[string]any) { c[k] = v } }
	setProf := func(i int, k string, v any) func(map[string]any) {
		return func(c map[string]any) { prof(c, i)[k] = v }
	}

	tests := []struct {
		name     string
		provName string
		edit     func(map[string]any)
		path     string // joined with "."; "-" means valid
		summary  string
	}{
		{name: "base", path: "-"},
		{name: "login alias", edit: set("login", "sandbox"), path: "-"},
		{name: "login ipv6", edit: set("login", "u@::1"), path: "-"},
		{name: "login empty", edit: set("login", ""), path: "login", summary: "Missing login"},
		{name: "login space", edit: set("login", "u@h x"), path: "login", summary: "Invalid login"},
		{name: "login option", edit: set("login", "-oProxyCommand=x"), path: "login", summary: "Invalid login"},
		{name: "login shell", edit: set("login", "u@h;rm"), path: "login", summary: "Invalid login"},
		{name: "login two ats", edit: set("login", "u@v@h"), path: "login", summary: "Invalid login"},
		{name: "login wrong type", edit: set("login", 3), path: "login", summary: "Wrong type"},
		{name: "login with port", edit: set("login", "u@h:2222"), path: "-"},
		{name: "login ipv6 with port", edit: set("login", "u@[::1]:2222"), path: "-"},
		{name: "login port and ssh_port", edit: func(c map[string]any) { c["login"], c["ssh_port"] = "u@h:2222", 22 }, path: "login", summary: "Two ports for the login node"},
		{name: "logins", edit: set("login", []string{"u@h1", "u@h2:2222", "sandbox"}), path: "-"},
		{name: "logins empty", edit: set("login", []string{}), path: "login", summary: "Missing login"},
		{name: "logins bad port", edit: set("login", []string{"u@h1", "u@h2:99999"}), path: "login.1", summary: "Invalid login"},
		{name: "logins port word", edit: set("login", []string{"u@h1:ssh", "u@h2"}), path: "login.0", summary: "Invalid login"},
		{name: "logins option", edit: set("login", []string{"u@h1", "-oProxyCommand=x"}), path: "login.1", summary: "Invalid login"},
		{name: "logins empty entry", edit: set("login", []string{"u@h1", ""}), path: "login.1", summary: "Invalid login"},
		{name: "logins twice", edit: set("login", []string{"u@h1:22", "u@h2", "u@h1:22"}), path: "login.2", summary: "Login listed twice"},
		{name: "logins wrong type", edit: set("login", []any{"u@h", 3}), path: "login", summary: "Wrong type"},
		{name: "bastion", edit: set("bastion", "jump@bastion.example.org"), path: "-"},
		{name: "bastion with port", edit: set("bastion", "jump@bastion.example.org:2200"), path: "-"},
		{name: "bastions", edit: set("bastion", []string{"jump@b1", "jump@[::1]:2200"}), path: "-"},
		{name: "bastion empty", edit: set("bastion", ""), path: "-"},
		{name: "bastion no user", edit: set("bastion", "bastion.example.org"), path: "bastion", summary: "Invalid bastion"},
		{name: "bastion port zero", edit: set("bastion", "u@b:0"), path: "bastion", summary: "Invalid bastion"},
		{name: "bastion port high", edit: set("bastion", "u@b:65536"), path: "bastion", summary: "Invalid bastion"},
		{name: "bastion port word", edit: set("bastion", "u@b:ssh"), path: "bastion", summary: "Invalid bastion"},
		{name: "bastion option", edit: set("bastion", "-oProxyCommand=x"), path: "bastion", summary: "Invalid bastion"},
		{name: "bastion space", edit: set("bastion", "u@b x"), path: "bastion", summary: "Invalid bastion"},
		{name: "bastions bad entry", edit: set("bastion", []string{"u@b1", "u@b2;rm"}), path: "bastion.1", summary: "Invalid bastion"},
		{name: "bastions twice", edit: set("bastion", []string{"u@b1:22", "u@b1:22"}), path: "bastion.1", summary: "Bastion listed twice"},
		{name: "bastion wrong type", edit: set("bastion", 3), path: "bastion", summary: "Wrong type"},
		{name: "bastion and ProxyJump", edit: func(c map[string]any) {
			c["bastion"] = "u@b"
			c["ssh_options"] = []string{"ConnectTimeout=5", "proxyjump=u@other"}
		}, path: "ssh_options.1", summary: "Two ways through a bastion"},
		{name: "bastion and ProxyCommand", edit: func(c map[string]any) {
			c["bastion"] = []string{"u@b"}
			c["ssh_options"] = []string{"ProxyCommand=ssh -W %h:%p jump"}
		}, path: "ssh_options.0", summary: "Two ways through a bastion"},
		{name: "port high", edit: set("ssh_port", 70000), path: "ssh_port", summary: "Invalid ssh_port"},
		{name: "port negative", edit: set("ssh_port", -1), path: "ssh_port", summary: "Invalid ssh_port"},
		{name: "port set", edit: set("ssh_port", 2222), path: "-"},
		{name: "key newline", edit: set("ssh_key", "/k\n"), path: "ssh_key", summary: "Invalid path"},
		{name: "config nul", edit: set("ssh_config", "/c\x00"), path: "ssh_config", summary: "Invalid path"},
		{name: "known_hosts space", edit: set("known_hosts", "/a b"), path: "known_hosts", summary: "Invalid path"},
		{name: "ssh option ok", edit: set("ssh_options", []string{"ControlMaster=auto", "ProxyCommand=ssh -W %h:%p jump"}), path: "-"},
		{name: "ssh option no value", edit: set("ssh_options", []string{"ControlMaster"}), path: "ssh_options.0", summary: "Invalid ssh option"},
		{name: "ssh option empty value", edit: set("ssh_options", []string{"ok=yes", "Port="}), path: "ssh_options.1", summary: "Invalid ssh option"},
		{name: "ssh option key digits", edit: set("ssh_options", []string{"K1=v"}), path: "ssh_options.0", summary: "Invalid ssh option"},
		{name: "ssh option key space", edit: set("ssh_options", []string{"A B=v"}), path: "ssh_options.0", summary: "Invalid ssh option"},
		{name: "ssh option newline", edit: set("ssh_options", []string{"A=v\nB=w"}), path: "ssh_options.0", summary: "Invalid ssh option"},
		{name: "ssh option remote command", edit: set("ssh_options", []string{"remotecommand=ls"}), path: "ssh_options.0", summary: "Unsupported ssh option"},
		{name: "ssh option batch mode", edit: set("ssh_options", []string{"BatchMode=no"}), path: "ssh_options.0", summary: "Unsupported ssh option"},
		{name: "ssh option host key with known_hosts", edit: func(c map[string]any) {
			c["known_hosts"] = "/kh"
			c["ssh_options"] = []string{"StrictHostKeyChecking=no"}
		}, path: "ssh_options.0", summary: "Host-key checking cannot be weakened"},
		{name: "ssh option no host key check", edit: set("ssh_options", []string{"StrictHostKeyChecking=no"}), path: "ssh_options.0", summary: "Host-key checking cannot be weakened"},
		{name: "ssh option accept-new", edit: set("ssh_options", []string{"ConnectTimeout=5", "stricthostkeychecking=Accept-New"}), path: "ssh_options.1", summary: "Host-key checking cannot be weakened"},
		{name: "ssh option known hosts null", edit: set("ssh_options", []string{"UserKnownHostsFile=/dev/null"}), path: "ssh_options.0", summary: "Host-key checking cannot be weakened"},
		{name: "ssh option known hosts command", edit: set("ssh_options", []string{"KnownHostsCommand=/bin/echo"}), path: "ssh_options.0", summary: "Host-key checking cannot be weakened"},
		{name: "ssh option known_hosts conflict", edit: func(c map[string]any) {
			c["known_hosts"] = "/kh"
			c["ssh_options"] = []string{"StrictHostKeyChecking=yes"}
		}, path: "ssh_options.0", summary: "Conflicting ssh option"},
		{name: "engine_url missing", edit: set("engine_url", ""), path: "engine_url", summary: "Missing engine_url"},
		{name: "engine_url scheme", edit: set("engine_url", "ftp://e"), path: "engine_url", summary: "Invalid engine_url"},
		{name: "engine_url relative", edit: set("engine_url", "engine:8765"), path: "engine_url", summary: "Invalid engine_url"},
		{name: "engine_url no host", edit: set("engine_url", "http://"), path: "engine_url", summary: "Invalid engine_url"},
		{name: "engine_url space", edit: set("engine_url", "http://e/a b"), path: "engine_url", summary: "Invalid engine_url"},
		{name: "artifact_url", edit: set("artifact_url", "s3://bucket"), path: "artifact_url", summary: "Invalid artifact_url"},
		{name: "artifact_url ok", edit: set("artifact_url", "https://a.example.org/x"), path: "-"},
		{name: "max_idle unparsable", edit: set("max_idle", "5 minutes"), path: "max_idle", summary: "Invalid duration"},
		{name: "provision_timeout negative", edit: set("provision_timeout", "-5m"), path: "provision_timeout", summary: "Invalid duration"},
		{name: "submit_timeout zero", edit: set("submit_timeout", "0s"), path: "submit_timeout", summary: "Invalid duration"},
		{name: "token_ttl", edit: set("token_ttl", "1d"), path: "token_ttl", summary: "Invalid duration"},
		{name: "poll_interval zero", edit: set("poll_interval", "0s"), path: "poll_interval", summary: "Invalid duration"},
		{name: "poll_interval words", edit: set("poll_interval", "often"), path: "poll_interval", summary: "Invalid duration"},
		{name: "attach_timeout negative", edit: set("attach_timeout", "-1m"), path: "attach_timeout", summary: "Invalid duration"},
		{name: "poll_interval ok", edit: set("poll_interval", "10s"), path: "-"},
		{name: "worker_command empty", edit: set("worker_command", []string{}), path: "worker_command", summary: "Empty worker_command"},
		{name: "worker_command empty program", edit: set("worker_command", []string{""}), path: "worker_command.0", summary: "Empty worker program"},
		{name: "worker_command newline", edit: set("worker_command", []string{"w", "a\nb"}), path: "worker_command.1", summary: "Invalid worker_command"},
		{name: "no profiles", edit: set("profile", []any{}), path: "profile", summary: "No profiles"},
		{name: "provisioner name", provName: "my hpc", path: "", summary: "Invalid provisioner name"},
		{name: "profile name", edit: setProf(1, "name", "cpu box"), path: "profile.1.name", summary: "Invalid profile name"},
		{name: "profile name empty", edit: setProf(0, "name", ""), path: "profile.0.name", summary: "Invalid profile name"},
		{name: "duplicate profile", edit: setProf(1, "name", "gpu"), path: "profile.1.name", summary: "Duplicate profile"},
		{name: "label", edit: setProf(0, "labels", []string{"ok", "a,b"}), path: "profile.0.labels.1", summary: "Invalid label"},
		{name: "label empty", edit: setProf(0, "labels", []string{""}), path: "profile.0.labels.0", summary: "Invalid label"},
		{name: "cpus zero", edit: setProf(1, "cpus", 0), path: "profile.1.cpus", summary: "Invalid cpus"},
		{name: "max_workers zero", edit: set("max_workers", 0), path: "max_workers", summary: "Invalid max_workers"},
		{name: "max_pending negative", edit: set("max_pending", -3), path: "max_pending", summary: "Invalid max_pending"},
		{name: "profile max_pending negative", edit: setProf(0, "max_pending", -1), path: "profile.0.max_pending", summary: "Invalid max_pending"},
		{name: "min above max", edit: func(c map[string]any) { setProf(1, "min_workers", 5)(c); setProf(1, "max_workers", 2)(c) }, path: "profile.1.min_workers", summary: "min_workers above max_workers"},
		{name: "warm beyond the provisioner", edit: func(c map[string]any) {
			c["max_workers"] = 3
			setProf(0, "min_workers", 2)(c)
			setProf(1, "min_workers", 2)(c)
		}, path: "max_workers", summary: "min_workers add up to more than max_workers"},
		{name: "cpus wrong type", edit: setProf(1, "cpus", "four"), path: "profile.1.cpus", summary: "Wrong type"},
		{name: "gpus negative", edit: setProf(0, "gpus", -1), path: "profile.0.gpus", summary: "Invalid gpus"},
		{name: "ram negative", edit: setProf(0, "ram_mb", -1), path: "profile.0.ram_mb", summary: "Invalid ram_mb"},
		{name: "sbatch short forms", edit: setProf(1, "sbatch", []string{"-p debug", "-A acct", "--time=10", "-c4", "--account=x", "--wckey=w"}), path: "-"},
		{name: "sbatch not an option", edit: setProf(1, "sbatch", []string{"--partition=debug", "partition=debug"}), path: "profile.1.sbatch.1", summary: "Invalid sbatch line"},
		{name: "sbatch newline", edit: setProf(1, "sbatch", []string{"--time=10\necho hi"}), path: "profile.1.sbatch.0", summary: "Invalid sbatch line"},
		{name: "sbatch cr", edit: setProf(1, "sbatch", []string{"--time=10\r"}), path: "profile.1.sbatch.0", summary: "Invalid sbatch line"},
		{name: "sbatch job name", edit: setProf(1, "sbatch", []string{"--job-name=x"}), path: "profile.1.sbatch.0", summary: "Reserved sbatch option"},
		{name: "sbatch job name abbreviated", edit: setProf(1, "sbatch", []string{"--job=x"}), path: "profile.1.sbatch.0", summary: "Reserved sbatch option"},
		{name: "sbatch -J", edit: setProf(1, "sbatch", []string{"-J x"}), path: "profile.1.sbatch.0", summary: "Reserved sbatch option"},
		{name: "sbatch -J bundled", edit: setProf(1, "sbatch", []string{"-vJx"}), path: "profile.1.sbatch.0", summary: "Reserved sbatch option"},
		{name: "sbatch comment", edit: setProf(1, "sbatch", []string{"--comment x"}), path: "profile.1.sbatch.0", summary: "Reserved sbatch option"},
		{name: "sbatch deadline sooner than the time limit", edit: setProf(1, "sbatch", []string{"--time=10", "--deadline=now+5minutes"}), path: "profile.1.sbatch.1", summary: "A --deadline before the job can end"},
		{name: "sbatch parsable", edit: setProf(1, "sbatch", []string{"--parsable"}), path: "profile.1.sbatch.0", summary: "Reserved sbatch option"},
		{name: "sbatch array", edit: setProf(1, "sbatch", []string{"-a 1-4"}), path: "profile.1.sbatch.0", summary: "Reserved sbatch option"},
		{name: "sbatch wait", edit: setProf(1, "sbatch", []string{"--wait"}), path: "profile.1.sbatch.0", summary: "Reserved sbatch option"},
		{name: "sbatch wrap", edit: setProf(1, "sbatch", []string{"--wrap=hostname"}), path: "profile.1.sbatch.0", summary: "Reserved sbatch option"},
		{name: "sbatch nodes", edit: setProf(1, "sbatch", []string{"--nodes=4"}), path: "profile.1.sbatch.0", summary: "Reserved sbatch option"},
		{name: "sbatch -N", edit: setProf(1, "sbatch", []string{"-N 2"}), path: "profile.1.sbatch.0", summary: "Reserved sbatch option"},
		{name: "sbatch ntasks", edit: setProf(1, "sbatch", []string{"--ntasks=2"}), path: "profile.1.sbatch.0", summary: "Reserved sbatch option"},
		{name: "sbatch ntasks-per-node", edit: setProf(1, "sbatch", []string{"--ntasks-per-node=2"}), path: "profile.1.sbatch.0", summary: "Reserved sbatch option"},
		{name: "reach unknown", edit: set("reach", "tunnel"), path: "reach", summary: "Invalid reach"},
		{name: "relay_host without relay", edit: set("relay_host", "login1"), path: "relay_host", summary: "relay_host without a relay"},
		{name: "relay_command without relay", edit: set("relay_command", []string{"/opt/x"}), path: "relay_command", summary: "relay_command without a relay"},
		{name: "relay_listen not host:port", edit: func(c map[string]any) { c["reach"] = "relay"; c["relay_listen"] = "7000" }, path: "relay_listen", summary: "Invalid relay_listen"},
		{name: "relay_host not a host", edit: func(c map[string]any) { c["reach"] = "relay"; c["relay_host"] = "a b" }, path: "relay_host", summary: "Invalid relay_host"},
		{name: "direct without engine_url", edit: set("engine_url", ""), path: "engine_url", summary: "Missing engine_url"},
		{name: "nodes negative", edit: setProf(0, "nodes", -1), path: "profile.0.nodes", summary: "Invalid nodes"},
		{name: "nodes too many", edit: setProf(0, "nodes", 5000), path: "profile.0.nodes", summary: "Invalid nodes"},
		{name: "nodes above max_workers", edit: func(c map[string]any) { setProf(0, "nodes", 4)(c); setProf(0, "max_workers", 3)(c) }, path: "profile.0.nodes", summary: "nodes above max_workers"},
		{name: "nodes above max_pending", edit: func(c map[string]any) { setProf(0, "nodes", 4)(c); set("max_pending", 2)(c) }, path: "profile.0.nodes", summary: "nodes above max_pending"},
		{name: "exclusive", edit: setProf(0, "exclusive", true), path: "-"},
		{name: "exclusive nodes 2", edit: func(c map[string]any) { setProf(0, "exclusive", true)(c); setProf(0, "nodes", 2)(c) }, path: "profile.0.exclusive", summary: "exclusive with nodes above 1"},
		{name: "exclusive oversubscribe", edit: func(c map[string]any) {
			setProf(0, "exclusive", true)(c)
			setProf(0, "sbatch", []string{"--partition=debug", "--oversubscribe"})(c)
		}, path: "profile.0.exclusive", summary: "exclusive with --oversubscribe"},
		{name: "exclusive -s", edit: func(c map[string]any) { setProf(0, "exclusive", true)(c); setProf(0, "sbatch", []string{"-s"})(c) }, path: "profile.0.exclusive", summary: "exclusive with --oversubscribe"},
		{name: "oversubscribe alone", edit: setProf(0, "sbatch", []string{"--oversubscribe"}), path: "-"},
		{name: "prerun newline", edit: setProf(1, "prerun", []string{"ok", "a\nb"}), path: "profile.1.prerun.1", summary: "Invalid prerun line"},
		{name: "prerun nul", edit: setProf(1, "prerun", []string{"a\x00"}), path: "profile.1.prerun.0", summary: "Invalid prerun line"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig()
			if tc.edit != nil {
				tc.edit(cfg)
			}
			name := "hpc"
			if tc.provName != "" {
				name = tc.provName
			}
			_, diags := parseConfig(name, mustJSON(t, cfg))
			if tc.path == "-" {
				if len(diags) != 0 {
					t.Fatalf("want no diagnostics, got:\n%v", diags)
				}
				return
			}
			if len(diags) != 1 {
				t.Fatalf("want one diagnostic at %q, got %d:\n%v", tc.path, len(diags), diags)
			}
			d := diags[0]
			if d.Severity != shared.SeverityError || strings.Join(d.Path, ".") != tc.path || d.Summary != tc.summary || d.Detail == "" {
				t.Errorf("got %v %q %q (%q), want error at %q %q", d.Severity, strings.Join(d.Path, "."), d.Summary, d.Detail, tc.path, tc.summary)
			}
		})
	}
}

func TestReservedOption(t *testing.T) {
	tests := []struct{ line, want string }{
		{"--job-name=x", "--job-name"},
		{"--job-name x", "--job-name"},
		{"--jo=x", "--job-name"},
		{"-J", "-J"},
		{"-Jname", "-J"},
		{"-HJ x", "-J"},
		{"--comment=x", "--comment"},
		{"--parsable", "--parsable"},
		{"--array=0-3", "--array"},
		{"-a0-3", "-a"},
		{"-W", "-W"},
		{"--partition=debug", ""},
		{"-p debug", ""},
		{"-pJ", ""}, // J is -p's argument
		{"--account=j", ""},
		{"-A x", ""},
		// sbatch reads every word of a #SBATCH line, split at C's
		// white space, with quotes, escapes and # comments.
		{"--partition=x --array=1-100", "--array"},
		{"-p x -J y", "-J"},
		{"--time=5\t-J y", "-J"},
		{"--time=5\v-J y", "-J"},
		{"--time=5\f--job-name=y", "--job-name"},
		{"--time=5\r--job=y", "--job-name"},
		{"--partition x --comment y", "--comment"},
		{"--partition=x -M c2", "-M"},
		{"--clusters=c2", "--clusters"},
		{"--test-only", "--test-only"},
		{"--partition='x -J y'", ""},
		{`--partition="x --array=1-5"`, ""},
		{`--partition=x\ -J`, ""},
		{"--partition=x # --array=1-5", ""},
		{"--partition=x #--array=1-5", ""},
	}
	for _, tc := range tests {
		opts, err := sbatch.ParseLine(tc.line)
		if err != nil {
			t.Errorf("sbatch.ParseLine(%q): %v", tc.line, err)
			continue
		}
		if got, _ := reservedOption(opts); got != tc.want {
			t.Errorf("reservedOption(%q) = %q, want %q", tc.line, got, tc.want)
		}
	}
}

// TestOptionFamiliesInAnyWord: an option the script would otherwise add
// (--mem, --time for the deadline) counts wherever it stands in a line.
func TestOptionFamiliesInAnyWord(t *testing.T) {
	lines := []string{"--partition=debug --mem=4G", "-p debug -t 30"}
	if !memOptions.setIn(sbatch.Opts(lines)) {
		t.Error("--mem in a line's second word was missed")
	}
	if limit, ok := sbatch.TimeLimit(lines); !ok || limit != 30*time.Minute {
		t.Errorf("sbatch.TimeLimit = %s, %v; want 30m", limit, ok)
	}
	if gpuOptions.setIn(sbatch.Opts(lines)) {
		t.Error("no GPU option was set")
	}
}

func TestFrequentPollingWarns(t *testing.T) {
	cfg := baseConfig()
	cfg["poll_interval"] = "2s"
	s, diags := parseConfig("hpc", mustJSON(t, cfg))
	if s == nil || len(diags) != 1 || diags[0].Severity != shared.SeverityWarning || strings.Join(diags[0].Path, ".") != "poll_interval" {
		t.Fatalf("diagnostics = %v", diags)
	}
	if s.pollInterval != 2*time.Second {
		t.Errorf("poll_interval = %s", s.pollInterval)
	}
}

// TestTrustFilesOthersCanWrite: a known_hosts, ssh_config or ssh_options
// known-hosts file that someone other than the engine's user or root can
// change is refused at the attribute that names it, with what to do
// (chmod go-w); the attack was ssh_options =
// ["UserKnownHostsFile=<a file anyone can write>"], accepted without a
// word.
func TestTrustFilesOthersCanWrite(t *testing.T) {
	dir := t.TempDir()
	file := func(name string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("# hosts\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := file("good", 0o644)
	anyone := file("anyone", 0o666)
	group := file("group", 0o664)
	open := filepath.Join(dir, "open")
	if err := os.Mkdir(open, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	inOpen := filepath.Join(open, "kh")
	if err := os.WriteFile(inOpen, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	foreign := file("foreign", 0o644)
	if os.Getuid() == 0 {
		if err := os.Chown(foreign, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	} else {
		foreign = "" // only root can give a file away
	}
	missingInTmp := filepath.Join(os.TempDir(), "fluksio-test-no-such-known-hosts")

	set := func(k string, v any) func(map[string]any) { return func(c map[string]any) { c[k] = v } }
	tests := []struct {
		name string
		edit func(map[string]any)
		path string // "-": valid
		why  string
	}{
		{"own file", set("known_hosts", good), "-", ""},
		{"own ssh_config", set("ssh_config", good), "-", ""},
		{"known_hosts anyone", set("known_hosts", anyone), "known_hosts", "mode 0666"},
		{"known_hosts group", set("known_hosts", group), "known_hosts", "mode 0664"},
		{"known_hosts in open dir", set("known_hosts", inOpen), "known_hosts", "its directory " + open},
		{"known_hosts missing in /tmp", set("known_hosts", missingInTmp), "known_hosts", "does not exist"},
		{"ssh_config anyone", set("ssh_config", anyone), "ssh_config", "mode 0666"},
		{"ssh_options UserKnownHostsFile", set("ssh_options", []string{"ConnectTimeout=5", "UserKnownHostsFile=" + anyone}), "ssh_options.1", "mode 0666"},
		{"ssh_options two files", set("ssh_options", []string{"UserKnownHostsFile=" + good + " " + inOpen}), "ssh_options.0", "its directory"},
		{"ssh_options GlobalKnownHostsFile", set("ssh_options", []string{"GlobalKnownHostsFile=" + anyone}), "ssh_options.0", "mode 0666"},
		{"ssh_options own file", set("ssh_options", []string{"UserKnownHostsFile=" + good}), "-", ""},
		{"foreign owner", set("known_hosts", foreign), "known_hosts", "owned by uid 65534"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.why == "owned by uid 65534" && foreign == "" {
				t.Skip("needs root to give a file away")
			}
			cfg := baseConfig()
			tc.edit(cfg)
			_, diags := parseConfig("hpc", mustJSON(t, cfg))
			if tc.path == "-" {
				if len(diags) != 0 {
					t.Fatalf("want no diagnostics, got:\n%v", diags)
				}
				return
			}
			if len(diags) != 1 {
				t.Fatalf("want one diagnostic at %q, got %d:\n%v", tc.path, len(diags), diags)
			}
			d := diags[0]
			if d.Severity != shared.SeverityError || strings.Join(d.Path, ".") != tc.path || d.Summary != "File others can write" ||
				!strings.Contains(d.Detail, tc.why) || !strings.Contains(d.Detail, "chmod go-w") {
				t.Errorf("got %v %q %q (%q), want error at %q saying %q and chmod go-w", d.Severity, strings.Join(d.Path, "."), d.Summary, d.Detail, tc.path, tc.why)
			}
		})
	}
}

// TestTrustFilesInSSHConfig: an ssh_config whose UserKnownHostsFile or
// GlobalKnownHostsFile others can write is refused at ssh_config, as
// ssh -G reads the file.
func TestTrustFilesInSSHConfig(t *testing.T) {
	testutil.LookPath(t, "ssh")
	dir := t.TempDir()
	anyone := filepath.Join(dir, "anyone")
	if err := os.WriteFile(anyone, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(anyone, 0o666); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"UserKnownHostsFile", "GlobalKnownHostsFile"} {
		conf := filepath.Join(dir, key+"_config")
		if err := os.WriteFile(conf, []byte("Host *\n  "+key+" "+anyone+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		c := baseConfig()
		c["ssh_config"] = conf
		resp, err := New(nil).ValidateConfig(context.Background(), &shared.ValidateConfigRequest{Name: "hpc", Config: mustJSON(t, c)})
		if err != nil || len(resp.Diagnostics) != 1 || strings.Join(resp.Diagnostics[0].Path, ".") != "ssh_config" ||
			resp.Diagnostics[0].Summary != "File others can write" || !strings.Contains(resp.Diagnostics[0].Detail, "mode 0666") {
			t.Errorf("%s naming a 0666 file: %+v, %v", key, resp, err)
		}
	}
}
