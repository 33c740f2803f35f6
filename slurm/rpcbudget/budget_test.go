package rpcbudget

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The test binary is a second process taking from a bucket when
// takerEnv is set: "dir|key|rate|burst|n".
const takerEnv = "RPCBUDGET_TAKER"

func TestMain(m *testing.M) {
	if spec, ok := os.LookupEnv(takerEnv); ok {
		os.Exit(taker(spec))
	}
	os.Exit(m.Run())
}

// taker takes n tokens one by one and prints when it took each, in Unix
// nanoseconds.
func taker(spec string) int {
	f := strings.Split(spec, "|")
	rate, _ := strconv.ParseFloat(f[2], 64)
	burst, _ := strconv.ParseFloat(f[3], 64)
	n, _ := strconv.Atoi(f[4])
	b, err := Open(f[0], f[1], rate, burst)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for range n {
		if _, err := b.Take(context.Background(), 1); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println(time.Now().UnixNano())
	}
	return 0
}

// TestSharedAcrossProcesses: three processes of one user taking from the
// bucket of one login stay inside one budget together: in every window
// of time, the takes of all three are at most the burst plus the rate
// times the window. Three buckets of their own would have taken three
// times as fast; a second login's bucket is apart.
func TestSharedAcrossProcesses(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "b")
	const rate, burst, each = 40.0, 4.0, 20
	run := func(key string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), takerEnv+"="+strings.Join([]string{dir, key, fmt.Sprint(rate), fmt.Sprint(burst), strconv.Itoa(each)}, "|"))
		return cmd
	}
	var cmds []*exec.Cmd
	for range 3 {
		cmds = append(cmds, run("alice@login:22"))
	}
	other := run("alice@other:22")
	outs := make([]chan []byte, len(cmds))
	for i, c := range cmds {
		outs[i] = make(chan []byte, 1)
		go func() {
			b, err := c.Output()
			if err != nil {
				t.Errorf("taker %d: %v", i, err)
			}
			outs[i] <- b
		}()
	}
	start := time.Now()
	if _, err := other.Output(); err != nil {
		t.Fatal(err)
	}
	otherTook := time.Since(start)
	var stamps []int64
	for _, o := range outs {
		for _, l := range strings.Fields(string(<-o)) {
			n, _ := strconv.ParseInt(l, 10, 64)
			stamps = append(stamps, n)
		}
	}
	if len(stamps) != 3*each {
		t.Fatalf("%d takes, want %d", len(stamps), 3*each)
	}
	// Every window from one take to a later one holds at most what the
	// bucket allows (a millisecond of slack for the clock read after
	// the take).
	for _, a := range stamps {
		for _, b := range stamps {
			w := time.Duration(b - a)
			if w < 0 {
				continue
			}
			in := 0
			for _, c := range stamps {
				if c >= a && c <= b {
					in++
				}
			}
			if allowed := burst + (w+time.Millisecond).Seconds()*rate; float64(in) > allowed+1 {
				t.Fatalf("%d takes within %s; the shared budget allows %.1f", in, w, allowed)
			}
		}
	}
	// The other login's 20 take about (20-4)/40 s, apart from the 60.
	if otherTook > 3*time.Second {
		t.Errorf("another login's bucket took %s for %d tokens; it is not apart", otherTook, each)
	}
}

// TestTakeWaitsForRefill: an empty bucket makes Take wait for the
// refill, and a context that ends first ends the wait with its error.
func TestTakeWaitsForRefill(t *testing.T) {
	b, err := Open(t.TempDir(), "k", 10, 2)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if w, err := b.Take(context.Background(), 1); err != nil || w > 50*time.Millisecond {
			t.Fatalf("a take from a full bucket waited %s: %v", w, err)
		}
	}
	if w, err := b.Take(context.Background(), 1); err != nil || w < 80*time.Millisecond {
		t.Fatalf("a take from an empty bucket at 10/s waited %s: %v; want about 100ms", w, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := b.Take(ctx, 2); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Take past its context = %v", err)
	}
}

// TestOpenRefusesAnOpenDirectory: a directory others may write is not
// trusted with the budget, and the error says what to do.
func TestOpenRefusesAnOpenDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, "k", 1, 1); err == nil || !strings.Contains(err.Error(), "only it may write") {
		t.Errorf("Open = %v", err)
	}
	if _, err := Open(dir, "k", 0, 1); err == nil {
		t.Error("a rate of 0 was taken")
	}
}
