package state_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/pgstore"
	"github.com/go-idempotency/idempotency/state"
)

// TestDeliveriesApart: an event's message that cannot be read (a payload
// that is not an event, headers that are not a JSON object of strings)
// comes back from Deliveries with its Err and its version, beside the
// record's other events, read as they are.
func TestDeliveriesApart(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 4 })
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	s := state.New(pool)
	r := state.Ref{Scope: "acme", Machine: "payment", ID: "pay_1"}
	if _, err := s.Create(ctx, r, "a", nil); err != nil {
		t.Fatal(err)
	}
	for i, c := range []state.Change{{From: "a", To: "b", ExpectedVersion: 1}, {From: "b", To: "c", ExpectedVersion: 2}, {From: "c", To: "d", ExpectedVersion: 3}} {
		if _, err := s.Transition(ctx, r, c); err != nil {
			t.Fatalf("transition %d: %v", i, err)
		}
	}
	for _, sql := range []string{
		`UPDATE idempotency_outbox SET payload = 'not an event' WHERE storage_key = $1 AND seq = 2`,
		`UPDATE idempotency_outbox SET headers = '["a"]' WHERE storage_key = $1 AND seq = 4`,
	} {
		if _, err := pool.Exec(ctx, sql, state.EventKey(r)); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := s.Deliveries(ctx, r)
	if err != nil {
		t.Fatalf("Deliveries: %v", err)
	}
	if len(ds) != 3 {
		t.Fatalf("%d deliveries, want 3", len(ds))
	}
	want := map[int64]string{2: "payload: invalid character", 4: "column headers is not a JSON object of strings"}
	for i, d := range ds {
		v := int64(i + 2)
		switch {
		case d.Version != v || d.ID != state.EventID(r, v):
			t.Errorf("delivery %d: version %d, ID %s; want %d, %s", i, d.Version, d.ID, v, state.EventID(r, v))
		case want[v] != "" && (d.Err == nil || !strings.Contains(d.Err.Error(), want[v])):
			t.Errorf("version %d: error %v, want %q", v, d.Err, want[v])
		case want[v] == "" && (d.Err != nil || d.From != "b" || d.To != "c"):
			t.Errorf("version %d: %+v, want b → c read as it is", v, d)
		}
	}
}
