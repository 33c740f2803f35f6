package queue

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// slurmctld's per-user RPC rate limiter, read as weather.
//
// Large sites turn it on (SlurmctldParameters=rl_enable, Slurm 23.02 and
// later): each user has a bucket of rl_bucket_size RPCs (30 by default)
// that gains rl_refill_rate (2) every rl_refill_period seconds (1). A
// client whose RPC is refused does not fail: it sleeps a second, tries
// again and exits 0 with nothing on stderr, so a rationed squeue (3 RPCs
// on 24.11) is a slow squeue, never an error. The one exception is
// scontrol show config, whose closing ping is not retried: it prints the
// whole configuration, then "Slurmctld(primary) at HOST is DOWN", and
// exits 1 (testdata/slurm-versions/24.11.5/ratelimit-*.txt, in slurm/).
//
// So the queue learns the limiter from the configuration itself
// (SlurmctldParameters, read with the start-up facts), and a command is
// rationed when, with the limiter on, it answered at least rationedDelay
// slower than the fastest call of its kind, or ran out of its deadline,
// or is that DOWN right after a configuration slurmctld had just sent.
// Running the commands with -v would have said it in Slurm's own words
// ("RPC rate limited 1 time(s)"), but squeue -v also prints its options,
// a date and a header on stdout, which every parser would have to step
// over; timing costs nothing. The slurmctld log, which names the
// refusals, is not the login user's to read on a real site.
//
// A rationed command is waiting, not failing: the queue unread for it is
// not an outage (no "cannot read the queue", no LastError), and Status,
// the commands' metrics and validate -check say "rate limited" instead.

// RateLimit is the limiter as SlurmctldParameters sets it.
type RateLimit struct {
	On bool
	// Bucket is how many RPCs a user may make at once, Refill how many
	// come back every Period seconds.
	Bucket, Refill, Period int
}

// Slurm's defaults for a limiter turned on without its sizes
// (slurm.conf(5), SlurmctldParameters).
const (
	defaultRLBucket = 30
	defaultRLRefill = 2
	defaultRLPeriod = 1
)

// rationedDelay is how much slower than the fastest call of its kind a
// command must answer to count as rationed: the client sleeps a whole
// second for each refusal.
const rationedDelay = 900 * time.Millisecond

var (
	slurmctldParamsRE = regexp.MustCompile(`(?m)^SlurmctldParameters\s*=\s*(.*?)\s*$`)
	// pingDownRE is the closing ping of scontrol show config finding a
	// controller DOWN.
	pingDownRE = regexp.MustCompile(`(?m)^Slurmctld\([a-z0-9]+\) at \S+ is DOWN\s*$`)
	// configHeaderRE is the first line scontrol show config prints once
	// slurmctld has answered: the configuration is the controller's.
	configHeaderRE = regexp.MustCompile(`(?m)^Configuration data as of `)
)

// ParseRateLimit reads the limiter from scontrol show config's output.
func ParseRateLimit(out []byte) RateLimit {
	m := slurmctldParamsRE.FindSubmatch(out)
	if m == nil {
		return RateLimit{}
	}
	r := RateLimit{Bucket: defaultRLBucket, Refill: defaultRLRefill, Period: defaultRLPeriod}
	for _, kv := range strings.Split(string(m[1]), ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(kv), "=")
		n, err := strconv.Atoi(v)
		switch {
		case k == "rl_enable":
			r.On = true
		case err != nil || n < 1:
		case k == "rl_bucket_size":
			r.Bucket = n
		case k == "rl_refill_rate":
			r.Refill = n
		case k == "rl_refill_period":
			r.Period = n
		}
	}
	if !r.On {
		return RateLimit{}
	}
	return r
}

// String says what the limiter allows, in an operator's words.
func (r RateLimit) String() string {
	if !r.On {
		return "off"
	}
	return fmt.Sprintf("on (SlurmctldParameters rl_enable): each user may make %d RPCs at once, and gets %d back %s; a rationed command sleeps and tries again, so it is slow, not failed",
		r.Bucket, r.Refill, r.every())
}

