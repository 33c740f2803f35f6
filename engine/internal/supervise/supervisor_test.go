package supervise

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/testutil"
	"github.com/fluksio/provision/internal/wire"
	"github.com/fluksio/provision/shared"
)

// parseBlock parses src, a file with one provisioner block, the way an
// engine reads its own file, and decodes the block.
func parseBlock(t *testing.T, src string) (*host.Block, hcl.Diagnostics) {
	t.Helper()
	file, diags := hclparse.NewParser().ParseHCL([]byte(src), "engine.hcl")
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	content, diags := file.Body.Content(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{
		{Type: "provisioner", LabelNames: []string{"kind", "name"}},
	}})
	if diags.HasErrors() || len(content.Blocks) != 1 {
		t.Fatalf("%d blocks: %v", len(content.Blocks), diags)
	}
	return host.DecodeBlock(content.Blocks[0], t.TempDir())
}

// upDown records what a Supervisor told its engine.
type upDown struct {
	mu    sync.Mutex // guards ups, downs
	ups   []Configured
	downs int
	// changed gets a value after each call, for waiting without sleeps.
	changed chan struct{}
}

func newUpDown(s *Supervisor) *upDown {
	u := &upDown{changed: make(chan struct{}, 16)}
	s.OnUp = func(c Configured) {
		u.mu.Lock()
		u.ups = append(u.ups, c)
		u.mu.Unlock()
		u.changed <- struct{}{}
	}
	s.OnDown = func(string) {
		u.mu.Lock()
		u.downs++
		u.mu.Unlock()
		u.changed <- struct{}{}
	}
	return u
}

// waitFor polls cond after each OnUp or OnDown, for at most d.
func (u *upDown) waitFor(t *testing.T, d time.Duration, what string, cond func(ups, downs int) bool) {
	t.Helper()
	deadline := time.After(d)
	for {
		u.mu.Lock()
		ok := cond(len(u.ups), u.downs)
		u.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-u.changed:
		case <-deadline:
			t.Fatalf("%s: not within %s", what, d)
		}
	}
}

