package lifecycle

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// NewMessage is a message as Enqueue writes it. Enqueue checks only what
// the table needs; outbox.Enqueue checks the messages against their
// grammar (outbox.Message) first.
type NewMessage struct {
	Topic   string
	Payload []byte
	Headers map[string]string
	// OrderingKey is the message's ordering key; "" for the storage key.
	OrderingKey string
	// NotBefore is when the message falls due; the zero time, or a time
	// not later than the database's clock at the enqueue, for at once.
	NotBefore time.Time
}

// enqueueSQL writes the messages of one Enqueue call: ready, or scheduled
// when NotBefore is later than the server's clock.
//
//	$1 storage key; the lists $2 topics, $3 payloads, $4 headers (JSON
//	objects), $5 ordering keys ("" for the storage key), $6 NotBefore
//	(NULL for none)
//
// The sequence continues past the highest one of the storage key that the
// statement's snapshot holds: the transaction's own messages, and those of
// earlier records with the key that committed. Two attempts at one record
// see the same committed rows (only one attempt ever commits), so they
// number their messages alike; the second to insert a number waits on the
// unique index for the first's transaction, and goes on once it rolled
// back (or fails, once it committed). The rows are inserted in the order
// of the lists, so that their ids ascend with their sequence.
const enqueueSQL = `
INSERT INTO {{.T}} (storage_key, seq, topic, payload, headers, ordering_key, status, enqueued_at, due_at)
SELECT {{p 1 "text"}}, base.n + m.i, m.topic, m.payload, {{json "m.headers"}},
	coalesce(nullif(m.ordering_key, ''), {{p 1 "text"}}),
	CASE WHEN m.not_before > clock.t THEN {{lit .Scheduled}} ELSE {{lit .Ready}} END,
	clock.t,
	CASE WHEN m.not_before > clock.t THEN m.not_before ELSE clock.t END
FROM {{template "clock"}},
	(SELECT coalesce(max(seq), 0) AS n FROM {{.T}} WHERE storage_key = {{p 1 "text"}}) AS base,
	{{rows "m" "topic" 2 "text" "payload" 3 "bytea" "headers" 4 "text" "ordering_key" 5 "text" "not_before" 6 "timestamptz"}}
ORDER BY m.i
RETURNING seq`

// Enqueue is the enqueue edge: it writes msgs as the messages of the
// record with storageKey, in db's transaction, and returns their IDs in
// the order of msgs. Each is ready, or scheduled when its NotBefore is
// later than the database's clock. The statement wakes the relays
// listening on the table's channel when the transaction commits, and is
// one round trip: with messages that set an ordering key, it first takes
// the dialect's lock on each of those keys (KeyLocks), so that the
// transactions enqueueing on one key commit in the order their messages
// are numbered.
//
// When another transaction committed messages of the same IDs first, the
// error wraps ErrConflict; any other error is the database's.
func (t *Table) Enqueue(ctx context.Context, db DB, storageKey string, msgs []NewMessage) ([]string, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	n := len(msgs)
	topics, headers, orderingKeys := make([]string, n), make([]string, n), make([]string, n)
	payloads, notBefore := make([][]byte, n), make([]*time.Time, n)
	var keys []string
	for i, m := range msgs {
		h := []byte("{}")
		if len(m.Headers) > 0 {
			var err error
			if h, err = json.Marshal(m.Headers); err != nil {
				return nil, fmt.Errorf("lifecycle: enqueue: message %d: headers: %w", i, err)
			}
		}
		payload := m.Payload
		if payload == nil {
			payload = []byte{}
		}
		topics[i], headers[i], orderingKeys[i], payloads[i] = m.Topic, string(h), m.OrderingKey, payload
		if !m.NotBefore.IsZero() {
			nb := m.NotBefore
			notBefore[i] = &nb
		}
		if m.OrderingKey != "" {
			keys = append(keys, m.OrderingKey)
		}
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)

	d := t.dialect
	var stmts []stmt
	if len(keys) > 0 && d.KeyLocks != "" {
		stmts = append(stmts, stmt{sql: d.KeyLocks, args: []any{t.name.String(), d.List(keys)}})
	}
	var seqs []int32
	stmts = append(stmts, stmt{
		sql:  t.sql.enqueue,
		args: []any{storageKey, d.List(topics), d.List(payloads), d.List(headers), d.List(orderingKeys), d.List(notBefore)},
		rows: func(rows Rows) error {
			var err error
			seqs, err = Collect(rows, scanOne[int32])
			return err
		},
	})
	if d.Notify != "" {
		stmts = append(stmts, stmt{sql: d.Notify, args: []any{t.Channel()}})
	}
	if err := run(ctx, db, stmts); err != nil {
		if d.UniqueViolation(err) {
			return nil, fmt.Errorf("lifecycle: enqueue: %w", ErrConflict)
		}
		return nil, fmt.Errorf("lifecycle: enqueue: %w", err)
	}
	if len(seqs) != n {
		return nil, fmt.Errorf("lifecycle: enqueue: %d of %d messages written", len(seqs), n)
	}
	first := slices.Min(seqs)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = MessageID(storageKey, int(first)+i)
	}
	return ids, nil
}
