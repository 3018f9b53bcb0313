package statetest

import (
	"bytes"
	"strings"
	"testing"

	"github.com/go-idempotency/idempotency/state"
)

var createTests = []test{
	{"Version1", func(t *testing.T, tg Target) {
		// A new record is at version 1 with the data as given, byte for
		// byte, and Get reads it back.
		s := tg.NewStore()
		r := ref(t, "pay_1")
		data := `{"amount": 1999,  "currency":"EUR"}`
		rec := create(t, s, r, "authorized", data)
		if rec.Ref != r || rec.State != "authorized" || rec.Version != 1 || string(rec.Data) != data {
			t.Fatalf("created %s", describe(rec))
		}
		if rec.CreatedAt.IsZero() || !rec.UpdatedAt.Equal(rec.CreatedAt) {
			t.Errorf("created at %v, updated at %v: want both set, equal", rec.CreatedAt, rec.UpdatedAt)
		}
		sameRecord(t, "Get after Create", get(t, s, r), rec)
	}},
	{"NilData", func(t *testing.T, tg Target) {
		// Nil data is the JSON object {}.
		s := tg.NewStore()
		rec := create(t, s, ref(t, "pay_1"), "new", "")
		if string(rec.Data) != "{}" {
			t.Errorf("data %q, want {}", rec.Data)
		}
	}},
	{"NoEvent", func(t *testing.T, tg Target) {
		// A creation is not a transition: no event, no history.
		s := tg.NewStore()
		r := ref(t, "pay_1")
		create(t, s, r, "authorized", "")
		wantWritten(t, "after Create", s, r, 0)
	}},
	{"Exists", func(t *testing.T, tg Target) {
		// Creating a record again, in any state with any data, is an
		// ExistsError carrying what is stored, which stays as it was.
		s := tg.NewStore()
		r := ref(t, "pay_1")
		first := create(t, s, r, "authorized", `{"n":1}`)
		moved := move(t, s, r, "authorized", "captured", 1)
		_, err := s.Create(ctx, r, "pending", []byte(`{"n":2}`))
		e := wantError[*state.ExistsError](t, "Create again", err, state.CodeExists, state.ErrExists, true)
		sameRecord(t, "ExistsError.Current", e.Current, moved)
		sameRecord(t, "Get after Create again", get(t, s, r), moved)
		if !moved.CreatedAt.Equal(first.CreatedAt) {
			t.Errorf("created at %v, then %v", first.CreatedAt, moved.CreatedAt)
		}
		wantWritten(t, "after Create again", s, r, 1)
	}},
	{"Scopes", func(t *testing.T, tg Target) {
		// The same machine and id in two scopes are two records.
		s := tg.NewStore()
		a, b := ref(t, "pay_1"), ref(t, "pay_1")
		create(t, s, a, "authorized", `"a"`)
		create(t, s, b, "pending", `"b"`)
		move(t, s, a, "authorized", "captured", 1)
		if rec := get(t, s, b); rec.State != "pending" || rec.Version != 1 || string(rec.Data) != `"b"` {
			t.Errorf("the other scope's record: %s", describe(rec))
		}
		if state.EventKey(a) == state.EventKey(b) || state.OrderingKey(a) == state.OrderingKey(b) {
			t.Errorf("two scopes share an event key or an ordering key")
		}
	}},
}

var getTests = []test{
	{"NotFound", func(t *testing.T, tg Target) {
		// Every operation on a record that does not exist is a
		// NotFoundError, and writes nothing.
		s := tg.NewStore()
		r := ref(t, "nobody")
		_, err := s.Get(ctx, r)
		e := wantError[*state.NotFoundError](t, "Get", err, state.CodeNotFound, state.ErrNotFound, true)
		if e.Ref != r {
			t.Errorf("NotFoundError.Ref %+v, want %+v", e.Ref, r)
		}
		_, err = s.Transition(ctx, r, state.Change{From: "a", To: "b", ExpectedVersion: 1})
		wantError[*state.NotFoundError](t, "Transition", err, state.CodeNotFound, state.ErrNotFound, true)
		_, err = s.History(ctx, r, 0, 0)
		wantError[*state.NotFoundError](t, "History", err, state.CodeNotFound, state.ErrNotFound, true)
		wantWritten(t, "after a Transition of nothing", s, r, 0)
		if _, err := s.Get(ctx, r); err == nil {
			t.Error("a Transition of nothing created a record")
		}
	}},
}