// TestSupervisorRestartsAndShutsDown takes a provisioner block to a
// configured plugin with its shapes, kills the plugin's process from
// outside (as the OOM killer would), and expects the Supervisor to say it
// is down, start a new process and publish it again; Shutdown then stops
// the plugin for good.
func TestSupervisorRestartsAndShutsDown(t *testing.T) {
	t.Parallel()
	b, diags := parseBlock(t, fmt.Sprintf("provisioner \"memory\" \"mem\" {\n  plugin = %q\n  greeting = \"hi\"\n}\n", testPlugin(t)))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	s := New(b, nullLogger(), Options{Signer: signerFunc(nil)})
	u := newUpDown(s)
	if diags := s.Start(context.Background()); diags.HasErrors() {
		t.Fatal(diags)
	}
	u.waitFor(t, 10*time.Second, "first start published", func(ups, _ int) bool { return ups == 1 })
	if c := u.ups[0]; c.Name != "mem" || len(c.Shapes) == 0 || c.Provisioner == nil {
		t.Fatalf("published %+v; want mem with its shapes", c)
	}
	if st := s.Status(context.Background()); st.Process != "running" || st.Status == nil || st.Status.Kind != "memory" {
		t.Fatalf("status %+v", st)
	}
	// The plugin's Info lists reconcile_delta: its Reconciles carry changes.
	s.mu.Lock()
	delta := sendsChanges(s.tracker)
	s.mu.Unlock()
	if !delta {
		t.Error("the test plugin offers reconcile_delta, and its tracker sends whole lists")
	}
	first := s.current.Pid()
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	u.waitFor(t, 20*time.Second, "restarted after SIGKILL", func(ups, downs int) bool { return downs == 1 && ups == 2 })
	st := s.Status(context.Background())
	if !strings.HasPrefix(st.Process, "running (restarts: 1, last exit: ") || !strings.Contains(st.Process, "killed") {
		t.Errorf("status after the restart: %q", st.Process)
	}
	second := s.current.Pid()
	if second == first || !alive(second) {
		t.Errorf("pid %d before, %d after; want a new live process", first, second)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if alive(second) {
		t.Errorf("plugin %d still runs after Shutdown", second)
	}
	if st := s.Status(context.Background()); !strings.HasPrefix(st.Process, "stopped") || st.Error == "" {
		t.Errorf("status after Shutdown: %+v", st)
	}
	if s.Provisioner() != nil {
		t.Error("Provisioner is not nil after Shutdown")
	}
	// A second Shutdown gets the first one's outcome.
	if _, err := s.Shutdown(ctx); err != nil {
		t.Errorf("second Shutdown: %v", err)
	}
}

// TestSupervisorDoesNotRestartAWrongPin: a pinned plugin whose binary is
// replaced while it runs, then killed, is launched once more, refused by
// its pin, and left failed with one error that says so and what to do:
// not restarted every two minutes for ever. Counted in launches.
func TestSupervisorDoesNotRestartAWrongPin(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "provisioner-memory")
	orig, err := os.ReadFile(testPlugin(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, orig, 0o755); err != nil {
		t.Fatal(err)
	}
	sum, err := host.FileSHA256(bin)
	if err != nil {
		t.Fatal(err)
	}
	b, diags := parseBlock(t, fmt.Sprintf("provisioner \"memory\" \"mem\" {\n  plugin = %q\n  sha256 = %q\n  greeting = \"hi\"\n}\n", bin, sum))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	logs := &syncBuffer{}
	s := New(b, hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info}), Options{Signer: signerFunc(nil)})
	failed := make(chan error, 4)
	s.OnFailed = func(_ string, err error) { failed <- err }
	if diags := s.Start(context.Background()); diags.HasErrors() {
		t.Fatal(diags)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, _ = s.Shutdown(ctx) // cannot relaunch it to cancel: expected
	})
	if p := s.Phase(); p != host.PhaseRunning {
		t.Fatalf("phase %v after Start; want running", p)
	}

	// A rebuild lands beside it (renamed over, as an install does: the
	// running file cannot be written), then the process dies.
	next := bin + ".new"
	if err := os.WriteFile(next, append(orig, "rebuilt"...), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(next, bin); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	pid := s.current.Pid()
	s.mu.Unlock()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}

	var got error
	select {
	case got = <-failed:
	case <-time.After(30 * time.Second):
		t.Fatalf("no failure within 30s; phase %v, %d launches\n%s", s.Phase(), s.launchCount(), logs)
	}
	// The watch goroutine has nothing left to do: it must end, where a
	// loop would wait out its backoff and launch again.
	watched := make(chan struct{})
	go func() { s.wg.Wait(); close(watched) }()
	select {
	case <-watched:
	case <-time.After(10 * time.Second):
		t.Fatalf("the supervisor is still restarting after the failure: %d launches\n%s", s.launchCount(), logs)
	}
	if n := s.launchCount(); n != 2 {
		t.Errorf("%d launches; want 2 (the start and the one restart the pin refused)", n)
	}
	var u *UnfixableError
	if !errors.As(got, &u) || !errors.Is(got, shared.ErrChecksumMismatch) || !errors.Is(s.Err(), shared.ErrChecksumMismatch) {
		t.Fatalf("failure %v (Err %v); want an UnfixableError for the pin", got, s.Err())
	}
	for _, want := range []string{`"mem"`, "will not be restarted", "sha256", "does not match its sha256 pin", "update the pin", "Restart the engine"} {
		if !strings.Contains(got.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, got)
		}
	}
	st := s.Status(context.Background())
	if st.Phase != host.PhaseFailed || !strings.HasPrefix(st.Process, "failed: ") || st.Error != got.Error() {
		t.Errorf("status: phase %v, process %q, error %q", st.Phase, st.Process, st.Error)
	}
	if n := strings.Count(logs.String(), "plugin failed for good"); n != 1 {
		t.Errorf("%d 'failed for good' lines; want 1\n%s", n, logs)
	}
	js, err := st.MarshalJSON()
	if err != nil || !strings.Contains(string(js), `"phase":"failed"`) {
		t.Errorf("status JSON %s %v; want phase failed", js, err)
	}
}

