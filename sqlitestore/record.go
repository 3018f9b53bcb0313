package sqlitestore

import (
	"bytes"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/wire"
)

// The states of a record, as the state column holds them.
const (
	stateInProgress = "in_progress"
	stateComplete   = "complete"
)

// record is one row of the table, as readSQL reads it. Times are unix
// microseconds.
type record struct {
	state       string
	token       string
	fingerprint []byte
	epoch       int64
	leaseUntil  int64
	ttlUntil    int64
	// The payload, read only for a replay: SQL NULL is a nil interface.
	status  sql.NullInt64
	headers any
	body    any
	omitted sql.NullInt64
}

// scanRecord reads a row of readSQL. It returns (nil, nil) for no row, and
// an error wrapping idempotency.ErrCorruptRecord for a row that is not a
// record: a NULL where a record has a value, a value of another type, an
// unknown state. Any other error is the query's. Every column is scanned
// as it is stored (into an any), so a value of the wrong type is told
// here, not by a conversion error of Scan.
func scanRecord(row *sql.Row) (*record, error) {
	var (
		r                                        record
		state, token, fingerprint                any
		epoch, leaseUntil, ttlUntil, status, omt any
	)
	err := row.Scan(&state, &token, &fingerprint, &epoch, &leaseUntil, &ttlUntil, &status, &r.headers, &r.body, &omt)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ok [7]bool
	r.state, ok[0] = text(state)
	r.token, ok[1] = text(token)
	r.fingerprint, ok[2] = blob(fingerprint)
	r.epoch, ok[3] = epoch.(int64)
	r.leaseUntil, ok[4] = leaseUntil.(int64)
	r.ttlUntil, ok[5] = ttlUntil.(int64)
	r.status, ok[6] = nullInt(status)
	var omittedOK bool
	r.omitted, omittedOK = nullInt(omt)
	for i, good := range append(ok[:], omittedOK) {
		if !good {
			names := [...]string{"state", "token", "fingerprint", "epoch", "lease_until", "ttl_until", "status", "body_omitted"}
			values := [...]any{state, token, fingerprint, epoch, leaseUntil, ttlUntil, status, omt}
			return nil, fmt.Errorf("%w: %s holds %T %v", idempotency.ErrCorruptRecord, names[i], values[i], values[i])
		}
	}
	switch r.state {
	case stateInProgress, stateComplete:
	default:
		return nil, fmt.Errorf("%w: unknown state %q", idempotency.ErrCorruptRecord, r.state)
	}
	if r.epoch < 1 {
		return nil, fmt.Errorf("%w: epoch %d", idempotency.ErrCorruptRecord, r.epoch)
	}
	return &r, nil
}

// text returns a TEXT value.
func text(v any) (string, bool) {
	s, ok := v.(string)
	return s, ok
}

// nullInt returns an INTEGER value or NULL.
func nullInt(v any) (sql.NullInt64, bool) {
	switch n := v.(type) {
	case nil:
		return sql.NullInt64{}, true
	case int64:
		return sql.NullInt64{Int64: n, Valid: true}, true
	}
	return sql.NullInt64{}, false
}

// blob returns the bytes of a BLOB value (or of TEXT, which holds the same
// bytes); false for NULL or a number.
func blob(v any) ([]byte, bool) {
	switch b := v.(type) {
	case []byte:
		return b, true
	case string:
		return []byte(b), true
	}
	return nil, false
}

// expiresAt is when the record is gone: its TTL deadline once COMPLETE,
// the later of its TTL deadline and its lease while IN_PROGRESS.
func (r *record) expiresAt() int64 {
	if r.state == stateComplete {
		return r.ttlUntil
	}
	return max(r.ttlUntil, r.leaseUntil)
}

// live reports whether the record exists at now: an expired record is
// absent to every operation, purged or not.
func (r *record) live(now int64) bool { return r != nil && r.expiresAt() > now }

