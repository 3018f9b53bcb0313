package idempotency

import "context"

// Info is what a handler behind the middleware can learn of its request
// from its context, with FromContext.
type Info struct {
	// Key is the client's Idempotency-Key, as parsed. Forward it to
	// downstream providers that take one (payment processors do), so that a
	// retry of this request is a retry there too.
	Key string
	// StorageKey is the record's key in the store: a hash of scope and key.
	StorageKey string
	// Epoch counts the attempts on the record: 1 for the first, +1 for each
	// steal. It is a fencing token for writes to other systems: a write
	// conditioned on it (UPDATE … WHERE fence < $epoch) is refused once a
	// later attempt has written.
	Epoch uint64
	// Tx is, on routes with WithTransaction, the handle of the request's
	// transaction (for pgstore a pgx.Tx; see its accessor); nil elsewhere.
	Tx any
}

type infoKey struct{}

// FromContext returns the Info of the request whose handler runs with ctx,
// and false outside a handler the middleware runs under a lease (no key,
// uncovered method, fail-open run).
func FromContext(ctx context.Context) (Info, bool) {
	info, ok := ctx.Value(infoKey{}).(*Info)
	if !ok {
		return Info{}, false
	}
	return *info, true
}
