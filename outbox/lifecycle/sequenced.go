package lifecycle

import (
	"context"
	"fmt"
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
}

// Messages reads the messages of the storage key storageKey still in the
// table (the purge deletes finished ones after their retention), in id
// order: the order in which the relays present those of one ordering key.
func (t *Table) Messages(ctx context.Context, db DB, storageKey string) ([]Sequenced, error) {
	sql := fmt.Sprintf(messagesSQL, t.name.Quoted(), t.dialect.Param(1, "text"))
	rows, err := db.Query(ctx, sql, storageKey)
	if err != nil {
		return nil, fmt.Errorf("lifecycle: messages: %w", err)
	}
	got, err := Collect(rows, func(row Rows) (Sequenced, error) {
		var m Sequenced
		var seq, attempts int32
		var headers string
		err := row.Scan(&m.RowID, &seq, &m.Topic, &m.Payload, &headers, &m.OrderingKey, &m.State, &attempts,
			&m.EnqueuedAt, &m.FinishedAt, &m.LastError)
		if err == nil {
			err = decodeHeaders(headers, &m.Headers)
		}
		if m.Payload == nil { // SQLite's driver reads an empty BLOB as nil
			m.Payload = []byte{}
		}
		m.ID, m.Seq, m.Attempts = MessageID(storageKey, int(seq)), int(seq), int(attempts)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("lifecycle: messages: %w", err)
	}
	return got, nil
}
