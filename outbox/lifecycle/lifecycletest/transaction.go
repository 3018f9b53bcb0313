package lifecycletest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
)

// runner returns a transactional Runner over the target's Store.
func (f *fixture) runner(opts ...idempotency.RunnerOption) *idempotency.Runner {
	return idempotency.NewRunner(f.Store, append([]idempotency.RunnerOption{idempotency.WithTransaction(true)}, opts...)...)
}

// enqueueCall runs a call of r with key that enqueues msgs, and returns
// their IDs.
func enqueueCall(r *idempotency.Runner, key string, msgs ...outbox.Message) ([]string, error) {
	res, err := idempotency.Do(ctx, r, idempotency.Call{Name: "enqueue", Key: key}, func(ctx context.Context) ([]string, error) {
		return outbox.Enqueue(ctx, msgs...)
	})
	return res.Value, err
}

// all returns the IDs of every message in the table.
func (f *fixture) all(t *testing.T) []string {
	t.Helper()
	var ids []string
	for _, s := range lifecycle.States() {
		listed, err := f.Table.List(ctx, f.DB, s, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range listed {
			ids = append(ids, m.ID)
		}
	}
	return ids
}

// pausable is a store whose heartbeats and releases land only while on:
// off, it is the store of a process that died.
type pausable struct {
	idempotency.TxStore
	on *atomic.Bool
}

var errPaused = errors.New("lifecycletest: the process is paused")

func (p pausable) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	if !p.on.Load() {
		return errPaused
	}
	return p.TxStore.Extend(ctx, key, token, lease)
}

func (p pausable) Release(ctx context.Context, key, token string) error {
	if !p.on.Load() {
		return errPaused
	}
	return p.TxStore.Release(ctx, key, token)
}

// twoMessages are what the calls of the transaction tests enqueue: an
// order and an audit message, naming the attempt's epoch.
func twoMessages(epoch uint64) []outbox.Message {
	return []outbox.Message{
		{Topic: "orders", Payload: fmt.Appendf(nil, "epoch %d", epoch)},
		{Topic: "audit", Headers: map[string]string{"epoch": fmt.Sprint(epoch)}},
	}
}

var errDeclined = errors.New("lifecycletest: declined")

// stolen is what the call that took a record over enqueued.
type stolen struct {
	res        idempotency.Result[[]string]
	storageKey string
	err        error
}

// steal runs calls of r with key, each enqueueing the two messages of its
// epoch, while they end in an outcome to retry (the key held), for at most
// 15 seconds. With t, it fails t unless one ran; without, the caller
// checks err.
func steal(t *testing.T, r *idempotency.Runner, key string) stolen {
	var s stolen
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		s.res, s.err = idempotency.Do(ctx, r, idempotency.Call{Name: "order", Key: key}, func(ctx context.Context) ([]string, error) {
			info, _ := idempotency.FromContext(ctx)
			s.storageKey = info.StorageKey
			return outbox.Enqueue(ctx, twoMessages(info.Epoch)...)
		})
		if s.err == nil || s.res.Outcome.Class() != idempotency.ClassRetry || time.Now().After(deadline) {
			break
		}
	}
	if t != nil && s.err != nil {
		t.Fatalf("no call took the record over: %v", s.err)
	}
	return s
}

// wantStolen fails t unless the thief's messages got the owner's IDs, and
// only they are in the table.
func wantStolen(t *testing.T, f *fixture, owner []string, thief stolen) {
	t.Helper()
	want := []string{thief.storageKey + "/1", thief.storageKey + "/2"}
	if !slices.Equal(owner, want) || !slices.Equal(thief.res.Value, want) {
		t.Fatalf("IDs of the owner %v and of the thief %v, want %v for both", owner, thief.res.Value, want)
	}
	msgs, err := f.Table.Messages(ctx, f.DB, thief.storageKey)
	if err != nil || len(msgs) != 2 {
		t.Fatalf("messages %+v, %v; want the thief's two", msgs, err)
	}
	if string(msgs[0].Payload) != "epoch 2" || msgs[1].Headers["epoch"] != "2" {
		t.Errorf("messages %+v: not the thief's", msgs)
	}
	if got := f.all(t); !sameIDs(got, want) {
		t.Errorf("the table holds %v", got)
	}
}

