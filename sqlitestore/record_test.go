package sqlitestore_test

import (
	"bytes"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/fakeclock"
	"github.com/go-idempotency/idempotency/internal/wire"
	"github.com/go-idempotency/idempotency/sqlitestore"
)

func sampleResponse() *idempotency.Response {
	return &idempotency.Response{
		Status: http.StatusCreated,
		Header: http.Header{
			"Content-Type": {"application/octet-stream"},
			"Location":     {"/payments/42"},
			"X-Multi":      {"b", "a", "c"},
		},
		Body: []byte("\x00\x01binary\xff\xfe body"),
	}
}

// TestReopenReplay: a COMPLETE record survives Close and a new Open of the
// file, and its replay is byte for byte the response stored.
func TestReopenReplay(t *testing.T) {
	path := newPath(t)
	s, err := sqlitestore.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	key, want := newKey(), sampleResponse()
	acquire(t, s, req(key, "owner", "fp", time.Minute, time.Hour), idempotency.Acquired)
	if err := s.Complete(ctx, key, "owner", sampleResponse(), time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, req(key, "late", "fp", time.Minute, time.Hour)); !errors.Is(err, idempotency.ErrStoreClosed) {
		t.Fatalf("Acquire after Close: %v, want ErrStoreClosed", err)
	}

	s = open(t, path)
	a := acquire(t, s, req(key, "retry", "fp", time.Minute, time.Hour), idempotency.Completed)
	gotMeta, err := wire.AppendMeta(nil, a.Response)
	if err != nil {
		t.Fatal(err)
	}
	wantMeta, _ := wire.AppendMeta(nil, want)
	if !bytes.Equal(gotMeta, wantMeta) || !bytes.Equal(a.Response.Body, want.Body) {
		t.Fatalf("replay after reopen differs:\n got %q %q\nwant %q %q", gotMeta, a.Response.Body, wantMeta, want.Body)
	}
	if !reflect.DeepEqual(a.Response.Header, want.Header) || a.Response.Status != want.Status {
		t.Fatalf("replay after reopen: %d %v, want %d %v", a.Response.Status, a.Response.Header, want.Status, want.Header)
	}
	if a.ExpiresIn <= 0 || a.ExpiresIn > time.Hour {
		t.Fatalf("ExpiresIn %v", a.ExpiresIn)
	}
}

// TestEmptyBodyAndFingerprint: an empty body and an empty fingerprint are
// stored as empty values (not NULL, which would be a corrupt row), and an
// omitted body replays as omitted.
func TestEmptyBodyAndFingerprint(t *testing.T) {
	s := open(t, newPath(t))
	for _, resp := range []*idempotency.Response{
		{Status: http.StatusNoContent},
		{Status: http.StatusOK, Body: []byte{}},
		{Status: http.StatusOK, BodyOmitted: true, Header: http.Header{"A": {"b"}}},
		{Status: http.StatusOK, HeaderOmitted: true, BodyOmitted: true},
	} {
		key := newKey()
		acquire(t, s, req(key, "owner", "", time.Minute, time.Hour), idempotency.Acquired)
		if err := s.Complete(ctx, key, "owner", resp, time.Hour); err != nil {
			t.Fatal(err)
		}
		a := acquire(t, s, req(key, "dup", "", time.Minute, time.Hour), idempotency.Completed)
		if a.Response.Status != resp.Status || len(a.Response.Body) != 0 || a.Response.BodyOmitted != resp.BodyOmitted || a.Response.HeaderOmitted != resp.HeaderOmitted {
			t.Fatalf("stored %+v, replayed %+v", resp, a.Response)
		}
	}
}

// corrupt runs stmt on key's row, with CHECK constraints off so that it may
// write an unknown state.
func corrupt(t *testing.T, s *sqlitestore.Store, key, stmt string) {
	t.Helper()
	conn, err := s.DB().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "PRAGMA ignore_check_constraints = 1"); err != nil {
		t.Fatal(err)
	}
	defer conn.ExecContext(ctx, "PRAGMA ignore_check_constraints = 0")
	if _, err := conn.ExecContext(ctx, stmt, key); err != nil {
		t.Fatalf("%s: %v", stmt, err)
	}
}

