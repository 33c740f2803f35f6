package shared

import "testing"

// TestShapeFits: a shape fits a need when it has at least the need's
// CPUs and GPUs, enough memory where both sides say, and the label among
// its labels or as its profile name.
func TestShapeFits(t *testing.T) {
	t.Parallel()
	gpu := Shape{Profile: "gpu", CPUs: 8, GPUs: 2, RAMMB: 64000, Labels: []string{"cuda", "a100"}}
	unsized := Shape{Profile: "cpu", CPUs: 4} // a profile that does not say its memory
	tests := []struct {
		name  string
		shape Shape
		need  Need
		fits  bool
	}{
		{"nothing asked", gpu, Need{}, true},
		{"exactly its size", gpu, Need{CPUs: 8, GPUs: 2, RAMMB: 64000}, true},
		{"one CPU too many", gpu, Need{CPUs: 9}, false},
		{"one GPU too many", gpu, Need{GPUs: 3}, false},
		{"GPUs of a CPU shape", unsized, Need{GPUs: 1}, false},
		{"one MB too many", gpu, Need{RAMMB: 64001}, false},
		{"memory of a shape that does not say", unsized, Need{RAMMB: 1 << 40}, true},
		{"no memory asked", gpu, Need{RAMMB: 0, CPUs: 1}, true},
		{"one of its labels", gpu, Need{Label: "a100"}, true},
		{"its profile name as label", gpu, Need{Label: "gpu"}, true},
		{"a label it lacks", gpu, Need{Label: "h100"}, false},
		{"a label it lacks, small enough", unsized, Need{CPUs: 1, Label: "cuda"}, false},
		{"label case matters", gpu, Need{Label: "CUDA"}, false},
		{"right label, too small", gpu, Need{CPUs: 16, Label: "cuda"}, false},
	}
	for _, tc := range tests {
		if got := tc.shape.Fits(tc.need); got != tc.fits {
			t.Errorf("%s: %+v fits %+v = %v; want %v", tc.name, tc.shape, tc.need, got, tc.fits)
		}
	}
	if (Shape{Profile: "x"}).HasLabel("") {
		t.Error("HasLabel(\"\") on a shape with a profile: want false")
	}
}
