package lifecycle

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/go-idempotency/idempotency/pgstore"
)

// TestDialectSeam renders every statement in SQLite's dialect, unlike
// PostgreSQL's in each fragment: each is a value of the same edges, with
// nothing of PostgreSQL's left in it, so another engine is a Dialect, not
// a copy of the edges.
func TestDialectSeam(t *testing.T) {
	tb, err := New("idempotency_outbox", SQLite)
	if err != nil {
		t.Fatal(err)
	}
	postgres := regexp.MustCompile(`::|\$\d|clock_timestamp|= ANY|unnest|ORDINALITY|FOR UPDATE|SKIP LOCKED|jsonb|extract\(epoch|interval|ARRAY\(`)
	for _, s := range tb.sql.all() {
		sql := *s.dst
		if sql == "" {
			t.Errorf("%s: not rendered", s.edge.name)
		}
		if m := postgres.FindString(sql); m != "" {
			t.Errorf("%s: %q of PostgreSQL's in another dialect's statement:\n%s", s.edge.name, m, sql)
		}
	}
	pg, err := New("idempotency_outbox", PostgreSQL)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(pg.sql.claim, "FOR UPDATE OF o SKIP LOCKED") || !strings.Contains(pg.sql.done, "id = ANY ($2::bigint[])") {
		t.Errorf("PostgreSQL's claim and done:\n%s\n%s", pg.sql.claim, pg.sql.done)
	}
}

// TestEdgesRenderTheirStates: each edge's statement names the states the
// edge moves from, rendered from its Edge value, and no state that is not
// one.
func TestEdgesRenderTheirStates(t *testing.T) {
	tb, err := New("s.box", PostgreSQL)
	if err != nil {
		t.Fatal(err)
	}
	quoted := regexp.MustCompile(`'([a-z_]+)'`)
	for _, s := range tb.sql.all() {
		sql := *s.dst
		if !strings.Contains(sql, `"s"."box"`) && s.edge.name != "clock" {
			t.Errorf("%s: not on the table:\n%s", s.edge.name, sql)
		}
		for _, m := range quoted.FindAllStringSubmatch(sql, -1) {
			if st := State(m[1]); !st.Valid() && m[1] != CodeClaimExpired {
				t.Errorf("%s: the literal %q is not a state", s.edge.name, m[1])
			}
		}
		if len(s.edge.from) > 0 {
			parts := make([]string, len(s.edge.from))
			for i, st := range s.edge.from {
				parts[i] = literal(string(st))
			}
			if from := "(" + strings.Join(parts, ", ") + ")"; !strings.Contains(sql, from) {
				t.Errorf("%s: its states %s are not in its statement:\n%s", s.edge.name, from, sql)
			}
		}
	}
}

// TestSchemaNamesTheStates: the schema's status check lists every state,
// and its partial indexes cover the states the statements look for them
// in: the claim's, the ordering check's, the claims', the purge's.
func TestSchemaNamesTheStates(t *testing.T) {
	schema := pgstore.OutboxSchema("idempotency_outbox")
	list := func(states []State) string {
		parts := make([]string, len(states))
		for i, s := range states {
			parts[i] = literal(string(s))
		}
		return strings.Join(parts, ", ")
	}
	for what, want := range map[string]string{
		"the status check":    "CHECK (status IN (" + list(States()) + "))",
		"the claim's index":   "(due_at, id) WHERE status IN (" + list(claimable) + ")",
		"the order's index":   "(ordering_key, id) WHERE status IN (" + list(nonTerminal) + ")",
		"the claims' index":   "(claim_until) WHERE status = 'claimed'",
		"the purge's index":   "(finished_at) WHERE status IN (" + list(terminal) + ")",
		"the claim's default": "status           text        NOT NULL DEFAULT 'ready'",
	} {
		if !strings.Contains(schema, want) {
			t.Errorf("%s: the schema lacks %q", what, want)
		}
	}
	for _, col := range []string{"due_at", "suspended_reason", "requeues", "requeued_at", "requeued_by"} {
		if !regexp.MustCompile(`(?m)^\t` + col + ` `).MatchString(schema) {
			t.Errorf("the schema lacks the column %s", col)
		}
	}
}

// TestNoOutboxSQLElsewhere: the outbox package, the relay, idemctl's
// outbox command and sqlitestore's outbox hold no statement on the outbox
// table: every one is in this package.
func TestNoOutboxSQLElsewhere(t *testing.T) {
	statement := regexp.MustCompile(`(?i)\b(INSERT\s+INTO|UPDATE\s+\{?\w*table|DELETE\s+FROM|SELECT\b[^"]*\bFROM\s+\{table\}|FROM\s+\{table\}|idempotency_outbox\b[^"]*\bWHERE|status\s*=\s*'|next_attempt_at|due_at\s*<=)`)
	var files []string
	for _, pattern := range []string{"../*.go", "../relay/*.go", "../../cmd/idemctl/outbox.go", "../../sqlitestore/outbox.go"} {
		got, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, got...)
	}
	files = slices.DeleteFunc(files, func(f string) bool { return strings.HasSuffix(f, "_test.go") })
	if len(files) < 5 {
		t.Fatalf("found only %v", files)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if m := statement.Find(b); m != nil {
			t.Errorf("%s holds SQL on the outbox table: %q", f, m)
		}
	}
}
