package idemrabbit

import (
	"math/rand/v2"
	"time"
)

// backoff returns how long to hold the n-th delivery of a message (n from
// 1) before requeueing it: the base, doubled for each earlier delivery up
// to the cap, with "equal jitter" (a random point in its upper half), so
// that deliveries failing together spread out while each step still lies
// above the one before until the cap; and at least after, the outcome's
// RetryAfter.
func (c *processorConfig) backoff(n int, after time.Duration) time.Duration {
	d := c.backoffBase
	for i := 1; i < n && d < c.backoffCap; i++ {
		if d > c.backoffCap/2 {
			d = c.backoffCap
			break
		}
		d *= 2
	}
	d = min(d, c.backoffCap)
	half := d / 2
	return max(half+rand.N(d-half), after)
}
