package host

//lint:file-ignore SA1019 Covers is the deprecated call these tests use as one a plugin can hold open

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/internal/testutil"
	"github.com/fluksio/provision/internal/wire"
	"github.com/fluksio/provision/shared"
)

var (
	buildOnce  sync.Once
	pluginPath string
	buildErr   error
)

// testPlugin builds examples/testplugin once per test binary and returns
// its path. The tests launch it as a real subprocess, the way an engine
// would.
func testPlugin(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "testplugin")
		if err != nil {
			buildErr = err
			return
		}
		pluginPath = filepath.Join(dir, "testplugin")
		out, err := exec.Command("go", "build", "-o", pluginPath, "../../examples/testplugin").CombinedOutput()
		if err != nil {
			buildErr = errors.New(string(out))
		}
	})
	if buildErr != nil {
		t.Fatalf("building the test plugin: %v", buildErr)
	}
	return pluginPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if pluginPath != "" {
		os.RemoveAll(filepath.Dir(pluginPath))
	}
	os.Exit(code)
}

// syncBuffer is a buffer goroutines write while the test reads it.
type syncBuffer = testutil.Buffer

type eventLog struct {
	mu     sync.Mutex // guards events
	events []shared.Event
}

func (e *eventLog) add(ev shared.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.events = append(e.events, ev)
}

func (e *eventLog) all() []shared.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]shared.Event(nil), e.events...)
}

func launchTest(t *testing.T, cfg LaunchConfig) *Plugin {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "mem"
	}
	if cfg.Path == "" {
		cfg.Path = testPlugin(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := Launch(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}

func TestLaunchedPluginRoundTrips(t *testing.T) {
	events := &eventLog{}
	logs := &syncBuffer{}
	p := launchTest(t, LaunchConfig{
		Logger: hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Debug}),
		Signer: signerFunc(func(c CredentialClaims, ttl time.Duration) (string, time.Time, error) {
			return "secret-token-for-" + c.Worker, time.Now().Add(ttl), nil
		}),
		OnEvent: events.add,
	})
	prov := p.Provisioner()
	ctx := context.Background()

	info, err := prov.Info(ctx, &shared.InfoRequest{})
	if err != nil || info.Kind != "memory" || info.ContractVersion != shared.ContractVersion {
		t.Fatalf("Info: %+v %v", info, err)
	}
	sr, err := prov.Schema(ctx, &shared.SchemaRequest{})
	if err != nil || len(sr.Schema.Attributes) != 5 || sr.Schema.Attributes[1].Default != false {
		t.Fatalf("Schema: %+v %v", sr, err)
	}
	if _, err := prov.Provision(ctx, &shared.ProvisionRequest{Demand: []shared.Demand{{Need: shared.Need{CPUs: 1}, Count: 1}}}); !errors.Is(err, shared.ErrNotConfigured) {
		t.Fatalf("Provision before Configure: got %v, want ErrNotConfigured", err)
	}
	vr, err := prov.ValidateConfig(ctx, &shared.ValidateConfigRequest{Name: "mem", Config: json.RawMessage(`{"greeting":"boom"}`)})
	if err != nil || len(vr.Diagnostics) != 1 || strings.Join(vr.Diagnostics[0].Path, ".") != "greeting" {
		t.Fatalf("ValidateConfig: %+v %v", vr, err)
	}
	cr, err := prov.Configure(ctx, &shared.ConfigureRequest{Name: "mem", Config: json.RawMessage(`{"greeting":"hi"}`)})
	if err != nil || len(cr.Diagnostics) != 0 {
		t.Fatalf("Configure: %+v %v", cr, err)
	}
	shapes, err := prov.Shapes(ctx, &shared.ShapesRequest{Label: "cuda"})
	if err != nil || len(shapes.Shapes) != 1 || shapes.Shapes[0].Profile != "gpu" {
		t.Fatalf("Shapes: %+v %v", shapes, err)
	}
	cov, err := prov.Covers(ctx, &shared.CoversRequest{Need: shared.Need{CPUs: 2}})
	if err != nil || !cov.Covered || cov.Profile != "gpu" {
		t.Fatalf("Covers: %+v %v", cov, err)
	}

	// One of each, then the same demand again: nothing new is asked for.
	demand := &shared.ProvisionRequest{Demand: []shared.Demand{{Need: shared.Need{CPUs: 1}, Count: 1}, {Need: shared.Need{GPUs: 1}, Count: 1}, {Need: shared.Need{CPUs: 64}, Count: 1}}}
	var outcomes []string
	for range 2 {
		r, err := prov.Provision(ctx, demand)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range r.Outcomes {
			outcomes = append(outcomes, o.Outcome.String())
		}
	}
	if got := strings.Join(outcomes, ","); got != "requested,requested,no_fit,outstanding,outstanding,no_fit" {
		t.Errorf("outcomes %s", got)
	}
	st, err := prov.Status(ctx, &shared.StatusRequest{})
	if err != nil || st.Name != "mem" || len(st.Outstanding) != 2 {
		t.Fatalf("Status: %+v %v", st, err)
	}
	attached := []string{st.Outstanding[0].Worker}
	for range 2 {
		rr, err := prov.Reconcile(ctx, &shared.ReconcileRequest{Attached: attached})
		if err != nil {
			t.Fatal(err)
		}
		_ = rr
	}
	st, _ = prov.Status(ctx, &shared.StatusRequest{})
	if len(st.Outstanding) != 1 {
		t.Fatalf("after Reconcile: %+v", st.Outstanding)
	}

	sd, err := p.Stop(ctx)
	if err != nil || len(sd.Cancelled) != 1 {
		t.Fatalf("Stop: %+v %v", sd, err)
	}
	select {
	case <-p.Exited():
	case <-time.After(5 * time.Second):
		t.Fatal("the plugin did not exit after Stop")
	}

	got := events.all()
	var kinds []string
	for i, ev := range got {
		if ev.Seq != uint64(i+1) || ev.Provisioner != "mem" {
			t.Errorf("event %d: %+v", i, ev)
		}
		kinds = append(kinds, string(ev.Kind))
	}
	if want := "worker_provisioned,worker_provisioned,worker_cancelled"; strings.Join(kinds, ",") != want {
		t.Errorf("events %v, want %s", kinds, want)
	}
	if strings.Contains(logs.String(), "secret-token-for") {
		t.Error("a credential reached the host's log")
	}
}

