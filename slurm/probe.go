package slurm

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/internal/queue"
)

// The reach probe (validate -check -probe, CheckRequest.Probe): whether
// compute nodes can dial engine_url is the one thing a preflight cannot
// learn from the login node, and the first thing a worker needs. The
// probe submits one short job of the first profile, through the very
// script a run submits (so the worker command, or the copy a run ships,
// the partition and the prerun lines are the run's), whose worker is started with --probe: it
// asks the engine's URL for its probe answer, prints one line, and
// exits. The host serves that answer at the engine's listen address
// meanwhile, or a running engine does.
//
// Rejected: dialling from the login node, which is often on both
// networks when the nodes are on one; and srun from the check, which
// needs an interactive allocation a site may forbid. The cost: one job
// in the queue, whose wait the probe waits out within the check's
// deadline; a job that has not ended by then is cancelled, and the
// check says how long it waited and why (the pending reason).
//
// With reach = "relay" the probe still dials engine_url directly: it says
// whether the relay is needed, not whether the relay works (that is the
// relay's own session, which a run starts and reports).

// probeTag names the probe's job in its comment (tag.go).
const probeTag = "reach-probe"

// probePoll is how often the probe looks at its job in the queue.
const probePoll = time.Second

// probe runs the reach probe and records what it found.
func (c *check) probe(ctx context.Context) {
	if c.resp.Diagnostics.HasErrors() {
		c.fact("reach probe", "not run: fix the errors above first (it submits a job)")
		return
	}
	prof := c.firstProfile()
	path := []string{"engine_url"}
	dir, err := c.q.files.ensureLogDir(ctx, c.cfg)
	if err != nil {
		c.fail([]string{"log_dir"}, "Reach probe not run", "The probe's job writes its answer to log_dir: %v.", err)
		return
	}
	// With worker_command unset the run ships the worker, and so does
	// the probe, whose job runs the copy a run's jobs would.
	if _, err := c.q.files.ensureWorker(ctx, c.cfg); err != nil {
		c.fail([]string{"worker_command"}, "Reach probe not run", "The probe's job runs the worker a run ships, which could not be put on the login node: %v.", err)
		return
	}
	url := c.cfg.EngineURL
	script := c.q.sub.scriptFor(prof, url, "", probeTag, nil, [][]string{{"reach-probe: no credential"}}, true)
	out := dir + "/probe-%j.out"
	start := time.Now()
	// On the command line, which wins over the profile's own #SBATCH
	// lines: the answer is where the probe reads it.
	job, err := c.q.q.Submit(ctx, script, "--output="+out, "--error="+out)
	if ce := (*queue.CommandError)(nil); errors.As(err, &ce) {
		c.fail(path, "Reach probe not submitted", "sbatch for the probe's job (profile %s) failed: %s.", prof.Name, quoteLines(truncate(firstNonEmpty(string(ce.Stderr), ce.Err.Error()))))
		return
	}
	if err != nil {
		c.fail(path, "Reach probe not submitted", "%v.", err)
		return
	}
	file := strings.ReplaceAll(out, "%j", job)
	defer func() {
		// The answer is read; the file is not left behind.
		_, _, _ = c.q.q.Run(context.WithoutCancel(ctx), nil, "rm", "-f", "--", file)
	}()
	waited, reason, err := c.waitProbe(ctx, job)
	if err != nil {
		// Not ended within the check's deadline: it is not left to run.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		cancelErr := c.q.q.Cancel(cctx, []string{job})
		cancel()
		left := "it was cancelled"
		if cancelErr != nil {
			left = fmt.Sprintf("cancelling it failed (%v): scancel %s", cancelErr, job)
		}
		why := ""
		if reason != "" {
			why = " (pending: " + reason + ")"
		}
		c.fail(path, "Reach probe did not finish", "The probe's job %s did not end within %s%s; %s. Check again with a longer -check-timeout, or when the partition has room.",
			job, time.Since(start).Round(time.Second), why, left)
		return
	}
	said, _, err := c.q.q.Run(ctx, nil, "cat", "--", file)
	if err != nil {
		c.fail(path, "Reach probe unanswered", "The probe's job %s ended, but its output %s cannot be read: %v.", job, file, err)
		return
	}
	c.probeSaid(job, string(said), waited, prof)
}

// firstProfile is the profile written first in the configuration.
func (c *check) firstProfile() Profile {
	first := c.cfg.Profiles[0]
	for _, prof := range c.cfg.Profiles {
		if c.index[prof.Name] < c.index[first.Name] {
			first = prof
		}
	}
	return first
}

// waitProbe waits for job to leave the queue, or to complete, and says
// how long it pended; on ctx's end it returns its error and the job's
// pending reason, if it pended.
func (c *check) waitProbe(ctx context.Context, job string) (pended time.Duration, reason string, err error) {
	start := time.Now()
	var running time.Time
	t := time.NewTicker(probePoll)
	defer t.Stop()
	for {
		state, why, err := c.q.q.State(ctx, job)
		if err == nil {
			switch {
			case state == "" || endedStates[state] || state == "COMPLETING":
				// Ended (its output is written), or gone from the queue.
				if running.IsZero() {
					running = time.Now()
				}
				return running.Sub(start), "", nil
			case state == "PENDING":
				reason = why
			case running.IsZero():
				running = time.Now()
			}
		} else if strings.Contains(err.Error(), "Invalid job id") {
			// An ended job that squeue has already forgotten.
			return time.Since(start), "", nil
		}
		select {
		case <-ctx.Done():
			return time.Since(start), reason, ctx.Err()
		case <-t.C:
		}
	}
}

// probeSaid reads the probe job's output and records the answer.
func (c *check) probeSaid(job, out string, pended time.Duration, prof Profile) {
	var line string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "probe: ") {
			line = strings.TrimSpace(l)
		}
	}
	relay := c.cfg.Reach == reachRelay
	where := fmt.Sprintf("job %s of profile %s, after %s in the queue", job, prof.Name, pended.Round(time.Second))
	switch {
	case strings.HasPrefix(line, "probe: reached "):
		c.fact("reach probe", strings.TrimPrefix(line, "probe: ")+" ("+where+")", "engine_url")
		if relay {
			c.resp.Diagnostics = append(c.resp.Diagnostics, shared.Diagnostic{Severity: shared.SeverityWarning, Path: []string{"reach"},
				Summary: "The relay is not needed",
				Detail:  fmt.Sprintf("The compute nodes reach the engine at %s directly (%s): reach = \"direct\" spares the relay on the login node.", c.cfg.EngineURL, where)})
		}
	case strings.HasPrefix(line, "probe: cannot reach "):
		said := strings.TrimPrefix(line, "probe: ")
		if relay {
			c.fact("reach probe", said+" ("+where+"): the relay (reach = \"relay\") is needed, as set", "reach")
			return
		}
		c.fail([]string{"engine_url"}, "Compute nodes cannot reach the engine",
			"The probe (%s) says: %s. Set reach = \"relay\" (the provisioner then runs a relay on the login node, which the nodes dial), or an engine_url the nodes can dial.",
			where, quoteLines(said))
	default:
		// The worker never probed: not found, too old for --probe, or
		// the prerun failed. Its words are in its output.
		c.fail([]string{"worker_command"}, "Reach probe got no answer",
			"The probe (%s) printed no answer; a worker too old for --probe, or one that did not start, says so in its output: %s.",
			where, quoteLines(truncate(firstNonEmpty(strings.TrimSpace(out), "(nothing)"))))
	}
}
