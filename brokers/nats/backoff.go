package idemnats

import (
	"math/rand/v2"
	"time"
)

// backoff returns the delay of a nak on the delivery-th delivery of a
// message (1 for the first): base doubled for each delivery before it, up
// to limit, less a random part of under half of it, so that messages that
// failed together do not come back together. Each delay is longer than
// the one before until the limit, and longer than half of min(base,
// limit): a failing message is never redelivered at once.
func backoff(delivery uint64, base, limit time.Duration) time.Duration {
	d := min(base, limit)
	for n := uint64(1); n < delivery && d < limit; n++ {
		if d > limit/2 {
			d = limit
		} else {
			d *= 2
		}
	}
	if half := d / 2; half > 0 {
		d -= rand.N(half)
	}
	return d
}
