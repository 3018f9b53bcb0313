package state

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/go-idempotency/idempotency/outbox/lifecycle"
)

// History returns the transitions of the record at ref that made a
// version after after (0 for all of them), in version order, at most
// limit of them (0: all). The history is written by each transition's
// statement and kept with the record, however long ago the outbox purged
// the events it delivered. A record that does not exist is a
// *NotFoundError.
func (s *Store) History(ctx context.Context, ref Ref, after int64, limit int) ([]Event, error) {
	if err := validRef(ref); err != nil {
		return nil, err
	}
	if after < 0 {
		return nil, invalid("after", "%d is negative", after)
	}
	if limit < 0 {
		return nil, invalid("limit", "%d is negative", limit)
	}
	lim := int64(math.MaxInt64)
	if limit > 0 {
		lim = int64(limit)
	}
	db, _, err := s.on(ctx)
	if err != nil {
		return nil, storeError("history", err)
	}
	key := EventKey(ref)
	rows, err := db.Query(ctx, s.sql.history, key, after, lim)
	if err != nil {
		return nil, storeError("history", err)
	}
	events, err := lifecycle.Collect(rows, func(row lifecycle.Rows) (Event, error) {
		ev := Event{Ref: ref}
		var cause []byte
		if err := row.Scan(&ev.Version, &ev.From, &ev.To, &cause, &ev.At); err != nil {
			return ev, err
		}
		ev.ID = EventID(ref, ev.Version)
		if err := json.Unmarshal(cause, &ev.Cause); err != nil {
			return ev, fmt.Errorf("version %d: cause: %w", ev.Version, err)
		}
		return ev, nil
	})
	if err != nil {
		return nil, storeError("history", err)
	}
	if len(events) == 0 {
		// No transition, or no record: only the latter is an error.
		if _, err := s.get(ctx, db, ref); err != nil {
			return nil, err
		}
	}
	return events, nil
}

// Delivery is an event's message as the outbox holds it, for as long as
// it does: the relays purge delivered messages after their retention
// (History keeps the transitions).
type Delivery struct {
	// Event is the message's body. Its At is the message's enqueue time,
	// the transition's commit.
	Event
	Topic       string
	OrderingKey string
	// Headers are the message's headers: the trace context, if any.
	Headers map[string]string
	// State is the message's state in the outbox (package
	// outbox/lifecycle): ready, claimed, done, dead...
	State      lifecycle.State
	Attempts   int
	FinishedAt *time.Time
	// LastError is why its last publication failed, or why it died.
	LastError *string
	// Err, when not nil, says why the message could not be read: its row
	// (see lifecycle.Sequenced), or its payload as an Event. Version is
	// then the message's sequence, which is the transition's version, and
	// the fields that could be read are set.
	Err error
}

// Deliveries returns the events of the record at ref that the outbox
// still holds (WithOutboxTable's, or the transaction's), in the order the
// relays present them, which is version order: an operator's view of
// where each event is. A record without events is no error. A message
// that cannot be read comes back with its Err set, beside the others.
func (s *Store) Deliveries(ctx context.Context, ref Ref) ([]Delivery, error) {
	if err := validRef(ref); err != nil {
		return nil, err
	}
	db, name, err := s.on(ctx)
	if err != nil {
		return nil, storeError("deliveries", err)
	}
	m, err := s.move(name)
	if err != nil {
		return nil, storeError("deliveries", err)
	}
	msgs, err := m.outbox.Messages(ctx, db, EventKey(ref))
	if err != nil {
		return nil, storeError("deliveries", err)
	}
	out := make([]Delivery, len(msgs))
	for i, msg := range msgs {
		d := Delivery{Topic: msg.Topic, OrderingKey: msg.OrderingKey, Headers: msg.Headers, State: msg.State,
			Attempts: msg.Attempts, FinishedAt: msg.FinishedAt, LastError: msg.LastError, Err: msg.Err}
		if d.Err == nil {
			if err := json.Unmarshal(msg.Payload, &d.Event); err != nil {
				d.Err = fmt.Errorf("message %s: payload: %w", msg.ID, err)
			}
		}
		if d.Err != nil {
			d.Event = Event{ID: msg.ID, Ref: ref, Version: int64(msg.Seq)}
		}
		d.At = msg.EnqueuedAt
		out[i] = d
	}
	return out, nil
}
