package replaycache

import (
	"context"

	"github.com/go-idempotency/idempotency"
)

// flight is a store call for a key that other callers wait for. Its
// answer fields are set before done is closed and read only after.
type flight struct {
	done        chan struct{}
	fingerprint string // the leader's
	waiters     int    // guarded by the cache's lock; read by tests
	// entry is the record the leader found COMPLETE (kept in the cache
	// or not); mismatch reports that the leader got Mismatch.
	entry    *entry
	mismatch bool
}

// lead makes the store call of f for req, publishes its answer to f's
// waiters and ends the flight.
func (c *Cache) lead(ctx context.Context, f *flight, req idempotency.AcquireRequest) (a idempotency.Acquisition, err error) {
	defer func() {
		c.mu.Lock()
		delete(c.flights, req.Key)
		c.mu.Unlock()
		close(f.done)
	}()
	a, f.entry, err = c.callEntry(ctx, req)
	f.mismatch = err == nil && a.Outcome == idempotency.Mismatch
	return a, err
}

// wait waits for f and answers req from its answer when that answer holds
// for req too: a COMPLETE record (Completed, or Mismatch to another
// fingerprint) or a Mismatch to the same fingerprint. Otherwise (the
// leader acquired, stole or found the record in flight, or failed) req
// goes to the store on its own, with its own token: sharing an Acquired
// would leave every waiter holding nothing.
func (c *Cache) wait(ctx context.Context, f *flight, req idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	select {
	case <-f.done:
	case <-ctx.Done():
		return idempotency.Acquisition{}, ctx.Err()
	}
	switch {
	case f.entry != nil:
		if now := c.now(); now.Before(f.entry.until) {
			if a, err := f.entry.answer(req.Fingerprint, now); err == nil {
				c.shared.Add(1)
				return a, nil
			}
		}
	case f.mismatch && f.fingerprint == req.Fingerprint:
		c.shared.Add(1)
		return idempotency.Acquisition{Outcome: idempotency.Mismatch}, nil
	}
	return c.call(ctx, req)
}
