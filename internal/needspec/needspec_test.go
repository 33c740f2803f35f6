package needspec

import (
	"strings"
	"testing"

	"github.com/fluksio/provision/shared"
)

var goodNeedTests = []struct {
	in   string
	want shared.Need
}{
	{"cpus=4", shared.Need{CPUs: 4}},
	{"gpus=1", shared.Need{CPUs: 1, GPUs: 1}},
	{"cpus=8,gpus=2,ram_mb=64000,label=a100", shared.Need{CPUs: 8, GPUs: 2, RAMMB: 64000, Label: "a100"}},
	{"label=gpu, cpus=2", shared.Need{CPUs: 2, Label: "gpu"}},
	{" cpus = 3 ", shared.Need{CPUs: 3}},
}

var badNeedTests = []struct {
	in, wantErr string
}{
	{"", "empty need"},
	{"cpus=0", "at least 1"},
	{"cpus=-1", "whole number"},
	{"cpus=two", "whole number"},
	{"cpus=1,cpus=2", "given twice"},
	{"cpus=1,mem=4", `unknown key "mem"`},
	{"cpus", "not key=value"},
	{"cpus=1,", "not key=value"},
	{"label=", "label is empty"},
	{"gpus=99999999999", "whole number"},
}

func TestParse(t *testing.T) {
	t.Parallel()
	for _, tc := range goodNeedTests {
		got, err := parseNeed(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseNeed(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			continue
		}
		// What Format writes, parseNeed reads back.
		if again, err := parseNeed(Format(got)); err != nil || again != got {
			t.Errorf("Format(%+v) = %q, which reads back as %+v, %v", got, Format(got), again, err)
		}
	}
	for _, tc := range badNeedTests {
		got, err := parseNeed(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("ParseNeed(%q) = %+v, %v; want an error containing %q", tc.in, got, err, tc.wantErr)
		}
	}
}

func TestList(t *testing.T) {
	t.Parallel()
	var l List
	for _, s := range []string{"cpus=2", "gpus=1,label=gpu"} {
		if err := l.Set(s); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Set("bogus"); err == nil {
		t.Error("Set(bogus) succeeded")
	}
	if got := l.String(); got != "cpus=2 cpus=1,gpus=1,label=gpu" {
		t.Errorf("String() = %q", got)
	}
}
