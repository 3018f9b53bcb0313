package idempotency

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"
)

// Store keeps idempotency records. A record is identified by a storage key
// (derived by the middleware from the request's scope and Idempotency-Key; it
// never contains client bytes) and is absent, IN_PROGRESS or COMPLETE:
//
//	acquire   absent, or COMPLETE past its TTL   -> IN_PROGRESS (fresh lease, epoch 1)
//	steal     IN_PROGRESS whose lease expired    -> IN_PROGRESS (new lease, epoch + 1)
//	complete  IN_PROGRESS holding the lease      -> COMPLETE, kept for the TTL from now
//	release   IN_PROGRESS holding the lease      -> absent
//	extend    IN_PROGRESS holding the lease      -> lease pushed forward
//	purge     COMPLETE past TTL; IN_PROGRESS past TTL and past lease -> absent
//
// Acquire is the only operation that judges lease expiry; Complete, Release
// and Extend compare the lease token only. An expired record (COMPLETE past
// its TTL, IN_PROGRESS past both TTL and lease) is absent to every operation
// from that instant, purged or not. Expiry is decided by the store's own
// clock, so the clocks of application nodes do not matter. Acquire and steal
// both start the record's TTL afresh.
//
// Every operation must be safe to retry with the same arguments: a call whose
// outcome is unknown (a timeout) is retried with the same token and gives the
// same answer as the first call would have.
//
// The middleware bounds the calls it makes after the handler ran (Complete,
// Release) and the heartbeat's Extend with a context deadline. A store must
// return by that deadline (the call may still take effect, as a timed-out
// call may): the deadline is what bounds how long a client waits for the
// record to be stored.
//
// Implementations must be safe for concurrent use. Package storetest holds the
// conformance suite every Store is expected to pass.
type Store interface {
	// Acquire looks up the record at req.Key and, when the caller may run the
	// handler, takes a lease on it with req.Token. It reports one of the
	// AcquireOutcome values in Acquisition.Outcome. A record whose fingerprint
	// differs from req.Fingerprint is reported as Mismatch and left untouched,
	// whatever its state. Acquire with the token that already holds an
	// IN_PROGRESS record reports Acquired (or Stolen) again, with the same
	// epoch, and renews the lease to run at least req.Lease from now on the
	// store's clock, whether or not it had run out, as long as no other token
	// took the record over: a retried Acquire (a client library resending a
	// call whose reply was late) never hands out a lease that has already
	// run out, and never shortens one.
	//
	// Acquire returns ErrStoreFull when the record cannot be created for lack
	// of room (memstore's bound; Redis at maxmemory under noeviction), and an
	// error wrapping ErrCorruptRecord when the stored value is not a record.
	// Any other error means the store could not be reached or refused the
	// arguments (an empty key or token, a non-positive lease or TTL); it
	// changes nothing.
	Acquire(ctx context.Context, req AcquireRequest) (Acquisition, error)

	// Complete stores resp as the record's payload and moves the record to
	// COMPLETE, kept for ttl from now. The record must be IN_PROGRESS and held
	// by token, or already COMPLETE by the same token (a retried Complete);
	// otherwise Complete returns ErrLeaseLost and changes nothing. A retried
	// Complete keeps the payload of the first. The store
	// must not keep a reference to resp.Header or resp.Body it may later
	// modify; it may keep resp itself, which callers treat as immutable.
	Complete(ctx context.Context, key, token string, resp *Response, ttl time.Duration) error

	// Release deletes the record when it is IN_PROGRESS and held by token. It
	// returns nil when there is no record (already released), and
	// ErrLeaseLost when the record is held by another token or COMPLETE.
	Release(ctx context.Context, key, token string) error

	// Extend pushes the lease of an IN_PROGRESS record held by token to
	// lease from now. It returns ErrLeaseLost when the record is absent,
	// COMPLETE or held by another token.
	Extend(ctx context.Context, key, token string, lease time.Duration) error

	// Watch subscribes to the record at key: the returned channel is closed
	// when the record is completed or released after Watch
	// returned. A waiter calls Watch before it re-checks the record with
	// Acquire, so no change can slip between the check and the wait. The
	// notification is a hint: the waiter must re-check, and must bound its
	// wait, since a notification can be lost (for example over a network),
	// and a steal or an expiry need not notify, nor need the edges of a
	// record that did not exist yet when Watch was called.
	// Extra wake-ups (a broken connection, Close) are allowed: the re-check
	// makes them harmless. stop releases the subscription and must be called
	// exactly once.
	Watch(ctx context.Context, key string) (changed <-chan struct{}, stop func(), err error)
}

// TxStore is a Store that can write a key's COMPLETE record in the same
// transaction as the handler's own writes (package pgstore does, on
// PostgreSQL). On routes with WithTransaction, the middleware begins the
// transaction once it holds the lease, hands it to the handler through the
// request's context (Info.Tx, from FromContext), and after the handler
// returns either completes the record in it and commits, or rolls it back
// and releases the key. The handler's writes and the record then commit
// together or not at all: a database side effect happens exactly once,
// whatever crashes, stalls or steals happen in between.
//
// A third-party SQL store implements TxStore by fencing inside the
// transaction: Complete must update the record only where it is still
// IN_PROGRESS under the token given to BeginTx (a row lock then orders it
// against a concurrent steal), and roll back with ErrLeaseLost otherwise.
type TxStore interface {
	Store
	// BeginTx starts a transaction for the request that holds the record
	// at key with token. ctx bounds the begin only.
	BeginTx(ctx context.Context, key, token string) (Tx, error)
}

