package sqlitestore_test

import (
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/sqlitestore"
	"github.com/go-idempotency/idempotency/storetest"
)

// TestConformance runs the Store conformance suite on one file, shared by
// every subtest (each works on keys of its own).
func TestConformance(t *testing.T) {
	s := open(t, newPath(t))
	storetest.Run(t, func(t *testing.T) idempotency.Store { return s })
}

// TestConformancePolling runs it again with the poller on, as processes
// sharing a file run: every Watch reads its record's holder, and a poll
// may wake a waiter besides the Store's own notifications.
func TestConformancePolling(t *testing.T) {
	if testing.Short() {
		t.Skip("the suite again, with polling")
	}
	s := open(t, newPath(t), sqlitestore.WithPollInterval(20*time.Millisecond))
	storetest.Run(t, func(t *testing.T) idempotency.Store { return s })
}
