package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/redisrecord"
	"github.com/go-idempotency/idempotency/internal/wire"
	"github.com/redis/go-redis/v9"
)

// Store is an idempotency.Store keeping records in Redis: one hash per
// record, changed only by Lua scripts that run on the server. It is safe for
// concurrent use. Create it with New and stop it with Close.
type Store struct {
	client redis.UniversalClient // the caller's: pub/sub, topology
	// calls is the client of the Store's scripts: client, or a clone of it
	// that honours deadlines (see callClient).
	calls  redis.UniversalClient
	cfg    config
	closed atomic.Bool
	hub    *hub
	// deadlines: the client stops a call at its context's deadline (see
	// bounded).
	deadlines bool

	// plainScripts is set once the server refused the flags line of a
	// script (a server before Redis 7): the Store then sends the scripts
	// without it (see flaggedScript).
	plainScripts atomic.Bool
}

var _ idempotency.Store = (*Store)(nil)

// New returns a Store using client, which may be a *redis.Client, a
// Sentinel-backed client from redis.NewFailoverClient or a
// *redis.ClusterClient. New sends nothing to Redis, and the Store does not
// close client. It panics when client is nil. Whether the server keeps
// records safely is the deployment's to check (package servercheck, or
// idemctl check).
func New(client redis.UniversalClient, opts ...Option) *Store {
	if client == nil {
		panic("redisstore: New: nil client")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			panic("redisstore: New: nil Option")
		}
		o(&cfg)
	}
	calls, deadlines := callClient(client)
	return &Store{client: client, calls: calls, cfg: cfg, hub: newHub(client), deadlines: deadlines}
}

// Close stops the Store's shared pub/sub subscription and wakes every
// waiter. Later calls on the Store return idempotency.ErrStoreClosed. Close
// does not close the Redis client. It is safe to call more than once.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	return s.hub.close()
}

// RecordKey returns the Redis key of the record stored under key:
// the prefix followed by key.
func (s *Store) RecordKey(key string) string { return s.cfg.prefix + key }

// Channel returns the pub/sub channel on which the record stored under key
// announces that it was completed or released: its Redis key followed by
// ":changed".
func (s *Store) Channel(key string) string { return redisrecord.Channel(s.RecordKey(key)) }

// millis converts d to whole milliseconds, rounding up so that a positive
// duration never becomes 0.
func millis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// validate returns why the Store cannot take a call on key with token:
// closed, or an argument missing.
func (s *Store) validate(key, token string) error {
	if s.closed.Load() {
		return idempotency.ErrStoreClosed
	}
	if key == "" {
		return errors.New("redisstore: empty key")
	}
	if token == "" {
		return errors.New("redisstore: empty lease token")
	}
	return nil
}

// Acquire implements idempotency.Store in one round trip: a COMPLETE
// record's payload comes back in the same reply and, when req.WantExpiresIn
// asks for it, the time its key has left (PTTL) as ExpiresIn (0 for a key
// without expiry, and when not asked). A retry by the
// token that holds the record renews its lease to run req.Lease from now on
// the server's clock when it would end sooner, even if it had run out, so a
// retry never hands out a lease that has already run out. A value under the
// key that is not a well-formed record is reported as an error wrapping
// idempotency.ErrCorruptRecord; a server out of memory (maxmemory reached
// with the noeviction policy) refusing a write as one wrapping
// idempotency.ErrStoreFull.
func (s *Store) Acquire(ctx context.Context, req idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	if err := s.validate(req.Key, req.Token); err != nil {
		return idempotency.Acquisition{}, err
	}
	if req.Lease <= 0 || req.TTL <= 0 {
		return idempotency.Acquisition{}, fmt.Errorf("redisstore: lease %v and TTL %v must be positive", req.Lease, req.TTL)
	}
	rkey := s.RecordKey(req.Key)
	lease, expiry := millis(req.Lease), millis(max(req.Lease, req.TTL))
	args := []any{redisrecord.PayloadField(req.Fingerprint), redisrecord.TokenTag(req.Token), lease, expiry}
	if req.WantExpiresIn {
		args = append(args, 1)
	}
	reply, err := s.bounded(ctx, func(ctx context.Context) ([]any, error) {
		return acquireScript.Run(ctx, s.calls, []string{rkey}, args...).Slice()
	})
	if err != nil {
		s.reloadSlotMapAfter(err)
		if isOOM(err) {
			return idempotency.Acquisition{}, fmt.Errorf("%w: %s: %v", idempotency.ErrStoreFull, rkey, err)
		}
		return idempotency.Acquisition{}, fmt.Errorf("redisstore: acquire %s: %w", rkey, err)
	}
	code, err := replyCode(rkey, reply)
	if err != nil {
		return idempotency.Acquisition{}, err
	}
	bad := func() (idempotency.Acquisition, error) {
		return idempotency.Acquisition{}, fmt.Errorf("redisstore: acquire %s: unexpected reply %v", rkey, reply)
	}
	switch code {
	case acquireAcquired, acquireStolen:
		epoch, ok := epochAt(reply, 1)
		if !ok {
			return bad()
		}
		o := idempotency.Acquired
		if code == acquireStolen {
			o = idempotency.Stolen
		}
		return idempotency.Acquisition{Outcome: o, Epoch: uint64(epoch)}, nil
	case acquireCompleted:
		// The payload, then the PTTL when it was asked for.
		payload, ok := strAt(reply, 1)
		if !ok {
			return bad()
		}
		var expires time.Duration
		n := 2
		if req.WantExpiresIn {
			pttl, ok := intAt(reply, n)
			if !ok || pttl < -1 {
				return bad()
			}
			expires = expiresIn(pttl)
			n++
		}
		if len(reply) != n {
			return bad()
		}
		meta, body, err := redisrecord.SplitPayload(payload)
		if err != nil {
			return idempotency.Acquisition{}, fmt.Errorf("%w: key %s: %v", idempotency.ErrCorruptRecord, rkey, err)
		}
		resp, err := wire.Decode(meta, body)
		if err != nil {
			return idempotency.Acquisition{}, fmt.Errorf("%w (key %s)", err, rkey)
		}
		return idempotency.Acquisition{Outcome: idempotency.Completed, Response: resp, ExpiresIn: expires}, nil
	case acquireInFlight:
		epoch, ok1 := epochAt(reply, 1)
		ms, ok2 := intAt(reply, 2)
		if !ok1 || !ok2 || ms < 0 {
			return bad()
		}
		return idempotency.Acquisition{
			Outcome:        idempotency.InFlight,
			Epoch:          uint64(epoch),
			LeaseRemaining: msDuration(max(ms, 1)),
		}, nil
	case acquireMismatch:
		return idempotency.Acquisition{Outcome: idempotency.Mismatch}, nil
	}
	return bad()
}

