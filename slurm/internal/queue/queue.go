// Package queue runs the Slurm plugin's commands on the login node:
// every squeue, sbatch, scancel, sacctmgr, sinfo and scontrol, and the
// few shell commands beside them (mkdir, a worker's check), through the
// ssh transport (slurm/sshrun). Around each it spends the login user's
// RPC budget (slurm/rpcbudget) and reads slurmctld's rate limiter from
// how long the command took, and it counts each for Status.
//
// Claim: the provisioner's decisions (package slurm) hold one lock that
// must never be held across ssh. A type of their own package, holding
// none of the provisioner's state, cannot take that lock, so the compiler
// keeps every command outside it rather than a comment. The queue's own
// lock is a leaf: held only to read or change its budget, its readings of
// the limiter and its counters, never across a command; it may be taken
// under the provisioner's lock (Status reads its notes there).
//
// Rejected: the same methods in files of their own in package slurm (a
// draft did so): nothing then stops a method from reaching the
// provisioner's lock or state, and the package's file-level arrows
// running back up grew (100/246 to 113/269) instead of shrinking.
//
// Cost: one more package whose types the decisions read (Job, RateLimit),
// and a Config copied from the settings at Configure.
//
// Seam: the decisions ask a Queue; tests of the decisions may ask an
// in-memory stand-in instead, and tests of the queue ask the sandbox's
// real Slurm over real ssh.
//
// Limits: the queue knows nothing of profiles, requests or holds; it runs
// what it is asked and says what came back, typed.
package queue

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fluksio/provision/slurm/sshrun"
)

// Config is what a Queue needs of the plugin's settings.
type Config struct {
	// JobName is the name of every job of this provisioner
	// (fluksio-<provisioner>): the queue reads its jobs by it.
	JobName string
	// User is the login's user when the login names one, else "": the
	// queue then filters by --me, and LoginUser asks the login node.
	User string
	// Host names the login nodes in errors ("login1 or login2").
	Host string
	// BudgetKey names the login user's RPC budget: the first login's
	// destination, with its port when one is set.
	BudgetKey string
	// MaxRPCRate is max_rpc_rate as the queue starts: the budget's rate,
	// before the site's limiter lowers it (SetMaxRPCRate changes it).
	MaxRPCRate float64
	// Log is where the queue says what it cannot keep (the budget's
	// file); nowhere if nil.
	Log hclog.Logger
	// Now is the clock of the readings Status shows; time.Now if nil.
	Now func() time.Time
}

// Queue runs commands on the login node. It is safe for concurrent use.
type Queue struct {
	ssh *sshrun.Transport
	cfg Config
	// calls counts the commands run, so that tests can see what a poll
	// cycle costs.
	calls atomic.Int64

	// mu guards the fields below. It is a leaf lock: held only to read
	// or change them, never across a command or a wait.
	mu sync.Mutex
	// maxRate is max_rpc_rate now: Config.MaxRPCRate, then what a
	// second Configure set (SetMaxRPCRate).
	maxRate float64
	// budget is where this queue stands with the login user's shared
	// RPC budget (budget.go).
	budget budget
	// rationing is what is known of slurmctld's RPC rate limiter
	// (ratelimit.go).
	rationing rationing
	// commands counts each kind of command and how it went (metrics.go).
	commands map[string]*commandStats
}

// New is a Queue that runs its commands through ssh. It starts nothing.
func New(ssh *sshrun.Transport, cfg Config) *Queue {
	if cfg.Log == nil {
		cfg.Log = hclog.NewNullLogger()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Queue{ssh: ssh, cfg: cfg, maxRate: cfg.MaxRPCRate}
}

// SetMaxRPCRate makes rate the budget's max_rpc_rate from the next
// command on: a second Configure may change it, where the transport
// the queue was built with stays.
func (q *Queue) SetMaxRPCRate(rate float64) {
	q.mu.Lock()
	q.maxRate = rate
	q.mu.Unlock()
}

// MaxRPCRate is the budget's max_rpc_rate now.
func (q *Queue) MaxRPCRate() float64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.maxRate
}

// Transport is the ssh transport the queue runs its commands through:
// for what is not a command (the relay's long-lived session, a login's
// state).
func (q *Queue) Transport() *sshrun.Transport { return q.ssh }

// Calls is how many commands the queue has run.
func (q *Queue) Calls() int64 { return q.calls.Load() }

// Run runs one command on the login node, bounded by the transport's
// timeout and ctx: it first takes what the command costs slurmctld from
// the login user's budget, then reads from how long it took whether the
// rate limiter made it wait, and counts it. The remote command is handed
// to the login node's shell as one string, each word shell-quoted;
// callers pass only constants, validated names and validated job ids.
func (q *Queue) Run(ctx context.Context, stdin []byte, remote ...string) (stdout, stderr []byte, err error) {
	q.calls.Add(1)
	start := time.Now()
	rationed := false
	defer func() { q.count(remote, start, err, rationed) }()
	if err := q.spend(ctx, remote); err != nil {
		return nil, nil, err
	}
	// The wait for the budget is this user's own pacing: neither the
	// command's latency nor slurmctld's rationing.
	start = time.Now()
	stdout, stderr, err = q.ssh.Run(ctx, stdin, remote...)
	if len(remote) > 0 {
		// Whether slurmctld's rate limiter made it wait (ratelimit.go).
		rationed = q.weigh(remote[0], time.Since(start), stdout, err)
	}
	return stdout, stderr, err
}

// Close ends the transport's connections to the login nodes; commands run
// after it connect anew.
func (q *Queue) Close(ctx context.Context) { q.ssh.Close(ctx) }