var transitionTests = []test{
	{"CAS", func(t *testing.T, tg Target) {
		// A transition from the record's state at its version moves it,
		// bumps the version and keeps the data (nil Data), the creation
		// time too; UpdatedAt moves on.
		s := tg.NewStore()
		r := ref(t, "pay_1")
		c := create(t, s, r, "authorized", `{"amount":1999}`)
		rec := move(t, s, r, "authorized", "captured", 1)
		if rec.State != "captured" || rec.Version != 2 || string(rec.Data) != `{"amount":1999}` ||
			!rec.CreatedAt.Equal(c.CreatedAt) || rec.UpdatedAt.Before(c.UpdatedAt) {
			t.Fatalf("after the transition: %s", describe(rec))
		}
		sameRecord(t, "Get after Transition", get(t, s, r), rec)
		rec = move(t, s, r, "captured", "settled", 2)
		if rec.Version != 3 || rec.State != "settled" {
			t.Errorf("after a second transition: %s", describe(rec))
		}
	}},
	{"Data", func(t *testing.T, tg Target) {
		// Data given replaces the stored data, byte for byte, whatever
		// JSON it is ({} and null too); nil keeps it.
		s := tg.NewStore()
		r := ref(t, "pay_1")
		create(t, s, r, "a", `{"n":1}`)
		version := int64(1)
		for _, data := range []string{`{"n": 2}`, `{}`, `null`, `[1, "x"]`, `"\u0000 \ud83d\ude00"`} {
			rec, err := s.Transition(ctx, r, state.Change{From: "a", To: "a", ExpectedVersion: version, Data: []byte(data)})
			if err != nil {
				t.Fatalf("Transition with data %s: %v", data, err)
			}
			version++
			if string(rec.Data) != data || string(get(t, s, r).Data) != data {
				t.Errorf("data %s stored as %s", data, rec.Data)
			}
			rec = move(t, s, r, "a", "a", version)
			version++
			if string(rec.Data) != data {
				t.Errorf("nil data replaced %s with %s", data, rec.Data)
			}
		}
	}},
	{"Self", func(t *testing.T, tg Target) {
		// A self-transition is a transition: the version grows, and it
		// has its event and its history row.
		s := tg.NewStore()
		r := ref(t, "pay_1")
		create(t, s, r, "open", "")
		rec := move(t, s, r, "open", "open", 1)
		if rec.State != "open" || rec.Version != 2 {
			t.Fatalf("after a self-transition: %s", describe(rec))
		}
		wantWritten(t, "after a self-transition", s, r, 1)
	}},
	{"ConflictVersion", func(t *testing.T, tg Target) {
		// A stale version is a conflict of reason version carrying the
		// record as it is; nothing is written.
		s := tg.NewStore()
		r := ref(t, "pay_1")
		create(t, s, r, "authorized", `{"n":1}`)
		now := move(t, s, r, "authorized", "authorized", 1)
		_, err := s.Transition(ctx, r, state.Change{From: "authorized", To: "captured", ExpectedVersion: 1, Data: []byte(`{"n":2}`)})
		e := wantError[*state.ConflictError](t, "stale version", err, state.CodeConflict, state.ErrConflict, true)
		if e.Reason != state.ReasonVersion {
			t.Errorf("reason %q, want %q", e.Reason, state.ReasonVersion)
		}
		sameRecord(t, "ConflictError.Current", e.Current, now)
		sameRecord(t, "Get after the conflict", get(t, s, r), now)
		wantWritten(t, "after the conflict", s, r, 1)
		// A version ahead of the record's is stale the other way.
		_, err = s.Transition(ctx, r, state.Change{From: "authorized", To: "captured", ExpectedVersion: 9})
		if e := wantError[*state.ConflictError](t, "version ahead", err, state.CodeConflict, state.ErrConflict, true); e.Reason != state.ReasonVersion {
			t.Errorf("version ahead: reason %q", e.Reason)
		}
	}},
	{"ConflictState", func(t *testing.T, tg Target) {
		// The expected version in another state than From is a conflict
		// of reason state carrying the record; nothing is written.
		s := tg.NewStore()
		r := ref(t, "pay_1")
		create(t, s, r, "authorized", "")
		now := move(t, s, r, "authorized", "captured", 1)
		_, err := s.Transition(ctx, r, state.Change{From: "authorized", To: "canceled", ExpectedVersion: 2})
		e := wantError[*state.ConflictError](t, "wrong state", err, state.CodeConflict, state.ErrConflict, true)
		if e.Reason != state.ReasonState {
			t.Errorf("reason %q, want %q", e.Reason, state.ReasonState)
		}
		sameRecord(t, "ConflictError.Current", e.Current, now)
		sameRecord(t, "Get after the conflict", get(t, s, r), now)
		wantWritten(t, "after the conflict", s, r, 1)
	}},
	{"ConflictOrder", func(t *testing.T, tg Target) {
		// Both the version and the state wrong: the version is reported.
		s := tg.NewStore()
		r := ref(t, "pay_1")
		create(t, s, r, "authorized", "")
		move(t, s, r, "authorized", "captured", 1)
		_, err := s.Transition(ctx, r, state.Change{From: "authorized", To: "canceled", ExpectedVersion: 1})
		if e := wantError[*state.ConflictError](t, "both wrong", err, state.CodeConflict, state.ErrConflict, true); e.Reason != state.ReasonVersion {
			t.Errorf("reason %q, want %q (checked first)", e.Reason, state.ReasonVersion)
		}
	}},
	{"ErrorText", func(t *testing.T, tg Target) {
		// The errors name the record and what was found.
		s := tg.NewStore()
		r := ref(t, "pay_1")
		create(t, s, r, "authorized", "")
		_, err := s.Transition(ctx, r, state.Change{From: "captured", To: "settled", ExpectedVersion: 1})
		if err == nil || !strings.Contains(err.Error(), `"pay_1"`) || !strings.Contains(err.Error(), "authorized") {
			t.Errorf("conflict's text %q names neither the record nor its state", err)
		}
	}},
}