// Complete implements idempotency.Store, in one round trip. A payload
// (the encoded status, headers and body) of at most WithMaxmemoryAllowance
// bytes is written even on a server at maxmemory. A larger one goes with a
// complete script that Redis 7 refuses at maxmemory before it runs; Complete
// then writes, in a second round trip, a marked payload in its place: the
// status and headers with the body omitted (Response.BodyOmitted) when they
// fit in the allowance, else the status alone (Response.HeaderOmitted). The
// record is COMPLETE either way, so a duplicate gets a replay marked as
// such, never a second execution. A retried Complete keeps the payload the
// first one stored, full or marked.
//
// With WithWAIT, the write and a WAIT go out together on one connection; a
// WAIT shortfall is reported to the WithWAITErrorHandler and does not fail
// Complete. On a Cluster, Complete follows the record to its current master
// when its slot has moved or is moving (MOVED, ASK) or its master has failed
// over (MOVED, READONLY, or an unreachable master: the client's slot map is
// then reloaded), WAIT included.
func (s *Store) Complete(ctx context.Context, key, token string, resp *idempotency.Response, ttl time.Duration) error {
	if err := s.validate(key, token); err != nil {
		return err
	}
	if ttl <= 0 {
		return fmt.Errorf("redisstore: TTL %v must be positive", ttl)
	}
	payload, err := redisrecord.AppendPayload(nil, resp)
	if err != nil {
		return fmt.Errorf("redisstore: %w", err)
	}
	rkey := s.RecordKey(key)
	tag, ms := redisrecord.TokenTag(token), millis(ttl)
	reply, err := s.bounded(ctx, func(ctx context.Context) ([]any, error) {
		if len(payload) <= s.cfg.oomAllowance {
			return s.runComplete(ctx, completeScript, rkey, tag, ms, payload)
		}
		reply, err := s.runComplete(ctx, completeDenyOOMScript, rkey, tag, ms, payload)
		// A server before Redis 7 refuses the first write of any script
		// at maxmemory, so it would refuse the marked payload too.
		if !isOOM(err) || s.plainScripts.Load() {
			return reply, err
		}
		// Redis 7 refused the script at maxmemory before it ran: nothing
		// was written.
		marked, err := redisrecord.AppendPayload(nil, s.markedResponse(resp))
		if err != nil {
			return nil, err
		}
		return s.runComplete(ctx, completeScript, rkey, tag, ms, marked)
	})
	if err != nil {
		s.reloadSlotMapAfter(err)
		return fmt.Errorf("redisstore: complete %s: %w", rkey, err)
	}
	return s.fenced("complete", rkey, reply)
}

