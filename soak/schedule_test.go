package soak

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"
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
