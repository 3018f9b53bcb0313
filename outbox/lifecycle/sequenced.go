package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
)

// The enqueue of messages whose sequence their writer chose, for writers
// that number their messages themselves (package state: a record's event
// is the message at the version its transition made, so that a transition
// cannot be written twice), and the read of one storage key's messages.

// InsertSequenced returns the enqueue edge as a statement to put into
// another statement, as one of its data-modifying WITH queries: it writes
// a message ready at once for each row of the row source src, whose
// columns are storage_key (text), seq (integer), topic (text), payload
// (bytea), headers (text: a JSON object of strings), ordering_key (text,
// never "") and enqueued_at (timestamptz: the enqueue's time on the
// database's clock, when the message falls due), and returns their id.
//
// The rows' writer owns their order: unlike Enqueue, the statement takes
// no lock on the ordering keys, so the writer makes the transactions that
// write messages of one ordering key commit in the order of their
// sequence (package state does it with the row lock of the record the
// transition updates first). The table's unique index on (storage_key,
// seq) refuses a message written twice. The caller checks the messages
// against their grammar (outbox.Message) and wakes the relays.
func (t *Table) InsertSequenced(src string) string {
	return fmt.Sprintf(`INSERT INTO %s (storage_key, seq, topic, payload, headers, ordering_key, status, enqueued_at, due_at)
	SELECT e.storage_key, e.seq, e.topic, e.payload, %s, e.ordering_key, %s, e.enqueued_at, e.enqueued_at
	FROM %s AS e
	RETURNING id`, t.name.Quoted(), t.dialect.JSON("e.headers"), literal(string(Ready)), src)
}

// messagesSQL reads the messages of the storage key $1, in id order.
const messagesSQL = `
SELECT id, seq, topic, payload, headers, ordering_key, status, attempts, enqueued_at, finished_at, last_error
FROM %s
WHERE storage_key = %s
ORDER BY id`

// Sequenced is a message as Messages reads it.
type Sequenced struct {
	// RowID is the message's row (the id column): the order in which the
	// relays present the messages of an ordering key.
	RowID int64
	// ID is the message's ID, "<storage key>/<seq>".
	ID          string
	Seq         int
	Topic       string
	Payload     []byte
	Headers     map[string]string
	OrderingKey string
	State       State
	Attempts    int
	EnqueuedAt  time.Time
	FinishedAt  *time.Time
	LastError   *string
	// Err, when not nil, says why the row could not be read (a column
	// NULL or of another type, headers that are not a JSON object of
	// strings, an unknown state, an infinite time); the fields it could
	// read are set. The storage key's other messages are read on their own.
	Err error
}

// sequencedColumns name the columns of messagesSQL, for errors.
var sequencedColumns = [11]string{"id", "seq", "topic", "payload", "headers", "ordering_key", "status", "attempts",
	"enqueued_at", "finished_at", "last_error"}

// Messages reads the messages of the storage key storageKey still in the
// table (the purge deletes finished ones after their retention), in id
// order: the order in which the relays present those of one ordering key.
// Each row is read on its own: a row that cannot be read comes back with
// its Err set, and the others as they are. It fails only when the query
// does, or when a row's id cannot be read.
func (t *Table) Messages(ctx context.Context, db DB, storageKey string) ([]Sequenced, error) {
	sql := fmt.Sprintf(messagesSQL, t.name.Quoted(), t.dialect.Param(1, "text"))
	rows, err := db.Query(ctx, sql, storageKey)
	if err != nil {
		return nil, fmt.Errorf("lifecycle: messages: %w", err)
	}
	defer rows.Close()
	var out []Sequenced
	cells, dst := newCells(len(sequencedColumns))
	for rows.Next() {
		if err := rows.Scan(dst...); err != nil {
			return nil, fmt.Errorf("lifecycle: messages: %w", err)
		}
		m, err := t.decodeSequenced(storageKey, cells)
		if err != nil { // the row's id itself: nothing to name it by
			return nil, fmt.Errorf("lifecycle: messages: %w", err)
		}
		out = append(out, m)
	}
	if err := rows.Close(); err != nil {
		return nil, fmt.Errorf("lifecycle: messages: %w", err)
	}
	return out, nil
}

// decodeSequenced reads one row of messagesSQL from the values its driver
// gave, column by column (see decodeClaimed). It returns an error only
// when the row's id cannot be read.
func (t *Table) decodeSequenced(storageKey string, cells []cell) (Sequenced, error) {
	var m Sequenced
	var errs []error
	col := func(i int, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("column %s %w", sequencedColumns[i], err))
		}
	}
	var err error
	if m.RowID, err = integer(cells[0].v, math.MaxInt64); err != nil {
		return m, fmt.Errorf("column id %w", err)
	}
	seq, err := integer(cells[1].v, math.MaxInt32)
	col(1, err)
	m.Seq = int(seq)
	m.ID = MessageID(storageKey, m.Seq)
	m.Topic, err = text(cells[2].v)
	col(2, err)
	m.Payload, err = blob(cells[3].v)
	col(3, err)
	headers, herr := text(cells[4].v)
	col(4, herr)
	if herr == nil {
		errs = append(errs, decodeHeaders(headers, &m.Headers))
	}
	m.OrderingKey, err = text(cells[5].v)
	col(5, err)
	state, err := text(cells[6].v)
	if m.State = State(state); err == nil && !m.State.Valid() {
		err = fmt.Errorf("holds an unknown state %q", state)
	}
	col(6, err)
	attempts, err := integer(cells[7].v, math.MaxInt32)
	col(7, err)
	m.Attempts = int(attempts)
	m.EnqueuedAt, err = t.dialect.time(cells[8].v)
	col(8, err)
	if cells[9].v != nil {
		finished, err := t.dialect.time(cells[9].v)
		col(9, err)
		m.FinishedAt = &finished
	}
	if cells[10].v != nil {
		last, err := text(cells[10].v)
		col(10, err)
		m.LastError = &last
	}
	if err := errors.Join(errs...); err != nil {
		m.Err = fmt.Errorf("row %d: %w", m.RowID, err)
	}
	return m, nil
}
