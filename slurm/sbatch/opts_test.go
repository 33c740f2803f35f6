package sbatch

import (
	"slices"
	"testing"
)

// TestWords splits a line as sbatch does: at C's white space, with
// quotes, backslash escapes and an unquoted # starting a comment; a quote
// left open is no line at all.
func TestWords(t *testing.T) {
	for _, c := range []struct {
		line string
		want []string
	}{
		{"--partition=x --array=1-100", []string{"--partition=x", "--array=1-100"}},
		{"--time=5\v-J y", []string{"--time=5", "-J", "y"}},
		{"--time=5\f\r\t-J\ny", []string{"--time=5", "-J", "y"}},
		{`--partition='x -J y'`, []string{"--partition=x -J y"}},
		{`--partition="x --array=1-5"`, []string{"--partition=x --array=1-5"}},
		{`--partition=x\ -J`, []string{"--partition=x -J"}},
		{"--partition=x # --array=1-5", []string{"--partition=x"}},
		{"--partition=x#--array", []string{"--partition=x"}},
		{`--comment='open`, nil},
	} {
		if got := Words(c.line); !slices.Equal(got, c.want) {
			t.Errorf("Words(%q) = %q, want %q", c.line, got, c.want)
		}
	}
}

// TestParseLine reads short options as getopt does (a letter that takes
// an argument takes the rest of its word or the next), long ones with
// their value after = or in the next word, and matches abbreviations.
func TestParseLine(t *testing.T) {
	opts, err := ParseLine("-vJ name --par debug -t30 --mem=4G")
	if err != nil {
		t.Fatal(err)
	}
	want := []Opt{{Short: 'v'}, {Short: 'J', Value: "name", HasValue: true}, {Long: "--par", Value: "debug", HasValue: true},
		{Short: 't', Value: "30", HasValue: true}, {Long: "--mem", Value: "4G", HasValue: true}}
	if !slices.Equal(opts, want) {
		t.Fatalf("ParseLine = %+v, want %+v", opts, want)
	}
	if !opts[2].Is("--partition", 'p') || !opts[2].Is("--parsable", 0) || !opts[4].Is("--mem-per-cpu", 0) {
		t.Error("--par is an abbreviation of --partition and --parsable, --mem of --mem-per-cpu")
	}
	if opts[1].Is("--job-name", 'p') || !opts[1].Is("--job-name", 'J') || opts[1].Name() != "-J" || opts[2].Name() != "--par" {
		t.Errorf("-J: Is and Name disagree: %+v", opts[1])
	}
	if got := Opts([]string{"-p x", "'open", "--time=5"}); len(got) != 2 {
		t.Errorf("Opts skips a line that does not parse: %+v", got)
	}
	// Words that are no option, and job components, are refused.
	for _, line := range []string{"--", "partition=debug", "--partition=debug extra", "--hold hetjob", "-p x : packjob"} {
		if _, err := ParseLine(line); err == nil {
			t.Errorf("ParseLine(%q) accepted it", line)
		}
	}
}
