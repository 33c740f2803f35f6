package engine

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEngineURLChecked: a provisioner whose engine_url names this machine
// on another port than engine.listen is warned about at engine_url, with
// both ports; the same port, another host, or a socket is left alone.
func TestEngineURLChecked(t *testing.T) {
	dir := t.TempDir()
	for i, tc := range []struct {
		listen, url string
		warn        bool
	}{
		{"127.0.0.1:8470", "http://127.0.0.1:8471", true},
		{"127.0.0.1:8470", "http://localhost:9000/", true},
		{"10.0.0.5:8470", "https://10.0.0.5", true},
		{"127.0.0.1:8470", "http://127.0.0.1:8470", false},
		{"0.0.0.0:8470", "http://engine.example.org:8470", false},
		{"127.0.0.1:8470", "http://proxy.example.org:9000", false},
		{"unix:/run/e.sock", "http://127.0.0.1:1", false},
	} {
		body := "engine {\n  listen = \"" + tc.listen + "\"\n}\nprovisioner \"slurm\" \"hpc\" {\n  login = \"u@h\"\n  engine_url = \"" + tc.url + "\"\n}\n"
		path := filepath.Join(dir, "c"+string(rune('a'+i))+".hcl")
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		_, diags := LoadConfig(path)
		var found bool
		for _, d := range diags {
			if d.Summary == "engine_url does not reach the engine" {
				found = true
				if d.Subject == nil || d.Subject.Start.Line != 6 || !strings.Contains(d.Detail, "engine.listen") {
					t.Errorf("%s vs %s: warning at %v: %s", tc.listen, tc.url, d.Subject, d.Detail)
				}
			}
		}
		if found != tc.warn {
			t.Errorf("listen %s, engine_url %s: warned %v, want %v (%v)", tc.listen, tc.url, found, tc.warn, diags)
		}
	}
}

// TestParkPollsAttribute: the engine block parks polls unless it says
// park_polls = false.
func TestParkPollsAttribute(t *testing.T) {
	dir := t.TempDir()
	for body, want := range map[string]bool{
		"engine {\n}\n":                       true,
		"engine {\n  park_polls = true\n}\n":  true,
		"engine {\n  park_polls = false\n}\n": false,
	} {
		path := filepath.Join(dir, "engine.hcl")
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, diags := LoadConfig(path)
		if diags.HasErrors() {
			t.Fatal(diags)
		}
		if cfg.Engine.ParkPolls != want {
			t.Errorf("%q: park_polls %v; want %v", body, cfg.Engine.ParkPolls, want)
		}
	}
}
