// Package memstore is an in-process idempotency.Store.
//
// Records live in memory, split over 64 shards chosen by a hash of the key,
// each guarded by its own mutex, held only for a map lookup and update, so
// operations on different keys rarely wait for each other. (A plain mutex
// rather than a read-write one: every call locks its shard once, and a brief
// collision spins rather than putting the caller to sleep; under parallel
// load that is worth far more than letting replays of one key share the
// lock.) Duplicates of a COMPLETE record take no lock at all from the third
// one on: the second publishes the record to an index that later duplicates
// only read, so replays, even of one hot key, scale with the cores. See
// BenchmarkAcquireComplete and BenchmarkAcquireReplay.
//
// The store is bounded in records (WithMaxEntries, default 1,000,000) and
// in the bytes they hold (WithMaxBytes, default 256 MiB), and never evicts
// a live record to make room: when it is full of live records, Acquire of a
// new key returns idempotency.ErrStoreFull. Complete never fails for lack
// of room: at the byte bound, a record keeps its status and headers and
// omits its body, so duplicates are answered without a body, never by a
// second execution. The bounds are global: one principal (one client or
// tenant) can fill the store for everyone, with a few hundred records of
// large bodies as easily as with a million small ones. Size the bounds for
// the traffic, scope keys to the principal (idempotency.WithKeyScope), and
// rate-limit clients upstream of the middleware.
//
// A COMPLETE record expires when its TTL has passed, an IN_PROGRESS record
// when both its TTL and its lease have. An expired record is absent to every
// operation from that instant, whether or not it has been purged yet:
// Acquire creates a fresh record (epoch 1), Complete and Extend return
// idempotency.ErrLeaseLost and Release returns nil. A background sweep
// (WithSweepInterval) frees the memory of expired records; Close stops it.
//
// A COMPLETE record keeps its body as the middleware captured it, without
// a copy, and its status and headers encoded in one block of bytes, which
// the garbage collector does not scan, however many records are kept.
// With a key, token and fingerprint of typical sizes and two headers, a
// record costs about 370 bytes beyond its body; see BenchmarkRecordMemory.
// A record that has been duplicated twice costs about 560 bytes more: its
// entry in the index of published records holds a decoded Response, which
// every later replay shares. WithMaxBytes counts both.
//
// Records are lost when the process exits, and are not shared between
// processes: use it for a single instance, for tests and for development.
package memstore

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/wire"
)

// ErrInvalid is returned (wrapped, with the reason) for arguments no record
// can be made from: an empty key or token, a lease or TTL that is not
// positive, or a nil response.
var ErrInvalid = errors.New("memstore: invalid argument")

// Store is an in-memory idempotency.Store. It is safe for concurrent use.
// Create it with New and stop it with Close.
type Store struct {
	shards     [shardCount]shard
	seed       maphash.Seed
	clock      func() time.Time // nil: the monotonic clock, read through time.Since
	epoch      time.Time        // the clock's reading at New; instants count from it
	maxEntries int64
	maxBytes   int64
	closed     atomic.Bool
	quit       chan struct{}
	swept      chan struct{}

	// count and bytes are written by every new record, release and purge,
	// and bytes by every Complete: they have cache lines of their own, so
	// writing them from one core does not evict the fields above, which
	// every call reads, from the others.
	_     [128]byte
	count atomic.Int64 // records held
	bytes atomic.Int64 // the records' held bytes (see WithMaxBytes)
	_     [112]byte
}

var _ idempotency.Store = (*Store)(nil)

// New returns a Store configured by opts and starts its background sweep.
func New(opts ...Option) *Store {
	cfg := defaultConfig()
	for _, opt := range opts {
		opt(&cfg)
	}
	s := &Store{
		seed:       maphash.MakeSeed(),
		clock:      cfg.clock,
		epoch:      time.Now(),
		maxEntries: int64(cfg.maxEntries),
		maxBytes:   cfg.maxBytes,
		quit:       make(chan struct{}),
		swept:      make(chan struct{}),
	}
	if cfg.clock != nil {
		s.epoch = cfg.clock()
	}
	for i := range s.shards {
		s.shards[i].records = make(map[string]record)
		s.shards[i].nextPurge = math.MaxInt64
	}
	go s.sweep(cfg.sweepInterval)
	return s
}

// Close stops the background sweep, wakes every waiter and drops all
// records. Operations after Close return idempotency.ErrStoreClosed. Close
// is idempotent and always returns nil.
func (s *Store) Close() error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	close(s.quit)
	<-s.swept
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.wakeAll()
		sh.records = nil
		sh.done.reset()
		sh.mu.Unlock()
	}
	s.count.Store(0)
	s.bytes.Store(0)
	return nil
}

