package slurm

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestSSHArgs(t *testing.T) {
	remote := []string{"squeue", "-h", "-o", "%i %k", "--name=fluksio-hpc"}
	tests := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"plain", Config{Login: "u@h"},
			[]string{"-o", "BatchMode=yes", "--", "u@h", "squeue", "-h", "-o", "'%i %k'", "--name=fluksio-hpc"}},
		{"everything", Config{
			Login: "u@h", SSHConfig: "/etc/ssh cfg", SSHPort: 2222, SSHKey: "/k", KnownHosts: "/kh",
			SSHOptions: []string{"ControlMaster=auto", "ConnectTimeout=5"},
		}, []string{"-o", "BatchMode=yes", "-F", "/etc/ssh cfg", "-p", "2222", "-i", "/k",
			"-o", "UserKnownHostsFile=/kh", "-o", "StrictHostKeyChecking=yes",
			"-o", "ControlMaster=auto", "-o", "ConnectTimeout=5",
			"--", "u@h", "squeue", "-h", "-o", "'%i %k'", "--name=fluksio-hpc"}},
	}
	for _, tc := range tests {
		if got := sshArgs(&settings{Config: tc.cfg}, remote); !slices.Equal(got, tc.want) {
			t.Errorf("%s: argv = %q\nwant %q", tc.name, got, tc.want)
		}
	}
}

func TestSSHErrors(t *testing.T) {
	newFakeCluster(t, "scancel=fail")
	p := New(nil)
	p.sshPath = os.Args[0]
	p.cfg = &settings{Config: Config{Login: "alice@login.example.org"}, submitTimeout: 10 * time.Second}

	_, stderr, err := p.ssh(context.Background(), nil, "scancel", "1")
	if err == nil || !strings.HasPrefix(err.Error(), "scancel on login.example.org: exit status 8") {
		t.Errorf("err = %v", err)
	}
	if !strings.Contains(string(stderr), "Unable to contact slurm controller") {
		t.Errorf("stderr = %q", stderr)
	}

	p.sshPath = "/nonexistent/ssh"
	if _, _, err := p.ssh(context.Background(), nil, "scancel", "1"); err == nil || !strings.HasPrefix(err.Error(), "scancel on login.example.org: ") {
		t.Errorf("err = %v", err)
	}
}
