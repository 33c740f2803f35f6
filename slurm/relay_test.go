package slurm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/internal/testutil"
	"github.com/fluksio/provision/shared"

	relayd "github.com/fluksio/provision/slurm/relay"
)

// TestRelayRefusesAnotherPlatform runs the relay's check script, as the
// login node's shell would, where uname says the machine is of another
// architecture: it exits exitWrongPlatform and says what it found. The
// real login node is this machine's own kind, so a uname on PATH stands
// in for the other one.
func TestRelayRefusesAnotherPlatform(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "uname"), []byte("#!/bin/sh\necho 'Linux sparc64'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", relayCheckScript(strings.Repeat("ab", 32)))
	cmd.Env = []string{"PATH=" + dir + ":/usr/bin:/bin", "HOME=" + t.TempDir()}
	out, err := cmd.CombinedOutput()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != exitWrongPlatform || !strings.Contains(string(out), "the login node is Linux sparc64, and the plugin binary is for "+uname()) {
		t.Errorf("check on another platform: %v, said %q; want exit %d saying both", err, out, exitWrongPlatform)
	}

	// This platform, no cached binary: exitNoBinary, so that it is
	// copied. With a wrong file in its place: the same.
	home := t.TempDir()
	cmd = exec.Command("sh", "-c", relayCheckScript(strings.Repeat("ab", 32)))
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + home}
	if err := cmd.Run(); err == nil || err.(*exec.ExitError).ExitCode() != exitNoBinary {
		t.Errorf("check without the binary: %v, want exit %d", err, exitNoBinary)
	}
	os.MkdirAll(filepath.Join(home, relayCacheDir), 0o700)
	os.WriteFile(filepath.Join(home, relayCacheDir, relayFile(strings.Repeat("ab", 32))), []byte("not it"), 0o700)
	cmd = exec.Command("sh", "-c", relayCheckScript(strings.Repeat("ab", 32)))
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + home}
	if err := cmd.Run(); err == nil || err.(*exec.ExitError).ExitCode() != exitNoBinary {
		t.Errorf("check with another file in its place: %v, want exit %d", err, exitNoBinary)
	}
}

// TestRelayNeedsTheEngineAddress: reach = "relay" from an engine that
// does not say where it listens is a configuration error, not a relay
// that dials nowhere.
func TestRelayNeedsTheEngineAddress(t *testing.T) {
	h := newUnconfigured(t, "sbatch=ok")
	cfg := baseConfig()
	cfg["reach"] = "relay"
	resp, err := h.p.Configure(context.Background(), &shared.ConfigureRequest{Name: "hpc", Config: mustJSON(t, cfg), Host: h.host})
	if err != nil || !resp.Diagnostics.HasErrors() || !strings.Contains(resp.Diagnostics.Error(), "did not say where it listens") {
		t.Errorf("Configure: %v %v; want an error saying the engine address is missing", err, resp.Diagnostics)
	}
	for _, bad := range []string{"127.0.0.1:8470", "udp:127.0.0.1:1", "unix:"} {
		if _, _, err := engineAddress(bad); err == nil {
			t.Errorf("engineAddress(%q) accepted", bad)
		}
	}
}