// Len returns the number of records held, including expired records that
// the sweep has not purged yet.
func (s *Store) Len() int { return int(s.count.Load()) }

func (s *Store) shard(key string) *shard { return &s.shards[s.hash(key)&(shardCount-1)] }

// hash is the hash of key that picks its shard and its slot in the shard's
// index of published records.
func (s *Store) hash(key string) uint64 { return maphash.String(s.seed, key) }

// lock locks sh and returns nil, or returns ErrStoreClosed with sh
// unlocked once the store is closed. Callers defer sh.mu.Unlock() after a
// nil return.
func (s *Store) lock(sh *shard) error {
	sh.mu.Lock()
	if s.closed.Load() {
		sh.mu.Unlock()
		return idempotency.ErrStoreClosed
	}
	return nil
}

// now reads the store's clock. Without WithClock it reads only the
// monotonic clock (time.Since of a reading that carries one), which costs
// about half of time.Now.
func (s *Store) now() instant {
	if s.clock == nil {
		return instant(time.Since(s.epoch))
	}
	return instant(s.clock().Sub(s.epoch))
}

// reserve takes room for one new record of size bytes, reporting false
// when either bound leaves none.
func (s *Store) reserve(size int64) bool {
	if !s.take(size) {
		return false
	}
	for {
		n := s.count.Load()
		if n >= s.maxEntries {
			s.bytes.Add(-size)
			return false
		}
		if s.count.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// take adds n to the byte total when that keeps it within the bound, and
// reports whether it did.
func (s *Store) take(n int64) bool {
	for {
		b := s.bytes.Load()
		if n > s.maxBytes-b {
			return false
		}
		if s.bytes.CompareAndSwap(b, b+n) {
			return true
		}
	}
}

// forget takes a record that held held bytes off the totals.
func (s *Store) forget(held int64) {
	s.count.Add(-1)
	s.bytes.Add(-held)
}

// purge purges the expired records of sh at now and takes them off the
// totals. Callers hold sh.mu.
func (s *Store) purge(sh *shard, now instant) {
	n, held := sh.purge(now, s.hash)
	if n > 0 {
		s.count.Add(-int64(n))
		s.bytes.Add(-held)
	}
}

// errNoRoom reports, inside the package, that the shard had no room.
var errNoRoom = errors.New("memstore: no room")

// full returns the error of an Acquire refused for lack of room, which
// says which bound the store has reached.
func (s *Store) full() error {
	if n := s.count.Load(); n >= s.maxEntries {
		return fmt.Errorf("%w: memstore holds %d records (WithMaxEntries)", idempotency.ErrStoreFull, n)
	}
	return fmt.Errorf("%w: memstore records hold %d of %d bytes (WithMaxBytes)", idempotency.ErrStoreFull, s.bytes.Load(), s.maxBytes)
}

// Acquire implements idempotency.Store. A retried Acquire by the token that
// holds the record reports Acquired (or Stolen) again and pushes the lease
// to at least req.Lease from now. A steal restarts the record's TTL.
//
// A new record that finds no room under WithMaxEntries or WithMaxBytes,
// even once expired records are purged, is refused with an error wrapping
// idempotency.ErrStoreFull that names the bound reached.
//
// Acquire never blocks: with an already cancelled ctx it returns ctx.Err()
// and changes nothing.
func (s *Store) Acquire(ctx context.Context, req idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	if err := ctx.Err(); err != nil {
		return idempotency.Acquisition{}, err
	}
	switch {
	case req.Key == "":
		return idempotency.Acquisition{}, fmt.Errorf("%w: empty key", ErrInvalid)
	case req.Token == "":
		return idempotency.Acquisition{}, fmt.Errorf("%w: empty token", ErrInvalid)
	case req.Lease <= 0:
		return idempotency.Acquisition{}, fmt.Errorf("%w: lease %v is not positive", ErrInvalid, req.Lease)
	case req.TTL <= 0:
		return idempotency.Acquisition{}, fmt.Errorf("%w: TTL %v is not positive", ErrInvalid, req.TTL)
	}
	h := s.hash(req.Key)
	sh := &s.shards[h&(shardCount-1)]
	if a, ok := s.replay(sh, h, req); ok {
		return a, nil
	}
	// One reading of the clock serves the whole call.
	now := s.now()

	a, p, err := s.acquire(sh, h, req, now)
	if err == errNoRoom {
		// Make room in other shards, one at a time, then try once more.
		s.purgeAll()
		a, p, err = s.acquire(sh, h, req, s.now())
		if err == errNoRoom {
			err = s.full()
		}
	}
	if err == nil && a.Outcome == idempotency.Completed && a.Response == nil {
		// Decoded once the shard is unlocked.
		if a.Response, err = p.response(); err != nil {
			return idempotency.Acquisition{}, fmt.Errorf("%w (key %q)", err, req.Key)
		}
	}
	return a, err
}

// replay answers req without the shard's lock when the key holds a live
// COMPLETE record that an earlier duplicate published (see shard.done):
// Completed with its response, or Mismatch. It reads the clock after the
// entry, so the record was COMPLETE, and still live, at that reading: the
// entry was published while it was, and only a call at or after its expiry
// replaces or purges it.
func (s *Store) replay(sh *shard, h uint64, req idempotency.AcquireRequest) (idempotency.Acquisition, bool) {
	c := sh.done.get(req.Key, h)
	if c == nil {
		return idempotency.Acquisition{}, false
	}
	if s.now() >= c.until || s.closed.Load() {
		return idempotency.Acquisition{}, false
	}
	if c.fingerprint != req.Fingerprint {
		return idempotency.Acquisition{Outcome: idempotency.Mismatch}, true
	}
	return idempotency.Acquisition{Outcome: idempotency.Completed, Response: c.resp}, true
}

// observe returns the outcome of req on a live record when it changes
// nothing, and false when req takes the lease. A Completed outcome comes
// without its Response, which the caller decodes.
func observe(rec *record, req idempotency.AcquireRequest, now instant) (idempotency.Acquisition, bool) {
	switch {
	case rec.fingerprint != req.Fingerprint:
		return idempotency.Acquisition{Outcome: idempotency.Mismatch}, true
	case rec.complete():
		return idempotency.Acquisition{Outcome: idempotency.Completed}, true
	case rec.token != req.Token && now < rec.leaseUntil:
		remaining := time.Duration(rec.leaseUntil - now)
		if remaining < time.Millisecond {
			remaining = time.Millisecond
		}
		return idempotency.Acquisition{Outcome: idempotency.InFlight, Epoch: uint64(rec.epoch), LeaseRemaining: remaining}, true
	}
	return idempotency.Acquisition{}, false
}

// acquire is Acquire under the lock of the shard sh, at the instant now; h
// is the key's hash. A Completed outcome without its Response comes with
// the record's payload, for Acquire to decode.
func (s *Store) acquire(sh *shard, h uint64, req idempotency.AcquireRequest, now instant) (idempotency.Acquisition, payload, error) {
	if err := s.lock(sh); err != nil {
		return idempotency.Acquisition{}, payload{}, err
	}
	defer sh.mu.Unlock()
	rec, ok := sh.records[req.Key]
	if ok && rec.live(now) {
		if a, ok := observe(&rec, req, now); ok {
			if !rec.complete() {
				return a, payload{}, nil
			}
			// The first duplicate only counts: most keys are duplicated
			// once or never, and publishing costs a decoded Response,
			// an allocation and a slot. The second publishes.
			if rec.dups == 0 {
				rec.dups = 1
				sh.records[req.Key] = rec
			} else {
				resp, err := s.publish(sh, req.Key, h, &rec)
				if err != nil {
					return idempotency.Acquisition{}, payload{}, fmt.Errorf("%w (key %q)", err, req.Key)
				}
				if a.Outcome == idempotency.Completed {
					a.Response = resp
				}
			}
			return a, payload{rec.meta, rec.body}, nil
		}
		outcome := idempotency.Stolen
		if rec.token == req.Token {
			// A retry by the holder.
			if rec.epoch == 1 {
				outcome = idempotency.Acquired
			}
			rec.leaseUntil = max(rec.leaseUntil, now.after(req.Lease))
		} else {
			// The new token's bytes replace the old one's, room or not:
			// a steal takes over a record, it does not make one.
			grown := int64(len(req.Token) - len(rec.token))
			rec.held += grown
			s.bytes.Add(grown)
			rec.token = req.Token
			rec.epoch++
			rec.leaseUntil = now.after(req.Lease)
			rec.ttlUntil = now.after(req.TTL)
		}
		sh.records[req.Key] = rec
		sh.noteDeadline(rec.purgeAt())
		return idempotency.Acquisition{Outcome: outcome, Epoch: uint64(rec.epoch)}, payload{}, nil
	}
	if ok {
		// The key's expired record gives its room to the new one.
		delete(sh.records, req.Key)
		if rec.complete() {
			sh.done.remove(req.Key, h)
		}
		s.forget(rec.held)
	}
	rec = record{
		fingerprint: req.Fingerprint,
		token:       req.Token,
		epoch:       1,
		leaseUntil:  now.after(req.Lease),
		ttlUntil:    now.after(req.TTL),
		held:        inProgressSize(req.Key, req.Fingerprint, req.Token),
	}
	if !s.reserve(rec.held) {
		s.purge(sh, now)
		if !s.reserve(rec.held) {
			return idempotency.Acquisition{}, payload{}, errNoRoom
		}
	}
	sh.records[req.Key] = rec
	sh.noteDeadline(rec.purgeAt())
	return idempotency.Acquisition{Outcome: idempotency.Acquired, Epoch: 1}, payload{}, nil
}

// payload is a COMPLETE record's response in the wire format.
type payload struct{ meta, body string }

// response decodes p. Every call returns a new Response, whose header
// names and values and body share p's bytes.
func (p payload) response() (*idempotency.Response, error) { return wire.Decode(p.meta, p.body) }

// Complete implements idempotency.Store. The store keeps the status and
// headers of resp in a compact block of its own, and resp.Body itself, not
// a copy: the caller must not modify resp.Body afterwards. Replays hand out
// Responses that share the stored bytes, and from a record's second
// duplicate on, one *Response: readers must not modify them. A retried
// Complete by the token that completed the record returns nil and keeps
// the first payload. A response with a status outside 200..599 is
// refused with ErrInvalid.
//
// Complete never fails for lack of room: when the body would take the
// store over its byte bound (WithMaxBytes), the record keeps the status
// and headers and is marked BodyOmitted, and the body is not kept.
func (s *Store) Complete(ctx context.Context, key, token string, resp *idempotency.Response, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	switch {
	case resp == nil:
		return fmt.Errorf("%w: nil response", ErrInvalid)
	case ttl <= 0:
		return fmt.Errorf("%w: TTL %v is not positive", ErrInvalid, ttl)
	}
	// The block is built before the lock is taken: its one allocation is
	// the record's, and nothing writes it again, so it becomes a string
	// without a copy. So does the body, which the caller leaves alone.
	block, err := wire.AppendMeta(nil, resp)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	done := payload{meta: unsafe.String(unsafe.SliceData(block), len(block))}
	var bodyHeld int64 // the body keeps its whole array alive
	if !resp.BodyOmitted && len(resp.Body) > 0 {
		done.body = unsafe.String(unsafe.SliceData(resp.Body), len(resp.Body))
		bodyHeld = int64(cap(resp.Body))
	}
	sh := s.shard(key)
	if err := s.lock(sh); err != nil {
		return err
	}
	defer sh.mu.Unlock()
	now := s.now()
	rec, ok := sh.records[key]
	if !ok || !rec.live(now) || rec.token != token || token == "" {
		return idempotency.ErrLeaseLost
	}
	if rec.complete() {
		return nil
	}
	held := int64(len(done.meta)) + bodyHeld
	if !s.take(held) {
		// The status and headers are kept even over the bound; the body
		// is not, if there is one.
		if bodyHeld > 0 {
			done = payload{meta: omitBody(resp)}
		}
		held = int64(len(done.meta))
		s.bytes.Add(held)
	}
	rec.held += held
	rec.meta, rec.body = done.meta, done.body
	rec.ttlUntil = now.after(ttl)
	sh.records[key] = rec
	sh.noteDeadline(rec.purgeAt())
	sh.wake(key)
	return nil
}

// Release implements idempotency.Store.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	sh := s.shard(key)
	if err := s.lock(sh); err != nil {
		return err
	}
	defer sh.mu.Unlock()
	rec, ok := sh.records[key]
	if !ok || !rec.live(s.now()) {
		return nil
	}
	if !rec.heldBy(token) {
		return idempotency.ErrLeaseLost
	}
	delete(sh.records, key)
	s.forget(rec.held)
	sh.wake(key)
	return nil
}

// omitBody returns the meta block of resp marked BodyOmitted, for a
// record whose body the store has no room for. Only a store at its byte
// bound encodes this second block, under the shard's lock.
func omitBody(resp *idempotency.Response) string {
	r := *resp
	r.Body, r.BodyOmitted = nil, true
	// resp's own block was encoded without error, and r differs from it in
	// its body only, which the block does not hold.
	block, _ := wire.AppendMeta(nil, &r)
	return unsafe.String(unsafe.SliceData(block), len(block))
}

// Extend implements idempotency.Store.
func (s *Store) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if lease <= 0 {
		return fmt.Errorf("%w: lease %v is not positive", ErrInvalid, lease)
	}
	sh := s.shard(key)
	if err := s.lock(sh); err != nil {
		return err
	}
	defer sh.mu.Unlock()
	now := s.now()
	rec, ok := sh.records[key]
	if !ok || !rec.live(now) || !rec.heldBy(token) {
		return idempotency.ErrLeaseLost
	}
	rec.leaseUntil = now.after(lease)
	sh.records[key] = rec
	sh.noteDeadline(rec.purgeAt())
	return nil
}
