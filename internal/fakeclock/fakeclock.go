// Package fakeclock provides a clock for tests that moves only when told
// to, for code that takes its time from a func() time.Time such as
// memstore.WithClock.
package fakeclock

import (
	"sync"
	"time"
)

// Clock is a clock that stands still until Advance moves it. It is safe for
// concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// New returns a Clock that reads t0.
func New(t0 time.Time) *Clock { return &Clock{now: t0} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d (back, for a negative d).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
