package slurm

import "testing"

// The lines are sinfo's (queue.ParseNodes): the first two from the 22.05
// sandbox; the others in the forms Slurm's sinfo man page gives for %G
// (a type, a socket list, several resources).
func TestParseNodeShapes(t *testing.T) {
	s := parseNodeShapes(`debug*|50|16000|gpu:2
debug*|50|16000|(null)
gpu|64|512000|gpu:a100:4(S:0-1),mps:400
gpu|128|256000|gpu:a100:2(S:0),gpu:v100:2(S:1)
odd|n/a|0|(null)
`)
	if s.def != "debug" || len(s.parts) != 3 {
		t.Fatalf("default %q, partitions %+v", s.def, s.parts)
	}
	for _, c := range []struct {
		name       string
		cpus, gpus int
		mem        int64
		unmeasured bool
	}{{"debug", 50, 2, 16000, false}, {"gpu", 128, 4, 512000, false}, {"odd", 0, 0, 0, true}} {
		p, ok := s.partition(c.name)
		if !ok || p.cpus != c.cpus || p.gpus != c.gpus || p.memMB != c.mem || p.unmeasuredShape != c.unmeasured {
			t.Errorf("partition %s: %+v, want %+v", c.name, p, c)
		}
	}
	if p, ok := s.partition(""); !ok || p.name != "debug" {
		t.Errorf("the default partition: %+v", p)
	}
	if got, want := s.names(), "debug (the default), gpu, odd"; got != want {
		t.Errorf("names %q, want %q", got, want)
	}
}
