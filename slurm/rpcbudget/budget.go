// Package rpcbudget is one budget of controller RPCs for every process
// of one login user on one machine: a token bucket kept in a file.
//
// slurmctld's rate limiter (SlurmctldParameters=rl_enable) gives each
// user one bucket, whatever process or machine the RPCs come from. The
// provisioner blocks of an engine that log in as one user are processes
// of their own (one plugin each), and two engines on one machine may
// share the user too; each pacing itself alone would spend N times what
// it meant to. So the bucket lives in a file, under a directory only the
// user may enter, named after the login: each process takes what a
// command costs before running it, under an exclusive flock, and the
// refill is counted from the time the file records. A take that finds
// too little waits for the refill, bounded by its context.
//
// Rejected: a bucket in the engine, handed to the plugins over the
// protocol: every plugin (in any language) would have to ask for each
// command, and two engines on one machine would still not share it; and
// a daemon of its own, one more process to own. A file costs a flock, a
// read and a write per command, a few microseconds beside an ssh round
// trip.
//
// The package knows nothing of Slurm: its caller says what a command
// costs. It does not see RPCs other clients of the user make (a person's
// squeue on the login node); the rate it keeps is kept below the site's
// so that they have room. Design record:
// docs/design/slurm-rpc-budget.md.
package rpcbudget

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/fluksio/provision/internal/fileperm"
)

// Bucket is a shared token bucket: Rate tokens a second, at most Burst at
// once. Its methods may be called from any goroutine, and from any
// process holding a Bucket of the same path.
type Bucket struct {
	path  string
	rate  float64
	burst float64
}

// Open is the bucket of key (the login: user@host:port) under dir, which
// is made as the ssh control directory is (slurm/sshrun): 0700, and then
// checked (CheckDir). rate must be positive; burst is at least 1.
func Open(dir, key string, rate, burst float64) (*Bucket, error) {
	if rate <= 0 || math.IsNaN(rate) || math.IsInf(rate, 0) {
		return nil, fmt.Errorf("rpc budget: rate %v is not a positive number", rate)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("rpc budget: %w", err)
	}
	if err := CheckDir(dir); err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(key))
	return &Bucket{path: filepath.Join(dir, "rpc-"+hex.EncodeToString(sum[:8])), rate: rate, burst: max(burst, 1)}, nil
}

// CheckDir says why dir cannot hold this user's budgets, nil when it can
// or does not exist yet: it must be a directory (not a link) owned by
// this user, of mode 0700, in directories nobody else can replace it
// from (internal/fileperm). A directory another user made first at the
// fixed name (a squatter in /tmp) could read, reset or hold the budget's
// lock, and so is an error that says how to fix it, never a budget kept
// elsewhere or not at all.
func CheckDir(dir string) error {
	st, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("rpc budget: %w", err)
	}
	me := os.Getuid()
	sys, _ := st.Sys().(*syscall.Stat_t)
	switch {
	case !st.IsDir():
		return fmt.Errorf("rpc budget: %s is not a directory (%s); another user may have made it first. Remove it (rm %s) or set TMPDIR to a directory of this user's", dir, st.Mode().Type(), dir)
	case sys != nil && int(sys.Uid) != me:
		return fmt.Errorf("rpc budget: %s is owned by uid %d, not this user (uid %d): another user made it first, and could read, reset or hold the budget. Remove it (rm -r %s, as root or uid %d) or set TMPDIR to a directory of this user's", dir, sys.Uid, me, dir, sys.Uid)
	case st.Mode().Perm()&0o077 != 0:
		return fmt.Errorf("rpc budget: %s has mode %04o; only its user may enter it. Fix: chmod 700 %s", dir, st.Mode().Perm(), dir)
	}
	if p := fileperm.Check(dir); p != nil {
		return fmt.Errorf("rpc budget: %s can be replaced by others: %s. Fix: %s, or set TMPDIR to a directory of this user's", dir, p.Why, p.Fix)
	}
	return nil
}

// DefaultDir is where the buckets of this user live: a directory of its
// own under the temporary directory.
func DefaultDir() string {
	return filepath.Join(os.TempDir(), "fluksio-rpc-"+strconv.Itoa(os.Getuid()))
}

