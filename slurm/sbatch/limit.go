package sbatch

import (
	"strconv"
	"strings"
	"time"
)

// TimeLimit returns the time limit the sbatch lines set with --time or
// -t, the last one winning as it does for sbatch. It is false when none
// is set, or the last is unlimited or not understood.
func TimeLimit(lines []string) (time.Duration, bool) {
	var limit time.Duration
	var ok bool
	for _, o := range Opts(lines) {
		if (o.Short == 't' || o.Long == "--time") && o.HasValue {
			limit, ok = ParseTimeLimit(strings.TrimSpace(o.Value))
		}
	}
	return limit, ok
}

// maxLimitDays bounds a time limit read from a profile, far above any
// cluster's, so that the arithmetic cannot overflow.
const maxLimitDays = 100 * 365

// ParseTimeLimit reads a time limit in one of Slurm's formats: minutes,
// minutes:seconds, hours:minutes:seconds, days-hours,
// days-hours:minutes and days-hours:minutes:seconds. 0, UNLIMITED and
// INFINITE mean no limit, and are false like anything unreadable.
func ParseTimeLimit(s string) (time.Duration, bool) {
	days := 0
	rest := s
	if d, r, found := strings.Cut(s, "-"); found {
		n, err := strconv.Atoi(d)
		if err != nil || n < 0 || d == "" || d[0] == '+' {
			return 0, false
		}
		days, rest = n, r
	}
	var nums []int
	for _, f := range strings.Split(rest, ":") {
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 || f == "" || f[0] == '+' {
			return 0, false
		}
		nums = append(nums, n)
	}
	var h, m, sec int
	switch {
	case strings.Contains(s, "-") && len(nums) == 1:
		h = nums[0]
	case strings.Contains(s, "-") && len(nums) == 2:
		h, m = nums[0], nums[1]
	case len(nums) == 1:
		m = nums[0]
	case len(nums) == 2:
		m, sec = nums[0], nums[1]
	case len(nums) == 3:
		h, m, sec = nums[0], nums[1], nums[2]
	default:
		return 0, false
	}
	if days > maxLimitDays || h > maxLimitDays*24 || m > maxLimitDays*24*60 || sec > maxLimitDays*24*3600 {
		return 0, false
	}
	d := time.Duration(days)*24*time.Hour + time.Duration(h)*time.Hour + time.Duration(m)*time.Minute + time.Duration(sec)*time.Second
	return d, d > 0
}
