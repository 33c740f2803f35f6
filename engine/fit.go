package engine

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fluksio/provision/internal/needspec"
	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/worker"
)

// A task no provisioner's machine can hold (larger than every shape, or
// longer than every shape's lifetime) is refused when it is submitted,
// before anything is asked for: a machine asked for it would attach, be
// unable to take it and leave, and another would be asked for in its
// place. A machine must hold the task's resources and last its timeout
// plus worker.EndMargin, since a worker leaves that long before its job
// ends and takes no task that would outlast that.

// ErrNothingHolds is what a FitError is: no machine the engine's
// provisioners can start holds the task.
var ErrNothingHolds = errors.New("no provisioner's machines can hold it")

// FitError says why no shape on offer holds a task, naming the longest
// lifetime and the largest shape there are. errors.Is(err,
// ErrNothingHolds) holds for it.
type FitError struct {
	// TooLong: some shape is large enough, none lasts long enough;
	// false: no shape is large enough.
	TooLong bool
	words   string
}

func (e *FitError) Error() string { return e.words }

// Unwrap makes errors.Is(err, ErrNothingHolds) true.
func (e *FitError) Unwrap() error { return ErrNothingHolds }

// lifetimeFor is how long a machine must last for work that runs for
// runFor (a task's timeout): runFor and the worker's end margin. Work
// without a timeout asks none (zero): how long it runs is not known.
func lifetimeFor(runFor time.Duration) time.Duration {
	if runFor <= 0 {
		return 0
	}
	return runFor + worker.EndMargin
}

// namedShape is a shape and the provisioner that offers it.
type namedShape struct {
	target string
	shape  shared.Shape
}

// fitError is why none of shapes holds n (its Lifetime set) for work of
// runFor, named what ("timeout", "work"); nil when one does, or there
// are none to judge by.
func fitError(shapes []namedShape, n shared.Need, what string, runFor time.Duration) error {
	if len(shapes) == 0 {
		return nil
	}
	targets := map[string]bool{}
	var sized []namedShape
	for _, s := range shapes {
		if s.shape.Fits(n) {
			return nil
		}
		targets[s.target] = true
		if s.shape.HoldsResources(n) {
			sized = append(sized, s)
		}
	}
	many := len(targets) > 1
	if len(sized) == 0 && n.Label != "" && !slices.ContainsFunc(shapes, func(s namedShape) bool { return s.shape.HasLabel(n.Label) }) {
		return &FitError{words: fmt.Sprintf("needs label %s, which no profile's machines carry", n.Label)}
	}
	if len(sized) == 0 {
		big := shapes[0]
		for _, s := range shapes[1:] {
			if moreDemanding(shapeNeed(s.shape), shapeNeed(big.shape)) < 0 {
				big = s
			}
		}
		return &FitError{words: fmt.Sprintf("needs %s, more than any profile's machines: the largest is %s (%s)",
			needspec.Format(n), shapeName(big, many), shapeWords(big.shape, true))}
	}
	longest := sized[0]
	for _, s := range sized[1:] {
		if s.shape.Lifetime > longest.shape.Lifetime {
			longest = s
		}
	}
	span := what + " " + shortDuration(runFor)
	if runFor <= longest.shape.Lifetime {
		span += " and the worker's " + shortDuration(worker.EndMargin) + " end margin"
	}
	verb := "is"
	if strings.Contains(span, " and ") {
		verb = "are"
	}
	if len(sized) < len(shapes) {
		return &FitError{TooLong: true, words: fmt.Sprintf("%s %s longer than the jobs of any profile that holds %s: the longest is %s (%s)",
			span, verb, needspec.Format(n), shapeName(longest, many), shapeWords(longest.shape, false))}
	}
	return &FitError{TooLong: true, words: fmt.Sprintf("%s %s longer than any profile's jobs: the longest is %s (%s)",
		span, verb, shapeName(longest, many), shapeWords(longest.shape, false))}
}

// shapeNeed is a shape's size as a need, for moreDemanding.
func shapeNeed(s shared.Shape) shared.Need {
	return shared.Need{CPUs: s.CPUs, GPUs: s.GPUs, RAMMB: s.RAMMB}
}

// shapeName is the shape's profile, with its provisioner where there are
// several.
func shapeName(s namedShape, many bool) string {
	if many {
		return s.shape.Profile + " of " + s.target
	}
	return s.shape.Profile
}

// shapeWords is a shape's lifetime in words ("5m, --time=00:05:00"),
// after its size with size.
func shapeWords(s shared.Shape, size bool) string {
	var parts []string
	if size {
		parts = append(parts, strconv.Itoa(s.CPUs)+" cpus")
		if s.GPUs > 0 {
			parts = append(parts, strconv.Itoa(s.GPUs)+" gpus")
		}
		if s.RAMMB > 0 {
			parts = append(parts, strconv.FormatInt(s.RAMMB, 10)+" MB")
		}
	}
	switch {
	case s.Lifetime > 0 && s.LifetimeFrom != "":
		parts = append(parts, shortDuration(s.Lifetime)+", "+s.LifetimeFrom)
	case s.Lifetime > 0:
		parts = append(parts, shortDuration(s.Lifetime))
	case s.LifetimeFrom == shared.LifetimeUnlimited:
		parts = append(parts, "no time limit")
	case !size:
		parts = append(parts, "time limit unknown")
	}
	return strings.Join(parts, ", ")
}

// shortDuration writes d as people do: 5m, 1h30m, 4m55s, 15s.
func shortDuration(d time.Duration) string {
	s := d.Round(time.Second).String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// offered is every shape of the router's targets, and whether every
// one of names (the provisioners configured) has said its shapes: until
// then a task cannot be judged.
func (p *router) offered(names []string) ([]namedShape, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []namedShape
	for _, name := range names {
		found := false
		for _, ts := range p.targets {
			if ts.Name == name {
				found = true
				for _, s := range ts.Shapes {
					out = append(out, namedShape{ts.Name, s})
				}
			}
		}
		if !found {
			return nil, false
		}
	}
	return out, true
}

// Holds reports whether a machine the engine's provisioners can start
// holds a task of need n that runs for runFor (its timeout; zero when
// it has none): large enough, and lasting runFor plus the worker's end
// margin. The error, a *FitError, names the longest lifetime and the
// largest shape on offer. It is nil while a provisioner has not yet
// said its shapes (its plugin starting), and with no provisioners.
// Submit checks it; a caller may check a batch before submitting any.
func (e *Engine) Holds(n shared.Need, runFor time.Duration) error {
	return e.holds(n, "timeout", runFor)
}

// holds is Holds with the work named what ("timeout", "work").
func (e *Engine) holds(n shared.Need, what string, runFor time.Duration) error {
	var names []string
	for _, s := range e.fleet.list() {
		names = append(names, s.Name())
	}
	if len(names) == 0 {
		return nil
	}
	shapes, known := e.router.offered(names)
	if !known {
		return nil
	}
	n.Lifetime = lifetimeFor(runFor)
	return fitError(shapes, n, what, runFor)
}

// HoldsWork is Holds for a need added with Add: work is how long its
// task takes.
func (e *Engine) HoldsWork(n shared.Need, work time.Duration) error {
	return e.holds(n, "work", work)
}
