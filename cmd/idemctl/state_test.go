package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/pgstore"
	"github.com/go-idempotency/idempotency/state"
)

// TestState: idemctl state shows a record, its last transitions with
// their causes, and where each event is (done, ready, purged), as text
// and as JSON; a record that does not exist is exit status 3; missing or
// malformed names are usage errors.
func TestState(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Database(t)
	pool := pgtest.PoolOn(t, url)
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	idem := pgstore.New(pool)
	t.Cleanup(func() { idem.Close() })
	runner := idempotency.NewRunner(idem, idempotency.WithTransaction(true))
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	s := state.New(pool, state.WithTraceContext(func(context.Context) map[string]string {
		return map[string]string{"traceparent": tp}
	}))
	ref := state.Ref{Scope: "acme", Machine: "payments.payment", ID: "pay_123"}
	if _, err := s.Create(ctx, ref, "authorized", []byte(`{"amount":1999}`)); err != nil {
		t.Fatal(err)
	}
	_, err := idempotency.Do(ctx, runner, idempotency.Call{Name: "capture", Key: "k-capture"}, func(ctx context.Context) (state.Record, error) {
		return s.Transition(ctx, ref, state.Change{From: "authorized", To: "captured", ExpectedVersion: 1})
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Transition(ctx, ref, state.Change{From: "captured", To: "settled", ExpectedVersion: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Transition(ctx, ref, state.Change{From: "settled", To: "settled", ExpectedVersion: 3, Data: []byte(`{"amount":1999,"fee":30}`)}); err != nil {
		t.Fatal(err)
	}
	// The first event was published and purged, the second published: as
	// the relays leave them.
	if _, err := pool.Exec(ctx, `DELETE FROM idempotency_outbox WHERE storage_key = $1 AND seq = 2`, state.EventKey(ref)); err != nil {
		t.Fatal(err)
	}
	table, err := outbox.Table(pgstore.DefaultOutboxTable)
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := table.Claim(ctx, lifecycle.Pgx(pool), "tok", "relay-1", time.Minute, 1)
	if err != nil || len(claimed) != 1 || claimed[0].ID != state.EventID(ref, 3) {
		t.Fatalf("claim %+v, %v", claimed, err)
	}
	if _, err := table.Done(ctx, lifecycle.Pgx(pool), "tok", []int64{claimed[0].RowID}); err != nil {
		t.Fatal(err)
	}

	args := []string{"state", "-postgres", url, "-scope", "acme", "-machine", "payments.payment", "-id", "pay_123"}
	idemctl(t, nil, args...).want(t, exitOK).contains(t,
		"record     payments.payment pay_123", "scope      acme", "state      settled", "version    4",
		`data       {"amount":1999,"fee":30}`, "event key  "+state.EventKey(ref),
		"history: 3 transitions",
		"v2    authorized -> captured", "key k-capture (epoch 1), trace "+tp, "event purged",
		"v3    captured -> settled", "no idempotency key", "event done, 1 attempt",
		"v4    settled -> settled", "event ready")

	last := idemctl(t, nil, append(args, "-limit", "1")...).want(t, exitOK)
	last.contains(t, "history: 3 transitions (the last 1 shown)", "v4 ")
	if strings.Contains(last.stdout, "v2 ") || strings.Contains(last.stdout, "v3 ") {
		t.Errorf("-limit 1 shows more:\n%s", last.stdout)
	}

	js := idemctl(t, map[string]string{"DATABASE_URL": url}, "state", "-scope", "acme", "-machine", "payments.payment", "-id", "pay_123", "-json").want(t, exitOK)
	var doc stateResult
	if err := json.Unmarshal([]byte(js.stdout), &doc); err != nil {
		t.Fatalf("-json: %v\n%s", err, js.stdout)
	}
	if doc.Record.State != "settled" || doc.Record.Version != 4 || len(doc.History) != 3 || doc.Earlier != 0 ||
		doc.History[0].Delivery != "purged" || doc.History[1].Delivery != "done" || doc.History[2].Delivery != "ready" ||
		doc.History[0].Cause.Key != "k-capture" || doc.History[0].ID != state.EventID(ref, 2) || doc.History[0].At.IsZero() {
		t.Errorf("-json: %s", js.stdout)
	}

	// An event whose message cannot be read is shown as unreadable, with
	// its error, beside the others.
	if _, err := pool.Exec(ctx, `UPDATE idempotency_outbox SET payload = 'garbled' WHERE storage_key = $1 AND seq = 4`, state.EventKey(ref)); err != nil {
		t.Fatal(err)
	}
	idemctl(t, nil, args...).want(t, exitOK).contains(t,
		"v3    captured -> settled", "event done, 1 attempt",
		"v4    settled -> settled", "event unreadable (message "+state.EventID(ref, 4)+": payload: invalid character")

	idemctl(t, nil, "state", "-postgres", url, "-scope", "acme", "-machine", "payments.payment", "-id", "pay_999").
		want(t, exitNotFound)
	idemctl(t, nil, "state", "-postgres", url, "-scope", "acme", "-machine", "payments.payment").
		want(t, exitUsage).contains(t, "-id is missing")
	idemctl(t, nil, "state", "-postgres", url, "-scope", "acme", "-machine", "Payments", "-id", "x").
		want(t, exitUsage).contains(t, "invalid machine")
	idemctl(t, nil, "state", "-scope", "acme", "-machine", "payments.payment", "-id", "x").
		want(t, exitUsage).contains(t, "no database")
}

// TestStateTable: -table and -outbox name the tables of a Store with
// WithTable and WithOutboxTable.
func TestStateTable(t *testing.T) {
	ctx := context.Background()
	url := pgtest.Database(t)
	pool := pgtest.PoolOn(t, url)
	for _, sql := range []string{`CREATE SCHEMA billing`, pgstore.StateSchema("billing.flows"), pgstore.OutboxSchema("billing.events")} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	s := state.New(pool, state.WithTable("billing.flows"), state.WithOutboxTable("billing.events"))
	ref := state.Ref{Scope: "acme", Machine: "onepony.task", ID: "t_1"}
	if _, err := s.Create(ctx, ref, "open", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Transition(ctx, ref, state.Change{From: "open", To: "done", ExpectedVersion: 1}); err != nil {
		t.Fatal(err)
	}
	idemctl(t, nil, "state", "-postgres", url, "-table", "billing.flows", "-outbox", "billing.events",
		"-scope", "acme", "-machine", "onepony.task", "-id", "t_1").
		want(t, exitOK).contains(t, "table billing.flows", "state      done", "v2    open -> done", "event ready")
	idemctl(t, nil, "state", "-postgres", url, "-scope", "acme", "-machine", "onepony.task", "-id", "t_1").
		want(t, exitFailure)
}
