package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/pgname"
	"github.com/go-idempotency/idempotency/pgstore"
)

// Errors of Enqueue.
var (
	// ErrNoTransaction is wrapped by the error of Enqueue called outside a
	// transactional route or call: a context without the idempotency
	// middleware's or Do's Info, or with one whose route or Runner has no
	// idempotency.WithTransaction(true) over a pgstore.Store.
	ErrNoTransaction = errors.New("outbox: no transaction")
	// ErrInvalidMessage is wrapped by the error of Enqueue given a message
	// without a topic, or with text a PostgreSQL text or JSON value cannot
	// hold (not UTF-8, or a NUL byte) in its topic, ordering key or
	// headers. Nothing was enqueued.
	ErrInvalidMessage = errors.New("outbox: invalid message")
)

// Enqueue adds msgs to the outbox in the transaction of the transactional
// route or call whose context ctx is (idempotency.WithTransaction(true) on
// a pgstore.Store): they commit with its record and its other writes, or
// not at all. A 5xx, a panic, a lost lease or a failed commit leaves none
// of them. It returns their IDs, in the order of msgs.
//
// Each message's ID is derived from the record: "<storage key>/<sequence
// within the record, from 1>" (see ID), stable across attempts (a stolen
// attempt's rolled-back messages and the thief's get the same IDs) and
// unique, for downstream deduplication. A handler that calls Enqueue more
// than once continues the sequence. A key used again after its record
// expired continues it too, past the messages of the earlier record still
// in the table (the relay's retention keeps them).
//
// The table is the outbox of the Store that began the transaction
// (pgstore.WithOutboxTable, pgstore.DefaultOutboxTable by default), and
// the statement notifies the relays listening on it when the transaction
// commits. Enqueue is one round trip; with messages that set OrderingKey
// it first takes a transaction-level advisory lock on each of those keys
// (in the same round trip), so that the transactions enqueueing on one key
// commit in the order their messages are numbered: another transaction
// enqueueing on the same key waits for this one to end. Take keys in one
// order across handlers, or the server breaks the deadlock by failing one
// of them.
//
// Outside a transactional route the error wraps ErrNoTransaction; an
// invalid message's wraps ErrInvalidMessage. When another attempt at the
// same record committed its messages first (it took the record over and
// completed it), the error wraps idempotency.ErrLeaseLost: this attempt
// cannot commit either. Any other error is the database's; after it the
// transaction is aborted, so answer with a status that rolls it back (a
// 5xx) or return the error from Do's function.
func Enqueue(ctx context.Context, msgs ...Message) ([]string, error) {
	info, ok := idempotency.FromContext(ctx)
	if !ok {
		return nil, fmt.Errorf("%w: the context is not one of a handler or function run by the idempotency middleware or Do", ErrNoTransaction)
	}
	tx, ok := info.Tx.(pgx.Tx)
	if !ok {
		return nil, fmt.Errorf("%w: the route or Runner has no idempotency.WithTransaction(true) over a pgstore.Store", ErrNoTransaction)
	}
	if len(msgs) == 0 {
		return nil, nil
	}
	name := pgstore.DefaultOutboxTable
	if o, ok := info.Tx.(interface{ OutboxTable() string }); ok {
		name = o.OutboxTable()
	}
	table, err := pgname.ParseTable(name)
	if err != nil {
		return nil, fmt.Errorf("outbox: table name %w", err)
	}
	cols, err := columnsOf(msgs)
	if err != nil {
		return nil, err
	}

	b := &pgx.Batch{}
	if len(cols.keys) > 0 {
		b.Queue(lockSQL, table.String(), cols.keys)
	}
	var first, added, notified int
	b.Queue(strings.ReplaceAll(enqueueSQL, "{table}", table.Quoted()),
		info.StorageKey, cols.topics, cols.payloads, cols.headers, cols.orderingKeys, Channel(table.Name())).
		QueryRow(func(row pgx.Row) error { return row.Scan(&first, &added, &notified) })
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" {
			return nil, fmt.Errorf("outbox: enqueue: another attempt at the record committed its messages first: %w", idempotency.ErrLeaseLost)
		}
		return nil, fmt.Errorf("outbox: enqueue: %w", err)
	}
	if added != len(msgs) {
		return nil, fmt.Errorf("outbox: enqueue: %d of %d messages written", added, len(msgs))
	}
	ids := make([]string, len(msgs))
	for i := range ids {
		ids[i] = ID(info.StorageKey, first+i)
	}
	return ids, nil
}

// Channel returns the LISTEN/NOTIFY channel on which the transactions that
// enqueue into the outbox table named table (without its schema) notify
// the relays: the table's name itself. Outboxes of the same name in two
// schemas share it, which costs their relays a wasted wake-up, no more.
func Channel(table string) string { return table }

// columns are messages as the enqueue statement's array parameters.
type columns struct {
	topics, headers, orderingKeys []string
	payloads                      [][]byte
	keys                          []string // the ordering keys given, sorted, once each
}

func columnsOf(msgs []Message) (columns, error) {
	c := columns{
		topics:       make([]string, len(msgs)),
		headers:      make([]string, len(msgs)),
		orderingKeys: make([]string, len(msgs)),
		payloads:     make([][]byte, len(msgs)),
	}
	for i, m := range msgs {
		if problem := check(m); problem != "" {
			return columns{}, fmt.Errorf("%w: message %d: %s", ErrInvalidMessage, i, problem)
		}
		h, err := json.Marshal(m.Headers)
		if err != nil {
			return columns{}, fmt.Errorf("%w: message %d: headers: %v", ErrInvalidMessage, i, err)
		}
		if m.Headers == nil {
			h = []byte("{}")
		}
		payload := m.Payload
		if payload == nil {
			payload = []byte{}
		}
		c.topics[i], c.headers[i], c.orderingKeys[i], c.payloads[i] = m.Topic, string(h), m.OrderingKey, payload
		if m.OrderingKey != "" {
			c.keys = append(c.keys, m.OrderingKey)
		}
	}
	slices.Sort(c.keys)
	c.keys = slices.Compact(c.keys)
	return c, nil
}

// check returns what makes m impossible to store, or "".
func check(m Message) string {
	if m.Topic == "" {
		return "no topic"
	}
	if !storable(m.Topic) {
		return "the topic is not UTF-8 text without NUL bytes"
	}
	if !storable(m.OrderingKey) {
		return "the ordering key is not UTF-8 text without NUL bytes"
	}
	for k, v := range m.Headers {
		if !storable(k) || !storable(v) {
			return fmt.Sprintf("header %q is not UTF-8 text without NUL bytes", k)
		}
	}
	return ""
}

// storable reports whether s fits a text column and a JSON string.
func storable(s string) bool { return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 }
