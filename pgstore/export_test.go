package pgstore

import (
	"context"
	"errors"

	"github.com/go-idempotency/idempotency"
	"github.com/jackc/pgx/v5"
)

// ListenerPID returns the backend of the Store's listening connection, or 0
// before the first Watch.
func (s *Store) ListenerPID() uint32 {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	return s.hub.pid
}

// ListenerConnects counts the listening connections the Store opened.
func (s *Store) ListenerConnects() int {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	return s.hub.connects
}

// Retries counts the statements the Store ran again because the row
// changed under them.
func (s *Store) Retries() int64 { return s.retries.Load() }

// SetBeforeCommit makes every Tx.Complete of s call f between the fence and
// the COMMIT. Set it before s is used.
func SetBeforeCommit(s *Store, f func(*Tx)) { s.beforeCommit = f }

// Key returns the record's key the transaction completes.
func (t *Tx) Key() string { return t.key }

// AcquireSQL returns the statement Acquire runs.
func AcquireSQL(s *Store) string { return s.sql.acquire }

// PurgeSQL returns the statement Purge runs.
func PurgeSQL(s *Store) string { return s.sql.purge }

// Waiters counts the waiters registered on key.
func (s *Store) Waiters(key string) int {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	return len(s.hub.waiters[key])
}

// The codes of the acquire statement.
const (
	CodeCorrupt      = codeCorrupt
	CodeRetry        = codeRetry
	AcquireTaken     = acquireTaken
	AcquireCompleted = acquireCompleted
	AcquireInFlight  = acquireInFlight
	AcquireMismatch  = acquireMismatch
)

// AcquireCode runs the statement of Acquire once, on tx, with the
// arguments Acquire sends for r, and returns the code it answers with.
func AcquireCode(ctx context.Context, s *Store, tx pgx.Tx, r idempotency.AcquireRequest) (int, error) {
	code, _, err := s.acquire(ctx, tx, r)
	if errors.Is(err, idempotency.ErrCorruptRecord) {
		err = nil
	}
	return code, err
}

// AcquireFunction is the statement of RecordsSchema(name) that Migrate runs
// on a schema already in place.
var AcquireFunction = acquireFunction
