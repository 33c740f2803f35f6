// Package backoff is the one doubling backoff of the module: a profile
// whose submissions keep failing (slurm), a login node that refuses
// (slurm/sshrun), a plugin that keeps exiting (the engine's
// supervise.Supervisor), a profile whose machines keep failing (the engine's
// hold), a worker whose engine does not answer.
// Each waits twice as long after each failure, up to a cap, so that a
// passing hiccup costs little and a lasting fault costs a bounded rate.
package backoff

import "time"

// Next is the wait after waiting d: doubled, at most max.
func Next(d, max time.Duration) time.Duration {
	if d <= 0 {
		return min(time.Millisecond, max)
	}
	if d >= max/2 {
		return max
	}
	return d * 2
}

// Delay is the wait after n failures in a row: first after one, doubling
// with each further failure, at most max.
func Delay(first, max time.Duration, n int) time.Duration {
	d := min(first, max)
	for i := 1; i < n && d < max; i++ {
		d = Next(d, max)
	}
	return d
}