// TestCorruptRows: a row that is not a record is reported as
// ErrCorruptRecord by every call that reads it, and left as it is.
func TestCorruptRows(t *testing.T) {
	s := open(t, newPath(t))
	resp := &idempotency.Response{Status: http.StatusCreated, Header: http.Header{"A": {"b"}}, Body: []byte("body")}
	for _, tc := range []struct {
		name     string
		complete bool // the record is COMPLETE before it is corrupted
		stmt     string
	}{
		{"garbage headers", true, `UPDATE idempotency_records SET headers = x'ff00fe' WHERE key = ?`},
		{"status disagrees", true, `UPDATE idempotency_records SET status = 500 WHERE key = ?`},
		{"body_omitted disagrees", true, `UPDATE idempotency_records SET body_omitted = 1 WHERE key = ?`},
		{"NULL body", true, `UPDATE idempotency_records SET body = NULL WHERE key = ?`},
		{"NULL headers", true, `UPDATE idempotency_records SET headers = NULL WHERE key = ?`},
		{"unknown state", false, `UPDATE idempotency_records SET state = 'paused' WHERE key = ?`},
		{"unknown state, complete", true, `UPDATE idempotency_records SET state = 'done' WHERE key = ?`},
		{"text epoch", false, `UPDATE idempotency_records SET epoch = 'one' WHERE key = ?`},
		{"text lease", false, `UPDATE idempotency_records SET lease_until = 'soon' WHERE key = ?`},
		{"zero epoch", false, `UPDATE idempotency_records SET epoch = 0 WHERE key = ?`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := newKey()
			acquire(t, s, req(key, "owner", "fp", time.Minute, time.Hour), idempotency.Acquired)
			if tc.complete {
				if err := s.Complete(ctx, key, "owner", resp, time.Hour); err != nil {
					t.Fatal(err)
				}
			}
			corrupt(t, s, key, tc.stmt)
			before := rowOf(t, s, key)
			calls := map[string]func() error{
				"Acquire": func() error {
					_, err := s.Acquire(ctx, req(key, "other", "fp", time.Minute, time.Hour))
					return err
				},
			}
			if !tc.complete || tc.name == "unknown state, complete" {
				// The payload of a COMPLETE record is read only for a
				// replay; a row that is not a record at all is refused by
				// every call.
				calls["Acquire by the holder"] = func() error {
					_, err := s.Acquire(ctx, req(key, "owner", "fp", time.Minute, time.Hour))
					return err
				}
				calls["Complete"] = func() error { return s.Complete(ctx, key, "owner", resp, time.Hour) }
				calls["Release"] = func() error { return s.Release(ctx, key, "owner") }
				calls["Extend"] = func() error { return s.Extend(ctx, key, "owner", time.Minute) }
				calls["Tx.Complete"] = func() error {
					tx, err := s.BeginTx(ctx, key, "owner")
					if err != nil {
						return err
					}
					defer tx.Rollback(ctx)
					return tx.Complete(ctx, resp, time.Hour)
				}
			}
			for name, call := range calls {
				if err := call(); !errors.Is(err, idempotency.ErrCorruptRecord) {
					t.Errorf("%s: %v, want ErrCorruptRecord", name, err)
				}
				if after := rowOf(t, s, key); after != before {
					t.Fatalf("%s changed the row:\n got %s\nwant %s", name, after, before)
				}
			}
		})
	}
}

