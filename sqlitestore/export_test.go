package sqlitestore

import "context"

// WithDSNParams adds query parameters to the URI every connection is
// opened with, after the Store's own: the tests simulate a read-only file
// with mode=ro or _pragma=query_only(1), and a journal that is not WAL
// with _journal_mode=DELETE.
func WithDSNParams(params string) Option {
	return func(c *config) { c.dsnParams = params }
}

// SetBeforeCommit makes every Tx.Complete of s call f between the fence and
// the COMMIT. Set it before s is used.
func SetBeforeCommit(s *Store, f func(*Tx)) { s.beforeCommit = f }

// SetAfterEmptyRead makes every Acquire of s that read no row call f
// before it writes the fresh record. Set it before s is used.
func SetAfterEmptyRead(s *Store, f func(key string)) { s.afterEmptyRead = f }

// OpenTxs counts the Store's open transactions.
func (s *Store) OpenTxs() int {
	s.txMu.Lock()
	defer s.txMu.Unlock()
	return len(s.txs)
}

// Waiters counts the waiters registered on key.
func (s *Store) Waiters(key string) int {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	return len(s.hub.waiters[key])
}

// WriterExec runs query on the connection of the Store's own writes, in
// its write turn: the proofs make that connection refuse writes as a full
// disk or a read-only file would.
func (s *Store) WriterExec(ctx context.Context, query string) error {
	return s.withWriter(ctx, func(w *writer) error {
		_, err := w.conn.ExecContext(ctx, query)
		return err
	})
}