var transactionTests = []test{
	{"CommittedOnly", func(t *testing.T, tg Target) {
		// The messages of calls that committed are in the table; a call
		// whose function fails, panics, or whose COMMIT the database
		// refuses leaves none (a later call with its key numbers its
		// messages from 1 again), and the calls after it commit as
		// before.
		f := newFixture(tg)
		r := f.runner()
		var committed []string
		commit := func(key string) {
			t.Helper()
			ids, err := enqueueCall(r, key, twoMessages(1)...)
			if err != nil || len(ids) != 2 {
				t.Fatalf("%s: %v, %v", key, ids, err)
			}
			committed = append(committed, ids...)
		}
		for i := range 3 {
			commit(fmt.Sprint("ok-", i))
		}
		failing := map[string]func(ctx context.Context) error{
			"fail":  func(context.Context) error { return errDeclined },
			"panic": func(context.Context) error { panic(errDeclined) },
		}
		if tg.FailCommit != nil {
			failing["refuse"] = tg.FailCommit
		}
		rolledBack := map[string][]string{}
		for key, fail := range failing {
			err := func() (err error) {
				defer func() {
					if v := recover(); v != nil {
						err = fmt.Errorf("panicked: %v", v)
					}
				}()
				_, err = idempotency.Do(ctx, r, idempotency.Call{Name: "enqueue", Key: key}, func(ctx context.Context) (int, error) {
					ids, err := outbox.Enqueue(ctx, twoMessages(1)...)
					rolledBack[key] = ids
					if err != nil {
						return 0, err
					}
					return 0, fail(ctx)
				})
				return err
			}()
			switch {
			case len(rolledBack[key]) != 2:
				t.Fatalf("%s: enqueued %v", key, rolledBack[key])
			case key == "refuse" && !errors.Is(err, idempotency.ErrOutcomeUnknown):
				t.Errorf("%s: %v, want ErrOutcomeUnknown", key, err)
			case key != "refuse" && (err == nil || !strings.Contains(err.Error(), errDeclined.Error())):
				t.Errorf("%s: %v, want %v", key, err, errDeclined)
			}
		}
		commit("ok-after")
		if got := f.all(t); !sameIDs(got, committed) {
			t.Errorf("the table holds %v, want the %d committed messages %v", got, len(committed), committed)
		}
		for key, ids := range rolledBack {
			again, err := enqueueCall(r, key, twoMessages(2)...)
			if err != nil || !slices.Equal(again, ids) {
				t.Errorf("%s again: %v, %v; want the rolled-back IDs %v", key, again, err, ids)
			}
		}
	}},
	{"LostLease", func(t *testing.T, tg Target) {
		// The owner of a call dies after enqueueing: its transaction rolls
		// back, and neither its heartbeats nor its release land. Once its
		// lease ran out, another call with the key takes the record over
		// and enqueues its own messages, which get the same IDs; only
		// they are in the table.
		f := newFixture(tg)
		var alive atomic.Bool
		owner := idempotency.NewRunner(pausable{tg.Store, &alive}, idempotency.WithTransaction(true), idempotency.WithLease(300*time.Millisecond))
		var first []string
		_, err := idempotency.Do(ctx, owner, idempotency.Call{Name: "order", Key: "k"}, func(ctx context.Context) (int, error) {
			info, _ := idempotency.FromContext(ctx)
			var err error
			if first, err = outbox.Enqueue(ctx, twoMessages(info.Epoch)...); err != nil {
				return 0, err
			}
			return 0, errDeclined // the process dies: the release after the rollback fails
		})
		if !errors.Is(err, errDeclined) {
			t.Fatalf("the owner: %v", err)
		}
		got := steal(t, f.runner(), "k")
		if got.res.Epoch != 2 {
			t.Fatalf("the thief ran at epoch %d, want 2 (a steal)", got.res.Epoch)
		}
		wantStolen(t, f, first, got)
	}},
	{"StolenWhileOpen", func(t *testing.T, tg Target) {
		// The owner of a call stalls after enqueueing, past its lease (its
		// heartbeats fail), its transaction still open; another call with
		// the key takes the record over, and its insert of the same IDs
		// waits for the owner's uncommitted messages; the owner's commit
		// is refused, and the thief's messages are in the table.
		needConcurrentWriters(t, tg, "a call taking a record over while its owner's transaction is open")
		f := newFixture(tg)
		var beats, waited atomic.Bool
		owner := idempotency.NewRunner(pausable{tg.Store, &beats}, idempotency.WithTransaction(true), idempotency.WithLease(400*time.Millisecond))
		var first []string
		stalled := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := idempotency.Do(ctx, owner, idempotency.Call{Name: "order", Key: "k"}, func(ctx context.Context) (int, error) {
				info, _ := idempotency.FromContext(ctx)
				var err error
				first, err = outbox.Enqueue(ctx, twoMessages(info.Epoch)...)
				close(stalled)
				<-ctx.Done() // the lease ran out: cancelled before any steal
				beats.Store(true)
				for deadline := time.Now().Add(10 * time.Second); tg.LockWaits(t) == 0 && time.Now().Before(deadline); {
					time.Sleep(2 * time.Millisecond)
				}
				waited.Store(tg.LockWaits(t) > 0)
				return 0, err
			})
			done <- err
		}()
		<-stalled
		got := make(chan stolen, 1)
		go func() { got <- steal(nil, f.runner(), "k") }()
		if err := <-done; !errors.Is(err, idempotency.ErrLeaseLost) {
			t.Fatalf("the owner: %v, want ErrLeaseLost", err)
		}
		thief := <-got
		if !waited.Load() {
			t.Error("the thief's insert never waited on the owner's uncommitted messages")
		}
		if thief.err != nil || thief.res.Epoch != 2 {
			t.Fatalf("the thief: epoch %d, %v; want epoch 2", thief.res.Epoch, thief.err)
		}
		wantStolen(t, f, first, thief)
	}},
	{"Sequence", func(t *testing.T, tg Target) {
		// A call that enqueues twice continues its sequence; a key used
		// again after its record expired numbers its messages past those
		// still kept, so that IDs stay unique.
		f := newFixture(tg)
		r := f.runner(idempotency.WithTTL(50 * time.Millisecond))
		var ids []string
		var key string
		do := func(n int) (idempotency.Result[int], error) {
			return idempotency.Do(ctx, r, idempotency.Call{Name: "n", Key: "k"}, func(ctx context.Context) (int, error) {
				info, _ := idempotency.FromContext(ctx)
				key = info.StorageKey
				for range n {
					got, err := outbox.Enqueue(ctx, outbox.Message{Topic: "t"}, outbox.Message{Topic: "t"})
					if err != nil {
						return 0, err
					}
					ids = append(ids, got...)
				}
				return 0, nil
			})
		}
		if _, err := do(2); err != nil {
			t.Fatal(err)
		}
		if want := []string{key + "/1", key + "/2", key + "/3", key + "/4"}; !slices.Equal(ids, want) {
			t.Fatalf("IDs %v, want %v", ids, want)
		}
		// Replayed until the record expires, then run again.
		ids = nil
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			res, err := do(1)
			if err != nil {
				t.Fatal(err)
			}
			if !res.Replayed {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the record did not expire within 10s")
			}
		}
		if want := []string{key + "/5", key + "/6"}; !slices.Equal(ids, want) {
			t.Fatalf("the key used again: %v, want %v", ids, want)
		}
	}},
	{"InvalidMessages", func(t *testing.T, tg Target) {
		// A message that breaks the grammar is refused with
		// ErrInvalidMessage, naming its index and the rule, before any
		// statement runs: the call's other messages are not enqueued, and
		// its transaction goes on (a valid Enqueue after it commits).
		f := newFixture(tg)
		r := f.runner()
		cases := []struct {
			m    outbox.Message
			rule string
		}{
			{outbox.Message{}, "no topic"},
			{outbox.Message{Topic: "payment created"}, "not visible ASCII"},
			{outbox.Message{Topic: "payments.*"}, "wildcards"},
			{outbox.Message{Topic: "t", OrderingKey: "\xff"}, "ordering key is not valid UTF-8"},
			{outbox.Message{Topic: "t", Headers: map[string]string{"k": "v\x00"}}, "header k: the value holds CR, LF or NUL"},
		}
		for i, c := range cases {
			var refused error
			res, err := idempotency.Do(ctx, r, idempotency.Call{Name: "bad", Key: fmt.Sprint("bad-", i)}, func(ctx context.Context) ([]string, error) {
				_, refused = outbox.Enqueue(ctx, outbox.Message{Topic: "fine"}, c.m)
				return outbox.Enqueue(ctx, outbox.Message{Topic: "after"})
			})
			if !errors.Is(refused, outbox.ErrInvalidMessage) || !strings.Contains(refused.Error(), "message 1: ") || !strings.Contains(refused.Error(), c.rule) {
				t.Errorf("message %+v: %v, want ErrInvalidMessage naming message 1 and %q", c.m, refused, c.rule)
			}
			if err != nil || len(res.Value) != 1 || !strings.HasSuffix(res.Value[0], "/1") {
				t.Errorf("the valid Enqueue after the refusal: %v, %v", res.Value, err)
			}
		}
		if ids, err := enqueueCall(r, "none"); err != nil || len(ids) != 0 {
			t.Errorf("no messages: %v, %v", ids, err)
		}
		if listed, err := f.Table.List(ctx, f.DB, lifecycle.Ready, "", 0); err != nil || len(listed) != len(cases) {
			t.Errorf("rows written: %+v, %v; want the %d valid ones", listed, err, len(cases))
		}
		if listed, err := f.Table.List(ctx, f.DB, lifecycle.Ready, "fine", 0); err != nil || len(listed) != 0 {
			t.Errorf("messages of a refused Enqueue written: %+v, %v", listed, err)
		}
	}},
	{"Scheduled", func(t *testing.T, tg Target) {
		// A message with a NotBefore later than the database's clock is
		// scheduled, due then; one with a NotBefore passed is ready.
		f := newFixture(tg)
		at := time.Now().Add(time.Hour)
		ids, err := enqueueCall(f.runner(), "k", outbox.Message{Topic: "later", NotBefore: at}, outbox.Message{Topic: "now", NotBefore: time.Now().Add(-time.Minute)})
		if err != nil {
			t.Fatal(err)
		}
		if r := f.row(t, ids[0]); r.state != lifecycle.Scheduled || !r.dueAt.Equal(at.Truncate(time.Microsecond)) {
			t.Errorf("%s: %+v, want scheduled at %v", ids[0], r, at)
		}
		if r := f.row(t, ids[1]); r.state != lifecycle.Ready || r.gap != 0 {
			t.Errorf("%s: %+v, want ready", ids[1], r)
		}
	}},
	{"Cancel", func(t *testing.T, tg Target) {
		// Cancel in a transactional call cancels the messages not
		// finished, with the call's commit; a call that rolls back
		// cancels nothing; an invalid ID is refused.
		f := newFixture(tg)
		r := f.runner()
		ids, err := enqueueCall(r, "order", outbox.Message{Topic: "a"}, outbox.Message{Topic: "b"}, outbox.Message{Topic: "c"})
		if err != nil {
			t.Fatal(err)
		}
		f.set(t, ids[2], "status", "done", "finished_at", time.Duration(0))
		_, err = idempotency.Do(ctx, r, idempotency.Call{Name: "cancel", Key: "rolled-back"}, func(ctx context.Context) (int, error) {
			if _, err := outbox.Cancel(ctx, ids[0]); err != nil {
				return 0, err
			}
			return 0, errDeclined
		})
		if !errors.Is(err, errDeclined) {
			t.Fatal(err)
		}
		if row := f.row(t, ids[0]); row.state != lifecycle.Ready {
			t.Fatalf("a rolled-back cancel left %s %s", ids[0], row.state)
		}
		res, err := idempotency.Do(ctx, r, idempotency.Call{Name: "cancel", Key: "committed"}, func(ctx context.Context) ([]string, error) {
			return outbox.Cancel(ctx, ids...)
		})
		if err != nil || !sameIDs(res.Value, ids[:2]) {
			t.Fatalf("cancel: %v, %v; want %v (the done one left alone)", res.Value, err, ids[:2])
		}
		for i, want := range []lifecycle.State{lifecycle.Canceled, lifecycle.Canceled, lifecycle.Done} {
			if row := f.row(t, ids[i]); row.state != want || (want == lifecycle.Canceled && row.lastError != "canceled: by outbox.Cancel") {
				t.Errorf("%s: %+v, want %s", ids[i], row, want)
			}
		}
		_, err = idempotency.Do(ctx, r, idempotency.Call{Name: "cancel", Key: "invalid"}, func(ctx context.Context) ([]string, error) {
			return outbox.Cancel(ctx, "not-an-id")
		})
		if !errors.Is(err, outbox.ErrInvalidID) {
			t.Errorf("an invalid ID: %v", err)
		}
	}},
	{"NoTransaction", func(t *testing.T, tg Target) {
		// Without a transaction (a plain context, a Runner over the Store
		// without WithTransaction), Enqueue and Cancel are refused with
		// ErrNoTransaction and write nothing.
		f := newFixture(tg)
		if _, err := outbox.Enqueue(ctx, outbox.Message{Topic: "t"}); !errors.Is(err, outbox.ErrNoTransaction) {
			t.Errorf("Enqueue with a plain context: %v", err)
		}
		if _, err := outbox.Cancel(ctx, "k/1"); !errors.Is(err, outbox.ErrNoTransaction) {
			t.Errorf("Cancel with a plain context: %v", err)
		}
		r := idempotency.NewRunner(tg.Store)
		_, err := idempotency.Do(ctx, r, idempotency.Call{Name: "x", Key: "k"}, func(ctx context.Context) (int, error) {
			if _, err := outbox.Cancel(ctx, "k/1"); !errors.Is(err, outbox.ErrNoTransaction) {
				t.Errorf("Cancel in a call without a transaction: %v", err)
			}
			_, err := outbox.Enqueue(ctx, outbox.Message{Topic: "t"})
			return 0, err
		})
		if !errors.Is(err, outbox.ErrNoTransaction) {
			t.Errorf("Enqueue in a call without a transaction: %v", err)
		}
		if got := f.all(t); len(got) != 0 {
			t.Errorf("the table holds %v", got)
		}
	}},
}
