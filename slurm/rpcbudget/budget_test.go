package rpcbudget

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
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
	b, err := Open(filepath.Join(t.TempDir(), "b"), "k", 10, 2)
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

// TestOpenRefusesAnOpenDirectory: a directory others may write, or one of
// ours that others may enter, is not trusted with the budget, and the
// error says the path, the mode and the fix.
func TestOpenRefusesAnOpenDirectory(t *testing.T) {
	for _, mode := range []os.FileMode{0o777, 0o755} {
		dir := filepath.Join(t.TempDir(), "open")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("%s has mode %04o; only its user may enter it. Fix: chmod 700 %s", dir, mode, dir)
		if _, err := Open(dir, "k", 1, 1); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Open of a %04o directory = %v, want it to say %q", mode, err, want)
		}
	}
	if _, err := Open(t.TempDir(), "k", 0, 1); err == nil {
		t.Error("a rate of 0 was taken")
	}
}

// TestOpenRefusesASquattedDirectory: the budget's directory made first by
// another user (uid 65534), or a link another user put at its name, is an
// error that names the path, the owner and the fix; nothing is made or
// written elsewhere, and no budget is handed out.
func TestOpenRefusesASquattedDirectory(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("gives a directory to uid 65534: needs root")
	}
	base := t.TempDir()
	dir := filepath.Join(base, "fluksio-rpc-0")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	b, err := Open(dir, "k", 1, 1)
	if err == nil || b != nil {
		t.Fatalf("Open of another user's directory = %v, %v", b, err)
	}
	for _, want := range []string{dir + " is owned by uid 65534, not this user (uid 0)", "rm -r " + dir, "TMPDIR"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	if err := CheckDir(dir); err == nil {
		t.Error("CheckDir passed another user's directory")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("something was written in the squatted directory: %v", entries)
	}

	elsewhere := filepath.Join(base, "theirs")
	if err := os.Mkdir(elsewhere, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "fluksio-rpc-link")
	if err := os.Symlink(elsewhere, link); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(link, "k", 1, 1); err == nil || !strings.Contains(err.Error(), link+" is not a directory") {
		t.Errorf("Open of a link = %v", err)
	}
}

// TestCorruptFileRecreated: a budget file that cannot be trusted
// (truncated, too long, garbage, -Inf, NaN or a huge negative count of
// tokens, a count dated far ahead of the clock) is recreated, not
// obeyed: the next Take of a burst of 2 returns at once, within a
// deadline of 10 s, with no error, and leaves a 16-byte file of at
// most the burst counted no later than now. Obeyed, -Inf spun on a
// negative wait to the deadline, and the far date or the huge negative
// count waited to it.
func TestCorruptFileRecreated(t *testing.T) {
	put := func(tokens float64, at int64) []byte {
		var buf [16]byte
		binary.LittleEndian.PutUint64(buf[:8], math.Float64bits(tokens))
		binary.LittleEndian.PutUint64(buf[8:], uint64(at))
		return buf[:]
	}
	now := time.Now().UnixNano()
	for name, content := range map[string][]byte{
		"truncated":    put(1, now)[:7],
		"too long":     append(put(1, now), 'x'),
		"garbage":      []byte("this is not a budget, it is text"),
		"-Inf tokens":  put(math.Inf(-1), now),
		"NaN tokens":   put(math.NaN(), now),
		"-1e300":       put(-1e300, now),
		"year 2200":    put(0, time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()),
		"a minute on":  put(0, now+int64(time.Minute)),
		"-1 tokens":    put(-1, now),
		"huge, not nn": put(1e308, now),
	} {
		dir := filepath.Join(t.TempDir(), "b")
		b, err := Open(dir, "k", 1, 2)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(b.path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err = b.Take(ctx, 2)
		cancel()
		if err != nil {
			t.Errorf("%s: Take = %v; the file was obeyed", name, err)
			continue
		}
		got, err := os.ReadFile(b.path)
		if err != nil || len(got) != 16 {
			t.Errorf("%s: the file afterwards is %d bytes (%v), want 16", name, len(got), err)
			continue
		}
		tokens := math.Float64frombits(binary.LittleEndian.Uint64(got[:8]))
		at := int64(binary.LittleEndian.Uint64(got[8:]))
		if !(tokens >= 0 && tokens <= 2) || at > time.Now().UnixNano() {
			t.Errorf("%s: the file afterwards holds %v tokens at %v", name, tokens, time.Unix(0, at))
		}
	}
}
