// Package memstore is an in-process idempotency.Store.
//
// Records live in Go maps split over 64 shards chosen by a hash of the
// key, each guarded by a sync.Mutex held only for a lookup and an update,
// so operations on different keys rarely wait for each other.
//
// The store is bounded in records (WithMaxEntries, default 1,000,000) and
// in the bytes they hold (WithMaxBytes, default 256 MiB), and never evicts
// a live record to make room: when it is full of live records, Acquire of a
// new key returns idempotency.ErrStoreFull. Complete never fails for lack
// of room, and never takes the store over its byte bound: at the bound, a
// record omits its body, or keeps its status alone (its IN_PROGRESS record
// held the room for that), so duplicates are answered by a marked replay,
// never by a second execution. The bounds are global: one principal (one client or
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
// A COMPLETE record keeps a copy of the response's body, and its status
// and headers encoded in one block of bytes (the format redisstore
// stores), which the garbage collector does not scan, however many records
// are kept: with a million records, a header map per record made each
// collection mark about three times as long. Every replay decodes the
// block into a Response of its own.
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
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/wire"
)

// ErrInvalid is returned (wrapped, with the reason) for arguments no record
// can be made from: an empty key or token, a lease or TTL that is not
// positive, a nil response or one with a status outside 200..599.
var ErrInvalid = errors.New("memstore: invalid argument")

// shardCount is the number of shards.
const shardCount = 64

// Store is an in-memory idempotency.Store. It is safe for concurrent use.
// Create it with New and stop it with Close.
type Store struct {
	shards     [shardCount]shard
	seed       maphash.Seed
	clock      func() time.Time // nil: the monotonic clock, read through time.Since
	epoch      time.Time        // the clock's reading at New; instants count from it
	maxEntries int64
	maxBytes   int64
	count      atomic.Int64 // records held
	bytes      atomic.Int64 // what the records count for (see WithMaxBytes)
	closed     atomic.Bool
	quit       chan struct{}
	swept      chan struct{}
}

// shard is one lock domain: the records and waiters of the keys that hash
// to it. A plain mutex: every call holds it for one lookup and, but for
// replays and refusals, an update; a read-write lock would let only
// replays of one key share it, and a sync.Map would turn every edge into
// a compare-and-swap loop.
type shard struct {
	mu       sync.Mutex
	records  map[string]*record
	watchers map[string]*watchers
	// nextPurge is no later than the earliest purgeAt of the shard's
	// records, so a purge before it skips the shard.
	nextPurge instant
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
		s.shards[i].records = make(map[string]*record)
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
		sh.mu.Unlock()
	}
	s.count.Store(0)
	s.bytes.Store(0)
	return nil
}

// Len returns the number of records held, including expired records that
// the sweep has not purged yet.
func (s *Store) Len() int { return int(s.count.Load()) }

func (s *Store) shard(key string) *shard {
	return &s.shards[maphash.String(s.seed, key)%shardCount]
}

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

// Acquire implements idempotency.Store. A retried Acquire by the token that
// holds the record reports Acquired (or Stolen) again and pushes the lease
// to at least req.Lease from now. A steal restarts the record's TTL.
// A Completed outcome carries a Response decoded for this call, whose body
// shares the record's bytes: readers must not modify it, and ExpiresIn, the
// time left before the record expires on the store's clock (at least 1ms).
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
	sh := s.shard(req.Key)
	a, done, err := s.acquire(sh, req)
	if err == errNoRoom {
		// Purge every shard, one at a time, then try once more.
		s.purgeAll()
		if a, done, err = s.acquire(sh, req); err == errNoRoom {
			err = s.full()
		}
	}
	if err == nil && a.Outcome == idempotency.Completed {
		// Decoded once the shard is unlocked.
		if a.Response, err = wire.Decode(done.meta, done.body); err != nil {
			return idempotency.Acquisition{}, fmt.Errorf("%w (key %q)", err, req.Key)
		}
	}
	return a, err
}

// errNoRoom reports, inside the package, that a new record found no room.
var errNoRoom = errors.New("memstore: no room")

