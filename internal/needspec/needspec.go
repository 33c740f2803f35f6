// Package needspec reads and writes a need as the -need flag takes it
// (cpus=N[,gpus=N][,ram_mb=N][,label=L][,count=N][,work=D]), for the
// engines of this module: host-example's -need and the soak's engine.
//
// It is not the engine kit's: a need written on a command line is a
// CLI's choice, and the kit's own surface takes a shared.Need or a
// TaskSpec. It imports only the contract (shared), so that the kit may
// use its Format in its messages without the CLI's parsing becoming
// part of its API.
package needspec

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fluksio/provision/shared"
)

// parseNeed reads a need as -need takes it:
//
//	cpus=N[,gpus=N][,ram_mb=N][,label=L]
//
// in any order. cpus defaults to 1 and may not be less; the others default
// to zero (no constraint) and empty (any machine).
func parseNeed(s string) (shared.Need, error) {
	const form = "cpus=N[,gpus=N][,ram_mb=N][,label=L]"
	n := shared.Need{CPUs: 1}
	if strings.TrimSpace(s) == "" {
		return shared.Need{}, fmt.Errorf("empty need; write %s", form)
	}
	seen := map[string]bool{}
	for _, item := range strings.Split(s, ",") {
		key, value, ok := strings.Cut(strings.TrimSpace(item), "=")
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		if !ok || key == "" {
			return shared.Need{}, fmt.Errorf("need %q: %q is not key=value; write %s", s, item, form)
		}
		if seen[key] {
			return shared.Need{}, fmt.Errorf("need %q: %s is given twice", s, key)
		}
		seen[key] = true
		switch key {
		case "label":
			if value == "" {
				return shared.Need{}, fmt.Errorf("need %q: label is empty; leave it out to take any machine", s)
			}
			n.Label = value
		case "cpus", "gpus", "ram_mb":
			v, err := strconv.ParseInt(value, 10, 32)
			if err != nil || v < 0 {
				return shared.Need{}, fmt.Errorf("need %q: %s=%q is not a whole number of at least 0", s, key, value)
			}
			switch key {
			case "cpus":
				if v < 1 {
					return shared.Need{}, fmt.Errorf("need %q: cpus must be at least 1", s)
				}
				n.CPUs = int(v)
			case "gpus":
				n.GPUs = int(v)
			case "ram_mb":
				n.RAMMB = v
			}
		default:
			return shared.Need{}, fmt.Errorf("need %q: unknown key %q; write %s", s, key, form)
		}
	}
	return n, nil
}

// Format writes a need the way Parse reads it, leaving out what
// is at its default.
func Format(n shared.Need) string {
	parts := []string{"cpus=" + strconv.Itoa(n.CPUs)}
	if n.GPUs != 0 {
		parts = append(parts, "gpus="+strconv.Itoa(n.GPUs))
	}
	if n.RAMMB != 0 {
		parts = append(parts, "ram_mb="+strconv.FormatInt(n.RAMMB, 10))
	}
	if n.Label != "" {
		parts = append(parts, "label="+n.Label)
	}
	return strings.Join(parts, ",")
}

// maxCount bounds count= in one -need, far above any burst a demo
// or a test makes.
const maxCount = 100000

// Spec is one -need flag: Count needs of one shape, each a task that
// takes Work (zero: the worker's stand-in computation).
type Spec struct {
	Need  shared.Need
	Count int
	Work  time.Duration
}

// Parse reads a -need flag: a need as parseNeed takes it, with
// count=N (how many such needs, default 1) and work=DURATION (how long
// each task takes, such as 5s) anywhere among its keys.
func Parse(s string) (Spec, error) {
	spec := Spec{Count: 1}
	var rest []string
	for _, item := range strings.Split(s, ",") {
		key, value, _ := strings.Cut(strings.TrimSpace(item), "=")
		switch strings.TrimSpace(key) {
		case "count":
			n, err := strconv.Atoi(strings.TrimSpace(value))
			if err != nil || n < 1 || n > maxCount {
				return Spec{}, fmt.Errorf("need %q: count=%q is not a whole number from 1 to %d", s, value, maxCount)
			}
			spec.Count = n
		case "work":
			d, err := time.ParseDuration(strings.TrimSpace(value))
			if err != nil || d <= 0 || d > 24*time.Hour {
				return Spec{}, fmt.Errorf("need %q: work=%q is not a duration such as 5s (more than 0, at most 24h)", s, value)
			}
			spec.Work = d
		default:
			rest = append(rest, item)
		}
	}
	n, err := parseNeed(strings.Join(rest, ","))
	if err != nil {
		return Spec{}, err
	}
	spec.Need = n
	return spec, nil
}

// List collects repeated -need flags: fs.Var(&needs, "need", ...).
type List []Spec

func (l *List) String() string {
	parts := make([]string, len(*l))
	for i, n := range *l {
		parts[i] = Format(n.Need)
		if n.Count != 1 {
			parts[i] += ",count=" + strconv.Itoa(n.Count)
		}
		if n.Work > 0 {
			parts[i] += ",work=" + n.Work.String()
		}
	}
	return strings.Join(parts, " ")
}

func (l *List) Set(s string) error {
	n, err := Parse(s)
	if err != nil {
		return err
	}
	*l = append(*l, n)
	return nil
}