// Take takes n tokens, waiting for the refill when there are too few,
// and reports how long it waited. n beyond the burst waits for a full
// bucket and takes it all. An error is ctx's, or the file's (one that is
// not this user's alone): the caller says it, and does not run its
// command unpaced.
func (b *Bucket) Take(ctx context.Context, n float64) (time.Duration, error) {
	start := time.Now()
	n = min(n, b.burst)
	for {
		wait, err := b.tryTake(n, time.Now())
		if err != nil || wait == 0 {
			return time.Since(start), err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return time.Since(start), ctx.Err()
		case <-t.C:
		}
	}
}

// fileLen is the bucket file's size: the tokens left (float64 bits) and
// when they were counted (Unix nanoseconds).
const fileLen = 16

// clockSlack is how far ahead of this process's clock another process of
// the machine may have counted: their clock is the same one, so a count
// further ahead is not one to obey (a clock stepped back, or a file
// written by someone else).
const clockSlack = time.Second

// tryTake takes n tokens if there are as many at now, or says how long
// until there are. An empty file is a full bucket. A file that cannot be
// trusted (another size, tokens negative, infinite or not a number, a
// count ahead of the clock) is recreated as a full bucket counted now,
// never obeyed: obeyed, -Inf tokens would make a negative wait that
// spins, and a count far in the future a wait to every command's
// deadline. A full bucket is what a missing file is. Tokens past the
// burst are the burst: another process of the user may keep a larger
// one.
func (b *Bucket) tryTake(n float64, now time.Time) (time.Duration, error) {
	// The directory is looked at again each time: one removed (a
	// cleaner of /tmp) and made again by another user is not ours.
	if err := CheckDir(filepath.Dir(b.path)); err != nil {
		return 0, err
	}
	f, err := os.OpenFile(b.path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return 0, fmt.Errorf("rpc budget: %w", err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return 0, fmt.Errorf("rpc budget: locking %s: %w", b.path, err)
	}
	// Closing the file lets the lock go.
	st, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("rpc budget: %w", err)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); !st.Mode().IsRegular() || (ok && int(sys.Uid) != os.Getuid()) || st.Mode().Perm()&0o077 != 0 {
		return 0, fmt.Errorf("rpc budget: %s is not a file of this user's that only it may read (mode %v); remove it", b.path, st.Mode())
	}
	var buf [fileLen + 1]byte
	k, err := f.ReadAt(buf[:], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("rpc budget: reading %s: %w", b.path, err)
	}
	tokens, at := b.burst, now
	if k == fileLen {
		tokens = math.Float64frombits(binary.LittleEndian.Uint64(buf[:8]))
		at = time.Unix(0, int64(binary.LittleEndian.Uint64(buf[8:fileLen])))
	}
	if k != 0 && (k != fileLen || !(tokens >= 0) || math.IsInf(tokens, 0) || at.After(now.Add(clockSlack))) {
		// Not a file to obey: recreated, as a full bucket now.
		if err := f.Truncate(0); err != nil {
			return 0, fmt.Errorf("rpc budget: recreating %s: %w", b.path, err)
		}
		tokens, at = b.burst, now
	}
	tokens = min(tokens, b.burst)
	if el := now.Sub(at); el > 0 {
		tokens = min(b.burst, tokens+el.Seconds()*b.rate)
	}
	if tokens < n {
		// At least a millisecond: a wait that rounds to zero is not a
		// take.
		return max(time.Millisecond, time.Duration((n-tokens)/b.rate*float64(time.Second))), nil
	}
	binary.LittleEndian.PutUint64(buf[:8], math.Float64bits(tokens-n))
	if at.After(now) {
		// Another process read the clock a moment after this one.
		now = at
	}
	binary.LittleEndian.PutUint64(buf[8:], uint64(now.UnixNano()))
	if _, err := f.WriteAt(buf[:fileLen], 0); err != nil {
		return 0, fmt.Errorf("rpc budget: writing %s: %w", b.path, err)
	}
	return 0, nil
}
