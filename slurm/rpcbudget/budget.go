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
	"math"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
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
// is made 0700 if missing and refused when another user owns it or others
// may write it. rate must be positive; burst is at least 1.
func Open(dir, key string, rate, burst float64) (*Bucket, error) {
	if rate <= 0 || math.IsNaN(rate) || math.IsInf(rate, 0) {
		return nil, fmt.Errorf("rpc budget: rate %v is not a positive number", rate)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("rpc budget: %w", err)
	}
	st, err := os.Lstat(dir)
	if err != nil {
		return nil, fmt.Errorf("rpc budget: %w", err)
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !st.IsDir() || st.Mode().Perm()&0o022 != 0 || (ok && int(sys.Uid) != os.Getuid()) {
		return nil, fmt.Errorf("rpc budget: %s is not a directory of this user's that only it may write: make it so, or remove it", dir)
	}
	sum := sha256.Sum256([]byte(key))
	return &Bucket{path: filepath.Join(dir, "rpc-"+hex.EncodeToString(sum[:8])), rate: rate, burst: max(burst, 1)}, nil
}

// DefaultDir is where the buckets of this user live: a directory of its
// own under the temporary directory.
func DefaultDir() string {
	return filepath.Join(os.TempDir(), "fluksio-rpc-"+strconv.Itoa(os.Getuid()))
}

// Take takes n tokens, waiting for the refill when there are too few,
// and reports how long it waited. n beyond the burst waits for a full
// bucket and takes it all. An error is ctx's, or the file's: a caller
// that cannot keep the budget runs its command all the same, since the
// site's limiter still holds.
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

// tryTake takes n tokens if there are as many at now, or says how long
// until there are. The file holds the tokens left (float64 bits) and when
// they were counted (Unix nanoseconds), 16 bytes; a missing or short
// file is a full bucket.
func (b *Bucket) tryTake(n float64, now time.Time) (time.Duration, error) {
	f, err := os.OpenFile(b.path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return 0, fmt.Errorf("rpc budget: %w", err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		return 0, fmt.Errorf("rpc budget: locking %s: %w", b.path, err)
	}
	// Closing the file lets the lock go.
	var buf [16]byte
	tokens, at := b.burst, now
	if k, err := f.ReadAt(buf[:], 0); k == len(buf) {
		tokens = math.Float64frombits(binary.LittleEndian.Uint64(buf[:8]))
		at = time.Unix(0, int64(binary.LittleEndian.Uint64(buf[8:])))
	} else if err != nil && !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("rpc budget: reading %s: %w", b.path, err)
	}
	if math.IsNaN(tokens) || tokens > b.burst {
		tokens = b.burst
	}
	if el := now.Sub(at); el > 0 {
		tokens = min(b.burst, tokens+el.Seconds()*b.rate)
	}
	if tokens < n {
		return time.Duration((n - tokens) / b.rate * float64(time.Second)), nil
	}
	binary.LittleEndian.PutUint64(buf[:8], math.Float64bits(tokens-n))
	if at.After(now) {
		// Another process counted with a clock ahead of this one's.
		now = at
	}
	binary.LittleEndian.PutUint64(buf[8:], uint64(now.UnixNano()))
	if _, err := f.WriteAt(buf[:], 0); err != nil {
		return 0, fmt.Errorf("rpc budget: writing %s: %w", b.path, err)
	}
	return 0, nil
}
