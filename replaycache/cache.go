package replaycache

import (
	"container/list"
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-idempotency/idempotency"
)

// Cache is an idempotency.Store that answers duplicates of completed
// requests from memory and passes everything else to the store behind it.
// It is safe for concurrent use. Create it with New (or NewTx for a
// TxStore); it holds no goroutine and needs no Close. Closing the store
// behind it is the caller's business.
type Cache struct {
	store    idempotency.Store
	maxAge   time.Duration
	maxBytes int64
	now      func() time.Time

	mu      sync.Mutex
	entries map[string]*list.Element // of lru, by key
	lru     *list.List               // of *entry, most recently used first
	bytes   int64
	flights map[string]*flight // the store calls in progress, by key

	hits, shared, misses, evictions atomic.Int64
}

var _ idempotency.Store = (*Cache)(nil)

// New returns a Cache in front of store, configured by opts. It panics if
// store is nil. For a store that is an idempotency.TxStore (pgstore), use
// NewTx, so that the Cache is one too and routes with
// idempotency.WithTransaction keep working.
func New(store idempotency.Store, opts ...Option) *Cache {
	if store == nil {
		panic("replaycache: New needs a Store")
	}
	cfg := defaultConfig()
	for _, opt := range opts {
		opt(&cfg)
	}
	c := &Cache{
		store:    store,
		maxAge:   cfg.maxAge,
		maxBytes: cfg.maxBytes,
		now:      cfg.clock,
		entries:  make(map[string]*list.Element),
		lru:      list.New(),
		flights:  make(map[string]*flight),
	}
	return c
}

// Acquire implements idempotency.Store. A key whose COMPLETE record the
// cache holds is answered without a store call: Completed when
// req.Fingerprint is the record's, with a Response decoded for this caller
// and the time left before the record expires as ExpiresIn; Mismatch when
// it is not. Other keys go to the store, and a Completed answer that tells
// its expiry (ExpiresIn) is kept.
//
// Callers that miss the same key at the same time share one store call:
// the first makes it, the others wait for its answer. A Completed answer
// is shared (Mismatch for a waiter with another fingerprint), and so is a
// Mismatch with the waiter's own fingerprint; after any other answer or an
// error, each waiter makes its own call, with its own lease token. A
// waiter whose ctx ends stops waiting and returns ctx's error.
//
// Requests with arguments a store refuses (an empty key or token, a lease
// or TTL that is not positive) go to the store, which says why.
func (c *Cache) Acquire(ctx context.Context, req idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	if req.Key == "" || req.Token == "" || req.Lease <= 0 || req.TTL <= 0 {
		return c.call(ctx, req)
	}
	now := c.now()
	c.mu.Lock()
	if el := c.entries[req.Key]; el != nil {
		e := el.Value.(*entry)
		if now.Before(e.until) {
			c.lru.MoveToFront(el)
			c.mu.Unlock()
			c.hits.Add(1)
			return c.answer(ctx, e, req, now)
		}
		c.drop(el)
	}
	if f := c.flights[req.Key]; f != nil {
		f.waiters++
		c.mu.Unlock()
		return c.wait(ctx, f, req)
	}
	f := &flight{done: make(chan struct{}), fingerprint: req.Fingerprint}
	c.flights[req.Key] = f
	c.mu.Unlock()
	return c.lead(ctx, f, req)
}

// answer is e's answer to req at now. Should the entry fail to decode,
// which only a bug would make it do, the store answers instead.
func (c *Cache) answer(ctx context.Context, e *entry, req idempotency.AcquireRequest, now time.Time) (idempotency.Acquisition, error) {
	if a, err := e.answer(req.Fingerprint, now); err == nil {
		return a, nil
	}
	return c.call(ctx, req)
}

