package lifecycletest

import (
	"bytes"
	"errors"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/outbox/lifecycle"
)

var enqueueTests = []test{
	{"States", func(t *testing.T, tg Target) {
		// A message is ready and due at its enqueue, or scheduled and due
		// at its NotBefore when that is later than the database's clock;
		// a NotBefore passed is ready at once. No attempt is counted.
		f := newFixture(tg)
		later := time.Now().Add(time.Hour)
		ids := f.enqueue(t, lifecycle.NewMessage{Topic: "a", Payload: []byte("p"), Headers: map[string]string{"h": "v"}},
			lifecycle.NewMessage{Topic: "b", NotBefore: later, OrderingKey: "acct"},
			lifecycle.NewMessage{Topic: "c", NotBefore: time.Now().Add(-time.Hour)})
		if want := []string{"key-1/1", "key-1/2", "key-1/3"}; !slices.Equal(ids, want) {
			t.Fatalf("IDs %v, want %v", ids, want)
		}
		if r := f.row(t, ids[0]); r.state != lifecycle.Ready || r.dueIn > 0 || r.gap != 0 || r.attempts != 0 || r.finished || r.token != "" {
			t.Errorf("first message %+v, want ready, due at its enqueue", r)
		}
		if r := f.row(t, ids[1]); r.state != lifecycle.Scheduled || !r.dueAt.Equal(later.Truncate(time.Microsecond)) ||
			!f.within(r.dueIn, 59*time.Minute, time.Hour) {
			t.Errorf("scheduled message %+v, want scheduled, due at %v", r, later)
		}
		if r := f.row(t, ids[2]); r.state != lifecycle.Ready || r.gap != 0 {
			t.Errorf("a NotBefore in the past: %+v, want ready, due at its enqueue", r)
		}
	}},
	{"Sequence", func(t *testing.T, tg Target) {
		// The IDs continue the record's sequence, in another transaction
		// too; another record starts at 1. A message without an ordering
		// key has its storage key's. Enqueue of no messages writes
		// nothing.
		f := newFixture(tg)
		first := f.enqueue(t, msg("a"), lifecycle.NewMessage{Topic: "b", OrderingKey: "acct"})
		more, err := f.enqueueAt("key-1", msg("c"))
		if err != nil || !slices.Equal(more, []string{"key-1/3"}) {
			t.Errorf("enqueue again: %v, %v; want key-1/3", more, err)
		}
		if other := f.enqueue(t, msg("d")); !slices.Equal(other, []string{"key-2/1"}) {
			t.Errorf("another record: %v, want key-2/1", other)
		}
		if none, err := f.enqueueAt("key-3"); err != nil || none != nil {
			t.Errorf("no messages: %v, %v", none, err)
		}
		msgs, err := f.Table.Messages(ctx, f.DB, "key-1")
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, m := range msgs {
			got = append(got, m.ID+" "+m.OrderingKey)
		}
		if want := []string{first[0] + " key-1", first[1] + " acct", "key-1/3 key-1"}; !slices.Equal(got, want) {
			t.Errorf("messages and ordering keys %v, want %v", got, want)
		}
		if st, err := f.Table.Status(ctx, f.DB, 5); err != nil || st.Total != 4 {
			t.Errorf("status %+v, %v: want 4 messages", st, err)
		}
	}},
	{"Content", func(t *testing.T, tg Target) {
		// Payloads and headers are kept byte for byte, as Messages and the
		// claim read them; a nil payload is empty (read as nil or empty,
		// as the engine's driver reads an empty value), no headers an
		// empty map.
		f := newFixture(tg)
		payload := []byte{0, 1, 2, 0xff, 'x'}
		headers := map[string]string{"traceparent": "00-abc-01", "k": "é\"\\"}
		ids := f.enqueue(t, lifecycle.NewMessage{Topic: "t.one", Payload: payload, Headers: headers}, msg("t.two"))
		msgs, err := f.Table.Messages(ctx, f.DB, "key-1")
		if err != nil || len(msgs) != 2 {
			t.Fatalf("messages %+v, %v", msgs, err)
		}
		if m := msgs[0]; m.ID != ids[0] || m.Seq != 1 || m.Topic != "t.one" || !bytes.Equal(m.Payload, payload) || !maps.Equal(m.Headers, headers) ||
			m.State != lifecycle.Ready || m.Attempts != 0 || m.EnqueuedAt.IsZero() || m.FinishedAt != nil || m.LastError != nil {
			t.Errorf("first message %+v", m)
		}
		if m := msgs[1]; len(m.Payload) != 0 || m.Headers == nil || len(m.Headers) != 0 || msgs[0].RowID >= m.RowID {
			t.Errorf("second message %+v, want an empty payload and headers, after the first", m)
		}
		got := f.claim(t, "t", 10, time.Minute)
		if len(got) != 1 || got[0].ID != ids[0] || !bytes.Equal(got[0].Payload, payload) || !maps.Equal(got[0].Headers, headers) ||
			got[0].OrderingKey != "key-1" || got[0].Topic != "t.one" || got[0].RowID != msgs[0].RowID || !got[0].EnqueuedAt.Equal(msgs[0].EnqueuedAt) {
			t.Errorf("claimed %+v", got)
		}
	}},
	{"KeyLockOrder", func(t *testing.T, tg Target) {
		// A transaction enqueueing on an ordering key waits for another
		// that holds the key, so that the key's messages commit in the
		// order of their ids: while the first is open, nothing of the key
		// is claimed, and the second's message comes after the first's.
		needConcurrentWriters(t, tg, "a transaction waiting on an ordering key's lock")
		f := newFixture(tg)
		a := holdEnqueue(t, f, "rec-a", lifecycle.NewMessage{Topic: "a", OrderingKey: "acct"})
		b := make(chan error, 1)
		go func() {
			_, err := f.enqueueAt("rec-b", lifecycle.NewMessage{Topic: "b", OrderingKey: "acct"})
			b <- err
		}()
		awaitLockWait(t, tg, "the second transaction on the key", b)
		if got := f.claim(t, "t0", 10, time.Minute); len(got) != 0 {
			t.Errorf("claimed %v while the first transaction was open", claimedIDs(got))
		}
		if err := a.commit(); err != nil {
			t.Fatal(err)
		}
		if err := <-b; err != nil {
			t.Fatal(err)
		}
		wantClaims(t, f, [][]string{{"rec-a/1"}, {"rec-b/1"}})
	}},
	{"Conflict", func(t *testing.T, tg Target) {
		// A transaction that enqueues messages of IDs another transaction
		// holds uncommitted waits for it: it fails with ErrConflict once
		// the other committed, and goes on once it rolled back.
		needConcurrentWriters(t, tg, "an insert waiting on another transaction's row")
		f := newFixture(tg)
		for _, commit := range []bool{true, false} {
			key := map[bool]string{true: "committed", false: "rolled-back"}[commit]
			a := holdEnqueue(t, f, key, msg("first"))
			b := make(chan error, 1)
			go func() {
				_, err := f.enqueueAt(key, msg("second"))
				b <- err
			}()
			awaitLockWait(t, tg, "the second insert of "+key, b)
			end := a.rollback
			if commit {
				end = a.commit
			}
			if err := end(); err != nil && commit {
				t.Fatal(err)
			}
			err := <-b
			msgs, merr := f.Table.Messages(ctx, f.DB, key)
			if merr != nil || len(msgs) != 1 {
				t.Fatalf("%s: messages %+v, %v; want one", key, msgs, merr)
			}
			switch {
			case commit && !errors.Is(err, lifecycle.ErrConflict):
				t.Errorf("after the other committed: %v, want ErrConflict", err)
			case commit && msgs[0].Topic != "first":
				t.Errorf("after the other committed: %+v, want its message", msgs[0])
			case !commit && (err != nil || msgs[0].ID != key+"/1" || msgs[0].Topic != "second"):
				t.Errorf("after the other rolled back: %v, %+v; want the second's message at 1", err, msgs[0])
			}
		}
	}},
}

