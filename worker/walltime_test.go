package worker

import (
	"testing"
	"time"
)

// TestJobEnd: the job's end is Slurm's own where it says it
// (SLURM_JOB_END_TIME, 23.02 on), else its start plus the walltime the
// provisioner passed, the start being Slurm's, the script's, or now.
func TestJobEnd(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	for _, tc := range []struct {
		name     string
		getenv   func(string) string
		walltime time.Duration
		want     time.Time
	}{
		{"slurm says", env("SLURM_JOB_END_TIME", "1800000060", "FLUKSIO_JOB_START", "1799999990"), time.Hour, time.Unix(1800000060, 0)},
		{"slurm's start", env("SLURM_JOB_START_TIME", "1799999990"), time.Minute, time.Unix(1800000050, 0)},
		{"the script's start", env("FLUKSIO_JOB_START", "1799999980"), time.Minute, time.Unix(1800000040, 0)},
		{"now", env(), time.Minute, now.Add(time.Minute)},
		{"a start in the future is now", env("FLUKSIO_JOB_START", "1800000100"), time.Minute, now.Add(time.Minute)},
		{"the script's walltime", env("FLUKSIO_JOB_START", "1799999980", "FLUKSIO_WALLTIME", "60"), 0, time.Unix(1800000040, 0)},
		{"not known", env("FLUKSIO_JOB_START", "1799999980"), 0, time.Time{}},
		{"garbage", env("SLURM_JOB_END_TIME", "soon"), 0, time.Time{}},
	} {
		if got := jobEnd(tc.getenv, tc.walltime, now); !got.Equal(tc.want) {
			t.Errorf("%s: %v; want %v", tc.name, got, tc.want)
		}
	}
}
