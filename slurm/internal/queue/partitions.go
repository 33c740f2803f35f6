package queue

import (
	"context"
	"strings"
	"time"

	"github.com/fluksio/provision/slurm/sbatch"
)

// partitionTimesArgs reads every partition the login user sees, one
// line each, key=value words.
var partitionTimesArgs = []string{"scontrol", "show", "partition", "-o"}

// TimeLimit is one of a partition's time limits as scontrol prints it:
// a duration, UNLIMITED, NONE (DefaultTime alone: no default), or
// something this parser does not read.
type TimeLimit struct {
	// Raw is what scontrol printed, for the words a shape carries.
	Raw       string
	D         time.Duration
	Unlimited bool
	None      bool
	Unread    bool
}

// PartitionTimes is one partition's time limits.
type PartitionTimes struct {
	Name string
	// IsDefault is whether the partition is the default one (Default=YES).
	IsDefault bool
	// Default and Max are its DefaultTime and MaxTime.
	Default, Max TimeLimit
}

// PartitionTimes reads the time limits of every partition the login user
// sees, with one scontrol show partition -o: 1 RPC, as sdiag counted it
// for the job user on 22.05.8 (RPCCost).
func (q *Queue) PartitionTimes(ctx context.Context) ([]PartitionTimes, error) {
	stdout, stderr, err := q.Run(ctx, nil, partitionTimesArgs...)
	if err != nil {
		return nil, WithStderr(err, stderr)
	}
	return ParsePartitionTimes(string(stdout)), nil
}

// parseTimeLimit reads one DefaultTime or MaxTime value. Slurm prints
// UNLIMITED, NONE, or secs2time_str's D-HH:MM:SS and HH:MM:SS (the same
// from 22.05 to 26.05; releases before 2.2 printed MaxTime in minutes,
// which sbatch.ParseTimeLimit reads too, as MM:SS is).
func parseTimeLimit(raw string) TimeLimit {
	l := TimeLimit{Raw: raw}
	switch strings.ToUpper(raw) {
	case "UNLIMITED", "INFINITE":
		l.Unlimited = true
		return l
	case "NONE":
		l.None = true
		return l
	}
	d, ok := sbatch.ParseTimeLimit(raw)
	if !ok {
		l.Unread = true
		return l
	}
	l.D = d
	return l
}

// ParsePartitionTimes reads scontrol show partition -o's lines, e.g.
//
//	PartitionName=debug ... Default=YES ... DefaultTime=NONE ... MaxTime=1-00:00:00 ...
//
// A partition without either word is left out: its times are unknown.
func ParsePartitionTimes(out string) []PartitionTimes {
	var parts []PartitionTimes
	for _, line := range strings.Split(out, "\n") {
		var p PartitionTimes
		var haveDef, haveMax bool
		for _, w := range strings.Fields(line) {
			k, v, ok := strings.Cut(w, "=")
			if !ok {
				continue
			}
			switch k {
			case "PartitionName":
				p.Name = v
			case "Default":
				p.IsDefault = v == "YES"
			case "DefaultTime":
				p.Default, haveDef = parseTimeLimit(v), true
			case "MaxTime":
				p.Max, haveMax = parseTimeLimit(v), true
			}
		}
		if p.Name != "" && haveDef && haveMax {
			parts = append(parts, p)
		}
	}
	return parts
}