// TestUnfixableLaunches: a plugin of another kind or another protocol is
// marked as a failure a restart cannot fix; a missing binary (which a
// deploy may put back) is not.
func TestUnfixableLaunches(t *testing.T) {
	t.Parallel()
	b, diags := parseBlock(t, fmt.Sprintf("provisioner \"slurm\" \"m\" {\n  plugin = %q\n  greeting = \"hi\"\n}\n", testPlugin(t)))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	if u := unfixable("m", host.Validate(context.Background(), b)); u == nil || !errors.Is(u, host.ErrKindMismatch) {
		t.Errorf("another kind: %v; want ErrKindMismatch", u)
	}
	// A stand-in that answers the handshake with a protocol this host
	// does not speak, as in engine/host's
	// TestProtocolMismatchSaysWhichSideToUpgrade.
	dir := t.TempDir()
	newer := filepath.Join(dir, "newer")
	body := fmt.Sprintf("#!/bin/sh\necho '1|%d|unix|%s/none.sock|grpc|'\nexec sleep 5\n", wire.ProtocolVersion+1, dir)
	if err := os.WriteFile(newer, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	b.Path, b.Kind = newer, "memory"
	if u := unfixable("m", host.Validate(context.Background(), b)); u == nil || !errors.Is(u, shared.ErrIncompatible) || !strings.Contains(u.Error(), "upgrade the host") {
		t.Errorf("another protocol: %v; want ErrIncompatible saying which side to upgrade", u)
	}
	b.Path = filepath.Join(dir, "gone")
	if u := unfixable("m", host.Validate(context.Background(), b)); u != nil {
		t.Errorf("a missing binary: %v; want a failure worth retrying", u)
	}
}

// TestOptionsCoverLaunchConfig: every host.LaunchConfig field a block
// does not give has its Options field, of the same type, so that the
// engine can set what one using host.Launch can.
func TestOptionsCoverLaunchConfig(t *testing.T) {
	t.Parallel()
	opts := reflect.TypeOf(Options{})
	lc := reflect.TypeOf(host.LaunchConfig{})
	for i := range lc.NumField() {
		f := lc.Field(i)
		if f.Name == "Name" || f.Name == "Path" || f.Name == "SHA256" {
			continue
		}
		o, ok := opts.FieldByName(f.Name)
		if !ok || o.Type != f.Type {
			t.Errorf("Options has no %s %v (LaunchConfig does)", f.Name, f.Type)
		}
	}
}

// launchCount is how many launches were tried.
func (s *Supervisor) launchCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.launches
}

// TestReconcileCutByItsCallerIsQuiet: a Reconcile that the caller's
// context ends (a run's -timeout, as the engine's loop passes it) failed
// nothing, and is neither logged as a failure nor counted as a missed
// deadline; one whose own ReconcileTimeout passes while the caller's
// context lives is both.
func TestReconcileCutByItsCallerIsQuiet(t *testing.T) {
	t.Setenv("TESTPLUGIN_HANG", "mem")
	b, diags := parseBlock(t, fmt.Sprintf("provisioner \"memory\" \"mem\" {\n  plugin = %q\n  greeting = \"hi\"\n}\n", testPlugin(t)))
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	logger, logs := testutil.Logger(t)
	s := New(b, logger, Options{Signer: signerFunc(nil)})
	s.WedgeAfter = 1
	u := newUpDown(s)
	if diags := s.Start(context.Background()); diags.HasErrors() {
		t.Fatal(diags)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, _ = s.Shutdown(ctx)
	})
	u.waitFor(t, 10*time.Second, "started", func(ups, _ int) bool { return ups == 1 })
	// reconciled makes one Reconcile and waits for it to end.
	reconciled := func(ctx context.Context) {
		t.Helper()
		if !s.Reconcile(ctx, nil) {
			t.Fatal("Reconcile was not made")
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			s.mu.Lock()
			busy := s.reconciling
			s.mu.Unlock()
			if !busy {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the Reconcile did not end")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	s.ReconcileTimeout = 200 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	reconciled(ctx)
	if strings.Contains(logs.String(), "reconcile failed") || s.Phase() != host.PhaseRunning {
		t.Errorf("a Reconcile cut by its caller's deadline was taken for a failure (phase %s):\n%s", s.Phase(), logs)
	}
	// The control: the plugin misses its own deadline.
	reconciled(context.Background())
	if !strings.Contains(logs.String(), "reconcile failed") {
		t.Errorf("a Reconcile that missed ReconcileTimeout was not logged as failed:\n%s", logs)
	}
	u.waitFor(t, 10*time.Second, "restarted as wedged", func(_, downs int) bool { return downs == 1 })
}
