package state

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/go-idempotency/idempotency/outbox/lifecycle"
)

// otherEngine is a dialect unlike PostgreSQL in each fragment (SQLite's
// spellings): numbered ? placeholders without casts, CAST, another clock,
// no notifications. Its outbox dialect is lifecycle's business (its own
// seam test): the transition's enqueue is rendered here as a placeholder.
var otherEngine = Dialect{
	Name:  "other",
	Param: func(n int, _ string) string { return fmt.Sprintf("?%d", n) },
	Cast:  func(expr, typ string) string { return fmt.Sprintf("CAST(%s AS %s)", expr, strings.ToUpper(typ)) },
	Now:   "strftime('%Y-%m-%d %H:%M:%f', 'now')",
}

// TestDialectSeam renders every statement in a dialect unlike PostgreSQL:
// nothing of PostgreSQL's is left in them, so another engine is a Dialect,
// not a copy of the operations. In PostgreSQL's, the transition wakes the
// relays; without notifications, it does not try.
func TestDialectSeam(t *testing.T) {
	postgres := regexp.MustCompile(`::|\$\d|clock_timestamp|pg_notify|jsonb`)
	v := vars{T: `"idempotency_state"`, H: `"idempotency_state_history"`}
	sql, err := newStatements(otherEngine, v)
	if err != nil {
		t.Fatal(err)
	}
	v.Enqueue = "INSERT INTO outbox SELECT * FROM message RETURNING id"
	move, err := render("transition", transitionSQL, otherEngine, v)
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]string{"create": sql.create, "get": sql.get, "history": sql.history, "transition": move} {
		if s == "" || strings.Contains(s, "{{") {
			t.Errorf("%s: not rendered:\n%s", name, s)
		}
		if m := postgres.FindString(s); m != "" {
			t.Errorf("%s: PostgreSQL's %q left in:\n%s", name, m, s)
		}
	}
	v.Enqueue = ""
	pg, err := transitionStatement(PostgreSQL, v, mustOutbox(t))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(pg, `pg_notify('idempotency_outbox', '')`) {
		t.Errorf("PostgreSQL's transition does not wake the relays:\n%s", pg)
	}
}

func mustOutbox(t *testing.T) *lifecycle.Table {
	out, err := lifecycle.New("idempotency_outbox", lifecycle.PostgreSQL)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
