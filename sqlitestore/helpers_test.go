package sqlitestore_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/sqlitestore"
)

var ctx = context.Background()

// newPath returns the path of a database file in a directory of the test's.
func newPath(t *testing.T) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "idempotency.db")
}

// open opens a Store on path, closed when the test ends.
func open(t *testing.T, path string, opts ...sqlitestore.Option) *sqlitestore.Store {
	t.Helper()
	s, err := sqlitestore.Open(path, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// newKey returns a random storage key of 64 hex digits, like the
// middleware's.
func newKey() string {
	var b [32]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func req(key, token, fp string, lease, ttl time.Duration) idempotency.AcquireRequest {
	return idempotency.AcquireRequest{Key: key, Token: token, Fingerprint: fp, Lease: lease, TTL: ttl}
}

// acquire calls Acquire and fails the test on an error or another outcome.
func acquire(t *testing.T, s idempotency.Store, r idempotency.AcquireRequest, want idempotency.AcquireOutcome) idempotency.Acquisition {
	t.Helper()
	a, err := s.Acquire(ctx, r)
	if err != nil {
		t.Fatalf("Acquire(%s): %v", r.Token, err)
	}
	if a.Outcome != want {
		t.Fatalf("Acquire(%s) = %v (%+v), want %v", r.Token, a.Outcome, a, want)
	}
	return a
}

// rowOf returns every column of key's row, quoted as SQL literals, or ""
// when there is none: what a call that must change nothing must leave.
func rowOf(t *testing.T, s *sqlitestore.Store, key string) string {
	t.Helper()
	var row string
	err := s.DB().QueryRowContext(ctx, `SELECT quote(key)||','||quote(state)||','||quote(token)||','||quote(fingerprint)||','||
		quote(epoch)||','||quote(lease_until)||','||quote(ttl_until)||','||quote(expires_at)||','||quote(status)||','||
		quote(headers)||','||quote(body)||','||quote(body_omitted)||','||quote(updated_at)
		FROM idempotency_records WHERE key = ?`, key).Scan(&row)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		t.Fatal(err)
	}
	return row
}

// waitFor polls cond every few milliseconds until it holds, failing the
// test after bound.
func waitFor(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, bound)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