// every is how often the refill comes.
func (r RateLimit) every() string {
	if r.Period == 1 {
		return "a second"
	}
	return fmt.Sprintf("every %d seconds", r.Period)
}

// PingRationed reports whether scontrol show config's output is a
// configuration followed by its closing ping finding the controller
// DOWN: the controller had just answered, so the ping was refused, not
// unanswered.
func PingRationed(out []byte) bool {
	return configHeaderRE.Match(out) && pingDownRE.Match(out)
}

// rationing is what this queue has learned of the limiter: what the
// configuration says and which command last waited its turn. Guarded by
// Queue.mu.
type rationing struct {
	limit RateLimit
	// fastest is, by command, the quickest call that succeeded: what the
	// login node takes for it when nothing waits.
	fastest map[string]time.Duration
	// lastAt, lastCommand and lastHow are the last rationed command,
	// when and how it showed; count is how many have been.
	lastAt      time.Time
	lastCommand string
	lastHow     string
	count       int64
}

// SetRateLimit keeps the limiter as the configuration says it is.
func (q *Queue) SetRateLimit(limit RateLimit) {
	q.mu.Lock()
	q.rationing.limit = limit
	q.mu.Unlock()
}

// weigh looks at a finished call of command for the limiter's marks, and
// reports whether it was rationed.
func (q *Queue) weigh(command string, took time.Duration, stdout []byte, err error) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	r := &q.rationing
	how := ""
	switch {
	case command == "scontrol" && PingRationed(stdout):
		// Also before the limiter is known: the facts' own read.
		how = "scontrol show config's closing ping was refused (it said DOWN right after the configuration)"
	case !r.limit.On:
	case errors.Is(err, context.DeadlineExceeded):
		how = fmt.Sprintf("%s got no answer within %s", command, took.Round(100*time.Millisecond))
	case err == nil:
		if f, ok := r.fastest[command]; ok && took >= f+rationedDelay {
			how = fmt.Sprintf("%s took %.1fs, %.1fs more than its fastest", command, took.Seconds(), (took - f).Seconds())
		}
	}
	if err == nil {
		if r.fastest == nil {
			r.fastest = map[string]time.Duration{}
		}
		if f, ok := r.fastest[command]; !ok || took < f {
			r.fastest[command] = took
		}
	}
	if how == "" {
		return false
	}
	r.lastAt, r.lastCommand, r.lastHow = q.cfg.Now(), command, how
	r.count++
	return true
}

// rationedLocked reports whether a command was rationed within
// rationedRecent. q.mu must be held.
func (q *Queue) rationedLocked(now time.Time) bool {
	return !q.rationing.lastAt.IsZero() && now.Sub(q.rationing.lastAt) < rationedRecent
}

// WaitingTurn reports whether err, from a command that failed, is the
// limiter's doing: the limiter is on and the command ran out of its
// deadline, or was seen rationed lately. A command slurmctld rations
// waits its turn; it is never an outage.
func (q *Queue) WaitingTurn(err error) bool {
	if errors.Is(err, ErrBudget) {
		// It waited for the login user's own budget (budget.go).
		return true
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.rationing.limit.On || q.rationedLocked(q.cfg.Now())
}

// RateNote is Status's note on the limiter, "" when it is off or
// unknown.
func (q *Queue) RateNote(now time.Time) string {
	q.mu.Lock()
	defer q.mu.Unlock()
	r := q.rationing
	switch {
	case q.rationedLocked(now):
		return fmt.Sprintf("rate limited: slurmctld rations this user's RPCs (%s); commands wait their turn, which is waiting, not an outage: %s at %s",
			limitOrUnknown(r.limit), r.lastHow, r.lastAt.UTC().Format(time.TimeOnly))
	case r.limit.On:
		return fmt.Sprintf("slurmctld's RPC rate limiter is %s; no command has waited its turn lately", r.limit)
	}
	return ""
}

// limitOrUnknown is the limiter's sizes in a few words.
func limitOrUnknown(r RateLimit) string {
	if !r.On {
		return "its limiter's sizes are not known yet"
	}
	return fmt.Sprintf("bucket %d, %d back %s", r.Bucket, r.Refill, r.every())
}