func TestForeignMintRefused(t *testing.T) {
	events := &eventLog{}
	p := launchTest(t, LaunchConfig{
		Signer:  signerFunc(func(CredentialClaims, time.Duration) (string, time.Time, error) { return "t", time.Now(), nil }),
		OnEvent: events.add,
	})
	ctx := context.Background()
	prov := p.Provisioner()
	if _, err := prov.Configure(ctx, &shared.ConfigureRequest{Name: "mem", Config: json.RawMessage(`{"greeting":"hi","foreign_worker":true}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := prov.Provision(ctx, &shared.ProvisionRequest{Demand: []shared.Demand{{Need: shared.Need{CPUs: 1}, Count: 1}}}); err != nil {
		t.Fatal(err)
	}
	got := events.all()
	if len(got) != 1 || got[0].Kind != shared.EventWorkerProvisionFailed || !strings.Contains(got[0].Detail, "permission denied") {
		t.Fatalf("events %+v, want one worker_provision_failed saying permission denied", got)
	}
}

func TestKilledPluginFailsCallsPromptly(t *testing.T) {
	p := launchTest(t, LaunchConfig{})
	prov := p.Provisioner()
	ctx := context.Background()
	if _, err := prov.Configure(ctx, &shared.ConfigureRequest{Name: "mem", Config: json.RawMessage(`{"greeting":"hi","block_covers":true}`)}); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := prov.Covers(ctx, &shared.CoversRequest{Need: shared.Need{CPUs: 1}})
		errc <- err
	}()
	// Wait until the call is in flight in the plugin: Status answers only
	// once the plugin is serving, and the Covers above has been sent first
	// or concurrently; either way the kill lands on a call in progress or
	// one about to be, and both must fail the same way.
	if _, err := prov.Status(ctx, &shared.StatusRequest{}); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if err := syscall.Kill(p.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, shared.ErrPluginGone) {
			t.Fatalf("got %v, want ErrPluginGone", err)
		}
		took := time.Since(killed)
		if took > time.Second {
			t.Errorf("the call returned %s after the kill, want under 1s", took)
		}
		t.Logf("the call in flight returned ErrPluginGone %s after SIGKILL", took)
	case <-time.After(5 * time.Second):
		t.Fatal("the call hung after the plugin was killed")
	}
	<-p.Exited()
	if st := p.ExitStatus(); st == nil || st.Signal != "killed" {
		t.Fatalf("exit status %v, want killed by a signal", st)
	}
	if _, err := prov.Info(ctx, &shared.InfoRequest{}); !errors.Is(err, shared.ErrPluginGone) {
		t.Fatalf("a call after the exit: got %v", err)
	}
}

func TestSHA256Pin(t *testing.T) {
	path := testPlugin(t)
	sum, err := FileSHA256(path)
	if err != nil {
		t.Fatal(err)
	}
	launchTest(t, LaunchConfig{SHA256: strings.ToUpper(sum)})

	// A wrong pin must refuse the launch before anything runs: point it at
	// a script that would leave a mark if it were executed.
	dir := t.TempDir()
	mark := filepath.Join(dir, "ran")
	script := filepath.Join(dir, "plugin.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\ntouch "+mark+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err = Launch(context.Background(), LaunchConfig{Name: "pinned", Path: script, SHA256: sum})
	if !errors.Is(err, shared.ErrChecksumMismatch) {
		t.Fatalf("got %v, want ErrChecksumMismatch", err)
	}
	for _, want := range []string{"pinned", script, sum, "update the pin"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if _, err := os.Stat(mark); err == nil {
		t.Error("the mismatched binary was executed")
	}
	if _, err := Launch(context.Background(), LaunchConfig{Name: "pinned", Path: script, SHA256: "abc"}); !errors.Is(err, shared.ErrChecksumMismatch) {
		t.Errorf("a malformed pin: got %v", err)
	}
}

func TestStdoutBeforeHandshake(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := Launch(ctx, LaunchConfig{Name: "noisy", Path: testPlugin(t), Env: []string{"TESTPLUGIN_STDOUT=1"}})
	if err == nil {
		t.Fatal("a plugin that wrote to stdout before the handshake was accepted")
	}
	for _, want := range []string{"noisy", "wrote to stdout before the plugin handshake", "hello from a plugin", "log to stderr"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// A line on stdout after the handshake, which go-plugin alone would drop,
// reaches the operator as a warning naming the plugin and the line.
func TestStdoutAfterHandshakeIsReported(t *testing.T) {
	logs := &syncBuffer{}
	p := launchTest(t, LaunchConfig{
		Name:   "chatty",
		Env:    []string{"TESTPLUGIN_BREAK=stdout"},
		Logger: hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Info}),
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := p.Provisioner().Configure(ctx, &shared.ConfigureRequest{Name: "chatty", Config: json.RawMessage(`{"greeting":"hi"}`)}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "wrote to stdout after the handshake") {
		if time.Now().After(deadline) {
			t.Fatalf("no warning about the line on stdout; the log:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if out := logs.String(); !strings.Contains(out, "chatty") || !strings.Contains(out, "configured!") {
		t.Errorf("the warning does not name the plugin and the line:\n%s", out)
	}
}

func TestLaunchMissingOrNotAPlugin(t *testing.T) {
	_, err := Launch(context.Background(), LaunchConfig{Name: "x", Path: "/nonexistent/provisioner-x"})
	if err == nil || !strings.Contains(err.Error(), "no plugin at /nonexistent/provisioner-x") {
		t.Errorf("missing: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = Launch(ctx, LaunchConfig{Name: "x", Path: "/bin/false"})
	if err == nil || !strings.Contains(err.Error(), "exited with status 1 before the plugin handshake") {
		t.Errorf("not a plugin: %v", err)
	}
}

func TestPluginExitsWhenHostDies(t *testing.T) {
	if os.Getenv("SHARED_TEST_ORPHAN_HOST") == "1" {
		// The stand-in host: launch, print the plugin's pid, and wait to be
		// killed without cleaning up.
		p, err := Launch(context.Background(), LaunchConfig{Name: "mem", Path: os.Getenv("SHARED_TEST_PLUGIN")})
		if err != nil {
			os.Stdout.WriteString("error " + err.Error() + "\n")
			os.Exit(1)
		}
		fmt.Printf("pid %d\n", p.Pid())
		select {}
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPluginExitsWhenHostDies$")
	cmd.Env = append(os.Environ(), "SHARED_TEST_ORPHAN_HOST=1", "SHARED_TEST_PLUGIN="+testPlugin(t))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := readPid(t, out)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("plugin %d outlived its SIGKILLed host by 5s", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// readPid reads the stand-in host's "pid N" line.
func readPid(t *testing.T, r io.Reader) int {
	t.Helper()
	var pid int
	if _, err := fmt.Fscanf(r, "pid %d\n", &pid); err != nil {
		t.Fatalf("the stand-in host did not report a plugin pid: %v", err)
	}
	return pid
}

// alive reports whether a process exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || (s[i+2] != 'Z' && s[i+2] != 'X')
}

func TestProtocolMismatchSaysWhichSideToUpgrade(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		version int
		advice  string
	}{
		{wire.ProtocolVersion + 1, "upgrade the host"},
		{wire.ProtocolVersion + 7, "upgrade the host"},
		{wire.ProtocolVersion - 1, "upgrade the plugin"},
	} {
		// A stand-in plugin that answers the handshake with a protocol this
		// host does not speak; go-plugin cannot be made to do that.
		script := filepath.Join(dir, fmt.Sprintf("speaks-%d", tc.version))
		body := fmt.Sprintf("#!/bin/sh\necho '1|%d|unix|%s/none.sock|grpc|'\nexec sleep 5\n", tc.version, dir)
		if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, err := Launch(ctx, LaunchConfig{Name: "newer", Path: script})
		cancel()
		if !errors.Is(err, shared.ErrIncompatible) || !strings.Contains(err.Error(), tc.advice) {
			t.Errorf("protocol %d: got %v, want ErrIncompatible saying %q", tc.version, err, tc.advice)
		}
	}
}

// TestLaunchSaysWhatThePluginDid: a plugin that gives up at start is
// reported with its exit status and its last stderr lines, not as a
// fault of the SDK: the exit code is in the error, not only in the log.
func TestLaunchSaysWhatThePluginDid(t *testing.T) {
	dir := t.TempDir()
	plugin := filepath.Join(dir, "provisioner-broken")
	script := "#!/bin/sh\necho 'reading /etc/broken.conf: no such file' >&2\necho 'giving up' >&2\nexit 3\n"
	if err := os.WriteFile(plugin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := Launch(ctx, LaunchConfig{Name: "broken", Path: plugin})
	if err == nil {
		t.Fatal("a plugin that exits at start was launched")
	}
	for _, want := range []string{"exited with status 3", "reading /etc/broken.conf: no such file", "giving up"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "built with this SDK") {
		t.Errorf("error %q blames the SDK", err)
	}
}

// TestSHA256PinCannotBeRaced: the pinned path is a symlink that another
// process flips, as fast as it can, between the pinned plugin and a
// program that leaves a mark when it runs. Over 40 launches every one
// either runs the pinned plugin or is refused as a mismatch; the other
// program never runs: the file is hashed through the descriptor that is
// executed, so no flip between hashing and running can slip code past.
func TestSHA256PinCannotBeRaced(t *testing.T) {
	good := testPlugin(t)
	sum, err := FileSHA256(good)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	mark := filepath.Join(dir, "evil-ran")
	evil := filepath.Join(dir, "evil")
	if err := os.WriteFile(evil, []byte("#!/bin/sh\ntouch "+mark+"\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "provisioner-pinned")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	flipped := make(chan int)
	go func() {
		n := 0
		defer func() { flipped <- n }()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			target := good
			if i%2 == 1 {
				target = evil
			}
			tmp := link + ".tmp"
			os.Remove(tmp)
			if os.Symlink(target, tmp) == nil && os.Rename(tmp, link) == nil {
				n++
			}
		}
	}()
	ran, refused := 0, 0
	for range 40 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		p, err := Launch(ctx, LaunchConfig{Name: "pinned", Path: link, SHA256: sum})
		cancel()
		switch {
		case err == nil:
			ran++
			p.Kill()
		case errors.Is(err, shared.ErrChecksumMismatch):
			refused++
		default:
			// The flip can also make the path vanish for a moment.
			if !strings.Contains(err.Error(), "no such file") && !strings.Contains(err.Error(), "not an executable") {
				t.Errorf("launch: %v", err)
			}
		}
	}
	close(stop)
	flips := <-flipped
	if _, err := os.Stat(mark); err == nil {
		t.Fatalf("unpinned code ran (pinned plugin ran %d times, refused %d, %d flips)", ran, refused, flips)
	}
	if ran == 0 || refused == 0 {
		t.Logf("the race was not exercised both ways: %d ran, %d refused", ran, refused)
	}
	t.Logf("40 launches during %d flips: %d ran the pinned plugin, %d refused, 0 ran anything else", flips, ran, refused)
}

// TestPinnedPluginWritableByOthersWarns: a pinned plugin that others can
// write is run (the pin still holds at each launch) with a warning.
func TestPinnedPluginWritableByOthersWarns(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "provisioner-open")
	data, err := os.ReadFile(testPlugin(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(path, 0o777)
	sum, _ := FileSHA256(path)
	logs := &syncBuffer{}
	launchTest(t, LaunchConfig{Name: "open", Path: path, SHA256: sum, Logger: hclog.New(&hclog.LoggerOptions{Output: logs})})
	if !strings.Contains(logs.String(), "can be replaced by other users") {
		t.Errorf("no warning:\n%s", logs)
	}
}

// countingWriter counts what is written to it.
type countingWriter struct {
	mu    sync.Mutex // guards n and lines
	n     int
	lines int
}

func (w *countingWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n += len(b)
	w.lines += strings.Count(string(b), "\n")
	return len(b), nil
}

func (w *countingWriter) counts() (int, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n, w.lines
}

// heapInUse is the Go heap in use after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// TestHostHoldsAnAbusivePlugin launches the test plugin told to send too
// much: 100 MB on stderr as it starts, a 100 MB event, and a Status of
// 200,000 outstanding machines, fetched 16 times at once. The host's log
// stays small, the event arrives cut (or not at all), Status fails or is
// cut, and the host's heap stays within 64 MB of where it started.
func TestHostHoldsAnAbusivePlugin(t *testing.T) {
	before := heapInUse()
	logs := &countingWriter{}
	events := &eventLog{}
	p := launchTest(t, LaunchConfig{
		Name:    "abuse",
		Logger:  hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Trace}),
		Env:     []string{"TESTPLUGIN_ABUSE=stderr,event,status"},
		OnEvent: events.add,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	prov := p.Provisioner()
	if _, err := prov.Configure(ctx, &shared.ConfigureRequest{Name: "abuse", Config: json.RawMessage(`{"greeting":"hi"}`)}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var listed []int
	var failed []error
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := prov.Status(ctx, &shared.StatusRequest{})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed = append(failed, err)
				return
			}
			listed = append(listed, len(st.Outstanding))
		}()
	}
	wg.Wait()
	for _, n := range listed {
		if n > wire.MaxStatusEntries {
			t.Errorf("Status listed %d outstanding; at most %d", n, wire.MaxStatusEntries)
		}
	}
	// The event may never arrive: an oversized message closes the host
	// channel. If it does, it is cut.
	for _, ev := range events.all() {
		if len(ev.Detail) > wire.MaxEventDetail+64 {
			t.Errorf("an event of %d bytes of detail reached the engine", len(ev.Detail))
		}
	}
	grown := int64(heapInUse()) - int64(before)
	n, lines := logs.counts()
	t.Logf("Status: %d answers (listing %v), %d failed (%v); events: %d; log: %d bytes in %d lines; heap grew %d MB",
		len(listed), uniq(listed), len(failed), firstErr(failed), len(events.all()), n, lines, grown>>20)
	if n > 8<<20 {
		t.Errorf("100 MB of plugin stderr put %d bytes in the host's log", n)
	}
	if grown > 64<<20 {
		t.Errorf("the host's heap grew by %d MB", grown>>20)
	}
}

func uniq(ns []int) []int {
	var out []int
	for _, n := range ns {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

func firstErr(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return errs[0]
}

// TestDropEnvKeepsVariablesFromThePlugin: a variable named in DropEnv is
// in this process's environment but not in the plugin's, as the kernel
// has it (/proc/PID/environ); other variables still are. host-example
// also unsets its secret once read; this guards the library's own promise
// to an engine that does not.
func TestDropEnvKeepsVariablesFromThePlugin(t *testing.T) {
	t.Setenv("FLUKSIO_TEST_SECRET", "s3cr3t-value")
	t.Setenv("FLUKSIO_TEST_KEPT", "kept-value")
	p := launchTest(t, LaunchConfig{Name: "dropenv", DropEnv: []string{"FLUKSIO_TEST_SECRET"}})
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(environ), "s3cr3t-value") {
		t.Error("the plugin's environment has the dropped variable")
	}
	if !strings.Contains(string(environ), "FLUKSIO_TEST_KEPT=kept-value") {
		t.Error("the plugin's environment lacks a variable that was not dropped; the check proves nothing")
	}
}

// TestHostileLogLineIsLogged: a plugin's JSON log line whose @message,
// @level and @timestamp are not strings, which go-plugin's stderr reader
// does not expect. The host stays up, the plugin keeps serving, and the
// line is logged.
func TestHostileLogLineIsLogged(t *testing.T) {
	logs := &syncBuffer{}
	p := launchTest(t, LaunchConfig{
		Name:   "hostile",
		Env:    []string{"TESTPLUGIN_BREAK=badlog"},
		Logger: hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Trace}),
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := p.Provisioner().Configure(ctx, &shared.ConfigureRequest{Name: "hostile", Config: json.RawMessage(`{"greeting":"hi"}`)}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), `"note":"hostile"`) && !strings.Contains(logs.String(), `note=hostile`) {
		if time.Now().After(deadline) {
			t.Fatalf("the hostile line was not logged; the log:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := p.Provisioner().Status(ctx, &shared.StatusRequest{}); err != nil {
		t.Errorf("the plugin stopped serving after the line: %v", err)
	}
}

func TestSafeLogLine(t *testing.T) {
	for in, want := range map[string]string{
		`{"@message":"ok","@level":"info"}`: `{"@message":"ok","@level":"info"}`,
		`{"@message":5}`:                    `{"@message":"5"}`,
		`{"@level":{"a":1},"x":true}`:       `{"@level":"{\"a\":1}","x":true}`,
		`{"@timestamp":7}`:                  `{"@timestamp":"7"}`,
		`not json {"@message":5}`:           `not json {"@message":5}`,
		`{"@message":null}`:                 `{"@message":"null"}`,
	} {
		if got := string(safeLogLine([]byte(in))); got != want {
			t.Errorf("safeLogLine(%s) = %s, want %s", in, got, want)
		}
	}
}
