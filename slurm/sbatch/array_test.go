package sbatch

import (
	"slices"
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
		if got := ExpandJobID(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("ExpandJobID(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestCompactIDs: a burst given up is one short scancel word per array;
// other ids pass as they are; what it writes, ExpandJobID reads back.
func TestCompactIDs(t *testing.T) {
	t.Parallel()
	in := []string{"9", "5_3", "5_4", "5_5", "5_9", "6_0", "5_4"}
	got := CompactIDs(in)
	if want := []string{"9", "5_[3-5,9]", "6_0"}; !slices.Equal(got, want) {
		t.Fatalf("CompactIDs = %q, want %q", got, want)
	}
	var back []string
	for _, id := range got {
		if !IsScancelArg(id) {
			t.Errorf("%q is not a scancel argument", id)
		}
		back = append(back, ExpandJobID(id)...)
	}
	slices.Sort(back)
	want := slices.Compact(slices.Sorted(slices.Values(in)))
	if !slices.Equal(back, want) {
		t.Errorf("read back %q, want %q", back, want)
	}
	if s := ArraySpec([]int{0, 1, 2, 3, 7, 9, 10}); s != "0-3,7,9-10" {
		t.Errorf("ArraySpec = %q", s)
	}
}

// FuzzSqueueID: whatever squeue prints as an id, ExpandJobID either
// refuses it or returns at most maxExpand job or task ids, each of which
// scancel may be given, and CompactIDs writes them back as words that
// read back the same.
func FuzzSqueueID(f *testing.F) {
	for _, s := range []string{"123", "123_7", "123_[4-9%2]", "123_[1,3,5-7]", "123_[0-4000001]", "1_[]", "1_[,]", "1_[1-]", "9_[3-1]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ids := ExpandJobID(s)
		if len(ids) > maxExpand {
			t.Fatalf("ExpandJobID(%q): %d ids", s, len(ids))
		}
		for _, id := range ids {
			if !IsJobRef(id) {
				t.Fatalf("ExpandJobID(%q) gave %q, not a job or task", s, id)
			}
		}
		var back []string
		for _, w := range CompactIDs(ids) {
			if !IsScancelArg(w) {
				t.Fatalf("CompactIDs wrote %q", w)
			}
			back = append(back, ExpandJobID(w)...)
		}
		if !slices.Equal(slices.Compact(slices.Sorted(slices.Values(back))), slices.Compact(slices.Sorted(slices.Values(ids)))) {
			t.Fatalf("%q: expanded %q, compacted and read back %q", s, ids, back)
		}
	})
}