// acquire is Acquire under the lock of the key's shard sh. A Completed
// outcome comes without its Response and with the record's payload, for
// Acquire to decode.
func (s *Store) acquire(sh *shard, req idempotency.AcquireRequest) (idempotency.Acquisition, payload, error) {
	if err := s.lock(sh); err != nil {
		return idempotency.Acquisition{}, payload{}, err
	}
	defer sh.mu.Unlock()
	now := s.now()
	rec := sh.records[req.Key]
	if rec != nil && rec.live(now) {
		switch {
		case rec.fingerprint != req.Fingerprint:
			return idempotency.Acquisition{Outcome: idempotency.Mismatch}, payload{}, nil
		case rec.complete():
			// live: ttlUntil is still ahead of now.
			left := max(time.Duration(rec.ttlUntil-now), time.Millisecond)
			return idempotency.Acquisition{Outcome: idempotency.Completed, ExpiresIn: left}, rec.done, nil
		case rec.token == req.Token:
			// A retry by the holder: the same answer, and a lease that
			// runs at least req.Lease from now.
			rec.leaseUntil = max(rec.leaseUntil, now.after(req.Lease))
			sh.noteDeadline(rec.purgeAt())
			outcome := idempotency.Stolen
			if rec.epoch == 1 {
				outcome = idempotency.Acquired
			}
			return idempotency.Acquisition{Outcome: outcome, Epoch: rec.epoch}, payload{}, nil
		case now < rec.leaseUntil:
			remaining := max(time.Duration(rec.leaseUntil-now), time.Millisecond)
			return idempotency.Acquisition{Outcome: idempotency.InFlight, Epoch: rec.epoch, LeaseRemaining: remaining}, payload{}, nil
		}
		// A steal. The new token's bytes replace the old one's, room or
		// not: a steal takes over a record, it does not make one.
		grown := int64(len(req.Token) - len(rec.token))
		rec.held += grown
		s.bytes.Add(grown)
		rec.token = req.Token
		rec.epoch++
		rec.leaseUntil = now.after(req.Lease)
		rec.ttlUntil = now.after(req.TTL)
		sh.noteDeadline(rec.purgeAt())
		return idempotency.Acquisition{Outcome: idempotency.Stolen, Epoch: rec.epoch}, payload{}, nil
	}
	if rec != nil {
		// The key's expired record gives its room to the new one.
		delete(sh.records, req.Key)
		s.forget(rec.held)
	}
	held := inProgressSize(req.Key, req.Fingerprint, req.Token)
	if !s.reserve(held) {
		return idempotency.Acquisition{}, payload{}, errNoRoom
	}
	rec = &record{
		fingerprint: req.Fingerprint,
		token:       req.Token,
		epoch:       1,
		leaseUntil:  now.after(req.Lease),
		ttlUntil:    now.after(req.TTL),
		held:        held,
	}
	sh.records[req.Key] = rec
	sh.noteDeadline(rec.purgeAt())
	return idempotency.Acquisition{Outcome: idempotency.Acquired, Epoch: 1}, payload{}, nil
}

// Complete implements idempotency.Store. The store keeps a copy of resp's
// status, headers and body, so the caller may reuse them. A retried
// Complete by the token that completed the record returns nil and keeps
// the first payload. A response with a status outside 200..599 is refused
// with ErrInvalid.
//
// Complete never fails for lack of room, nor takes the store over its byte
// bound (WithMaxBytes): when the body would take the total over it, the
// record keeps the status and headers and is marked BodyOmitted; when the
// headers would too, it keeps the status alone and is marked HeaderOmitted
// as well, in room its IN_PROGRESS record held for that since Acquire.
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
	// Encoded and copied before the lock is taken.
	block, err := wire.AppendMeta(nil, resp)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	done := payload{meta: string(block)}
	if !resp.BodyOmitted && !resp.HeaderOmitted {
		done.body = string(resp.Body)
	}
	sh := s.shard(key)
	if err := s.lock(sh); err != nil {
		return err
	}
	defer sh.mu.Unlock()
	now := s.now()
	rec := sh.records[key]
	if rec == nil || !rec.live(now) || rec.token != token {
		return idempotency.ErrLeaseLost
	}
	if rec.complete() {
		return nil
	}
	done, grown := s.fit(done, resp)
	rec.done = done
	rec.held += grown
	rec.ttlUntil = now.after(ttl)
	sh.noteDeadline(rec.purgeAt())
	sh.wake(key)
	return nil
}

// fit takes room for done, the payload of resp, beyond the
// completionReserve its record holds, and returns it with the bytes it
// took. When the store has too little room, it returns the payload without
// the body, or else with the status alone, which takes no more room.
func (s *Store) fit(done payload, resp *idempotency.Response) (payload, int64) {
	if grown := done.size() - completionReserve; s.take(grown) {
		return done, grown
	}
	if done.body != "" {
		done = payload{meta: omitBody(resp)}
		if grown := done.size() - completionReserve; s.take(grown) {
			return done, grown
		}
	}
	return payload{meta: omitAll(resp.Status)}, 0
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
	rec := sh.records[key]
	if rec == nil || !rec.live(s.now()) {
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
	rec := sh.records[key]
	if rec == nil || !rec.live(now) || !rec.heldBy(token) {
		return idempotency.ErrLeaseLost
	}
	rec.leaseUntil = now.after(lease)
	sh.noteDeadline(rec.purgeAt())
	return nil
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
		// Never above the bound, not even for a moment: Len reports it.
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

// full returns the error of an Acquire refused for lack of room, which
// says which bound the store has reached.
func (s *Store) full() error {
	if n := s.count.Load(); n >= s.maxEntries {
		return fmt.Errorf("%w: memstore holds %d records (WithMaxEntries)", idempotency.ErrStoreFull, n)
	}
	return fmt.Errorf("%w: memstore records count for %d of %d bytes (WithMaxBytes)", idempotency.ErrStoreFull, s.bytes.Load(), s.maxBytes)
}