// TestRelayPrivateCopy starts the relay for real, over ssh to the
// sandbox's login node, from a cache that holds two binaries of other
// versions: they are gone after the first start, and so is the private
// copy the relay ran from. Then it starts the relay 150 times while a
// goroutine flips the cached file between the real binary and another
// program, as an attacker with the login account could: the flip lands
// in the cache often enough to be copied (those starts refuse, exit
// exitNoBinary), and no start runs the other program (0 of 150). The
// start script that checked the cached file and then executed it ran the
// other program in 18 of 150.
func TestRelayPrivateCopy(t *testing.T) {
	sandboxtest.RelayCache(t)
	env := sandboxtest.Require(t)
	p := configureSSH(t, testutil.LookPath(t, "ssh"), func(c map[string]any) {
		c["login"], c["ssh_port"], c["ssh_key"], c["known_hosts"] = env.Login, env.Port, env.Key, env.KnownHosts
		c["submit_timeout"] = "2m"
	})
	cfg := p.settings()
	ctx := context.Background()
	sh := func(script string) string {
		t.Helper()
		out, stderr, err := p.q.Run(ctx, nil, "sh", "-c", script)
		if err != nil {
			t.Fatalf("%s: %v: %s", script, err, stderr)
		}
		return strings.TrimSpace(string(out))
	}
	// The login node is this machine, so its cache can be reached
	// directly too, as the attacker would.
	var home string
	var uid, gid int
	fmt.Sscan(sh(`echo "$HOME" "$(id -u)" "$(id -g)"`), &home, &uid, &gid)
	cache := filepath.Join(home, relayCacheDir)
	stale := []string{"provisioner-slurm-0000000000000000", "provisioner-slurm-1111111111111111"}
	// Unused for two hours: another version's binary used a moment ago
	// is left alone (another engine of the same account may run it).
	sh(`umask 077; mkdir -p ~/` + relayCacheDir + ` && cd ~/` + relayCacheDir + ` && printf stale > ` + stale[0] + ` && printf stale > ` + stale[1] +
		` && touch -d '2 hours ago' ` + stale[0] + ` ` + stale[1] + ` && printf recent > provisioner-slurm-2222222222222222`)
	t.Cleanup(func() { os.Remove(filepath.Join(cache, "provisioner-slurm-2222222222222222")) })

	r := newRelay(p, cfg, "tcp", "127.0.0.1:1", nil)
	remote, err := r.command(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := func() (stdout string, code int) {
		out, _, err := p.q.Run(ctx, nil, remote...)
		var ee *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			code = ee.ExitCode()
		default:
			t.Fatalf("starting the relay: %v", err)
		}
		return string(out), code
	}
	// The relay runs (its stdin, the session, ends at once, and so does
	// it) and says where it listens.
	if out, code := start(); code != 0 || !strings.Contains(out, relayd.Greeting) {
		t.Fatalf("the relay's start: exit %d, said %q", code, out)
	}
	entries := func() []string {
		es, err := os.ReadDir(cache)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range es {
			names = append(names, e.Name())
		}
		return names
	}
	_, sum, _ := ownBinary()
	cached := filepath.Join(cache, relayFile(sum))
	// Other tests running at the same time may have cached binaries of
	// their own, and private copies of relays still starting: what is
	// checked is what this start had to do. (TestE2ERelay checks that no
	// private copy is left once its relays are gone.)
	got := entries()
	if !slices.Contains(got, relayFile(sum)) || !slices.Contains(got, "provisioner-slurm-2222222222222222") ||
		slices.ContainsFunc(got, func(n string) bool { return slices.Contains(stale, n) }) {
		t.Errorf("left in the cache after a start: %v; want %s and the recently used other version, the stale binaries gone", got, relayFile(sum))
	}

	// The other program says so on stdout, where the start's output is
	// read; it is the account's, as the cached binary is.
	real, evil, tmp := filepath.Join(cache, ".real"), filepath.Join(cache, ".evil"), filepath.Join(cache, ".flip")
	if err := os.Link(cached, real); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(evil, []byte("#!/bin/sh\necho SWAPPED-BINARY-RAN\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(evil, uid, gid); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.Remove(real)
		os.Remove(evil)
		os.Remove(tmp)
	})
	stop := make(chan struct{})
	flipped := make(chan int)
	go func() {
		n := 0
		defer func() { flipped <- n }()
		for {
			for _, from := range []string{evil, real} {
				select {
				case <-stop:
					return
				default:
				}
				// Atomic: the cached name always names a whole file,
				// one or the other.
				os.Remove(tmp)
				if err := os.Link(from, tmp); err == nil && os.Rename(tmp, cached) == nil {
					n++
				}
				// A pause to share the machine's cores with the
				// starts, not to wait for anything.
				time.Sleep(500 * time.Microsecond)
			}
		}
	}()
	const n = 150
	var ran, refused, swapped int
	for range n {
		out, code := start()
		switch {
		case strings.Contains(out, "SWAPPED-BINARY-RAN"):
			swapped++
		case code == 0 && strings.Contains(out, relayd.Greeting):
			ran++
		case code == exitNoBinary:
			refused++
		default:
			t.Errorf("a start exited %d and said %q", code, out)
		}
	}
	close(stop)
	flips := <-flipped
	os.Link(real, tmp)
	os.Rename(tmp, cached)
	t.Logf("%d starts while the cached file flipped %d times: %d ran the relay, %d refused a copy that did not match, %d ran the swapped binary", n, flips, ran, refused, swapped)
	if swapped != 0 {
		t.Errorf("%d of %d starts ran the swapped binary; want 0", swapped, n)
	}
	if refused == 0 || ran == 0 {
		t.Errorf("%d refused, %d ran: the flips never reached a start, or no start got through; the test proves nothing", refused, ran)
	}
	for _, name := range entries() {
		if strings.HasPrefix(name, "run.") {
			t.Errorf("a private directory was left in the cache: %s", name)
		}
	}
}

