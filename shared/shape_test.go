package shared

import (
	"testing"
	"time"
)

// TestShapeFits: a shape fits a need when it has at least the need's
// CPUs and GPUs, enough memory where both sides say, and the label among
// its labels or as its profile name, and a lifetime at least the need's
// where both say.
func TestShapeFits(t *testing.T) {
	t.Parallel()
	gpu := Shape{Profile: "gpu", CPUs: 8, GPUs: 2, RAMMB: 64000, Labels: []string{"cuda", "a100"}}
	unsized := Shape{Profile: "cpu", CPUs: 4} // a profile that does not say its memory
	short := Shape{Profile: "short", CPUs: 4, Lifetime: 5 * time.Minute, LifetimeFrom: "--time=00:05:00"}
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
		{"exactly its lifetime", short, Need{CPUs: 1, Lifetime: 5 * time.Minute}, true},
		{"a second longer than its lifetime", short, Need{CPUs: 1, Lifetime: 5*time.Minute + time.Second}, false},
		{"no lifetime asked", short, Need{CPUs: 1}, true},
		{"a lifetime of a shape that does not say", unsized, Need{Lifetime: 100 * time.Hour}, true},
		{"long enough, too small", short, Need{CPUs: 8, Lifetime: time.Minute}, false},
	}
	for _, tc := range tests {
		if got := tc.shape.Fits(tc.need); got != tc.fits {
			t.Errorf("%s: %+v fits %+v = %v; want %v", tc.name, tc.shape, tc.need, got, tc.fits)
		}
	}
	if !short.HoldsResources(Need{CPUs: 4, Lifetime: time.Hour}) || short.HoldsResources(Need{CPUs: 5}) {
		t.Error("HoldsResources: want the size alone, whatever the lifetime")
	}
	if (Shape{Profile: "x"}).HasLabel("") {
		t.Error("HasLabel(\"\") on a shape with a profile: want false")
	}
}