var grammarTests = []test{
	{"Refused", func(t *testing.T, tg Target) {
		// Arguments outside the grammar are refused before any statement
		// runs: nothing is created or moved.
		s := tg.NewStore()
		good := ref(t, "pay_1")
		create(t, s, good, "authorized", "")
		with := func(f func(*state.Ref)) state.Ref { r := good; f(&r); return r }
		refs := map[string]state.Ref{
			"scope":   with(func(r *state.Ref) { r.Scope = "" }),
			"machine": with(func(r *state.Ref) { r.Machine = "Payments" }),
			"id":      with(func(r *state.Ref) { r.ID = "a/b" }),
		}
		for field, r := range refs {
			_, err := s.Create(ctx, r, "authorized", nil)
			if e := wantError[*state.InvalidArgumentError](t, "Create with a bad "+field, err, state.CodeInvalidArgument, state.ErrInvalidArgument, true); e.Field != field {
				t.Errorf("Create with a bad %s: field %q", field, e.Field)
			}
			_, err = s.Transition(ctx, r, state.Change{From: "authorized", To: "captured", ExpectedVersion: 1})
			wantError[*state.InvalidArgumentError](t, "Transition with a bad "+field, err, state.CodeInvalidArgument, state.ErrInvalidArgument, true)
		}
		changes := map[string]state.Change{
			"from":             {From: "", To: "captured", ExpectedVersion: 1},
			"to":               {From: "authorized", To: "cap tured", ExpectedVersion: 1},
			"expected_version": {From: "authorized", To: "captured", ExpectedVersion: 0},
			"data":             {From: "authorized", To: "captured", ExpectedVersion: 1, Data: []byte(`{"open":`)},
		}
		for field, c := range changes {
			_, err := s.Transition(ctx, good, c)
			if e := wantError[*state.InvalidArgumentError](t, "Transition with a bad "+field, err, state.CodeInvalidArgument, state.ErrInvalidArgument, true); e.Field != field {
				t.Errorf("Transition with a bad %s: field %q", field, e.Field)
			}
		}
		_, err := s.Create(ctx, ref(t, "pay_2"), "authorized", []byte("\xff"))
		wantError[*state.InvalidArgumentError](t, "Create with data not UTF-8", err, state.CodeInvalidArgument, state.ErrInvalidArgument, true)
		if rec := get(t, s, good); rec.Version != 1 {
			t.Errorf("a refused transition moved the record: %s", describe(rec))
		}
		wantWritten(t, "after refused calls", s, good, 0)
	}},
	{"Caps", func(t *testing.T, tg Target) {
		// Names at their caps are taken; a byte more is refused.
		s := tg.NewStore()
		sc := scope(t)
		long := state.Ref{
			Scope:   sc + strings.Repeat("s", state.MaxScopeBytes-len(sc)),
			Machine: "m." + strings.Repeat("x", state.MaxMachineBytes-2),
			ID:      strings.Repeat("é", state.MaxIDBytes/2),
		}
		st := "S" + strings.Repeat("t", state.MaxStateBytes-1)
		create(t, s, long, st, "")
		move(t, s, long, st, st, 1)
		for field, r := range map[string]state.Ref{
			"scope":   {Scope: long.Scope + "s", Machine: long.Machine, ID: long.ID},
			"machine": {Scope: long.Scope, Machine: long.Machine + "x", ID: long.ID},
			"id":      {Scope: long.Scope, Machine: long.Machine, ID: long.ID + "x"},
		} {
			_, err := s.Create(ctx, r, "a", nil)
			if e := wantError[*state.InvalidArgumentError](t, field+" over its cap", err, state.CodeInvalidArgument, state.ErrInvalidArgument, true); e.Field != field {
				t.Errorf("%s over its cap: field %q", field, e.Field)
			}
		}
		_, err := s.Create(ctx, ref(t, "x"), st+"t", nil)
		wantError[*state.InvalidArgumentError](t, "state over its cap", err, state.CodeInvalidArgument, state.ErrInvalidArgument, true)
	}},
	{"DataCap", func(t *testing.T, tg Target) {
		// Data of DefaultMaxDataBytes is taken, a byte more refused; the
		// cap is WithMaxDataBytes's, or none with 0.
		s := tg.NewStore()
		at := jsonString(state.DefaultMaxDataBytes)
		r := ref(t, "big")
		rec := create(t, s, r, "a", string(at))
		if !bytes.Equal(rec.Data, at) {
			t.Errorf("data of %d bytes stored as %d bytes", len(at), len(rec.Data))
		}
		over := jsonString(state.DefaultMaxDataBytes + 1)
		_, err := s.Transition(ctx, r, state.Change{From: "a", To: "b", ExpectedVersion: 1, Data: over})
		wantError[*state.InvalidArgumentError](t, "data over the cap", err, state.CodeInvalidArgument, state.ErrInvalidArgument, true)
		_, err = s.Create(ctx, ref(t, "big2"), "a", over)
		wantError[*state.InvalidArgumentError](t, "data over the cap", err, state.CodeInvalidArgument, state.ErrInvalidArgument, true)

		small := tg.NewStore(state.WithMaxDataBytes(16))
		_, err = small.Transition(ctx, r, state.Change{From: "a", To: "b", ExpectedVersion: 1, Data: jsonString(17)})
		wantError[*state.InvalidArgumentError](t, "data over WithMaxDataBytes(16)", err, state.CodeInvalidArgument, state.ErrInvalidArgument, true)
		if _, err := small.Transition(ctx, r, state.Change{From: "a", To: "b", ExpectedVersion: 1, Data: jsonString(16)}); err != nil {
			t.Errorf("data at WithMaxDataBytes(16): %v", err)
		}
		none := tg.NewStore(state.WithMaxDataBytes(0))
		if _, err := none.Transition(ctx, r, state.Change{From: "b", To: "c", ExpectedVersion: 2, Data: over}); err != nil {
			t.Errorf("data over the default cap with WithMaxDataBytes(0): %v", err)
		}
	}},
}

// jsonString returns a JSON string of n bytes (n >= 2).
func jsonString(n int) []byte {
	return []byte(`"` + strings.Repeat("x", n-2) + `"`)
}
