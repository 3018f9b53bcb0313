package servercheck

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/pgstore"
)

func TestPostgres(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	if err := pgstore.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	check := func(table string, opts ...PostgresOption) Report {
		t.Helper()
		r, err := Postgres(ctx, pool, table, opts...)
		if err != nil {
			t.Fatalf("Postgres(%s): %v", table, err)
		}
		return r
	}

	r := check(pgstore.DefaultTable)
	for _, item := range []string{"version", "recovery", "table", "columns", "primary-key", "acquire-function", "expires-at-index", "fsync", "purge"} {
		wantVerdict(t, r, item, OK)
	}
	wantVerdict(t, r, "clock", Info)
	if w := r.Worst(); w == Fail {
		t.Errorf("a fresh table fails: %+v", r.Findings)
	}
	for _, f := range r.Findings {
		if f.Node != "" || f.Value == "" || f.Detail == "" {
			t.Errorf("finding incomplete: %+v", f)
		}
	}

	// A row that expired three hours ago: the purge is not running.
	s := pgstore.New(pool)
	defer s.Close()
	sk := idempotency.StorageKey("", "stale")
	if _, err := s.Acquire(ctx, idempotency.AcquireRequest{Key: sk, Token: "t", Fingerprint: "f", Lease: time.Millisecond, TTL: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "UPDATE idempotency_records SET ttl_until = ttl_until - interval '3 hours', lease_until = lease_until - interval '3 hours' WHERE key = $1", sk); err != nil {
		t.Fatal(err)
	}
	if f := wantVerdict(t, check(pgstore.DefaultTable), "purge", Warn); !strings.HasPrefix(f.Value, "a row expired 3h0m") {
		t.Errorf("purge value %q", f.Value)
	}
	wantVerdict(t, check(pgstore.DefaultTable, WithPurgeLag(4*time.Hour)), "purge", OK)

	// A table that is not there.
	r = check("nope")
	if f := wantVerdict(t, r, "table", Fail); f.Value != "nope missing" {
		t.Errorf("table value %q", f.Value)
	}
	if r.Worst() != Fail {
		t.Errorf("Worst() = %v, want FAIL", r.Worst())
	}

	if _, err := Postgres(ctx, pool, "a.b.c"); err == nil || !strings.Contains(err.Error(), "more than two parts") {
		t.Errorf("a bad table name: %v", err)
	}
	for name, f := range map[string]func(){
		"WithPurgeLag(-1s)":    func() { WithPurgeLag(-time.Second) },
		"a nil option":         func() { Postgres(ctx, pool, "x", nil) },
		"a nil db (Postgres)":  func() { Postgres(ctx, nil, "x") },
		"a nil client (Redis)": func() { Redis(ctx, nil) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s did not panic", name)
				}
			}()
			f()
		}()
	}
}
