package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/engine/host"
	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/shared"
)

// reloadSchema is a plugin's schema as the Slurm plugin's is made: caps
// on the provisioner and on each labelled profile, a sensitive token.
var reloadSchema = &shared.Schema{
	Attributes: []shared.Attribute{{Name: "login", Type: shared.TypeString}, {Name: "max_workers", Type: shared.TypeInt},
		{Name: "token", Type: shared.TypeString, Sensitive: true}},
	Blocks: []shared.BlockType{{Name: "profile", Labels: []string{"name"}, Body: &shared.Schema{Attributes: []shared.Attribute{
		{Name: "cpus", Type: shared.TypeInt}, {Name: "max_workers", Type: shared.TypeInt}, {Name: "sbatch", Type: shared.TypeListString}}}}},
}

func reloadJSON(t *testing.T, v map[string]any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDiffBody: a change of the caps, a profile added and one removed,
// a profile's attribute and a sensitive value are each one typed change,
// in file order, told in one line; the same block twice is no change.
func TestDiffBody(t *testing.T) {
	from := reloadJSON(t, map[string]any{"login": "a@b", "max_workers": 8, "token": "s3cret", "profile": []any{
		map[string]any{"name": "cpu", "cpus": 1, "max_workers": 2, "sbatch": []string{"--partition=debug"}},
		map[string]any{"name": "old", "cpus": 4, "max_workers": 0, "sbatch": nil},
	}})
	to := reloadJSON(t, map[string]any{"login": "a@b", "max_workers": 8, "token": "0ther", "profile": []any{
		map[string]any{"name": "cpu", "cpus": 1, "max_workers": 4, "sbatch": []string{"--partition=debug"}},
		map[string]any{"name": "gpu", "cpus": 2, "max_workers": 0, "sbatch": nil},
	}})
	got := diffBody("sandbox", reloadSchema, from, to)
	want := []Change{
		{Kind: ChangeSetting, Provisioner: "sandbox", Attribute: "token", Old: "(sensitive)", New: "(sensitive)"},
		{Kind: ChangeSetting, Provisioner: "sandbox", BlockType: "profile", Block: "cpu", Attribute: "max_workers", Old: "2", New: "4"},
		{Kind: ChangeBlockAdded, Provisioner: "sandbox", BlockType: "profile", Block: "gpu"},
		{Kind: ChangeBlockRemoved, Provisioner: "sandbox", BlockType: "profile", Block: "old"},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("diffBody:\n got %+v\nwant %+v", got, want)
	}
	lines := []string{"token of sandbox (sensitive) → (sensitive)", "max_workers of sandbox/cpu 2 → 4", "profile gpu added to sandbox", "profile old removed from sandbox"}
	for i, c := range got {
		if c.String() != lines[i] {
			t.Errorf("change %d says %q; want %q", i, c, lines[i])
		}
		if strings.Contains(c.String(), "s3cret") || strings.Contains(c.String(), "0ther") {
			t.Errorf("change %d shows a sensitive value: %q", i, c)
		}
	}
	if cs := diffBody("sandbox", reloadSchema, from, from); len(cs) != 0 {
		t.Errorf("the same block twice: %v", cs)
	}
}

// TestDiffEngine: every attribute of the engine block is compared, and
// a change of one is a change of its own.
func TestDiffEngine(t *testing.T) {
	a := EngineBlock{Listen: "127.0.0.1:8470", PluginDir: "bin", ParkPolls: true}
	b := a
	b.Listen, b.OpenMetrics = "127.0.0.1:9000", true
	got := diffEngine(a, b)
	want := []Change{
		{Kind: ChangeEngine, Attribute: "listen", Old: `"127.0.0.1:8470"`, New: `"127.0.0.1:9000"`},
		{Kind: ChangeEngine, Attribute: "open_metrics", Old: "false", New: "true"},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("diffEngine:\n got %+v\nwant %+v", got, want)
	}
	if !got[0].refused() {
		t.Error("a change of the engine block is not refused")
	}
	if cs := diffEngine(a, a); len(cs) != 0 {
		t.Errorf("the same engine block twice: %v", cs)
	}
}

// TestReloadRefusesEngineBlock: a reload that changes engine.listen is
// refused with a diagnostic at the attribute (file:line:col), and the
// engine's generation and digest stay.
func TestReloadRefusesEngineBlock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.hcl")
	write := func(body string) *File { return writeLoaded(t, path, body) }
	from := write("engine {\n  listen = \"127.0.0.1:0\"\n}\n")
	e, err := New(Config{Secret: testSecret, ID: "test", Listen: from.Engine.Listen, Digest: from.Digest})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop(context.Background())
	if diags := e.Start(context.Background()); diags.HasErrors() {
		t.Fatal(diags)
	}
	to := write("engine {\n  listen = \"127.0.0.1:1\"\n}\n")
	if from.Digest == to.Digest || len(from.Digest) != 12 {
		t.Fatalf("digests %q and %q of two files", from.Digest, to.Digest)
	}
	_, diags := e.Reload(context.Background(), from, to)
	if !diags.HasErrors() {
		t.Fatal("a reload changing engine.listen was applied")
	}
	d := diags[0]
	if d.Subject == nil || d.Subject.Filename != path || d.Subject.Start.Line != 2 || d.Subject.Start.Column != 12 {
		t.Errorf("the diagnostic points at %v; want %s:2:12", d.Subject, path)
	}
	if !strings.Contains(d.Detail, "listen of the engine") || !strings.Contains(d.Detail, "restart the engine") {
		t.Errorf("the diagnostic says %q", d.Detail)
	}
	if v := e.Config(); v.Generation != 1 || v.Digest != from.Digest {
		t.Errorf("after a refused reload the engine runs %+v; want generation 1, digest %s", v, from.Digest)
	}
	// The same file again applies, with nothing to change.
	r, diags := e.Reload(context.Background(), from, from)
	if diags.HasErrors() || r.Generation != 2 || len(r.Changes) != 0 {
		t.Errorf("reloading the same file: %+v %v", r, diags)
	}
	e.Stop(context.Background())
	if _, diags := e.Reload(context.Background(), from, from); !diags.HasErrors() || !strings.Contains(diags.Error(), "stopping") {
		t.Errorf("a reload after Stop: %v; want it refused, the engine stopping", diags)
	}
}

