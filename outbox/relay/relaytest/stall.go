package relaytest

import (
	"context"
	"sync"

	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/outbox/relay"
)

// stallDB is a lifecycle.DB that stops answering on demand, as a database
// cut off from its relay does: while it is stalled, each statement waits
// until it is restored, or fails when its context ends first (an extend
// that outlasts the claim).
type stallDB struct {
	db lifecycle.DB

	mu   sync.Mutex
	gate chan struct{} // nil while the DB answers; closed by restore
}

// stall makes the statements sent from now on wait.
func (s *stallDB) stall() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gate == nil {
		s.gate = make(chan struct{})
	}
}

// restore lets the waiting statements, and those that follow, through.
func (s *stallDB) restore() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gate != nil {
		close(s.gate)
		s.gate = nil
	}
}

// pass waits while the DB is stalled, or until ctx ends.
func (s *stallDB) pass(ctx context.Context) error {
	s.mu.Lock()
	gate := s.gate
	s.mu.Unlock()
	if gate == nil {
		return nil
	}
	select {
	case <-gate:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func (s *stallDB) Exec(ctx context.Context, sql string, args ...any) error {
	if err := s.pass(ctx); err != nil {
		return err
	}
	return s.db.Exec(ctx, sql, args...)
}

func (s *stallDB) Query(ctx context.Context, sql string, args ...any) (lifecycle.Rows, error) {
	if err := s.pass(ctx); err != nil {
		return nil, err
	}
	return s.db.Query(ctx, sql, args...)
}

// stallable returns a constructor of relays on the target's outbox
// through a stallDB of their own (relay.NewDB, polling), and that DB.
func stallable(tg Target) (func(outbox.Sink, ...relay.Option) *relay.Relay, *stallDB) {
	db := &stallDB{db: tg.DB}
	return func(sink outbox.Sink, opts ...relay.Option) *relay.Relay {
		return relay.NewDB(db, tg.Table, nil, sink, opts...)
	}, db
}
