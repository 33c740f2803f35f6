package slurm

//lint:file-ignore SA1019 the plugin still honours the deprecated Covers and ShapesRequest.Label

import (
	"context"
	"slices"
	"testing"

	"github.com/fluksio/provision/shared"
)

// matchProfiles are written out of order; match order is by GPUs, then
// CPUs, then memory, with ties kept in the order written.
var matchProfiles = []Profile{
	{Name: "a100", CPUs: 16, GPUs: 2, RAMMB: 128000, Labels: []string{"cuda", "a100"}},
	{Name: "big", CPUs: 32, RAMMB: 256000},
	{Name: "small", CPUs: 2, RAMMB: 4000},
	{Name: "t4", CPUs: 8, GPUs: 1, RAMMB: 0, Labels: []string{"cuda"}},
	{Name: "small-twin", CPUs: 2, RAMMB: 4000, Labels: []string{"twin"}},
	{Name: "mem-unknown", CPUs: 8},
	{Name: "node", CPUs: 1, Exclusive: true},
}

func matchSettings() *settings {
	s := &settings{Config: Config{Profiles: slices.Clone(matchProfiles)}}
	sortProfiles(s.Profiles)
	return s
}

func TestSortProfiles(t *testing.T) {
	var got []string
	for _, p := range matchSettings().Profiles {
		got = append(got, p.Name)
	}
	want := []string{"small", "small-twin", "mem-unknown", "big", "t4", "a100", "node"}
	if !slices.Equal(got, want) {
		t.Errorf("order = %q, want %q", got, want)
	}
}

func TestMatch(t *testing.T) {
	tests := []struct {
		need shared.Need
		want string // "" for no fit
	}{
		{shared.Need{}, "small"},
		{shared.Need{CPUs: 1}, "small"},
		{shared.Need{CPUs: 2, RAMMB: 4000}, "small"},
		{shared.Need{CPUs: 2, RAMMB: 4001}, "mem-unknown"}, // unknown memory does not constrain
		{shared.Need{CPUs: 3}, "mem-unknown"},
		{shared.Need{CPUs: 9}, "big"},
		{shared.Need{CPUs: 33}, ""},
		{shared.Need{GPUs: 1}, "t4"},
		{shared.Need{GPUs: 1, RAMMB: 500000}, "t4"}, // t4 says nothing about memory
		{shared.Need{GPUs: 2}, "a100"},
		{shared.Need{GPUs: 3}, ""},
		{shared.Need{CPUs: 1, Label: "cuda"}, "t4"},
		{shared.Need{CPUs: 9, Label: "cuda"}, "a100"},
		{shared.Need{Label: "a100"}, "a100"},
		{shared.Need{Label: "big"}, "big"}, // a profile's name is one of its labels
		{shared.Need{Label: "twin"}, "small-twin"},
		{shared.Need{Label: "tpu"}, ""},
	}
	s := matchSettings()
	for _, tc := range tests {
		p, ok := s.match(tc.need, nil)
		if ok != (tc.want != "") || p.Name != tc.want {
			t.Errorf("match(%+v) = %q, %v, want %q", tc.need, p.Name, ok, tc.want)
		}
	}
}

func TestShapesAndCovers(t *testing.T) {
	p := New(nil)
	p.cfg = matchSettings()
	ctx := context.Background()

	names := func(label string) []string {
		resp, err := p.Shapes(ctx, &shared.ShapesRequest{Label: label})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, s := range resp.Shapes {
			out = append(out, s.Profile)
		}
		return out
	}
	if got, want := names(""), []string{"small", "small-twin", "mem-unknown", "big", "t4", "a100", "node"}; !slices.Equal(got, want) {
		t.Errorf("Shapes(\"\") = %q, want %q", got, want)
	}
	if got, want := names("cuda"), []string{"t4", "a100"}; !slices.Equal(got, want) {
		t.Errorf("Shapes(cuda) = %q, want %q", got, want)
	}
	if got := names("nothing"); len(got) != 0 {
		t.Errorf("Shapes(nothing) = %q", got)
	}
	resp, _ := p.Shapes(ctx, &shared.ShapesRequest{Label: "a100"})
	want := shared.Shape{Profile: "a100", CPUs: 16, GPUs: 2, RAMMB: 128000, Labels: []string{"cuda", "a100"}}
	if got := resp.Shapes[0]; got.Profile != want.Profile || got.CPUs != want.CPUs || got.GPUs != want.GPUs || got.RAMMB != want.RAMMB || !slices.Equal(got.Labels, want.Labels) {
		t.Errorf("shape = %+v, want %+v", got, want)
	}

	c, err := p.Covers(ctx, &shared.CoversRequest{Need: shared.Need{CPUs: 4, GPUs: 1}})
	if err != nil || !c.Covered || c.Profile != "t4" {
		t.Errorf("Covers = %+v, %v", c, err)
	}
	c, err = p.Covers(ctx, &shared.CoversRequest{Need: shared.Need{CPUs: 64}})
	if err != nil || c.Covered || c.Profile != "" {
		t.Errorf("Covers(64 CPUs) = %+v, %v", c, err)
	}
}