// Tx is one request's transaction on a TxStore.
type Tx interface {
	// Handle returns what handlers write with (for pgstore, a pgx.Tx); it is
	// Info.Tx in the handler's context.
	Handle() any
	// Complete writes resp as the record's COMPLETE payload, kept for ttl
	// from now, fenced by the token given to BeginTx, and commits. It
	// returns ErrLeaseLost, with everything rolled back, when the record is
	// no longer IN_PROGRESS under that token. Any other error leaves the
	// commit's outcome unknown: both the handler's writes and the record
	// landed, or neither did.
	Complete(ctx context.Context, resp *Response, ttl time.Duration) error
	// Rollback abandons the transaction. It is safe to call after Complete
	// and more than once.
	Rollback(ctx context.Context) error
}

// AcquireRequest holds the arguments of Store.Acquire.
type AcquireRequest struct {
	// Key is the storage key: bounded, free of client bytes.
	Key string
	// Token is the caller's lease token, unique per attempt. A retried
	// Acquire presents the same token.
	Token string
	// Fingerprint identifies the request payload; compared byte for byte.
	Fingerprint string
	// Lease is how long the caller holds the record without extending it.
	Lease time.Duration
	// TTL bounds how long an IN_PROGRESS record is kept: it is purged only
	// once both TTL and lease have passed.
	TTL time.Duration
	// WantExpiresIn asks for Acquisition.ExpiresIn on a Completed answer.
	// A store may tell it unasked; one that pays for it (redisstore: a PTTL
	// in the replay's script) tells it only when asked. The middleware does
	// not ask; a cache in front of the store (package replaycache) does.
	WantExpiresIn bool
}

// AcquireOutcome is what Store.Acquire found. (Outcome is how a whole
// attempt ended.)
type AcquireOutcome uint8

const (
	// Acquired: there was no record (or only a COMPLETE one past its TTL);
	// the caller now holds a fresh lease and runs the handler.
	Acquired AcquireOutcome = iota + 1
	// Stolen: the record was IN_PROGRESS with an expired lease; the caller
	// took it over atomically (Epoch incremented) and runs the handler.
	Stolen
	// Completed: the record is COMPLETE with the same fingerprint;
	// Acquisition.Response holds the payload to replay.
	Completed
	// InFlight: the record is IN_PROGRESS under a live lease held by another
	// token; Acquisition.LeaseRemaining says how long it still runs at most
	// before it can be stolen.
	InFlight
	// Mismatch: the record (IN_PROGRESS or COMPLETE) was made by a request
	// with a different fingerprint. Nothing was changed.
	Mismatch
)

var acquireOutcomeNames = [...]string{"", "acquired", "stolen", "completed", "in_flight", "mismatch"}

// String returns the outcome's lower-case name.
func (o AcquireOutcome) String() string {
	if int(o) < len(acquireOutcomeNames) && o != 0 {
		return acquireOutcomeNames[o]
	}
	return "acquire_outcome(" + strconv.Itoa(int(o)) + ")"
}

// Acquisition is the result of Store.Acquire.
type Acquisition struct {
	Outcome AcquireOutcome
	// Epoch counts the attempts on the record: 1 for the first lease, +1 for
	// each steal. Reported for Acquired, Stolen and InFlight.
	Epoch uint64
	// LeaseRemaining is the time left on the current holder's lease, for
	// InFlight (at least 1ms).
	LeaseRemaining time.Duration
	// Response is the stored payload, for Completed. Callers must not modify it.
	Response *Response
	// ExpiresIn is the time left before the record expires, for Completed
	// when AcquireRequest.WantExpiresIn asked for it, as the store's clock
	// counts it when it answers (at least 1ms). Zero means the store does
	// not tell; a cache in front of the store (see package replaycache)
	// then keeps nothing.
	ExpiresIn time.Duration
}

// Response is the stored, replayable part of a handler's response.
type Response struct {
	// Status is the HTTP status code (200–599).
	Status int
	// Header holds the stored headers (hop-by-hop headers, Date and, unless
	// configured, Set-Cookie are never stored).
	Header http.Header
	// Body is the response body; empty when BodyOmitted.
	Body []byte
	// BodyOmitted reports that the body was not stored: it was over the
	// store cap, or not known in full (the first client hung up, or the
	// server's WriteTimeout passed, while the handler wrote it), or over a
	// store's own bound. A replay sends the status and headers with an
	// empty body and Idempotent-Body-Omitted: true.
	BodyOmitted bool
	// HeaderOmitted reports that the headers were not stored either: they
	// were over WithMaxResponseHeader, or the store had no room for them
	// (memstore at its byte bound, Redis at maxmemory). It implies
	// BodyOmitted, and Header is empty. A replay sends the status alone,
	// with Idempotent-Header-Omitted: true and Idempotent-Body-Omitted:
	// true.
	HeaderOmitted bool
}

// Errors returned by stores and reported by the middleware.
var (
	// ErrLeaseLost is returned by Complete, Release and Extend when the caller
	// no longer holds the record's lease (it was stolen, completed or purged),
	// and is the cause of a handler context cancelled for that reason.
	ErrLeaseLost = errors.New("idempotency: lease lost")
	// ErrStoreFull is returned by Acquire when a store bounded in size has no
	// room for a new record. The middleware answers 503.
	ErrStoreFull = errors.New("idempotency: store full")
	// ErrStoreClosed is returned by a store used after Close.
	ErrStoreClosed = errors.New("idempotency: store closed")
	// ErrCorruptRecord is returned (wrapped) when the value stored under a
	// record's key is not a record or cannot be decoded (by Acquire, and by
	// Complete, Release and Extend, which then change nothing). The
	// middleware answers 500 and neither replays nor runs the handler.
	ErrCorruptRecord = errors.New("idempotency: corrupt record")
)
