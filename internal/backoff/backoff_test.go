package backoff

import (
	"testing"
	"time"
)

func TestDelay(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want time.Duration
	}{{0, 5 * time.Second}, {1, 5 * time.Second}, {2, 10 * time.Second}, {3, 20 * time.Second}, {7, 5 * time.Minute}, {1000, 5 * time.Minute}} {
		if got := Delay(5*time.Second, 5*time.Minute, tc.n); got != tc.want {
			t.Errorf("Delay(5s, 5m, %d) = %s, want %s", tc.n, got, tc.want)
		}
	}
}

func TestNext(t *testing.T) {
	for _, tc := range []struct{ d, max, want time.Duration }{
		{time.Second, 2 * time.Minute, 2 * time.Second},
		{time.Minute, 2 * time.Minute, 2 * time.Minute},
		{90 * time.Second, 2 * time.Minute, 2 * time.Minute},
		{2 * time.Minute, 2 * time.Minute, 2 * time.Minute},
		{1<<62 + 1, 1 << 62, 1 << 62},
	} {
		if got := Next(tc.d, tc.max); got != tc.want {
			t.Errorf("Next(%s, %s) = %s, want %s", tc.d, tc.max, got, tc.want)
		}
	}
}
