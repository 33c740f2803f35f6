package sbatch

import (
	"testing"
	"time"
)

// TestParseTimeLimit reads every form of a Slurm time limit, and takes
// no limit, an unreadable one and one too large to add for none.
func TestParseTimeLimit(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration // 0 for no limit or unreadable
	}{
		{"10", 10 * time.Minute},
		{"10:30", 10*time.Minute + 30*time.Second},
		{"04:00:00", 4 * time.Hour},
		{"1:02:03", time.Hour + 2*time.Minute + 3*time.Second},
		{"2-0", 48 * time.Hour},
		{"2-12", 60 * time.Hour},
		{"1-02:30", 26*time.Hour + 30*time.Minute},
		{"1-02:03:04", 26*time.Hour + 3*time.Minute + 4*time.Second},
		{"0", 0},
		{"0:0:0", 0},
		{"UNLIMITED", 0},
		{"INFINITE", 0},
		{"", 0},
		{"foo", 0},
		{"1:2:3:4", 0},
		{"1-2:3:4:5", 0},
		{"-5", 0},
		{"+5", 0},
		{"1-", 0},
		{"5m", 0},
		{"99999999999999999", 0},
		{"100000000-0", 0},
	}
	for _, tc := range tests {
		got, ok := ParseTimeLimit(tc.in)
		if got != tc.want || ok != (tc.want > 0) {
			t.Errorf("ParseTimeLimit(%q) = %s, %v, want %s", tc.in, got, ok, tc.want)
		}
	}
}

// TestTimeLimitLastWins: the last --time or -t of the lines is the limit,
// in any word of a line, as sbatch keeps the last.
func TestTimeLimitLastWins(t *testing.T) {
	if d, ok := TimeLimit([]string{"--time=10", "-p debug -t 30"}); !ok || d != 30*time.Minute {
		t.Errorf("TimeLimit = %s, %v; want 30m", d, ok)
	}
	if _, ok := TimeLimit([]string{"--time=10", "--time=UNLIMITED"}); ok {
		t.Error("an UNLIMITED last --time is a limit")
	}
}
