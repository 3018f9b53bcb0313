package state_test

import (
	"errors"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/state"
)

// TestGrammar: names at the edges of their grammar.
func TestGrammar(t *testing.T) {
	cases := []struct {
		check func(string) error
		name  string
		good  []string
		bad   []string
	}{
		{state.ValidScope, "scope",
			[]string{"acme", "user-42", "a/b", "tenant with spaces", "münchen", strings.Repeat("s", state.MaxScopeBytes)},
			[]string{"", "tab\there", "nul\x00", "\x7f", "c1\u0085", "\xff", strings.Repeat("s", state.MaxScopeBytes+1)}},
		{state.ValidMachine, "machine",
			[]string{"payments", "payments.payment", "onepony.task", "a1.b_2.c-3", "m." + strings.Repeat("x", state.MaxMachineBytes-2)},
			[]string{"", "Payments", "payments.", ".payments", "a..b", "1pay", "pay.2x", "pay ment", "pay/ment", "pay*", "pay>", "é",
				"m." + strings.Repeat("x", state.MaxMachineBytes-1)}},
		{state.ValidID, "id",
			[]string{"pay_123", "acme:t_123", "a b", "é", "😀", strings.Repeat("i", state.MaxIDBytes)},
			[]string{"", "a/b", "/", "line\nbreak", "\x00", "\xc3", strings.Repeat("i", state.MaxIDBytes+1)}},
		{state.ValidState, "state",
			[]string{"authorized", "Captured", "in_review", "step-2", "a", "S" + strings.Repeat("t", state.MaxStateBytes-1)},
			[]string{"", "_x", "-x", "2fa", "in review", "a.b", "a/b", "é", strings.Repeat("t", state.MaxStateBytes+1)}},
	}
	for _, c := range cases {
		for _, s := range c.good {
			if err := c.check(s); err != nil {
				t.Errorf("%s %q refused: %v", c.name, s, err)
			}
		}
		for _, s := range c.bad {
			err := c.check(s)
			var e *state.InvalidArgumentError
			if !errors.As(err, &e) || e.Field != c.name {
				t.Errorf("%s %q: error %v, want an InvalidArgumentError of field %s", c.name, s, err, c.name)
			}
		}
	}
}

// FuzzNames: whatever the names, the checks do not panic, and names they
// take make events that the outbox's grammar takes (topic, ordering key,
// message ID) and text that a database's text column holds.
func FuzzNames(f *testing.F) {
	f.Add("acme", "payments.payment", "pay_1", "authorized")
	f.Fuzz(func(t *testing.T, scope, machine, id, st string) {
		ref := state.Ref{Scope: scope, Machine: machine, ID: id}
		errs := []error{state.ValidScope(scope), state.ValidMachine(machine), state.ValidID(id), state.ValidState(st)}
		for i, s := range []string{scope, machine, id, st} {
			if errs[i] != nil {
				continue
			}
			if !utf8.ValidString(s) || strings.ContainsFunc(s, unicode.IsControl) || s == "" {
				t.Errorf("%q taken: empty, not UTF-8, or with a control character", s)
			}
		}
		if errs[1] == nil {
			if len(machine) > state.MaxMachineBytes || strings.ContainsAny(machine, "/ *>") {
				t.Errorf("machine %q taken", machine)
			}
			topic := state.DefaultTopicPrefix + "." + machine
			if err := (outbox.Message{Topic: topic}).Validate(); err != nil {
				t.Errorf("machine %q makes topic %q, which the outbox refuses: %v", machine, topic, err)
			}
		}
		if errs[2] == nil && (len(id) > state.MaxIDBytes || strings.Contains(id, "/")) {
			t.Errorf("id %q taken", id)
		}
		if errs[3] == nil && (len(st) > state.MaxStateBytes || strings.ContainsAny(st, " ./")) {
			t.Errorf("state %q taken", st)
		}
		if errs[0] != nil || errs[1] != nil || errs[2] != nil {
			return
		}
		if len(scope) > state.MaxScopeBytes {
			t.Errorf("scope of %d bytes taken", len(scope))
		}
		msg := outbox.Message{Topic: state.DefaultTopicPrefix + "." + machine, OrderingKey: state.OrderingKey(ref)}
		if err := msg.Validate(); err != nil {
			t.Errorf("%+v makes a message the outbox refuses: %v", ref, err)
		}
		key, seq, err := outbox.ParseID(state.EventID(ref, 2))
		if err != nil || key != state.EventKey(ref) || seq != 2 {
			t.Errorf("EventID(%+v, 2) = %s: parsed %q %d, %v", ref, state.EventID(ref, 2), key, seq, err)
		}
		// The ordering key names the record alone: its last two parts
		// are the machine and the id, what precedes them the scope.
		ok := state.OrderingKey(ref)
		i := strings.LastIndexByte(ok, '/')
		j := strings.LastIndexByte(ok[:i], '/')
		if ok[i+1:] != id || ok[j+1:i] != machine || ok[:j] != scope {
			t.Errorf("ordering key %q does not split back into %+v", ok, ref)
		}
	})
}
