package slurm

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/sbatch"
)

// A profile's machines last as long as its job's time limit: the
// profile's --time, else its partition's DefaultTime, capped by the
// partition's MaxTime (with DefaultTime=NONE a job gets MaxTime). The
// engine chooses a profile by it (a task's timeout must fit), so a
// profile without --time needs the partition's times, read with one
// scontrol show partition when Shapes is asked, and no other call.

// partitionTimesArgs reads every partition the login user sees, one
// line each, key=value words.
var partitionTimesArgs = []string{"scontrol", "show", "partition", "-o"}

// timeLimit is one of a partition's time limits as scontrol prints it:
// a duration, UNLIMITED, NONE (DefaultTime alone: no default), or
// something this parser does not read.
type timeLimit struct {
	// raw is what scontrol printed, for the words a shape carries.
	raw       string
	d         time.Duration
	unlimited bool
	none      bool
	unread    bool
}

// partTimes is one partition's time limits.
type partTimes struct {
	name      string
	isDefault bool
	def, max  timeLimit
}

// parseTimeLimit reads one DefaultTime or MaxTime value. Slurm prints
// UNLIMITED, NONE, or secs2time_str's D-HH:MM:SS and HH:MM:SS (the same
// from 22.05 to 26.05; releases before 2.2 printed MaxTime in minutes,
// which sbatch.ParseTimeLimit reads too, as MM:SS is).
func parseTimeLimit(raw string) timeLimit {
	l := timeLimit{raw: raw}
	switch strings.ToUpper(raw) {
	case "UNLIMITED", "INFINITE":
		l.unlimited = true
		return l
	case "NONE":
		l.none = true
		return l
	}
	d, ok := sbatch.ParseTimeLimit(raw)
	if !ok {
		l.unread = true
		return l
	}
	l.d = d
	return l
}

// parsePartitionTimes reads scontrol show partition -o's lines, e.g.
//
//	PartitionName=debug ... Default=YES ... DefaultTime=NONE ... MaxTime=1-00:00:00 ...
//
// A partition without either word is left out: its times are unknown.
func parsePartitionTimes(out string) []partTimes {
	var parts []partTimes
	for _, line := range strings.Split(out, "\n") {
		var p partTimes
		var haveDef, haveMax bool
		for _, w := range strings.Fields(line) {
			k, v, ok := strings.Cut(w, "=")
			if !ok {
				continue
			}
			switch k {
			case "PartitionName":
				p.name = v
			case "Default":
				p.isDefault = v == "YES"
			case "DefaultTime":
				p.def, haveDef = parseTimeLimit(v), true
			case "MaxTime":
				p.max, haveMax = parseTimeLimit(v), true
			}
		}
		if p.name != "" && haveDef && haveMax {
			parts = append(parts, p)
		}
	}
	return parts
}

// lifetime is how long a job without --time lasts in the partition:
// the smaller of DefaultTime and MaxTime (NONE and UNLIMITED are no
// bound), with the words of the one that bounds it. ok is false when
// either is unread.
func (p partTimes) lifetime() (d time.Duration, from string, ok bool) {
	if p.def.unread || p.max.unread {
		return 0, "", false
	}
	switch {
	case p.def.d > 0 && (p.max.d == 0 || p.def.d <= p.max.d):
		return p.def.d, fmt.Sprintf("partition %s's DefaultTime=%s", p.name, p.def.raw), true
	case p.max.d > 0:
		return p.max.d, fmt.Sprintf("partition %s's MaxTime=%s", p.name, p.max.raw), true
	}
	return 0, shared.LifetimeUnlimited, true
}

// profileLifetime is how long a machine of prof lasts: its --time, else
// what its partitions give a job without one (the shortest, where it
// names several), from parts. ok is false when that is not known: the
// partition is not among parts (hidden, or parts unread).
func profileLifetime(prof Profile, parts []partTimes) (d time.Duration, from string, ok bool) {
	if limit, has := sbatch.TimeLimit(prof.Sbatch); has {
		return limit, "--time=" + timeOption(prof.Sbatch), true
	}
	names := profilePartitions(prof)
	if names == nil {
		names = []string{""}
	}
	from = shared.LifetimeUnlimited
	for _, name := range names {
		i := -1
		for j, p := range parts {
			if (name == "" && p.isDefault) || (name != "" && p.name == name) {
				i = j
				break
			}
		}
		if i < 0 {
			return 0, "", false
		}
		pd, pfrom, pok := parts[i].lifetime()
		if !pok {
			return 0, "", false
		}
		if pd > 0 && (d == 0 || pd < d) {
			d, from = pd, pfrom
		}
	}
	return d, from, true
}

// timeOption is the value of the last --time (or -t) of the sbatch
// lines, as written.
func timeOption(lines []string) string {
	var v string
	for _, o := range sbatch.Opts(lines) {
		if (o.Short == 't' || o.Long == "--time") && o.HasValue {
			v = strings.TrimSpace(o.Value)
		}
	}
	return v
}

// needsPartitionTimes reports whether a profile of cfg has no --time,
// so that its lifetime comes from its partition.
func (s *settings) needsPartitionTimes() bool {
	for _, p := range s.Profiles {
		if _, ok := sbatch.TimeLimit(p.Sbatch); !ok {
			return true
		}
	}
	return false
}

// readPartitionTimes reads the partitions' time limits, nil when they
// cannot be read now (the shapes then say those profiles' lifetimes are
// unknown).
func (p *Provisioner) readPartitionTimes(ctx context.Context, cfg *settings) []partTimes {
	p.mu.Lock()
	transport := p.ssh
	p.mu.Unlock()
	if transport == nil {
		// Settings without Configure (a unit test's): nothing to ask.
		return nil
	}
	if need, _ := p.loginNeeded(cfg); need {
		return nil
	}
	stdout, stderr, err := p.call(ctx, nil, partitionTimesArgs...)
	if err != nil {
		cfg.log.Warn("cannot read the partitions' DefaultTime and MaxTime; the lifetime of a profile without --time is unknown to the engine, which takes it as unlimited",
			"error", withStderr(err, stderr))
		return nil
	}
	return parsePartitionTimes(string(stdout))
}
