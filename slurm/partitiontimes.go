package slurm

import (
	"context"
	"fmt"
	"time"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/internal/queue"
)

// A profile's machines last as long as its job's time limit: the
// profile's --time, else its partition's DefaultTime, capped by the
// partition's MaxTime (with DefaultTime=NONE a job gets MaxTime). The
// engine chooses a profile by it (a task's timeout must fit), so a
// profile without --time needs the partition's times, read with one
// scontrol show partition when Shapes is asked, and no other call: the
// queue's PartitionTimes (slurm/internal/queue/partitions.go), which
// reads its lines.

// partitionLifetime is how long a job without --time lasts in the
// partition p: the smaller of DefaultTime and MaxTime (NONE and UNLIMITED
// are no bound), with the words of the one that bounds it. ok is false
// when either is unread.
func partitionLifetime(p queue.PartitionTimes) (d time.Duration, from string, ok bool) {
	if p.Default.Unread || p.Max.Unread {
		return 0, "", false
	}
	switch {
	case p.Default.D > 0 && (p.Max.D == 0 || p.Default.D <= p.Max.D):
		return p.Default.D, fmt.Sprintf("partition %s's DefaultTime=%s", p.Name, p.Default.Raw), true
	case p.Max.D > 0:
		return p.Max.D, fmt.Sprintf("partition %s's MaxTime=%s", p.Name, p.Max.Raw), true
	}
	return 0, shared.LifetimeUnlimited, true
}

// profileLifetime is how long a machine of prof lasts: its --time, else
// what its partitions give a job without one (the shortest, where it
// names several), from parts. ok is false when that is not known: the
// partition is not among parts (hidden, or parts unread).
func profileLifetime(prof Profile, parts []queue.PartitionTimes) (d time.Duration, from string, ok bool) {
	opts := prof.options()
	if opts.hasLimit {
		return opts.limit, "--time=" + opts.timeRaw, true
	}
	names := opts.partitions
	if names == nil {
		names = []string{""}
	}
	from = shared.LifetimeUnlimited
	for _, name := range names {
		i := -1
		for j, p := range parts {
			if (name == "" && p.IsDefault) || (name != "" && p.Name == name) {
				i = j
				break
			}
		}
		if i < 0 {
			return 0, "", false
		}
		pd, pfrom, pok := partitionLifetime(parts[i])
		if !pok {
			return 0, "", false
		}
		if pd > 0 && (d == 0 || pd < d) {
			d, from = pd, pfrom
		}
	}
	return d, from, true
}

// needsPartitionTimes reports whether a profile of cfg has no --time,
// so that its lifetime comes from its partition.
func (s *settings) needsPartitionTimes() bool {
	for _, p := range s.Profiles {
		if !p.options().hasLimit {
			return true
		}
	}
	return false
}

// readPartitionTimes reads the partitions' time limits, nil when they
// cannot be read now (the shapes then say those profiles' lifetimes are
// unknown).
func (p *Provisioner) readPartitionTimes(ctx context.Context, cfg *settings) []queue.PartitionTimes {
	p.mu.Lock()
	q := p.q
	need, _ := p.loginNeeded(cfg)
	p.mu.Unlock()
	if q == nil {
		// Settings without Configure (a unit test's): nothing to ask.
		return nil
	}
	if need {
		return nil
	}
	parts, err := q.PartitionTimes(ctx)
	if err != nil {
		cfg.log.Warn("cannot read the partitions' DefaultTime and MaxTime; the lifetime of a profile without --time is unknown to the engine, which takes it as unlimited",
			"error", err)
		return nil
	}
	return parts
}
