package replaycache

import (
	"context"

	"github.com/go-idempotency/idempotency"
)

// TxCache is a Cache in front of an idempotency.TxStore, and a TxStore
// itself: BeginTx, and the transactions it begins, are the store's.
type TxCache struct {
	*Cache
	tx idempotency.TxStore
}

var _ idempotency.TxStore = (*TxCache)(nil)

// NewTx returns a TxCache in front of store, configured by opts as New
// configures a Cache. It panics if store is nil.
func NewTx(store idempotency.TxStore, opts ...Option) *TxCache {
	if store == nil {
		panic("replaycache: NewTx needs a TxStore")
	}
	return &TxCache{Cache: New(store, opts...), tx: store}
}

// BeginTx implements idempotency.TxStore: it is the store's. A record
// completed in the transaction is cached, as any other, from the first
// duplicate's answer.
func (c *TxCache) BeginTx(ctx context.Context, key, token string) (idempotency.Tx, error) {
	return c.tx.BeginTx(ctx, key, token)
}
