package slurm

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fluksio/provision/slurm/internal/queue"
)

// TestParseRowsExpandsArrays: a pending array squeue prints as one line
// is read as each of its tasks; a line that is no row is skipped.
func TestParseRowsExpandsArrays(t *testing.T) {
	t.Parallel()
	rows := queue.ParseJobs([]byte("77_[0-2%1]|PENDING|JobArrayTaskLimit|N/A|tag\n78_4|RUNNING|None|now|tag\nbanner line\n"), "")
	var ids []string
	for _, r := range rows {
		ids = append(ids, r.ID+"="+r.State)
	}
	if want := []string{"77_0=PENDING", "77_1=PENDING", "77_2=PENDING", "78_4=RUNNING"}; !slices.Equal(ids, want) {
		t.Errorf("ParseJobs = %q, want %q", ids, want)
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
