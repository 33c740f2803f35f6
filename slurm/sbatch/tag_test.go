package sbatch

import "testing"

// TestTag: a tag reads back what it was written from, and a comment that
// is not a v2 tag of three valid names is no tag.
func TestTag(t *testing.T) {
	in := Tag{Engine: "prod", Epoch: "e1", Worker: "hpc-cpu-0123abcd"}
	if c := in.Comment(); c != "fluksio:v2:prod:e1:hpc-cpu-0123abcd" {
		t.Errorf("Comment = %q", c)
	}
	if out, ok := ParseTag(in.Comment()); !ok || out != in {
		t.Errorf("ParseTag(%q) = %+v, %v", in.Comment(), out, ok)
	}
	for _, c := range []string{
		"my own analysis, please keep", "fluksio:hpc-cpu-0123abcd", "fluksio:v2:prod:e1",
		"fluksio:v2:prod:e1:hpc-cpu-0123abcd:x", "fluksio:v2:prod:e1:hpc cpu", "fluksio:v2::e1:w", "", "(null)",
	} {
		if tag, ok := ParseTag(c); ok {
			t.Errorf("ParseTag(%q) = %+v", c, tag)
		}
	}
}
