package queue

import (
	"context"
	"errors"
	"regexp"
	"strconv"
	"strings"
)

// What scontrol show config says that the provisioner adapts to, and
// what sinfo says of the nodes' sizes.

// DefaultMaxJobCount is Slurm's own MaxJobCount, taken where the
// configuration does not say.
const DefaultMaxJobCount = 10000

var (
	// maxArraySizeRE finds MaxArraySize in scontrol show config.
	maxArraySizeRE = regexp.MustCompile(`(?m)^MaxArraySize\s*=\s*([0-9]+)\s*$`)
	// maxJobCountRE finds MaxJobCount in scontrol show config.
	maxJobCountRE  = regexp.MustCompile(`(?m)^MaxJobCount\s*=\s*([0-9]+)\s*$`)
	slurmVersionRE = regexp.MustCompile(`(?m)^SLURM_VERSION\s*=\s*(\S+)`)
	clusterNameRE  = regexp.MustCompile(`(?m)^ClusterName\s*=\s*(\S+)`)
)

// Facts is what scontrol show config says that the provisioner adapts
// to.
type Facts struct {
	Version string
	Cluster string
	// MaxArraySize is MaxArraySize, -1 when the output does not say.
	MaxArraySize int
	// MaxJobCount is MaxJobCount, Slurm's default when the output does
	// not say.
	MaxJobCount int
	// RateLimit is slurmctld's RPC rate limiter (ratelimit.go).
	RateLimit RateLimit
	// PingRationed is the configuration followed by its closing ping
	// refused by the limiter (PingRationed).
	PingRationed bool
}

// ParseFacts reads scontrol show config's output. ok is false when it
// holds no configuration: slurmctld never answered. Whatever follows the
// configuration (the ping of each controller at its end) does not make
// what it says less the controller's.
func ParseFacts(out []byte) (c Facts, ok bool) {
	if !configHeaderRE.Match(out) {
		return Facts{}, false
	}
	c.MaxArraySize = -1
	if m := slurmVersionRE.FindSubmatch(out); m != nil {
		c.Version = string(m[1])
	}
	if m := clusterNameRE.FindSubmatch(out); m != nil {
		c.Cluster = string(m[1])
	}
	if m := maxArraySizeRE.FindSubmatch(out); m != nil {
		if n, err := strconv.Atoi(string(m[1])); err == nil {
			c.MaxArraySize = n
		}
	}
	c.MaxJobCount = DefaultMaxJobCount
	if m := maxJobCountRE.FindSubmatch(out); m != nil {
		if n, err := strconv.Atoi(string(m[1])); err == nil && n > 0 {
			c.MaxJobCount = n
		}
	}
	c.RateLimit = ParseRateLimit(out)
	c.PingRationed = PingRationed(out)
	return c, true
}

// Facts reads the cluster's facts with scontrol show config, and keeps
// its rate limiter for the budget and the readings of the commands that
// follow. A configuration printed and then a DOWN from its closing ping
// is the limiter refusing the ping: the facts hold. An error is a
// *CommandError when no configuration came back.
func (q *Queue) Facts(ctx context.Context) (Facts, error) {
	stdout, stderr, err := q.Run(ctx, nil, "scontrol", "show", "config")
	c, ok := ParseFacts(stdout)
	if !ok {
		if err == nil {
			err = errors.New("scontrol show config printed no configuration")
		}
		return Facts{}, &CommandError{Stdout: stdout, Stderr: stderr, Err: err}
	}
	q.SetRateLimit(c.RateLimit)
	return c, nil
}

// nodesArgs is what Nodes reads: one line per group of nodes of the same
// partition, CPUs, memory (MB) and generic resources, -e so that a group
// is never a minimum with "+". The fields and their words are the same
// on 22.05, 24.11 and 26.05.
var nodesArgs = []string{"sinfo", "-h", "-e", "-o", "%P|%c|%m|%G"}

// NodeGroup is one line of sinfo: nodes of one partition and one size.
type NodeGroup struct {
	Partition string
	// Default is whether the partition is the default one (sinfo's '*').
	Default bool
	CPUs    int
	MemMB   int64
	// Gres are the generic resources, one item each ("gpu:a100:4"),
	// their socket lists dropped.
	Gres []string
	// Unmeasured is a group whose CPUs or memory sinfo did not give as
	// numbers.
	Unmeasured bool
}

// Nodes reads the nodes' sizes, a group of a partition and a size a
// line, with one sinfo.
func (q *Queue) Nodes(ctx context.Context) ([]NodeGroup, error) {
	stdout, stderr, err := q.Run(ctx, nil, nodesArgs...)
	if err != nil {
		return nil, WithStderr(err, stderr)
	}
	return ParseNodes(string(stdout)), nil
}

// ParseNodes reads sinfo's lines (nodesArgs), e.g.
//
//	debug*|50|16000|gpu:2
//	debug*|50|16000|(null)
//	gpu|64|512000|gpu:a100:4(S:0-1),mps:400
func ParseNodes(out string) []NodeGroup {
	var groups []NodeGroup
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(strings.TrimSpace(line), "|")
		if len(f) != 4 || f[0] == "" {
			continue
		}
		g := NodeGroup{Partition: f[0]}
		if n, ok := strings.CutSuffix(f[0], "*"); ok {
			g.Partition, g.Default = n, true
		}
		cpus, errC := strconv.Atoi(strings.TrimSuffix(f[1], "+"))
		mem, errM := strconv.ParseInt(strings.TrimSuffix(f[2], "+"), 10, 64)
		if errC != nil || errM != nil {
			g.Unmeasured = true
		} else {
			g.CPUs, g.MemMB, g.Gres = cpus, mem, splitGres(f[3])
		}
		groups = append(groups, g)
	}
	return groups
}

// splitGres splits a %G field at its commas outside parentheses, and
// drops each item's parenthesised socket list.
func splitGres(g string) []string {
	var items []string
	depth, start := 0, 0
	for i, r := range g + "," {
		switch r {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				item := g[start:min(i, len(g))]
				if j := strings.IndexByte(item, '('); j >= 0 {
					item = item[:j]
				}
				if item != "" {
					items = append(items, item)
				}
				start = i + 1
			}
		}
	}
	return items
}