// held is a transaction that enqueued and waits to end.
type held struct {
	end  chan bool // true: commit
	done chan error
	once *sync.Once
}

var errRollback = errors.New("lifecycletest: rolled back")

func (h held) commit() error { return h.finish(true) }

func (h held) rollback() error { return h.finish(false) }

// finish ends the transaction, once.
func (h held) finish(commit bool) error {
	err := errors.New("lifecycletest: the transaction ended already")
	h.once.Do(func() {
		h.end <- commit
		err = <-h.done
	})
	return err
}

// holdEnqueue enqueues msgs as messages of storageKey in a transaction it
// keeps open until commit or rollback, or until t ends (rolled back), so
// that a test that fails first leaves no transaction open.
func holdEnqueue(t *testing.T, f *fixture, storageKey string, msgs ...lifecycle.NewMessage) held {
	t.Helper()
	h := held{end: make(chan bool), done: make(chan error, 1), once: new(sync.Once)}
	enqueued := make(chan error, 1)
	go func() {
		h.done <- lifecycle.InTx(ctx, f.DB, func(db lifecycle.DB) error {
			_, err := f.Table.Enqueue(ctx, db, storageKey, msgs)
			enqueued <- err
			if err != nil {
				return err
			}
			if !<-h.end {
				return errRollback
			}
			return nil
		})
	}()
	if err := <-enqueued; err != nil {
		h.once.Do(func() { <-h.done })
		t.Fatal(err)
	}
	t.Cleanup(func() { h.rollback() })
	return h
}

// wantClaims claims one batch after another, marking each done, and fails
// t unless they are want.
func wantClaims(t *testing.T, f *fixture, want [][]string) {
	t.Helper()
	for i, w := range want {
		got := f.claim(t, "w"+string(rune('a'+i)), 100, time.Minute)
		if ids := claimedIDs(got); !slices.Equal(ids, w) {
			t.Fatalf("claim %d: %v, want %v", i+1, ids, w)
		}
		rows := make([]int64, len(got))
		for j, m := range got {
			rows[j] = m.RowID
		}
		if _, err := f.Table.Done(ctx, f.DB, "w"+string(rune('a'+i)), rows); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.claim(t, "last", 100, time.Minute); len(got) != 0 {
		t.Errorf("then claimed %v, want nothing", claimedIDs(got))
	}
}
