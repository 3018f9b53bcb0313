package sqlitestore_test

import (
	"database/sql"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/sqlitestore"
)

// TestProofFileRefusesTheRecord: the file stops taking writes while a
// handler runs, after its effect row, so that the record cannot be
// stored: the disk is full, or the file read-only. The server answers
// with a clear error and its event says SQLite's, and nothing is half
// written: the record is IN_PROGRESS or released, never COMPLETE, and on
// a transactional route the effect row is gone with it. A server started
// on the file once it takes writes again runs the client's retry once.
//
// The handler sets a PRAGMA on the connection on which the Store then
// writes the record, the Store's own writer: through the request's
// transaction, which runs on it, on a transactional route, and in the
// Store's write turn on the plain route.
//
//   - A full disk is PRAGMA max_page_count = 1, which SQLite raises to the
//     pages the file holds: the file may not grow, and a write that needs
//     a new page fails with SQLITE_FULL, "database or disk is full", as
//     on a full disk. The response body (64 KiB) needs new pages; the
//     effect row, written before, does not.
//   - A read-only file is PRAGMA query_only = 1: SQLite refuses every
//     write on the connection with SQLITE_READONLY, "attempt to write a
//     readonly database", the error of a read-only file. The file's mode
//     cannot stand in for it: running as root ignores it, and a connection
//     already open writes through its descriptor whatever the mode becomes
//     (nor can mode=ro, which takes effect on the connections opened after
//     it, not on the one that holds the transaction).
func TestProofFileRefusesTheRecord(t *testing.T) {
	const lease = 500 * time.Millisecond
	for _, tc := range []struct {
		name, pragma, sqliteError string
	}{
		{"full disk", "max_page_count = 1", "database or disk is full"},
		{"read-only file", "query_only = 1", "attempt to write a readonly database"},
	} {
		t.Run(tc.name+", transactional route", func(t *testing.T) {
			r := newRig(t)
			srv := r.start(proofLeaseEnv + "=" + lease.String())
			const key = "refused-tx"
			a := r.post(srv.url, "/pay", key, pragmaHeader, tc.pragma, bodyHeader, "65536")
			wantReply(t, "the request whose record the file refused", a, http.StatusServiceUnavailable, string(idempotency.CodeOutcomeUnknown), false)
			// The attempt's outcome, and why: SQLite's error.
			event := r.awaitEvent(srv.Process, 5*time.Second, "commit outcome unknown", tc.sqliteError)
			state, epoch := r.record(key)
			effects := r.effects(key)
			if (state != "" && state != "in_progress") || len(effects) != 0 {
				t.Fatalf("after the refused commit: record %q at epoch %d, effect rows %v; want in_progress or none, and no row", state, epoch, effects)
			}
			srv.Stop(5 * time.Second)

			// The file takes writes again: a new server runs the retry, once
			// the refused attempt's lease ran out if its record was left.
			srv = r.start(proofLeaseEnv + "=" + lease.String())
			retry := r.postPast409(srv.url, "/pay", key, 10*time.Second)
			wantReply(t, "the retry", retry, http.StatusCreated, "", false)
			dup := r.post(srv.url, "/pay", key)
			wantReply(t, "its duplicate", dup, http.StatusCreated, "", true)
			rows := r.effects(key)
			if len(rows) != 1 || !strings.HasSuffix(rows[0], " "+srv.Name) || dup.body != retry.body {
				t.Fatalf("after the retry: effect rows %v, replay %q of %q; want the retry's row only", rows, dup.body, retry.body)
			}
			t.Logf("%s at Tx.Complete: answered %v; event %q; then record %q, %d effect rows; the retry on a server with a writable file: %v, effect rows %v",
				tc.name, a, event, state, len(effects), retry, rows)
		})

		t.Run(tc.name+", plain route", func(t *testing.T) {
			r := newRig(t)
			srv := r.start(proofLeaseEnv + "=" + lease.String())
			const key = "refused-plain"
			a := r.post(srv.url, "/plain", key, pragmaHeader, tc.pragma, bodyHeader, "65536")
			// A plain route answers the client first and stores after: the
			// client has the handler's response.
			wantReply(t, "the request whose record the file refused", a, http.StatusCreated, "", false)
			event := r.awaitEvent(srv.Process, 5*time.Second, "the result was not stored", tc.sqliteError)
			state, body := r.recordBody(key)
			if state != "in_progress" || body.Valid {
				t.Fatalf("after the refused Complete: record %q with a body of %v bytes; want in_progress without one", state, body)
			}
			// The handler's own write committed before the record, as on any
			// plain route: it is not the record's to undo.
			effects := r.effects(key)
			if len(effects) != 1 {
				t.Fatalf("effect rows %v, want the handler's own", effects)
			}
			srv.Stop(5 * time.Second)
			t.Logf("%s at Complete: answered %v; event %q; then record %q without a body, %d effect row (the plain route's own)",
				tc.name, a, event, state, len(effects))
		})
	}
}

// postPast409 posts until the reply is not 409, for at most d.
func (r *rig) postPast409(url, path, key string, d time.Duration, headers ...string) reply {
	deadline := time.Now().Add(d)
	for {
		a := r.post(url, path, key, headers...)
		if a.status != http.StatusConflict || time.Now().After(deadline) {
			return a
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// recordBody returns the state of key's record row in the file ("" for
// none) and the length of its body (NULL for none).
func (r *rig) recordBody(key string) (string, sql.NullInt64) {
	r.t.Helper()
	var state string
	var body sql.NullInt64
	err := r.store.DB().QueryRow(`SELECT state, length(body) FROM `+sqlitestore.DefaultTable+` WHERE key = ?`,
		idempotency.StorageKey("", key)).Scan(&state, &body)
	if errors.Is(err, sql.ErrNoRows) {
		return "", body
	}
	if err != nil {
		r.t.Fatal(err)
	}
	return state, body
}