// callEntry passes req to the store and keeps a Completed answer that
// tells its expiry. It returns the store's answer and the entry made of
// it, if any, kept or not (a response larger than the bound is not).
func (c *Cache) callEntry(ctx context.Context, req idempotency.AcquireRequest) (idempotency.Acquisition, *entry, error) {
	sent := c.now()
	req.WantExpiresIn = true // an entry lives no longer than its record
	a, err := c.store.Acquire(ctx, req)
	c.misses.Add(1)
	if err != nil || a.Outcome != idempotency.Completed || a.Response == nil || a.ExpiresIn <= 0 {
		return a, nil, err
	}
	// Counted from when the call was sent: the store read its clock
	// after that, so the entry ends no later than the record.
	expires := sent.Add(a.ExpiresIn)
	until := sent.Add(c.maxAge)
	if expires.Before(until) {
		until = expires
	}
	e, ok := newEntry(req.Key, req.Fingerprint, a.Response, expires, until)
	if !ok {
		return a, nil, nil
	}
	c.put(e)
	return a, e, nil
}

// call is callEntry without the entry.
func (c *Cache) call(ctx context.Context, req idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	a, _, err := c.callEntry(ctx, req)
	return a, err
}

// put keeps e, in place of any entry of its key, dropping the ended
// entries at the cold end of the list and evicting the least recently
// used ones to make room. An entry that has already ended, or that alone
// is over the bound, is not kept.
func (c *Cache) put(e *entry) {
	if e.size > c.maxBytes {
		return
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !now.Before(e.until) {
		return
	}
	if old := c.entries[e.key]; old != nil {
		c.drop(old)
	}
	// Ended entries at the cold end go first, and are not evictions.
	for t := c.lru.Back(); t != nil && !now.Before(t.Value.(*entry).until); t = c.lru.Back() {
		c.drop(t)
	}
	for c.bytes+e.size > c.maxBytes && c.lru.Len() > 0 {
		c.drop(c.lru.Back())
		c.evictions.Add(1)
	}
	c.entries[e.key] = c.lru.PushFront(e)
	c.bytes += e.size
}

// drop removes the entry of el from the cache. The caller holds c.mu.
func (c *Cache) drop(el *list.Element) {
	e := c.lru.Remove(el).(*entry)
	delete(c.entries, e.key)
	c.bytes -= e.size
}

// Complete implements idempotency.Store: it is the store's. The cache
// keeps nothing of it: the first duplicate after it asks the store, which
// tells the record's expiry, and the entry is made from that answer.
func (c *Cache) Complete(ctx context.Context, key, token string, resp *idempotency.Response, ttl time.Duration) error {
	return c.store.Complete(ctx, key, token, resp, ttl)
}

// Release implements idempotency.Store: it is the store's.
func (c *Cache) Release(ctx context.Context, key, token string) error {
	return c.store.Release(ctx, key, token)
}

// Extend implements idempotency.Store: it is the store's.
func (c *Cache) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	return c.store.Extend(ctx, key, token, lease)
}

// Watch implements idempotency.Store: it is the store's.
func (c *Cache) Watch(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	return c.store.Watch(ctx, key)
}

// Stats counts what a Cache did since New, and what it holds.
type Stats struct {
	// Hits counts the Acquires answered from the cache.
	Hits int64
	// Shared counts the Acquires answered by another caller's store call
	// for the same key.
	Shared int64
	// Misses counts the Acquires passed to the store.
	Misses int64
	// Evictions counts the entries dropped to make room (WithMaxBytes),
	// not counting entries that ended.
	Evictions int64
	// Entries is the number of entries held, Bytes what they count for
	// against WithMaxBytes. An ended entry counts until a lookup of its
	// key drops it, or a new entry finds it at the cold end of the LRU
	// list, or it is evicted.
	Entries int
	Bytes   int64
}

// Stats returns the cache's counters.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	n, b := len(c.entries), c.bytes
	c.mu.Unlock()
	return Stats{
		Hits:      c.hits.Load(),
		Shared:    c.shared.Load(),
		Misses:    c.misses.Load(),
		Evictions: c.evictions.Load(),
		Entries:   n,
		Bytes:     b,
	}
}
