package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/internal/testutil"
	"github.com/fluksio/provision/shared"
)

// TestNewOpensNothing: New builds the engine and nothing else; the
// socket appears with Serve, and Stop ends what Serve began.
func TestNewOpensNothing(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "engine.sock")
	before := ourGoroutines()
	e, err := New(Config{Secret: testSecret, ID: "test", Listen: "unix:" + sock})
	if err != nil {
		t.Fatal(err)
	}
	if n := ourGoroutines(); n > before {
		t.Errorf("New started %d goroutine(s)", n-before)
	}
	if _, err := os.Lstat(sock); err == nil {
		t.Errorf("New made the socket %s; listening is Serve's", sock)
	}
	if e.Addr() != "" {
		t.Errorf("Addr is %q before Serve", e.Addr())
	}
	if err := e.Serve(e.Mux(nil, false)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(sock); err != nil {
		t.Errorf("Serve did not listen: %v", err)
	}
	if got := e.Stop(context.Background()); len(got) != 0 {
		t.Errorf("Stop without provisioners: %v", got)
	}
}

// ourGoroutines counts the goroutines the module's code started.
func ourGoroutines() int {
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	return strings.Count(string(buf[:n]), "created by github.com/fluksio/provision/")
}

// TestStartListens: Start before Serve listens first, so that the
// plugins are told where; Serve then serves on that listener; an address
// in use is Serve's error, not New's.
func TestStartListens(t *testing.T) {
	e, err := New(Config{Secret: testSecret, ID: "test", Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop(context.Background())
	if diags := e.Start(context.Background()); diags.HasErrors() {
		t.Fatal(diags)
	}
	if e.Addr() == "" {
		t.Fatal("Start did not listen")
	}
	if err := e.Serve(e.Mux(nil, false)); err != nil {
		t.Fatal(err)
	}
	taken, err := New(Config{Secret: testSecret, ID: "test", Listen: e.Addr()})
	if err != nil {
		t.Fatalf("New with an address in use: %v; listening is Serve's", err)
	}
	defer taken.Stop(context.Background())
	if err := taken.Serve(taken.Mux(nil, false)); err == nil {
		t.Errorf("Serve on %s, in use, did not fail", e.Addr())
	}
}

// TestEngineEvents: a real plugin's events reach a subscriber in order of
// sequence; Status and PIDs have the plugin; a subscription resumes after
// the last seq read; cancelling its context closes the channel, and so
// does Stop.
func TestEngineEvents(t *testing.T) {
	bin := testutil.BuildTestPlugin(t)
	body := fmt.Sprintf("engine {\n  listen = \"127.0.0.1:0\"\n}\nprovisioner \"memory\" \"mem\" {\n  plugin = %q\n  greeting = \"hi\"\n}\n", bin)
	cfgPath := filepath.Join(t.TempDir(), "engine.hcl")
	if err := os.WriteFile(cfgPath, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, diags := LoadConfig(cfgPath)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	logger, _ := testLogger(t)
	e, err := New(Config{Provisioners: cfg.Provisioners, Secret: testSecret, ID: "test", Listen: cfg.Engine.Listen, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first, cancelFirst := context.WithCancel(ctx)
	events := e.Events(first, 0)
	lasting := e.Events(ctx, 0)
	if err := e.Serve(e.Mux(nil, false)); err != nil {
		t.Fatal(err)
	}
	if diags := e.Start(ctx); diags.HasErrors() {
		t.Fatal(diags)
	}
	e.Add(shared.Need{CPUs: 1}, 0)
	runDone := make(chan bool, 1)
	go func() { runDone <- e.Run(ctx, nil) }()

	deadline := time.After(30 * time.Second)
	var seqs []uint64
	var up, provisioned Event
	for up.Seq == 0 || provisioned.Seq == 0 {
		select {
		case ev := <-events:
			seqs = append(seqs, ev.Seq)
			switch ev.Kind {
			case EventPluginUp:
				up = ev
			case EventWorkerProvisioned:
				provisioned = ev
			}
		case <-deadline:
			t.Fatalf("events seen: %v; want plugin_up and worker_provisioned", seqs)
		}
	}
	for i, s := range seqs {
		if s != uint64(i+1) {
			t.Fatalf("sequence numbers %v, want 1, 2, 3, ...", seqs)
		}
	}
	if up.Provisioner != "mem" || provisioned.Provisioner != "mem" || provisioned.Worker == "" || up.Seq > provisioned.Seq {
		t.Errorf("plugin_up %+v, then worker_provisioned %+v", up, provisioned)
	}
	st := e.Status(ctx)
	if len(st.Provisioners) != 1 || st.Provisioners[0].Name != "mem" || st.Provisioners[0].Status == nil {
		t.Errorf("Status: %+v; want provisioner mem with its plugin's report", st)
	}
	if pids := e.PIDs(); len(pids) != 1 {
		t.Errorf("PIDs %v; want the one plugin's", pids)
	}
	resumed := e.Events(ctx, up.Seq)
	if ev := <-resumed; ev.Seq != up.Seq+1 {
		t.Errorf("resumed after %d at %d", up.Seq, ev.Seq)
	}

	cancelFirst()
	for range events {
	}
	cancel()
	<-runDone
	e.Stop(context.Background())
	for range lasting {
	}
}

// TestEventsReaderBehind: a reader that does not keep up is let go, as
// the stream's client is: it reads what was queued, in order, and then
// the channel closes, rather than the engine waiting on it.
func TestEventsReaderBehind(t *testing.T) {
	e, err := New(Config{Secret: testSecret, ID: "test", Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop(context.Background())
	events := e.Events(context.Background(), 0)
	const sent = subscriberBuffer + 50
	for i := range sent {
		e.hub.publish(Event{Kind: EventTaskDone, Task: fmt.Sprint(i)})
	}
	var got uint64
	for ev := range events {
		got++
		if ev.Seq != got {
			t.Fatalf("event %d has seq %d", got, ev.Seq)
		}
	}
	if got == 0 || got >= sent {
		t.Errorf("a reader behind read %d of %d events; want it let go after at most %d", got, sent, subscriberBuffer+1)
	}
}
