package wire

import (
	"bytes"
	"github.com/hashicorp/go-hclog"
	"strings"
	"testing"
	"unicode"

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

// TestRepeatedLinesHeldBack: the same line a hundred times is one line;
// the next different line is preceded by a count of the copies held back;
// the same words with other values are different lines.
func TestRepeatedLinesHeldBack(t *testing.T) {
	var buf bytes.Buffer
	l := LimitLogger(hclog.New(&hclog.LoggerOptions{Output: &buf, Level: hclog.Trace})).Named("p")
	for range 100 {
		l.Info("job still pending", "job", "7", "timestamp", "2026-12-03T00:00:00Z")
	}
	l.Info("job still pending", "job", "8")
	l.Named("other").Info("job still pending", "job", "8")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("%d lines, want 4 (the line, the count, a line of another job, the same from another logger):\n%s", len(lines), buf.String())
	}
	if !strings.Contains(lines[1], "copies held back") || !strings.Contains(lines[1], "copies=99") {
		t.Errorf("no count of the 99 copies held back: %s", lines[1])
	}
	if strings.Contains(buf.String(), "timestamp=") {
		t.Errorf("a relayed line kept the plugin's own timestamp:\n%s", buf.String())
	}
}

// TestClipEventClass: a failure class outside the contract's reaches the
// engine as "other" (it may become a metric label); none stays none.
func TestClipEventClass(t *testing.T) {
	for in, want := range map[shared.FailureClass]shared.FailureClass{
		"": "", shared.FailureTransient: shared.FailureTransient, shared.FailureDiedBeforeAttach: shared.FailureDiedBeforeAttach,
		"worker-abc123": "other", shared.FailureClass(strings.Repeat("x", 1<<20)): "other",
	} {
		if got := ClipEvent(shared.Event{Class: in}).Class; got != want {
			t.Errorf("class %.20q came through as %.20q; want %q", in, got, want)
		}
	}
}

// TestLimitLoggerEscapes: a plugin's log line reaches the engine's
// logger with every control and bidi character escaped, in its message,
// its keys, its values and its logger's name, in text and in JSON.
func TestLimitLoggerEscapes(t *testing.T) {
	const evil = "hpc\u202etxt\x1b[2J\u0085\u2066"
	for _, asJSON := range []bool{false, true} {
		var buf bytes.Buffer
		l := LimitLogger(hclog.New(&hclog.LoggerOptions{Output: &buf, Level: hclog.Trace, JSONFormat: asJSON})).Named("p" + evil)
		l.Warn("profile "+evil+" refused", "name"+evil, evil, "list", []any{evil})
		out := buf.String()
		for _, r := range out {
			if r != '\n' && r != '\t' && !unicode.IsGraphic(r) {
				t.Errorf("json %v: %U raw in %q", asJSON, r, out)
				break
			}
		}
		if !strings.Contains(out, `\u202e`) {
			t.Errorf("json %v: no \\u202e in %q", asJSON, out)
		}
	}
}