// TestPurge: Purge deletes the expired records, COMPLETE past its TTL and
// IN_PROGRESS past both its TTL and its lease, and keeps the others, in
// batches.
func TestPurge(t *testing.T) {
	clock := fakeclock.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	s := open(t, newPath(t), sqlitestore.WithClock(clock.Now))
	done, abandoned, leased, live := newKey(), newKey(), newKey(), newKey()
	acquire(t, s, req(done, "a", "fp", time.Minute, time.Hour), idempotency.Acquired)
	if err := s.Complete(ctx, done, "a", &idempotency.Response{Status: 200}, time.Second); err != nil {
		t.Fatal(err)
	}
	acquire(t, s, req(abandoned, "b", "fp", time.Second, time.Second), idempotency.Acquired)
	acquire(t, s, req(leased, "c", "fp", time.Hour, time.Second), idempotency.Acquired) // past its TTL, not its lease
	acquire(t, s, req(live, "d", "fp", time.Minute, time.Hour), idempotency.Acquired)
	clock.Advance(2 * time.Second)
	if n, err := s.Purge(ctx, 1); err != nil || n != 1 {
		t.Fatalf("Purge(1) = %d, %v; want 1", n, err)
	}
	if n, err := s.Purge(ctx, 10); err != nil || n != 1 {
		t.Fatalf("Purge(10) = %d, %v; want 1", n, err)
	}
	for key, want := range map[string]bool{done: false, abandoned: false, leased: true, live: true} {
		if got := rowOf(t, s, key) != ""; got != want {
			t.Errorf("record %s present: %v, want %v", key[:8], got, want)
		}
	}
	if _, err := s.Purge(ctx, 0); err == nil {
		t.Fatal("Purge(0) succeeded")
	}
}

// TestBackgroundPurge: WithPurgeInterval purges on its own.
func TestBackgroundPurge(t *testing.T) {
	s := open(t, newPath(t), sqlitestore.WithPurgeInterval(10*time.Millisecond), sqlitestore.WithPurgeBatch(1))
	keys := []string{newKey(), newKey(), newKey()}
	for _, k := range keys {
		acquire(t, s, req(k, "a", "fp", time.Millisecond, time.Millisecond), idempotency.Acquired)
	}
	waitFor(t, 5*time.Second, "the background purge", func() bool {
		var n int
		s.DB().QueryRowContext(ctx, `SELECT count(*) FROM idempotency_records`).Scan(&n)
		return n == 0
	})
}

// TestRefusedArguments: keys and tokens a TEXT column cannot hold, or the
// store does not take, are refused before anything is read.
func TestRefusedArguments(t *testing.T) {
	s := open(t, newPath(t))
	long := string(bytes.Repeat([]byte("k"), sqlitestore.MaxKeyLen+1))
	for _, key := range []string{"", long, "bad\xffutf8", "nul\x00byte"} {
		if _, err := s.Acquire(ctx, req(key, "t", "fp", time.Minute, time.Hour)); err == nil {
			t.Errorf("Acquire with key %q succeeded", key)
		}
		if _, err := s.Acquire(ctx, req(newKey(), key, "fp", time.Minute, time.Hour)); err == nil {
			t.Errorf("Acquire with token %q succeeded", key)
		}
		if _, _, err := s.Watch(ctx, key); err == nil {
			t.Errorf("Watch of key %q succeeded", key)
		}
	}
}

// TestFreshRace: a record written by another acquire between Acquire's
// read, which found no row, and its fresh record's INSERT is kept: the
// INSERT writes nothing, and Acquire decides under the lock, on the row
// it finds there (a duplicate in flight, or a mismatch).
func TestFreshRace(t *testing.T) {
	for _, tc := range []struct {
		name, fp string
		want     idempotency.AcquireOutcome
	}{
		{"same request", "fp", idempotency.InFlight},
		{"another request", "other fp", idempotency.Mismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t, newPath(t))
			key := newKey()
			var raced bool
			sqlitestore.SetAfterEmptyRead(s, func(k string) {
				if k == key && !raced {
					raced = true
					acquire(t, s, req(key, "first", tc.fp, time.Minute, time.Hour), idempotency.Acquired)
				}
			})
			a := acquire(t, s, req(key, "second", "fp", time.Minute, time.Hour), tc.want)
			if !raced {
				t.Fatal("the race was not run")
			}
			if tc.want == idempotency.InFlight && a.Epoch != 1 {
				t.Errorf("in flight at epoch %d, want 1", a.Epoch)
			}
			if row := rowOf(t, s, key); !strings.Contains(row, "first") || strings.Contains(row, "second") {
				t.Errorf("the row after the race: %s, want the first acquire's", row)
			}
		})
	}
}