// TestLetGoFinishesTheTask: a real worker of a provisioner a reload
// removed, busy with a task, is given no other: it finishes the task
// (its result is taken), then hears it may leave at its next poll,
// detaches and exits 0.
func TestLetGoFinishesTheTask(t *testing.T) {
	t.Parallel()
	e, stderr, exited := busyWorker(t, 1)
	if n := e.letGo([]ownedProfile{{testProvisioner, ""}}); n != 1 {
		t.Fatalf("letGo let %d worker(s) go; want 1", n)
	}
	if idle := e.IdleWorkers(); len(idle) != 0 {
		t.Errorf("a worker let go is idle for the router: %v", idle)
	}
	select {
	case code := <-exited:
		if code != 0 {
			t.Errorf("exit %d; want 0 (the engine let it go):\n%s", code, stderr)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the worker let go is still running 20 s later:\n%s", stderr)
	}
	if res, _ := e.TaskOutcome("w", "task-1"); res.TaskID != "task-1" {
		t.Errorf("the task of the worker let go has no result (%+v):\n%s", res, stderr)
	}
	if strings.Contains(stderr.String(), "dropping task-1") {
		t.Errorf("the worker let go dropped its task:\n%s", stderr)
	}
}

// TestReloadProvisioners runs real plugin processes (examples/testplugin,
// which does not take a second Configure): a reload that adds one
// provisioner and removes another launches the one and shuts the other's
// plugin down; one that changes a block of a plugin that cannot be
// configured again is refused at the block, and a provisioner it would
// have added is shut down again: the fleet and the generation are as
// they were.
func TestReloadProvisioners(t *testing.T) {
	bin := sandboxtest.Binary(t, "examples/testplugin", "provisioner-memory")
	path := filepath.Join(t.TempDir(), "config.hcl")
	write := func(blocks ...string) *File {
		t.Helper()
		return writeLoaded(t, path, "engine {\n  listen = \"127.0.0.1:0\"\n}\n"+strings.Join(blocks, ""))
	}
	block := func(name, greeting string) string {
		return fmt.Sprintf("provisioner \"memory\" %q {\n  plugin   = %q\n  greeting = %q\n}\n", name, bin, greeting)
	}
	names := func(e *Engine) []string {
		var out []string
		for _, s := range e.fleet.list() {
			out = append(out, s.Name())
		}
		return out
	}
	ctx := context.Background()
	from := write(block("one", "hi"))
	e, err := New(Config{Provisioners: from.Provisioners, Secret: testSecret, ID: "test", Listen: from.Engine.Listen, Digest: from.Digest})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop(ctx)
	if diags := e.Start(ctx); diags.HasErrors() {
		t.Fatal(diags)
	}
	one := e.fleet.get("one")

	to := write(block("two", "hi"))
	r, diags := e.Reload(ctx, from, to)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	want := []Change{{Kind: ChangeProvisionerAdded, Provisioner: "two"}, {Kind: ChangeProvisionerRemoved, Provisioner: "one"}}
	if !slices.Equal(r.Changes, want) || r.Generation != 2 || r.Digest != to.Digest {
		t.Errorf("reload: %+v; want generation 2, %s, %v", r, to.Digest, want)
	}
	if got := names(e); !slices.Equal(got, []string{"two"}) {
		t.Errorf("provisioners after the reload: %v; want [two]", got)
	}
	if e.fleet.get("two").Phase() != host.PhaseRunning {
		t.Errorf("the added provisioner's plugin is %s", e.fleet.get("two").Phase())
	}
	waitFor(t, "the removed provisioner's plugin to be shut down", func() bool { return one.Phase() == host.PhaseStopped })

	// testplugin takes one Configure: a changed block is refused, and
	// three, launched for the same reload, is shut down again.
	refused := write(block("two", "hello"), block("three", "hi"))
	_, diags = e.Reload(ctx, to, refused)
	if !diags.HasErrors() || !strings.Contains(diags.Error(), "does not take a second Configure") {
		t.Fatalf("a reload changing a block of a plugin without reconfigure: %v", diags)
	}
	if d := diags[0]; d.Subject == nil || d.Subject.Filename != path || d.Subject.Start.Line != 4 {
		t.Errorf("the refusal points at %v; want %s:4, the block", d.Subject, path)
	}
	if got := names(e); !slices.Equal(got, []string{"two"}) {
		t.Errorf("provisioners after a refused reload: %v; want [two]", got)
	}
	if v := e.Config(); v.Generation != 2 || v.Digest != to.Digest {
		t.Errorf("after a refused reload the engine runs %+v; want generation 2, %s", v, to.Digest)
	}
	if shapes := e.router.asks.shapesOf("three"); shapes != nil {
		t.Errorf("the router still asks provisioner three, which a refused reload launched: %v", shapes)
	}
}

// TestReloadLiftsHolds: the engine's hold of a profile whose machines
// failed for the configuration (misconfigured) is dropped when a reload
// changes its provisioner, and another provisioner's stays.
func TestReloadLiftsHolds(t *testing.T) {
	logger, _ := testLogger(t)
	books := newBareBooks(logger, host.NewSigner(testSecret), nil)
	defer books.Close()
	r := newRouter(logger, books, nil)
	for _, prov := range []string{"hpc", "lab"} {
		if err := r.observeEvent(shared.Event{Kind: shared.EventWorkerProvisionFailed, Provisioner: prov, Profile: "gpu",
			Class: shared.FailureMisconfigured, Detail: "invalid partition"}); err != nil {
			t.Fatal(err)
		}
	}
	if held := r.holds.list(); len(held) != 2 || !held[0].Held {
		t.Fatalf("held before the reload: %+v", held)
	}
	if lifted := r.holds.forget("hpc"); !slices.Equal(lifted, []string{"gpu"}) {
		t.Errorf("holds.forget lifted %v; want [gpu]", lifted)
	}
	if held := r.holds.list(); len(held) != 1 || held[0].Provisioner != "lab" {
		t.Errorf("held after hpc's reload: %+v; want lab's alone", held)
	}
}

// writeLoaded writes body to path and loads it, failing the test on
// any error: a configuration file as a reload reads it.
func writeLoaded(t *testing.T, path, body string) *File {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	f, diags := LoadConfig(path)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	return f
}
