package queue

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fluksio/provision/internal/sandboxtest"
	"github.com/fluksio/provision/internal/testutil"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/sshrun"
)

// sandboxQueue is a Queue on the sandbox's login node over real ssh, for
// jobs named name, with a budget of its own that never slows the test.
func sandboxQueue(t *testing.T, env sandboxtest.Env, name string) *Queue {
	t.Helper()
	login, err := sshrun.ParseLogin(env.Login)
	if err != nil {
		t.Fatal(err)
	}
	ssh := sshrun.New(sshrun.Config{Program: testutil.LookPath(t, "ssh"), Logins: []sshrun.Login{login}, Port: env.Port,
		Key: env.Key, KnownHosts: env.KnownHosts, Timeout: 30 * time.Second, Multiplex: true, MaxSessions: 8}, nil)
	t.Cleanup(func() { ssh.Close(context.Background()) })
	user, _, _ := strings.Cut(env.Login, "@")
	return New(ssh, Config{JobName: name, User: user, Host: login.Host(),
		BudgetKey: fmt.Sprintf("queuetest%d@%s", os.Getpid(), login.Host()), MaxRPCRate: 1000})
}

// TestIntegrationQueueCommands runs each of the queue's commands against
// the sandbox's real Slurm over real ssh: the facts, the nodes' sizes and
// the default partition's time limits are the sandbox's; a held job submitted is found by Jobs, Lookup, State
// and the counts, typed, and is gone after Cancel; an id that is not a
// job's is refused before anything runs; every command is counted.
func TestIntegrationQueueCommands(t *testing.T) {
	env := sandboxtest.Require(t)
	name := fmt.Sprintf("fluksio-queuetest%d", os.Getpid())
	q := sandboxQueue(t, env, name)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	facts, err := q.Facts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if facts.Version != env.Version || facts.Cluster == "" || facts.MaxArraySize == 0 || facts.MaxJobCount <= 0 {
		t.Errorf("facts %+v; want version %s, a cluster, a MaxArraySize and a MaxJobCount", facts, env.Version)
	}

	groups, err := q.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(groups, func(g NodeGroup) bool { return g.Partition == env.Partition })
	if i < 0 || !groups[i].Default || groups[i].CPUs != env.CPUs || groups[i].Unmeasured {
		t.Errorf("node groups %+v; want the default partition %s with nodes of %d CPUs", groups, env.Partition, env.CPUs)
	}

	parts, err := q.PartitionTimes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	i = slices.IndexFunc(parts, func(p PartitionTimes) bool { return p.Name == env.Partition })
	if i < 0 || !parts[i].IsDefault || parts[i].Default.Unread || parts[i].Max.Unread || parts[i].Max.Raw == "" {
		t.Errorf("partition times %+v; want the default partition %s with its DefaultTime and MaxTime read", parts, env.Partition)
	}

	comment := fmt.Sprintf("queuetest-%d", os.Getpid())
	script := fmt.Sprintf("#!/bin/sh\n#SBATCH --job-name=%s\n#SBATCH --comment=%s\n#SBATCH --partition=%s\n#SBATCH --time=5\n#SBATCH --output=/dev/null\nsleep 300\n",
		name, comment, env.Partition)
	before := q.Calls()
	job, err := q.Submit(ctx, []byte(script), "--hold")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Command("scancel", job).Run() })
	if q.Calls() != before+1 {
		t.Errorf("a submission ran %d commands; want 1", q.Calls()-before)
	}

	jobs, err := q.Jobs(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 1 || jobs[0].ID != job || jobs[0].State != "PENDING" || jobs[0].Comment != comment || jobs[0].Partial {
		t.Errorf("Jobs = %+v; want job %s pending, commented %s", jobs, job, comment)
	}
	if found, err := q.Lookup(ctx, comment); err != nil || found != job {
		t.Errorf("Lookup(%s) = %q, %v; want %s", comment, found, err, job)
	}
	if state, reason, err := q.State(ctx, job); err != nil || state != "PENDING" || reason == "" {
		t.Errorf("State(%s) = %q, %q, %v; want PENDING with a reason", job, state, reason, err)
	}
	for what, count := range map[string]func(context.Context) (int, error){"CountQueued": q.CountQueued, "CountAll": q.CountAll} {
		if n, err := count(ctx); err != nil || n < 1 {
			t.Errorf("%s = %d, %v; want the held job counted", what, n, err)
		}
	}
	if user, err := q.LoginUser(ctx); err != nil || !strings.HasPrefix(env.Login, user+"@") {
		t.Errorf("LoginUser = %q, %v; want the login's user", user, err)
	}

	before = q.Calls()
	if err := q.Cancel(ctx, []string{job, "1;rm -rf ~"}); !errors.Is(err, shared.ErrInvalidArgument) || q.Calls() != before {
		t.Errorf("Cancel of a bad id: %v after %d commands; want ErrInvalidArgument before any", err, q.Calls()-before)
	}
	if err := q.Cancel(ctx, []string{job}); err != nil {
		t.Fatal(err)
	}
	for {
		jobs, err := q.Jobs(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		if len(jobs) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("job %s still queued after Cancel: %+v", job, jobs)
		case <-time.After(200 * time.Millisecond):
		}
	}

	var commands []string
	for _, c := range q.Commands() {
		commands = append(commands, c.Command)
	}
	for _, want := range []string{"sbatch", "scancel", "scontrol", "sinfo", "squeue"} {
		if !slices.Contains(commands, want) {
			t.Errorf("commands counted %v; want %s among them", commands, want)
		}
	}
}

// TestIntegrationQueueRefusals: what Slurm refuses comes back typed. An
// sbatch of a partition that does not exist is a *CommandError carrying
// sbatch's words; squeue's --only-job-state is Slurm 24.05's, and an
// older squeue's refusal of it is an error, never rows.
func TestIntegrationQueueRefusals(t *testing.T) {
	env := sandboxtest.Require(t)
	q := sandboxQueue(t, env, fmt.Sprintf("fluksio-queuetest%d", os.Getpid()))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	_, err := q.Submit(ctx, []byte("#!/bin/sh\n#SBATCH --partition=nosuchpartition\ntrue\n"))
	var ce *CommandError
	if !errors.As(err, &ce) || !strings.Contains(string(ce.Stderr), "sbatch: error") {
		t.Errorf("an sbatch Slurm refuses: %v; want a CommandError with sbatch's words", err)
	}

	rows, err := q.States(ctx, []string{"1"})
	older := strings.HasPrefix(env.Version, "22.") || strings.HasPrefix(env.Version, "23.")
	switch {
	case older && (err == nil || rows != nil):
		t.Errorf("States on Slurm %s: %+v, %v; want squeue's refusal", env.Version, rows, err)
	case !older && err != nil:
		t.Errorf("States on Slurm %s: %v", env.Version, err)
	}
}
