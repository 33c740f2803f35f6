package slurm

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestExpandJobID reads every form squeue prints an id in: a job, a task,
// and a pending array's ranges with and without a running limit; and
// nothing else.
func TestExpandJobID(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want []string
	}{
		{"123", []string{"123"}},
		{"123_7", []string{"123_7"}},
		{"123_[4-6]", []string{"123_4", "123_5", "123_6"}},
		{"123_[4-9%2]", []string{"123_4", "123_5", "123_6", "123_7", "123_8", "123_9"}},
		{"123_[1,3,5-6]", []string{"123_1", "123_3", "123_5", "123_6"}},
		{"123_[9-4]", nil},
		{"123_[]", nil},
		{"123_[0-99999999]", nil},
		{"abc", nil},
		{"123_x", nil},
		{"123_[1-2]x", nil},
		{"-1", nil},
	}
	for _, tc := range tests {
		if got := expandJobID(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("expandJobID(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	rows := parseRows([]byte("77_[0-2%1]|PENDING|JobArrayTaskLimit|N/A|tag\n78_4|RUNNING|None|now|tag\nbanner line\n"))
	var ids []string
	for _, r := range rows {
		ids = append(ids, r.id+"="+r.state)
	}
	if want := []string{"77_0=PENDING", "77_1=PENDING", "77_2=PENDING", "78_4=RUNNING"}; !slices.Equal(ids, want) {
		t.Errorf("parseRows = %q, want %q", ids, want)
	}
}

// TestCompactIDs: a burst given up is one short scancel word per array;
// other ids pass as they are; what it writes, expandJobID reads back.
func TestCompactIDs(t *testing.T) {
	t.Parallel()
	in := []string{"9", "5_3", "5_4", "5_5", "5_9", "6_0", "5_4"}
	got := compactIDs(in)
	if want := []string{"9", "5_[3-5,9]", "6_0"}; !slices.Equal(got, want) {
		t.Fatalf("compactIDs = %q, want %q", got, want)
	}
	var back []string
	for _, id := range got {
		if !isScancelArg(id) {
			t.Errorf("%q is not a scancel argument", id)
		}
		back = append(back, expandJobID(id)...)
	}
	slices.Sort(back)
	want := slices.Compact(slices.Sorted(slices.Values(in)))
	if !slices.Equal(back, want) {
		t.Errorf("read back %q, want %q", back, want)
	}
	if s := arraySpec([]int{0, 1, 2, 3, 7, 9, 10}); s != "0-3,7,9-10" {
		t.Errorf("arraySpec = %q", s)
	}
}

// TestProfileOfArrayTask: an array task's worker name ends in -<task>,
// and a profile name may end in digits too; the configured profile wins.
func TestProfileOfArrayTask(t *testing.T) {
	t.Parallel()
	s := &settings{name: "hpc", Config: Config{Profiles: []Profile{{Name: "cpu"}, {Name: "gpu-2"}}}}
	tests := []struct{ worker, profile, why string }{
		{"hpc-cpu-0a1b2c3d", "cpu", ""},
		{"hpc-cpu-0a1b2c3d-17", "cpu", ""},
		{"hpc-gpu-2-0a1b2c3d", "gpu-2", ""},
		{"hpc-gpu-2-0a1b2c3d-3", "gpu-2", ""},
		{"hpc-tpu-0a1b2c3d-3", "tpu", "not configured"},
		{"other-cpu-0a1b2c3d", "", "not a worker"},
	}
	for _, tc := range tests {
		profile, why := s.profileOf(tc.worker)
		if profile != tc.profile || (tc.why == "") != (why == "") || !strings.Contains(why, tc.why) {
			t.Errorf("profileOf(%q) = %q, %q; want %q, %q", tc.worker, profile, why, tc.profile, tc.why)
		}
	}
	if w := machineWorker("hpc-cpu-0a1b2c3d", "55_"+strconv.Itoa(12)); w != "hpc-cpu-0a1b2c3d-12" {
		t.Errorf("machineWorker = %q", w)
	}
}

// FuzzSqueueID: whatever squeue prints as an id, expandJobID either
// refuses it or returns at most maxExpand job or task ids, each of which
// scancel may be given, and compactIDs writes them back as words that
// read back the same.
func FuzzSqueueID(f *testing.F) {
	for _, s := range []string{"123", "123_7", "123_[4-9%2]", "123_[1,3,5-7]", "123_[0-4000001]", "1_[]", "1_[,]", "1_[1-]", "9_[3-1]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ids := expandJobID(s)
		if len(ids) > maxExpand {
			t.Fatalf("expandJobID(%q): %d ids", s, len(ids))
		}
		for _, id := range ids {
			if !isJobRef(id) {
				t.Fatalf("expandJobID(%q) gave %q, not a job or task", s, id)
			}
		}
		var back []string
		for _, w := range compactIDs(ids) {
			if !isScancelArg(w) {
				t.Fatalf("compactIDs wrote %q", w)
			}
			back = append(back, expandJobID(w)...)
		}
		if !slices.Equal(slices.Compact(slices.Sorted(slices.Values(back))), slices.Compact(slices.Sorted(slices.Values(ids)))) {
			t.Fatalf("%q: expanded %q, compacted and read back %q", s, ids, back)
		}
	})
}
