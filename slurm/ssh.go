package slurm

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/internal/queue"
	"github.com/fluksio/provision/slurm/sshrun"
)

// The provisioner's side of its ssh transport (package slurm/sshrun):
// the transport made from the settings, and the settings it is made from
// checked. Running ssh, multiplexing, the session cap, host keys and
// failing over between logins are the transport's; what its words and
// its Access mean to the provisioner (a login needed, logins.go) are
// this package's.

// maxMaxSessions is a sanity bound on max_sessions: beyond it the login
// node is being hammered, whatever its sshd allows.
const maxMaxSessions = 64

// newTransport is the ssh transport for cfg: its settings, the ssh
// program and clock the Provisioner was given, and the Provisioner
// told of each change of the way in (accessChanged). It starts nothing.
func (p *Provisioner) newTransport(cfg *settings) *sshrun.Transport {
	c := cfg.sshConfig()
	c.Program, c.Now = p.sshPath, p.now
	c.AccessChanged = func(ch sshrun.AccessChange) { p.accessChanged(cfg, ch) }
	log := cfg.log
	if log == nil {
		log = p.logger
	}
	return sshrun.New(c, log)
}

// slurmQueue is what the provisioner asks of Slurm and the login node:
// slurm/internal/queue's Queue, which runs each command over ssh outside
// the provisioner's lock. It is the seam of the decisions' tests, which
// give them an in-memory queue (memqueue_test.go); the Queue itself is
// tested against the sandbox's real Slurm.
type slurmQueue interface {
	Run(ctx context.Context, stdin []byte, remote ...string) (stdout, stderr []byte, err error)
	Jobs(ctx context.Context, all bool) ([]queue.Job, error)
	States(ctx context.Context, ids []string) ([]queue.Job, error)
	State(ctx context.Context, job string) (state, reason string, err error)
	Lookup(ctx context.Context, comment string) (string, error)
	Submit(ctx context.Context, script []byte, opts ...string) (string, error)
	TestOnly(ctx context.Context, script []byte) (stdout, stderr []byte, err error)
	Cancel(ctx context.Context, ids []string) error
	CountQueued(ctx context.Context) (int, error)
	CountAll(ctx context.Context) (int, error)
	Facts(ctx context.Context) (queue.Facts, error)
	Nodes(ctx context.Context) ([]queue.NodeGroup, error)
	Limits(ctx context.Context, cluster string) (queue.UserLimits, error)
	PartitionTimes(ctx context.Context) ([]queue.PartitionTimes, error)
	PollCost() float64
	SetMaxRPCRate(rate float64)
	Prepay(ctx context.Context) context.Context
	WaitingTurn(err error) bool
	RateNote(now time.Time) string
	BudgetNote(now time.Time) string
	Commands() []shared.CommandStats
	Calls() int64
	Transport() *sshrun.Transport
	Close(ctx context.Context)
}

var _ slurmQueue = (*queue.Queue)(nil)

// newQueue is the queue that runs cfg's commands through ssh: its jobs
// are the provisioner's name's, its user the first login's when it names
// one (else squeue filters with --me), and the login user's budget is
// keyed by the first login, with its port.
func (p *Provisioner) newQueue(cfg *settings, ssh *sshrun.Transport) *queue.Queue {
	log := cfg.log
	if log == nil {
		log = p.logger
	}
	user, _, _ := strings.Cut(cfg.firstLogin().Dest, "@")
	if !strings.Contains(cfg.firstLogin().Dest, "@") {
		user = ""
	}
	return queue.New(ssh, queue.Config{JobName: jobName(cfg.name), User: user, Host: cfg.host(),
		BudgetKey: budgetKey(cfg), MaxRPCRate: cfg.maxRPCRate, Log: log, Now: p.now})
}

// sshConfig is the transport's configuration from the settings.
func (s *settings) sshConfig() sshrun.Config {
	return sshrun.Config{
		Logins:     s.loginList(),
		Bastions:   s.bastions,
		ConfigFile: s.SSHConfig,
		Port:       s.SSHPort,
		Key:        s.SSHKey,
		KnownHosts: s.KnownHosts,
		Options:    s.SSHOptions,
		Timeout:    max(s.submitTimeout, s.checkWait),
		// A check's longer wait is for Slurm's answers, not a login
		// that does not answer.
		ConnectTimeout: s.submitTimeout / 2,
		Multiplex:      s.multiplex,
		MaxSessions:    s.maxSessions,
		// sbatch exits 255 itself for an option it cannot parse.
		RemoteSaid: sbatchSaid,
	}
}

// fillSSHDefaults gives multiplex and max_sessions their defaults when
// absent.
func (c *Config) fillSSHDefaults() {
	if c.Multiplex == nil {
		on := true
		c.Multiplex = &on
	}
	if c.MaxSessions == nil {
		n := sshrun.DefaultMaxSessions
		c.MaxSessions = &n
	}
}

// validateSSH checks max_sessions and resolves the multiplexing settings.
func validateSSH(s *settings) shared.Diagnostics {
	var diags shared.Diagnostics
	s.multiplex = s.Multiplex == nil || *s.Multiplex
	n := sshrun.DefaultMaxSessions
	if s.MaxSessions != nil {
		n = *s.MaxSessions
	}
	switch {
	case n < 1 || n > maxMaxSessions:
		diags = append(diags, shared.Errorf([]string{"max_sessions"}, "Invalid max_sessions",
			"max_sessions must be between 1 and %d; got %d. Most sshd allow 10 sessions per connection (MaxSessions); stay below it.", maxMaxSessions, n))
	case n >= 10 && s.multiplex:
		s.maxSessions = n
		diags = append(diags, shared.Diagnostic{Severity: shared.SeverityWarning, Path: []string{"max_sessions"}, Summary: "max_sessions at or above sshd's usual limit",
			Detail: fmt.Sprintf("Most sshd allow 10 sessions per connection (MaxSessions); stay below it. With %d, commands beyond the login node's limit each open a connection of their own.", n)})
	default:
		s.maxSessions = n
	}
	return diags
}
