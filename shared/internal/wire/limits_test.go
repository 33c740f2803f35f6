package wire

import (
	"strings"
	"testing"

	"github.com/fluksio/provision/shared"
)

// A plugin's counters become metric labels in the engine, so what it
// sends is bounded before anyone sees it: a class outside the contract's
// is "other", label values are short, there are few commands, and a
// histogram that is not one is dropped while its calls still count.
func TestClipCounters(t *testing.T) {
	long := strings.Repeat("é", 100)
	var cmds []shared.CommandStats
	for range maxCounterCommands + 5 {
		cmds = append(cmds, shared.CommandStats{Command: "c", Calls: 3})
	}
	cmds[0] = shared.CommandStats{Command: long, Calls: 3, Errors: -1, Buckets: []float64{1, 0.5}, BucketCounts: []int64{1, 2}}
	cmds[1] = shared.CommandStats{Command: "ok", Calls: 3, Buckets: []float64{0.5, 1}, BucketCounts: []int64{1, 3}}
	cmds[2] = shared.CommandStats{Command: "more than called", Calls: 1, Buckets: []float64{1}, BucketCounts: []int64{2}}
	s := clipStatus(&shared.StatusResponse{Counters: &shared.Counters{
		Failures: []shared.FailureCount{{Profile: long, Class: "worker-abc123", Count: -4}, {Profile: "p", Class: shared.FailureTimedOut, Count: 2}},
		Commands: cmds,
	}})
	c := s.Counters
	if f := c.Failures[0]; f.Class != "other" || len(f.Profile) > maxCounterLabel || f.Count != 0 {
		t.Errorf("an unknown class, a long profile and a negative count came through as %+v", f)
	}
	if c.Failures[1].Class != shared.FailureTimedOut || c.Failures[1].Count != 2 {
		t.Errorf("a good count was changed: %+v", c.Failures[1])
	}
	if len(c.Commands) != maxCounterCommands {
		t.Errorf("%d commands kept, want %d", len(c.Commands), maxCounterCommands)
	}
	if cs := c.Commands[0]; len(cs.Command) > maxCounterLabel || cs.Errors != 0 || cs.Buckets != nil || cs.Calls != 3 {
		t.Errorf("a bad histogram, a long name and negative errors came through as %+v", cs)
	}
	if cs := c.Commands[1]; len(cs.Buckets) != 2 {
		t.Errorf("a good histogram was dropped: %+v", cs)
	}
	if cs := c.Commands[2]; cs.Buckets != nil {
		t.Errorf("a histogram counting more calls than were made was kept: %+v", cs)
	}
}