// response rebuilds a COMPLETE record's response. Anything missing,
// unreadable or inconsistent is an error wrapping
// idempotency.ErrCorruptRecord.
func (r *record) response() (*idempotency.Response, error) {
	headers, hok := blob(r.headers)
	body, bok := blob(r.body)
	if !r.status.Valid || !hok || !bok || !r.omitted.Valid {
		return nil, fmt.Errorf("%w: a COMPLETE row without status, headers, body or body_omitted", idempotency.ErrCorruptRecord)
	}
	// The row's bytes are the Store's own: scanRecord's Scan copies them.
	resp, err := wire.DecodeOwned(headers, body)
	if err != nil {
		return nil, err
	}
	if int64(resp.Status) != r.status.Int64 || resp.BodyOmitted != (r.omitted.Int64 != 0) {
		return nil, fmt.Errorf("%w: status %d and body_omitted %d disagree with the headers block (%d, %v)",
			idempotency.ErrCorruptRecord, r.status.Int64, r.omitted.Int64, resp.Status, resp.BodyOmitted)
	}
	return resp, nil
}

// encoded is a response in the form of the table's columns.
type encoded struct {
	status  int64
	headers []byte
	body    []byte // nil for an empty body: completeSQL stores x''
	omitted int64
}

func encode(resp *idempotency.Response) (encoded, error) {
	meta, err := wire.AppendMeta(nil, resp)
	if err != nil {
		return encoded{}, fmt.Errorf("sqlitestore: %w", err)
	}
	e := encoded{status: int64(resp.Status), headers: meta, body: resp.Body}
	if resp.BodyOmitted || resp.HeaderOmitted {
		e.omitted, e.body = 1, nil
	}
	return e, nil
}

// micros converts a duration to microseconds, rounding up so that a lease
// or TTL is never shortened.
func micros(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

// sinceMicros is the duration from now to t, both unix microseconds.
func sinceMicros(t, now int64) time.Duration {
	return time.Duration(t-now) * time.Microsecond
}

// acquireAction is what Acquire must do with a record.
type acquireAction uint8

const (
	answer acquireAction = iota // the record settles the answer: nothing to write
	fresh                       // no record, or an expired one: epoch 1
	renew                       // the holder's retry: same epoch, a lease not shortened
	steal                       // a lease that ran out: epoch + 1
)

// judgeAcquire decides what Acquire does with r (nil: no row) at now, and,
// for answer, the acquisition. A row that is not a record was refused by
// scanRecord already.
func judgeAcquire(r *record, now int64, req idempotency.AcquireRequest) (acquireAction, idempotency.Acquisition, error) {
	if !r.live(now) {
		return fresh, idempotency.Acquisition{}, nil
	}
	if !bytes.Equal(r.fingerprint, []byte(req.Fingerprint)) {
		return answer, idempotency.Acquisition{Outcome: idempotency.Mismatch}, nil
	}
	if r.state == stateComplete {
		resp, err := r.response()
		if err != nil {
			return answer, idempotency.Acquisition{}, err
		}
		return answer, idempotency.Acquisition{
			Outcome:   idempotency.Completed,
			Epoch:     uint64(r.epoch),
			Response:  resp,
			ExpiresIn: max(sinceMicros(r.ttlUntil, now), time.Millisecond),
		}, nil
	}
	switch {
	case r.token == req.Token:
		return renew, idempotency.Acquisition{}, nil
	case r.leaseUntil <= now:
		return steal, idempotency.Acquisition{}, nil
	}
	return answer, idempotency.Acquisition{
		Outcome:        idempotency.InFlight,
		Epoch:          uint64(r.epoch),
		LeaseRemaining: max(sinceMicros(r.leaseUntil, now), time.Millisecond),
	}, nil
}

// held reports whether token holds r at now: IN_PROGRESS, not expired,
// under token. Complete, Release and Extend compare the token only; the
// lease may have run out.
func (r *record) held(token string, now int64) bool {
	return r.live(now) && r.state == stateInProgress && r.token == token
}

// isCorrupt reports a row that is not a record.
func isCorrupt(err error) bool { return errors.Is(err, idempotency.ErrCorruptRecord) }
