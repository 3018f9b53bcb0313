package redisstore

import (
	"context"
	"fmt"
	"time"
)

// Option configures a Store.
type Option func(*config)

type config struct {
	prefix string
	// oomAllowance is the largest payload Complete writes on a server at
	// maxmemory (see WithMaxmemoryAllowance).
	oomAllowance int
	waitN        int
	waitTimeout  time.Duration
	onWAIT       func(ctx context.Context, err *WAITError)
}

func defaultConfig() config {
	return config{prefix: DefaultPrefix, oomAllowance: defaultMaxmemoryAllowance}
}

// DefaultPrefix is the prefix of record keys without WithPrefix.
const DefaultPrefix = "idempotency:"

// WithPrefix sets the prefix of every record key (and of every record's
// pub/sub channel). Stores sharing a Redis database must use distinct
// prefixes unless they are meant to share records. It panics when p is
// empty.
//
// Default: DefaultPrefix ("idempotency:").
func WithPrefix(p string) Option {
	if p == "" {
		panic("redisstore: WithPrefix: empty prefix")
	}
	return func(c *config) { c.prefix = p }
}

// defaultMaxmemoryAllowance is WithMaxmemoryAllowance's default.
const defaultMaxmemoryAllowance = 4 << 10

// WithMaxmemoryAllowance sets the largest payload, in bytes, that Complete
// writes on a Redis server at maxmemory (with noeviction): the encoded
// status, headers and body as stored. A payload of at most n bytes is
// written there with the allow-oom complete script. A larger one is sent
// with a script that Redis 7 refuses at maxmemory before it runs; Complete
// then stores in its place the status and headers without the body
// (BodyOmitted) when those fit in n bytes, and otherwise the status alone
// (HeaderOmitted), a few bytes written whatever n is. Either way the
// record is COMPLETE, so a duplicate is replayed, marked, and the handler
// never runs a second time for lack of memory.
//
// A server at maxmemory refuses new records, so only the records already
// in progress when it got there can complete past it, each storing at most
// n bytes of payload: it goes past maxmemory by at most their number times
// n (plus what Redis adds to each: its allocator rounds a value up by at
// most a quarter, and a record's hash costs under 256 bytes; a record with
// a 4 KiB payload takes 5.2 KiB), and by at most one larger payload, which
// Redis admitted while still below maxmemory. With 0, nothing but the
// status-only marks (under 100 bytes a record) is written past
// maxmemory. It panics when n < 0.
//
// Default: 4 KiB.
func WithMaxmemoryAllowance(n int) Option {
	if n < 0 {
		panic(fmt.Sprintf("redisstore: WithMaxmemoryAllowance: %d bytes < 0", n))
	}
	return func(c *config) { c.oomAllowance = n }
}

// WithWAIT makes Complete follow its write with WAIT replicas timeout on the
// same connection, so the COMPLETE record is on that many replicas before
// the response is sent, when they acknowledge in time. It is best effort: a
// WAIT that reaches fewer replicas, or fails, does not fail Complete; it is
// reported to the handler set with WithWAITErrorHandler. WAIT narrows the
// window in which a failover loses a completed record; it does not make
// Redis strongly consistent (see the package documentation).
//
// timeout should stay below the client's ReadTimeout. On a Cluster the
// script and WAIT follow the record's master through MOVED, ASK, READONLY
// and a failed-over master, so WAIT counts the replicas of the master that
// wrote the record. It panics when
// replicas < 1 or timeout <= 0 (WAIT 0 would block forever).
//
// Default: no WAIT.
func WithWAIT(replicas int, timeout time.Duration) Option {
	if replicas < 1 {
		panic(fmt.Sprintf("redisstore: WithWAIT: replicas %d < 1", replicas))
	}
	if timeout <= 0 {
		panic(fmt.Sprintf("redisstore: WithWAIT: timeout %v <= 0", timeout))
	}
	return func(c *config) { c.waitN, c.waitTimeout = replicas, timeout }
}

// WithWAITErrorHandler sets the function called when the WAIT issued after
// Complete (see WithWAIT) reached fewer replicas than asked or failed. It is
// called synchronously from Complete, which still returns nil. It panics
// when fn is nil.
//
// Default: none; shortfalls are ignored.
func WithWAITErrorHandler(fn func(ctx context.Context, err *WAITError)) Option {
	if fn == nil {
		panic("redisstore: WithWAITErrorHandler: nil handler")
	}
	return func(c *config) { c.onWAIT = fn }
}

// WAITError reports a WAIT after Complete that did not reach the number of
// replicas asked for with WithWAIT. The record is COMPLETE on the master
// either way.
type WAITError struct {
	// Key is the record's Redis key.
	Key string
	// Replicas is the number of replicas asked for; Acked the number that
	// acknowledged the write before the timeout.
	Replicas, Acked int
	// Err is set when WAIT itself failed (for example the connection broke
	// after the write); Acked is then 0.
	Err error
}

// Error describes the shortfall.
func (e *WAITError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("redisstore: WAIT after completing %s failed: %v", e.Key, e.Err)
	}
	return fmt.Sprintf("redisstore: WAIT after completing %s: %d of %d replicas acknowledged", e.Key, e.Acked, e.Replicas)
}

// Unwrap returns the error WAIT failed with, if any.
func (e *WAITError) Unwrap() error { return e.Err }
