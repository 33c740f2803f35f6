package slurm

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/sshrun"
)

// The transport itself (argv, multiplexing, the session cap, Close) is
// tested in slurm/sshrun; here, what the provisioner gives it.

// withoutMux is argv without the multiplexing options the transport adds
// (three Control options right after BatchMode), for tests that pin the
// rest.
func withoutMux(argv []string) []string {
	if len(argv) < 8 || argv[1] != "BatchMode=yes" || argv[3] != "ControlMaster=auto" ||
		!strings.HasPrefix(argv[5], "ControlPath=") || !strings.HasPrefix(argv[7], "ControlPersist=") {
		return argv
	}
	return append(slices.Clone(argv[:2]), argv[8:]...)
}

// unbounded is argv without the remote timeout the transport runs each
// command under (sshrun/deadline.go), and the seconds it gave: "" when
// there is none.
func unbounded(argv []string) ([]string, string) {
	i := slices.Index(argv, "--")
	if i < 0 || len(argv) < i+6 || argv[i+2] != "timeout" || argv[i+3] != "-k" {
		return argv, ""
	}
	return append(slices.Clone(argv[:i+2]), argv[i+6:]...), argv[i+5]
}

// sshArgs is the argv a call of remote runs ssh with under cfg's
// settings, without multiplexing, as the fake ssh records it.
func sshArgs(t *testing.T, cfg *settings, remote ...string) []string {
	t.Helper()
	f := newFakeCluster(t, "")
	c := cfg.sshConfig()
	c.Program, c.Multiplex = os.Args[0], false
	if _, stderr, err := sshrun.New(c, nil).Run(context.Background(), nil, remote...); err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	calls := f.calls()
	if len(calls) != 1 {
		t.Fatalf("%d calls, want 1", len(calls))
	}
	return calls[0].Argv
}

// TestSSHSettings: the transport gets the settings as configured, the
// login entry's port, ConnectTimeout from submit_timeout, and sbatch's
// words.
func TestSSHSettings(t *testing.T) {
	s, diags := parseConfig("hpc", mustJSON(t, func() map[string]any {
		c := baseConfig()
		c["login"], c["ssh_key"], c["known_hosts"], c["ssh_config"] = "u@h:2222", "/k", "/kh", "/etc/ssh cfg"
		c["ssh_options"], c["submit_timeout"] = []string{"ServerAliveInterval=5"}, "20s"
		return c
	}()))
	if diags.HasErrors() {
		t.Fatalf("diagnostics: %v", diags)
	}
	want := []string{"-o", "BatchMode=yes", "-F", "/etc/ssh cfg", "-p", "2222", "-i", "/k",
		"-o", "UserKnownHostsFile=/kh", "-o", "StrictHostKeyChecking=yes", "-o", "ServerAliveInterval=5", "-o", "ConnectTimeout=10",
		"--", "u@h", "squeue", "-h", "-o", "'%i %k'"}
	// The command runs under the login node's timeout, a little within
	// submit_timeout.
	if got, given := unbounded(sshArgs(t, s, "squeue", "-h", "-o", "%i %k")); !slices.Equal(got, want) || given != "18.0" {
		t.Errorf("argv = %q under timeout %q\nwant %q under 18.0", got, given, want)
	}
	// sbatch exits 255 itself, which the transport must not take for a
	// login that does not answer (sshrun's TestRemoteSaid).
	if c := s.sshConfig(); c.RemoteSaid == nil || !c.RemoteSaid.Match([]byte("sbatch: error: Batch job submission failed: Connection refused")) {
		t.Errorf("the transport is not told sbatch's words: %v", c.RemoteSaid)
	}
}

func TestMultiplexSettings(t *testing.T) {
	tests := []struct {
		name      string
		edit      func(map[string]any)
		multiplex bool
		sessions  int
		diag      string // "" for none, else severity:path:summary
	}{
		{"absent", func(c map[string]any) { delete(c, "multiplex"); delete(c, "max_sessions") }, true, 8, ""},
		{"null", func(c map[string]any) { c["multiplex"], c["max_sessions"] = nil, nil }, true, 8, ""},
		{"off", func(c map[string]any) { c["multiplex"], c["max_sessions"] = false, 3 }, false, 3, ""},
		{"one", func(c map[string]any) { c["max_sessions"] = 1 }, true, 1, ""},
		{"zero", func(c map[string]any) { c["max_sessions"] = 0 }, true, 0, "error:max_sessions:Invalid max_sessions"},
		{"negative", func(c map[string]any) { c["max_sessions"] = -2 }, true, 0, "error:max_sessions:Invalid max_sessions"},
		{"too many", func(c map[string]any) { c["max_sessions"] = 65 }, true, 0, "error:max_sessions:Invalid max_sessions"},
		{"sshd's limit", func(c map[string]any) { c["max_sessions"] = 10 }, true, 10, "warning:max_sessions:max_sessions at or above sshd's usual limit"},
		{"many without multiplexing", func(c map[string]any) { c["multiplex"], c["max_sessions"] = false, 64 }, false, 64, ""},
		{"multiplex wrong type", func(c map[string]any) { c["multiplex"] = "yes" }, false, 0, "error:multiplex:Wrong type"},
		{"max_sessions wrong type", func(c map[string]any) { c["max_sessions"] = 2.5 }, false, 0, "error:max_sessions:Wrong type"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := baseConfig()
			tc.edit(c)
			s, diags := parseConfig("hpc", mustJSON(t, c))
			var got string
			if len(diags) > 1 {
				t.Fatalf("diagnostics: %v", diags)
			}
			if len(diags) == 1 {
				sev := map[shared.Severity]string{shared.SeverityError: "error", shared.SeverityWarning: "warning"}[diags[0].Severity]
				got = sev + ":" + strings.Join(diags[0].Path, ".") + ":" + diags[0].Summary
				if !strings.Contains(diags[0].Detail, "MaxSessions") && tc.name != "multiplex wrong type" && tc.name != "max_sessions wrong type" {
					t.Errorf("detail %q does not mention MaxSessions", diags[0].Detail)
				}
			}
			if got != tc.diag {
				t.Fatalf("diagnostic %q, want %q", got, tc.diag)
			}
			if s != nil && (s.multiplex != tc.multiplex || s.maxSessions != tc.sessions) {
				t.Errorf("multiplex %v max_sessions %d, want %v %d", s.multiplex, s.maxSessions, tc.multiplex, tc.sessions)
			}
		})
	}
	var names []string
	for _, a := range schema().Attributes {
		names = append(names, a.Name)
	}
	if !slices.Contains(names, "multiplex") || !slices.Contains(names, "max_sessions") {
		t.Errorf("schema attributes %q lack multiplex or max_sessions", names)
	}
}

// configureSSH configures a Provisioner named "hpc" whose ssh is sshPath;
// edit changes the base configuration first. It is shut down at cleanup.
func configureSSH(t *testing.T, sshPath string, edit func(map[string]any)) *Provisioner {
	t.Helper()
	p := New(hclog.NewNullLogger())
	p.sshPath = sshPath
	cfg := baseConfig()
	if edit != nil {
		edit(cfg)
	}
	resp, err := p.Configure(context.Background(), &shared.ConfigureRequest{Name: "hpc", Config: mustJSON(t, cfg), Host: newFakeHost()})
	if err != nil || resp.Diagnostics.HasErrors() {
		t.Fatalf("Configure: %v %v", err, resp.Diagnostics)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		p.Shutdown(ctx, &shared.ShutdownRequest{})
	})
	return p
}
