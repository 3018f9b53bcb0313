package relay

import "time"

// backoff returns the wait after the failure of attempt n (from 1): lo
// doubled n-1 times, at most hi, less a random part of up to half (random
// returns a number in [0, 1)).
func backoff(n int, lo, hi time.Duration, random func() float64) time.Duration {
	d := lo
	for i := 1; i < n && d < hi; i++ {
		d *= 2
	}
	d = time.Duration(float64(min(d, hi)) * (1 - random()/2))
	return max(d, time.Microsecond)
}