// runComplete runs sc, completeScript or completeDenyOOMScript, for the
// record at rkey: with WAIT when WithWAIT asks for it.
func (s *Store) runComplete(ctx context.Context, sc *flaggedScript, rkey, tag string, ttl int64, payload []byte) ([]any, error) {
	args := []any{tag, ttl, payload}
	if s.cfg.waitN > 0 {
		return s.completeAndWait(ctx, sc, rkey, args)
	}
	return s.runReloading(ctx, sc, []string{rkey}, args...)
}

// markedResponse returns what Complete stores in place of resp when a
// server at maxmemory refused its payload: the status and headers, marked
// BodyOmitted, when their payload fits in WithMaxmemoryAllowance; else the
// status alone, marked HeaderOmitted, which always is written.
func (s *Store) markedResponse(resp *idempotency.Response) *idempotency.Response {
	withHeader := &idempotency.Response{Status: resp.Status, Header: resp.Header, BodyOmitted: true}
	if !resp.HeaderOmitted {
		if p, err := redisrecord.AppendPayload(nil, withHeader); err == nil && len(p) <= s.cfg.oomAllowance {
			return withHeader
		}
	}
	return &idempotency.Response{Status: resp.Status, BodyOmitted: true, HeaderOmitted: true}
}

// Release implements idempotency.Store.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := s.validate(key, token); err != nil {
		return err
	}
	rkey := s.RecordKey(key)
	reply, err := s.bounded(ctx, func(ctx context.Context) ([]any, error) {
		return s.run(ctx, releaseScript, []string{rkey}, redisrecord.TokenTag(token))
	})
	if err != nil {
		s.reloadSlotMapAfter(err)
		return fmt.Errorf("redisstore: release %s: %w", rkey, err)
	}
	return s.fenced("release", rkey, reply)
}

// Extend implements idempotency.Store.
func (s *Store) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if err := s.validate(key, token); err != nil {
		return err
	}
	if lease <= 0 {
		return fmt.Errorf("redisstore: lease %v must be positive", lease)
	}
	rkey := s.RecordKey(key)
	reply, err := s.bounded(ctx, func(ctx context.Context) ([]any, error) {
		return s.run(ctx, extendScript, []string{rkey}, redisrecord.TokenTag(token), millis(lease))
	})
	if err != nil {
		s.reloadSlotMapAfter(err)
		return fmt.Errorf("redisstore: extend %s: %w", rkey, err)
	}
	return s.fenced("extend", rkey, reply)
}

// fenced interprets the reply of a complete, release or extend script.
func (s *Store) fenced(op, rkey string, reply []any) error {
	code, err := replyCode(rkey, reply)
	if err != nil {
		return err
	}
	switch code {
	case fencedOK:
		return nil
	case fencedLost:
		return idempotency.ErrLeaseLost
	}
	return fmt.Errorf("redisstore: %s %s: unexpected reply %v", op, rkey, reply)
}

// replyCode returns the first element of a script reply, its code, turning
// the {replyCorrupt, message} reply into an error wrapping
// idempotency.ErrCorruptRecord.
func replyCode(rkey string, reply []any) (int64, error) {
	code, ok := intAt(reply, 0)
	if !ok {
		return 0, fmt.Errorf("redisstore: %s: unexpected reply %v", rkey, reply)
	}
	if code == replyCorrupt {
		msg, _ := strAt(reply, 1)
		return 0, fmt.Errorf("%w: key %s: %s", idempotency.ErrCorruptRecord, rkey, msg)
	}
	return code, nil
}

// epochAt returns the epoch at reply[i], which must lie in [1,
// redisrecord.MaxEpoch].
// Redis turns a Lua number into an integer reply by truncation, so a reply
// outside that range (which the script never sends) is refused rather than
// trusted.
func epochAt(reply []any, i int) (int64, bool) {
	v, ok := intAt(reply, i)
	return v, ok && v >= 1 && v <= redisrecord.MaxEpoch
}

// expiresIn converts a COMPLETE record key's PTTL to Acquisition.ExpiresIn:
// at least 1ms while the key has an expiry, and 0 (unknown) for a key
// without one (-1), such as a record made persistent by hand: it stays until
// someone deletes it, so no cache may keep it for any time.
func expiresIn(pttl int64) time.Duration {
	if pttl < 0 {
		return 0
	}
	return msDuration(max(pttl, 1))
}

// msDuration converts a non-negative number of milliseconds to a Duration,
// saturating at the largest Duration instead of overflowing.
func msDuration(ms int64) time.Duration {
	if ms > math.MaxInt64/int64(time.Millisecond) {
		return math.MaxInt64
	}
	return time.Duration(ms) * time.Millisecond
}

func intAt(reply []any, i int) (int64, bool) {
	if i >= len(reply) {
		return 0, false
	}
	v, ok := reply[i].(int64)
	return v, ok
}

func strAt(reply []any, i int) (string, bool) {
	if i >= len(reply) {
		return "", false
	}
	v, ok := reply[i].(string)
	return v, ok
}

func isOOM(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "OOM ")
}
