package sshrun

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDecisive: of the real ssh's stderr (testdata/stderr, and its
// README for how each was made), the decisive lines are picked, and Lead
// puts them first and keeps every other line; a refusal through a jump
// host reads as the same Refusal as one at the login node.
func TestDecisive(t *testing.T) {
	for _, c := range []struct {
		file    string
		want    string
		refusal Refusal
	}{
		{"jump-hostkey-unknown", "No ED25519 host key is known for [127.0.0.1]:2222 and you have requested strict checking.\nHost key verification failed.", RefusedHostKey},
		{"jump-hostkey-changed", "Host key for [127.0.0.1]:2222 has changed and you have requested strict checking.\nHost key verification failed.", RefusedHostKey},
		{"recipe-proxyjump", "Host key verification failed.", RefusedHostKey},
		{"login-hostkey-changed", "Host key for [127.0.0.1]:2222 has changed and you have requested strict checking.\nHost key verification failed.", RefusedHostKey},
		{"jump-auth", "slurmuser@127.0.0.1: Permission denied (publickey).", RefusedAuth},
		{"login-auth", "slurmuser@127.0.0.1: Permission denied (publickey).", RefusedAuth},
		{"jump-refused", "ssh: connect to host 127.0.0.1 port 1: Connection refused", NotRefused},
		{"login-refused", "ssh: connect to host 127.0.0.1 port 1: Connection refused", NotRefused},
		{"login-refused-via-jump", "channel 0: open failed: connect failed: Connection refused", NotRefused},
		{"jump-resolve", "ssh: Could not resolve hostname nosuchhost.invalid: Name or service not known", NotRefused},
		{"jump-connect-timeout", "ssh: connect to host 127.0.0.1 port 57535: Connection timed out", NotRefused},
		{"login-connect-timeout", "ssh: connect to host 127.0.0.1 port 57535: Connection timed out", NotRefused},
		{"login-banner-timeout", "Connection timed out during banner exchange", NotRefused},
		{"jump-noroute", "ssh: connect to host 192.0.2.77 port 22: No route to host", NotRefused},
		{"login-noroute", "ssh: connect to host 192.0.2.77 port 22: No route to host", NotRefused},
	} {
		t.Run(c.file, func(t *testing.T) {
			said, err := os.ReadFile(filepath.Join("testdata", "stderr", c.file+".txt"))
			if err != nil {
				t.Fatal(err)
			}
			if got := Decisive(said); got != c.want {
				t.Errorf("Decisive:\n%s\nwant:\n%s", got, c.want)
			}
			lead := string(Lead(said))
			if !strings.HasPrefix(lead, c.want+"\n") {
				t.Errorf("Lead does not start with the decisive lines:\n%s", lead)
			}
			// Every line ssh said is still there, once.
			for _, l := range strings.Split(strings.TrimSpace(string(said)), "\n") {
				if n := strings.Count(lead, strings.Trim(l, "@ \r")); n < 1 {
					t.Errorf("Lead lost the line %q:\n%s", l, lead)
				}
			}
			if got, want := strings.Count(lead, "\n"), strings.Count(string(said), "\n"); got != want {
				t.Errorf("Lead has %d lines, ssh said %d:\n%s", got, want, lead)
			}
			if got := Refused(said); got != c.refusal {
				t.Errorf("Refused = %v, want %v", got, c.refusal)
			}
			if Refused(Lead(said)) != Refused(said) || NeverRan(Lead(said)) != NeverRan(said) {
				t.Error("Lead changed how the words classify")
			}
		})
	}
	plain := []byte("sbatch: error: Batch job submission failed: Invalid partition name specified\n")
	if Decisive(plain) != "" || string(Lead(plain)) != string(plain) {
		t.Errorf("words without a decisive line: Decisive %q, Lead %q", Decisive(plain), Lead(plain))
	}
}
