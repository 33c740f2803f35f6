package soak

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"

	"github.com/fluksio/provision/internal/sandboxtest"
)

// TestPlanSameSeed: the schedule is a function of the seed and the
// length alone, and another seed gives another.
func TestPlanSameSeed(t *testing.T) {
	a, b := newPlan(42, 3*time.Minute), newPlan(42, 3*time.Minute)
	if a.String() != b.String() || a.Digest() != b.Digest() {
		t.Fatalf("seed 42 gave two schedules:\n%s\n%s", a, b)
	}
	if c := newPlan(43, 3*time.Minute); c.Digest() == a.Digest() {
		t.Fatalf("seeds 42 and 43 gave the same schedule:\n%s", a)
	}
	if len(a.Faults) == 0 || len(a.Bursts) == 0 {
		t.Fatalf("a 3m plan with no faults or no bursts:\n%s", a)
	}
	for _, bu := range a.Bursts {
		if bu.Count < 1 || bu.Count > 200 || bu.Work < time.Second || bu.Work > 20*time.Second {
			t.Errorf("burst out of range: %s", bu)
		}
	}
	for _, f := range a.Faults {
		if f.At >= 3*time.Minute {
			t.Errorf("fault past the end: %s", f)
		}
	}
}

// TestProxyCarriesBytes: what goes through the proxy, slowed or not,
// arrives whole and in order, both ways.
func TestProxyCarriesBytes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }() // echo
		}
	}()
	p, err := newProxy(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	for _, d := range []time.Duration{0, 20 * time.Millisecond} {
		p.setDelay(d)
		c, err := net.Dial("tcp", p.ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		msg := bytes.Repeat([]byte("soak-"), 40000)
		go func() { c.Write(msg); c.(*net.TCPConn).CloseWrite() }()
		got, err := io.ReadAll(c)
		c.Close()
		if err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("delay %s: got %d bytes (%v), want %d", d, len(got), err, len(msg))
		}
	}
}

// TestConfig: the soak's configuration is HCL that says what the soak
// assumes: two provisioners, the direct one dialling the engine with its
// caps, the relay one with reach = "relay" and its own, each a profile of
// every shape the workload asks for.
func TestConfig(t *testing.T) {
	s := &soak{name: "soak-x", relay: "soak-x-relay", port: 4242, dir: "/tmp/d", workerBin: "/tmp/d/fluksio-worker",
		env: sandboxtest.Env{Login: "u@127.0.0.1", Key: "/k", Partition: "debug"}}
	src := s.config("/tmp/d/known_hosts", 2999)
	f, diags := hclparse.NewParser().ParseHCL([]byte(src), "config.hcl")
	if diags.HasErrors() {
		t.Fatalf("%s\n%s", diags, src)
	}
	content, diags := f.Body.Content(&hcl.BodySchema{Blocks: []hcl.BlockHeaderSchema{
		{Type: "engine"}, {Type: "provisioner", LabelNames: []string{"kind", "name"}}}})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	want := map[string]map[string]string{
		"soak-x":       {"engine_url": `"http://127.0.0.1:4242"`, "max_workers": fmt.Sprint(maxWorkers), "max_pending": fmt.Sprint(maxPending), "ssh_port": "2999"},
		"soak-x-relay": {"reach": `"relay"`, "max_workers": fmt.Sprint(relayMaxWorkers), "max_pending": fmt.Sprint(relayMaxPending), "ssh_port": "2999"},
	}
	cpus := map[string]bool{}
	seen := 0
	for _, b := range content.Blocks {
		if b.Type != "provisioner" {
			continue
		}
		seen++
		attrs, _ := b.Body.JustAttributes()
		for k, v := range want[b.Labels[1]] {
			a := attrs[k]
			if a == nil {
				t.Errorf("provisioner %s lacks %s", b.Labels[1], k)
				continue
			}
			if got := strings.TrimSpace(string(a.Expr.Range().SliceBytes([]byte(src)))); got != v {
				t.Errorf("provisioner %s: %s = %s, want %s", b.Labels[1], k, got, v)
			}
		}
		for _, line := range strings.Split(src[b.DefRange.Start.Byte:], "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "cpus   = "); ok {
				cpus[v] = true
			}
		}
	}
	if seen != 2 {
		t.Errorf("%d provisioner blocks, want 2:\n%s", seen, src)
	}
	for _, sh := range shapes {
		if !cpus[strings.TrimPrefix(sh, "cpus=")] {
			t.Errorf("no profile for the workload's shape %s:\n%s", sh, src)
		}
	}
}