// TestRelayWarnsOfAnotherPin: with an engine without TLS the relay pins
// its own certificate, so a pin or CA in worker_command is warned about.
func TestRelayWarnsOfAnotherPin(t *testing.T) {
	for _, flag := range []string{"--engine-cert-sha256", "--engine-ca=/etc/ca.pem"} {
		cfg := baseConfig()
		cfg["reach"], cfg["engine_url"] = "relay", "http://engine.invalid"
		cfg["worker_command"] = []string{"/opt/worker", flag, "ab"}
		_, diags := parseConfig("hpc", mustJSON(t, cfg))
		if len(diags) != 1 || diags[0].Severity != shared.SeverityWarning || strings.Join(diags[0].Path, ".") != "worker_command.1" {
			t.Errorf("%s: %v; want one warning at worker_command.1", flag, diags)
		}
		cfg["engine_url"] = "https://engine.invalid"
		if _, diags := parseConfig("hpc", mustJSON(t, cfg)); len(diags) != 0 {
			t.Errorf("%s with an https engine: %v; want none", flag, diags)
		}
	}
}

// TestRelayAdoptionCancelsAnEarlierRelaysJobs: in relay mode with the
// relay's own certificate, the jobs an earlier run left pin that run's
// relay, so Configure cancels them instead of adopting them, saying why.
func TestRelayAdoptionCancelsAnEarlierRelaysJobs(t *testing.T) {
	sandboxtest.RelayCache(t)
	h := newUnconfigured(t, "squeue=rows,scancel=ok")
	h.fake.setRows(t,
		"500|PENDING|Priority|N/A|fluksio:v2:hpc:0:hpc-cpu-0000000a",
		"499|RUNNING|None|2026-12-02T09:00:00|fluksio:v2:hpc:0:hpc-cpu-00000009",
	)
	cfg := baseConfig()
	cfg["reach"], cfg["engine_url"] = "relay", ""
	resp, err := h.p.Configure(context.Background(), &shared.ConfigureRequest{Name: "hpc", Config: mustJSON(t, cfg), Host: h.host, EngineAddress: "tcp:127.0.0.1:1"})
	if err != nil || resp.Diagnostics.HasErrors() {
		t.Fatalf("Configure: %v %v", err, resp.Diagnostics)
	}
	<-h.p.poll.adoptTried
	scancels := h.fake.callsTo("scancel")
	if len(scancels) != 1 || !slices.Equal(slices.Sorted(slices.Values(scancels[0].remote()[1:])), []string{"499", "500"}) {
		t.Fatalf("scancel calls %+v; want one for 499 and 500", scancels)
	}
	for _, ev := range h.host.Events() {
		if ev.Kind != shared.EventWorkerCancelled || !strings.Contains(ev.Detail, "relay of an earlier run") {
			t.Errorf("event %+v; want worker_cancelled, saying why", ev)
		}
	}
	if st := h.status(t); len(st.Outstanding) != 0 {
		t.Errorf("outstanding %v; want nothing adopted", st.Outstanding)
	}
}
