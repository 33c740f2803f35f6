package slurm

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fluksio/provision/shared"
	"github.com/fluksio/provision/slurm/internal/queue"
)

// TestParsePartitionTimes: every form scontrol prints a partition's
// DefaultTime and MaxTime in (UNLIMITED, NONE, D-HH:MM:SS, HH:MM:SS,
// MM:SS, minutes) is read, from Slurm 22.05's, 24.11's and 26.05's real
// output (the sandbox's partition updated between captures) and from
// lines of the other forms;
// a value it does not read leaves the partition's lifetime unknown.
func TestParsePartitionTimes(t *testing.T) {
	t.Parallel()
	type want struct {
		d    time.Duration
		from string
	}
	// Each release's real output, the sandbox's partition updated
	// between captures.
	releases := map[string][]want{
		"22.05.8": {
			{2 * time.Minute, "partition debug's DefaultTime=00:02:00"},
			{0, shared.LifetimeUnlimited},
			{10 * time.Minute, "partition debug's MaxTime=00:10:00"},
			{24 * time.Hour, "partition debug's MaxTime=1-00:00:00"},
		},
		"24.11.5": {
			{2 * time.Minute, "partition debug's DefaultTime=00:02:00"},
			{0, shared.LifetimeUnlimited},
			{10 * time.Minute, "partition debug's MaxTime=00:10:00"},
		},
		"26.05.5": {
			{2 * time.Minute, "partition debug's DefaultTime=00:02:00"},
			{0, shared.LifetimeUnlimited},
			{10 * time.Minute, "partition debug's MaxTime=00:10:00"},
			{24 * time.Hour, "partition debug's MaxTime=1-00:00:00"},
		},
	}
	for release, wants := range releases {
		out, err := os.ReadFile(filepath.Join("testdata", "slurm-versions", release, "scontrol-show-partition.txt"))
		if err != nil {
			t.Fatal(err)
		}
		got := queue.ParsePartitionTimes(string(out))
		if len(got) != len(wants) {
			t.Fatalf("%s: %d partitions read, want %d: %+v", release, len(got), len(wants), got)
		}
		for i, w := range wants {
			if !got[i].IsDefault || got[i].Name != "debug" {
				t.Errorf("%s line %d: %+v, want the default partition debug", release, i+1, got[i])
			}
			d, from, ok := partitionLifetime(got[i])
			if !ok || d != w.d || from != w.from {
				t.Errorf("%s line %d: lifetime %s %q %v, want %s %q", release, i+1, d, from, ok, w.d, w.from)
			}
		}
	}

	forms := []struct {
		line string
		d    time.Duration
		from string
		ok   bool
	}{
		{"PartitionName=a DefaultTime=2-03:04:05 MaxTime=UNLIMITED", 2*24*time.Hour + 3*time.Hour + 4*time.Minute + 5*time.Second, "partition a's DefaultTime=2-03:04:05", true},
		{"PartitionName=a DefaultTime=05:00 MaxTime=UNLIMITED", 5 * time.Minute, "partition a's DefaultTime=05:00", true},
		{"PartitionName=a DefaultTime=NONE MaxTime=30", 30 * time.Minute, "partition a's MaxTime=30", true},
		{"PartitionName=a DefaultTime=01:00:00 MaxTime=00:30:00", 30 * time.Minute, "partition a's MaxTime=00:30:00", true},
		{"PartitionName=a DefaultTime=NONE MaxTime=UNLIMITED", 0, shared.LifetimeUnlimited, true},
		{"PartitionName=a DefaultTime=INVALID MaxTime=UNLIMITED", 0, "", false},
	}
	for _, tc := range forms {
		ps := queue.ParsePartitionTimes(tc.line)
		if len(ps) != 1 {
			t.Errorf("%q: %d partitions read", tc.line, len(ps))
			continue
		}
		d, from, ok := partitionLifetime(ps[0])
		if d != tc.d || from != tc.from || ok != tc.ok {
			t.Errorf("%q: lifetime %s %q %v, want %s %q %v", tc.line, d, from, ok, tc.d, tc.from, tc.ok)
		}
	}
	if ps := queue.ParsePartitionTimes("PartitionName=a State=UP\nnonsense\n"); len(ps) != 0 {
		t.Errorf("a partition without its times: read %+v, want none", ps)
	}
}

// TestProfileLifetime: a profile lasts its --time, else its partition's
// (the default partition when it names none, the shortest of those it
// names), and an unknown time when the partition is not known.
func TestProfileLifetime(t *testing.T) {
	t.Parallel()
	parts := queue.ParsePartitionTimes("PartitionName=debug Default=YES DefaultTime=00:02:00 MaxTime=1-00:00:00\n" +
		"PartitionName=long Default=NO DefaultTime=NONE MaxTime=2-00:00:00\n" +
		"PartitionName=free Default=NO DefaultTime=NONE MaxTime=UNLIMITED\n")
	tests := []struct {
		name   string
		sbatch []string
		d      time.Duration
		from   string
		ok     bool
	}{
		{"its --time", []string{"--partition=long", "--time=00:05:00"}, 5 * time.Minute, "--time=00:05:00", true},
		{"its -t, the last one", []string{"-t 10", "-t 7"}, 7 * time.Minute, "--time=7", true},
		{"the default partition's DefaultTime", nil, 2 * time.Minute, "partition debug's DefaultTime=00:02:00", true},
		{"its partition's MaxTime", []string{"--partition=long"}, 48 * time.Hour, "partition long's MaxTime=2-00:00:00", true},
		{"the shortest of its partitions", []string{"--partition=long,debug"}, 2 * time.Minute, "partition debug's DefaultTime=00:02:00", true},
		{"an unlimited partition", []string{"-p free"}, 0, shared.LifetimeUnlimited, true},
		{"a partition not listed", []string{"--partition=hidden"}, 0, "", false},
	}
	for _, tc := range tests {
		d, from, ok := profileLifetime(Profile{Name: "p", Sbatch: tc.sbatch}, parts)
		if d != tc.d || from != tc.from || ok != tc.ok {
			t.Errorf("%s: %s %q %v, want %s %q %v", tc.name, d, from, ok, tc.d, tc.from, tc.ok)
		}
	}
	if _, _, ok := profileLifetime(Profile{Name: "p"}, nil); ok {
		t.Error("no --time and the partitions unread: want unknown")
	}
}
