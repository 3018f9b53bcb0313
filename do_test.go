package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

type receipt struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

// charger counts the executions of a charge.
type charger struct{ n atomic.Int64 }

func (c *charger) charge(ctx context.Context) (receipt, error) {
	n := c.n.Add(1)
	return receipt{ID: fmt.Sprint("ch_", n), Amount: 100}, nil
}

func call(key string) idempotency.Call {
	return idempotency.Call{Name: "charge", Key: key, Payload: []byte(`{"amount":100}`)}
}

// TestDoRunsOnce: 100 concurrent calls with one key in wait mode run the
// function once; every call gets its result, all but one replayed.
func TestDoRunsOnce(t *testing.T) {
	const calls = 100
	store := &arrivals{Store: newMemStore(t), want: calls, all: make(chan struct{})}
	r := idempotency.NewRunner(store, idempotency.WithWait(5*time.Second))
	var c charger
	release := make(chan struct{})
	slow := func(ctx context.Context) (receipt, error) {
		<-release
		return c.charge(ctx)
	}
	var wg sync.WaitGroup
	results := make([]idempotency.Result[receipt], calls)
	errs := make([]error, calls)
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = idempotency.Do(context.Background(), r, call("k"), slow)
		}()
	}
	<-store.all // every call has asked the store while the first runs
	close(release)
	wg.Wait()
	ran := 0
	for i := range calls {
		if errs[i] != nil {
			t.Fatalf("call %d: %v", i, errs[i])
		}
		if results[i].Value != (receipt{ID: "ch_1", Amount: 100}) {
			t.Fatalf("call %d got %+v", i, results[i].Value)
		}
		if !results[i].Replayed {
			ran++
			if results[i].Epoch != 1 {
				t.Fatalf("the call that ran has epoch %d", results[i].Epoch)
			}
		}
	}
	if ran != 1 || c.n.Load() != 1 {
		t.Fatalf("%d calls report running, %d executions; want 1 and 1", ran, c.n.Load())
	}
}

// arrivals closes all once want Acquires have been made.
type arrivals struct {
	idempotency.Store
	want int64
	n    atomic.Int64
	all  chan struct{}
}

func (s *arrivals) Acquire(ctx context.Context, req idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	a, err := s.Store.Acquire(ctx, req)
	if s.n.Add(1) == s.want {
		close(s.all)
	}
	return a, err
}

// TestDoOutcomes: replays, mismatches, errors that release, panics, the
// in-flight error, and scopes.
func TestDoOutcomes(t *testing.T) {
	ctx := context.Background()
	r := idempotency.NewRunner(newMemStore(t))
	var c charger

	first, err := idempotency.Do(ctx, r, call("a"), c.charge)
	if err != nil || first.Replayed || first.Value.ID != "ch_1" {
		t.Fatalf("first: %+v %v", first, err)
	}
	again, err := idempotency.Do(ctx, r, call("a"), c.charge)
	if err != nil || !again.Replayed || again.Value != first.Value || again.Epoch != 0 {
		t.Fatalf("duplicate: %+v %v", again, err)
	}

	t.Run("Mismatch", func(t *testing.T) {
		other := call("a")
		other.Payload = []byte(`{"amount":999}`)
		if _, err := idempotency.Do(ctx, r, other, c.charge); !errors.Is(err, idempotency.ErrFingerprintMismatch) {
			t.Fatalf("another payload: %v, want ErrFingerprintMismatch", err)
		}
		refund := call("a")
		refund.Name = "refund"
		if _, err := idempotency.Do(ctx, r, refund, c.charge); !errors.Is(err, idempotency.ErrFingerprintMismatch) {
			t.Fatalf("another operation: %v, want ErrFingerprintMismatch", err)
		}
		if res, err := idempotency.Do(ctx, r, call("a"), c.charge); err != nil || !res.Replayed || res.Value != first.Value {
			t.Fatalf("the record changed: %+v %v", res, err)
		}
	})
	t.Run("Scope", func(t *testing.T) {
		scoped := call("a")
		scoped.Scope = "tenant-2"
		res, err := idempotency.Do(ctx, r, scoped, c.charge)
		if err != nil || res.Replayed || res.Value == first.Value {
			t.Fatalf("another scope: %+v %v", res, err)
		}
	})
	t.Run("ErrorReleases", func(t *testing.T) {
		declined := errors.New("card declined")
		var runs int
		fail := func(context.Context) (receipt, error) { runs++; return receipt{}, declined }
		for range 2 {
			if _, err := idempotency.Do(ctx, r, call("e"), fail); err != declined {
				t.Fatalf("error: %v, want the function's own", err)
			}
		}
		res, err := idempotency.Do(ctx, r, call("e"), c.charge)
		if runs != 2 || err != nil || res.Replayed {
			t.Fatalf("after two errors: %d runs, then %+v %v", runs, res, err)
		}
	})
	t.Run("PanicReleases", func(t *testing.T) {
		func() {
			defer func() {
				if v := recover(); v != "boom" {
					t.Fatalf("recovered %v, want the panic re-raised", v)
				}
			}()
			idempotency.Do(ctx, r, call("p"), func(context.Context) (receipt, error) { panic("boom") })
		}()
		if res, err := idempotency.Do(ctx, r, call("p"), c.charge); err != nil || res.Replayed {
			t.Fatalf("after a panic: %+v %v", res, err)
		}
	})
	t.Run("InFlight", func(t *testing.T) {
		entered, release := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := idempotency.Do(ctx, r, call("f"), func(ctx context.Context) (receipt, error) {
				close(entered)
				<-release
				return c.charge(ctx)
			})
			done <- err
		}()
		<-entered
		_, err := idempotency.Do(ctx, r, call("f"), c.charge)
		var inFlight *idempotency.InFlightError
		if !errors.Is(err, idempotency.ErrInFlight) || !errors.As(err, &inFlight) || inFlight.Remaining <= 0 || inFlight.Remaining > 10*time.Second {
			t.Fatalf("duplicate while running: %v, want an InFlightError with the lease left", err)
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
	t.Run("Info", func(t *testing.T) {
		scoped := call("i")
		scoped.Scope = "acct-7"
		_, err := idempotency.Do(ctx, r, scoped, func(ctx context.Context) (int, error) {
			info, ok := idempotency.FromContext(ctx)
			if !ok || info.Key != "i" || info.StorageKey != idempotency.StorageKey("acct-7", "i") || info.Epoch != 1 {
				t.Errorf("Info = %+v, %v", info, ok)
			}
			return 1, nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Run("BadCalls", func(t *testing.T) {
		for _, bad := range []idempotency.Call{{Key: "k"}, {Name: "n"}, {Name: "n", Key: strings.Repeat("k", 256)}} {
			if _, err := idempotency.Do(ctx, r, bad, c.charge); err == nil {
				t.Errorf("Do(%+v) ran", bad)
			}
		}
	})
}

// TestDoCodecs: []byte results are stored as they are, a custom codec is
// used for others, and a result stored by another codec is not misread.
func TestDoCodecs(t *testing.T) {
	ctx := context.Background()
	store := newMemStore(t)
	raw := idempotency.NewRunner(store)
	res, err := idempotency.Do(ctx, raw, call("b"), func(context.Context) ([]byte, error) { return []byte{0, 1, 2}, nil })
	again, err2 := idempotency.Do(ctx, raw, call("b"), func(context.Context) ([]byte, error) { return nil, errors.New("ran twice") })
	if err != nil || err2 != nil || string(again.Value) != "\x00\x01\x02" || !again.Replayed || string(res.Value) != string(again.Value) {
		t.Fatalf("[]byte: %v %v, %+v", err, err2, again)
	}
	// The same record read as a struct is refused, not misread.
	if _, err := idempotency.Do(ctx, raw, call("b"), func(context.Context) (receipt, error) { return receipt{}, nil }); !errors.Is(err, idempotency.ErrCorruptRecord) {
		t.Fatalf("[]byte record read as JSON: %v, want ErrCorruptRecord", err)
	}
	upper := idempotency.NewRunner(store, idempotency.WithCodec(upperCodec{}))
	if _, err := idempotency.Do(ctx, upper, call("u"), func(context.Context) (string, error) { return "hello", nil }); err != nil {
		t.Fatal(err)
	}
	got, err := idempotency.Do(ctx, upper, call("u"), func(context.Context) (string, error) { return "", errors.New("ran twice") })
	if err != nil || got.Value != "HELLO" {
		t.Fatalf("custom codec replay: %+v %v", got, err)
	}
	if _, err := idempotency.Do(ctx, raw, call("u"), func(context.Context) (string, error) { return "", nil }); !errors.Is(err, idempotency.ErrCorruptRecord) {
		t.Fatalf("a record of another codec: %v, want ErrCorruptRecord", err)
	}
}

// upperCodec stores strings upper-cased, to show which codec decoded.
type upperCodec struct{}

func (upperCodec) ContentType() string { return "text/upper" }
func (upperCodec) Marshal(v any) ([]byte, error) {
	return []byte(strings.ToUpper(v.(string))), nil
}
func (upperCodec) Unmarshal(data []byte, v any) error {
	*(v.(*string)) = string(data)
	return nil
}

// TestDoResultOverCap: a result over WithMaxResponseBody reaches the first
// caller; duplicates get ErrResultOmitted, and the function runs once.
func TestDoResultOverCap(t *testing.T) {
	ctx := context.Background()
	r := idempotency.NewRunner(newMemStore(t), idempotency.WithMaxResponseBody(8))
	var runs atomic.Int64
	big := func(context.Context) (string, error) { runs.Add(1); return strings.Repeat("x", 100), nil }
	first, err := idempotency.Do(ctx, r, call("big"), big)
	if err != nil || len(first.Value) != 100 {
		t.Fatalf("first: %v, %d bytes", err, len(first.Value))
	}
	if _, err := idempotency.Do(ctx, r, call("big"), big); !errors.Is(err, idempotency.ErrResultOmitted) {
		t.Fatalf("duplicate: %v, want ErrResultOmitted", err)
	}
	// A value the codec cannot encode is stored the same way.
	ch := func(context.Context) (chan int, error) { runs.Add(1); return make(chan int), nil }
	if res, err := idempotency.Do(ctx, r, call("chan"), ch); !errors.Is(err, idempotency.ErrResultOmitted) || res.Value == nil {
		t.Fatalf("unencodable: %v, %v", res.Value, err)
	}
	if _, err := idempotency.Do(ctx, r, call("chan"), ch); !errors.Is(err, idempotency.ErrResultOmitted) {
		t.Fatalf("duplicate of unencodable: %v", err)
	}
	if runs.Load() != 2 {
		t.Fatalf("%d executions, want 2", runs.Load())
	}
}

// TestDoLeaseLost: when no extend succeeds, the function's context is
// cancelled with a cause wrapping ErrLeaseLost before the lease can end on
// the store, and the stale result is not stored.
func TestDoLeaseLost(t *testing.T) {
	store := newStalledStore(t)
	store.extendHang = true
	const lease = 300 * time.Millisecond
	r := idempotency.NewRunner(store, idempotency.WithLease(lease))
	start := time.Now()
	var cause error
	var cancelledAt time.Duration
	_, err := idempotency.Do(context.Background(), r, call("l"), func(ctx context.Context) (int, error) {
		<-ctx.Done()
		cancelledAt, cause = time.Since(start), context.Cause(ctx)
		return 1, nil
	})
	if !errors.Is(cause, idempotency.ErrLeaseLost) {
		t.Fatalf("cause %v, want ErrLeaseLost", cause)
	}
	if cancelledAt >= lease {
		t.Fatalf("cancelled after %v, not before the %v lease ended", cancelledAt, lease)
	}
	// Nobody took the record over, so the completion still lands (as for
	// HTTP): the key replays.
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	store.unstall()
}

// TestDoTransaction: on a TxStore, the function's writes and the record
// commit together: a replay writes nothing, an error commits nothing, and
// a result over the cap commits with the record marked omitted, so that a
// retry never runs again.
func TestDoTransaction(t *testing.T) {
	ctx := context.Background()
	l := newLedger(t)
	r := idempotency.NewRunner(l, idempotency.WithTransaction(true), idempotency.WithMaxResponseBody(64))
	pay := func(rows int, fail error) func(ctx context.Context) (string, error) {
		return func(ctx context.Context) (string, error) {
			info, _ := idempotency.FromContext(ctx)
			tx := info.Tx.(*ledgerTx)
			for i := range rows {
				tx.Insert(fmt.Sprint(info.Key, "-", i))
			}
			return strings.Repeat("r", rows), fail
		}
	}
	for range 3 {
		if _, err := idempotency.Do(ctx, r, call("t"), pay(2, nil)); err != nil {
			t.Fatal(err)
		}
	}
	if l.count("t-0") != 1 || l.count("t-1") != 1 {
		t.Fatalf("rows: %d %d, want one each", l.count("t-0"), l.count("t-1"))
	}
	if _, err := idempotency.Do(ctx, r, call("e"), pay(2, errors.New("provider down"))); err == nil || l.count("e-0") != 0 {
		t.Fatalf("an error committed %d rows (%v)", l.count("e-0"), err)
	}
	if res, err := idempotency.Do(ctx, r, call("big"), pay(100, nil)); err != nil || res.Outcome != idempotency.OutcomeOmitted ||
		len(res.Value) != 100 || l.count("big-0") != 1 {
		t.Fatalf("a result over the cap: %v %v, %d rows", res.Outcome, err, l.count("big-0"))
	}
	if res, err := idempotency.Do(ctx, r, call("big"), pay(3, nil)); !errors.Is(err, idempotency.ErrResultOmitted) ||
		res.Outcome != idempotency.OutcomeReplayedOmitted || l.count("big-0") != 1 {
		t.Fatalf("a retry of the omitted result: %v %v, %d rows; want a replay without the value", res.Outcome, err, l.count("big-0"))
	}
	l.commitFails.Store("after")
	if _, err := idempotency.Do(ctx, r, call("u"), pay(1, nil)); !errors.Is(err, idempotency.ErrOutcomeUnknown) {
		t.Fatalf("commit of unknown outcome: %v", err)
	}
	l.commitFails.Store("")
	if res, err := idempotency.Do(ctx, r, call("u"), pay(1, nil)); err != nil || !res.Replayed || l.count("u-0") != 1 {
		t.Fatalf("the retry after a landed commit: %+v %v, %d rows", res, err, l.count("u-0"))
	}
}

// TestDoEvents: each call reports one final event, named by the call.
func TestDoEvents(t *testing.T) {
	var mu sync.Mutex
	var finals []idempotency.Event
	r := idempotency.NewRunner(newMemStore(t), idempotency.WithObserver(func(_ context.Context, e idempotency.Event) {
		if e.Final {
			mu.Lock()
			finals = append(finals, e)
			mu.Unlock()
		}
	}))
	var c charger
	ctx := context.Background()
	idempotency.Do(ctx, r, call("k"), c.charge)
	idempotency.Do(ctx, r, call("k"), c.charge)
	other := call("k")
	other.Payload = nil
	idempotency.Do(ctx, r, other, c.charge)
	idempotency.Do(ctx, r, idempotency.Call{Name: "charge"}, c.charge) // no key
	r.Reject(ctx, "charge", errors.New("the message has no key"))
	want := []idempotency.EventKind{idempotency.EventExecuted, idempotency.EventReplayed, idempotency.EventMismatch,
		idempotency.EventRejected, idempotency.EventRejected}
	if len(finals) != len(want) {
		t.Fatalf("%d final events, want %d", len(finals), len(want))
	}
	for i, e := range finals {
		if e.Kind != want[i] || e.Route != "charge" || (e.Kind != idempotency.EventRejected && e.Key != idempotency.StorageKey("", "k")) {
			t.Errorf("event %d: %+v, want %v on route charge", i, e, want[i])
		}
	}
	if !finals[0].Ran || finals[0].Epoch != 1 {
		t.Errorf("the execution's event: Ran %v, Epoch %d", finals[0].Ran, finals[0].Epoch)
	}
}

// TestRunnerOptions: the compiler keeps each option to the constructors
// it applies to: every option of the middleware only is an Option and no
// RunnerOption, WithCodec the reverse, and the common ones both; the
// values no type rules out panic.
func TestRunnerOptions(t *testing.T) {
	option := reflect.TypeFor[idempotency.Option]()
	runnerOption := reflect.TypeFor[idempotency.RunnerOption]()
	for _, c := range []struct {
		name               string
		opt                any
		middleware, runner bool
	}{
		{"WithTTL", idempotency.WithTTL(time.Hour), true, true},
		{"WithLease", idempotency.WithLease(time.Second), true, true},
		{"WithWait", idempotency.WithWait(time.Second), true, true},
		{"WithMaxResponseBody", idempotency.WithMaxResponseBody(1), true, true},
		{"WithMaxResponseHeader", idempotency.WithMaxResponseHeader(1), true, true},
		{"WithFailOpen", idempotency.WithFailOpen(true), true, true},
		{"WithTransaction", idempotency.WithTransaction(true), true, true},
		{"WithObserver", idempotency.WithObserver(func(context.Context, idempotency.Event) {}), true, true},
		{"WithLogger", idempotency.WithLogger(nil), true, true},
		{"WithCodec", idempotency.WithCodec(idempotency.JSON), false, true},
		{"WithMethods", idempotency.WithMethods("POST"), true, false},
		{"WithKeyRequired", idempotency.WithKeyRequired(true), true, false},
		{"WithKeyScope", idempotency.WithKeyScope(userOf), true, false},
		{"WithUnscopedKeys", idempotency.WithUnscopedKeys(true), true, false},
		{"WithFingerprint", idempotency.WithFingerprint(idempotency.DefaultFingerprint), true, false},
		{"WithMaxRequestBody", idempotency.WithMaxRequestBody(1), true, false},
		{"WithStoredHeaders", idempotency.WithStoredHeaders("X"), true, false},
		{"WithStoreSetCookie", idempotency.WithStoreSetCookie(true), true, false},
		{"WithReleaseStatus", idempotency.WithReleaseStatus(func(int) bool { return false }), true, false},
		{"WithProblemTypeBase", idempotency.WithProblemTypeBase("x"), true, false},
		{"WithErrorHandler", idempotency.WithErrorHandler(idempotency.WriteProblem), true, false},
		{"WithRoute", idempotency.WithRoute(func(*http.Request) string { return "" }), true, false},
	} {
		typ := reflect.TypeOf(c.opt)
		if got := typ.Implements(option); got != c.middleware {
			t.Errorf("%s (%v) is an Option: %v, want %v", c.name, typ, got, c.middleware)
		}
		if got := typ.Implements(runnerOption); got != c.runner {
			t.Errorf("%s (%v) is a RunnerOption: %v, want %v", c.name, typ, got, c.runner)
		}
	}
	for name, f := range map[string]func(){
		"NewRunner(nil)":        func() { idempotency.NewRunner(nil) },
		"NewRunner(tx, !Tx)":    func() { idempotency.NewRunner(newMemStore(t), idempotency.WithTransaction(true)) },
		"NewRunner(nil option)": func() { idempotency.NewRunner(newMemStore(t), nil) },
		"WithTTL(-1)":           func() { idempotency.WithTTL(-1) },
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

// TestDoWaitForHolder: a call with Wait set to WaitForHolder, on a Runner
// without wait mode, waits for the holder of its key past several of its
// leases (heartbeats keep them alive), woken by the store: it replays the
// holder's result, or runs once the holder released the key; only its
// context ends the wait.
func TestDoWaitForHolder(t *testing.T) {
	ctx := context.Background()
	r := idempotency.NewRunner(newMemStore(t), idempotency.WithLease(60*time.Millisecond))
	waiting := func(key string) idempotency.Call {
		c := call(key)
		c.Wait = idempotency.WaitForHolder
		return c
	}
	for _, fail := range []bool{false, true} {
		key := fmt.Sprint("hold-", fail)
		started, release := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := idempotency.Do(ctx, r, call(key), func(context.Context) (receipt, error) {
				close(started)
				<-release
				if fail {
					return receipt{}, errors.New("provider down")
				}
				return receipt{ID: "holder"}, nil
			})
			done <- err
		}()
		<-started
		time.AfterFunc(300*time.Millisecond, func() { close(release) }) // five leases
		res, err := idempotency.Do(ctx, r, waiting(key), func(context.Context) (receipt, error) {
			return receipt{ID: "waiter"}, nil
		})
		<-done
		switch {
		case !fail && (err != nil || res.Outcome != idempotency.OutcomeReplayed || res.Value.ID != "holder"):
			t.Errorf("holder succeeded: the waiter got %v %+v %v, want the holder's replay", res.Outcome, res.Value, err)
		case fail && (err != nil || res.Outcome != idempotency.OutcomeStored || res.Value.ID != "waiter"):
			t.Errorf("holder failed: the waiter got %v %+v %v, want to run once the key was released", res.Outcome, res.Value, err)
		}
	}

	started, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	go idempotency.Do(ctx, r, call("held"), func(context.Context) (receipt, error) {
		close(started)
		<-release
		return receipt{}, nil
	})
	<-started
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	res, err := idempotency.Do(cctx, r, waiting("held"), func(context.Context) (receipt, error) { return receipt{}, nil })
	if res.Outcome != idempotency.OutcomeCanceled || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the waiter's context ended: %v %v, want OutcomeCanceled", res.Outcome, err)
	}
	bad := waiting("k")
	bad.Wait = -time.Second
	if res, err := idempotency.Do(ctx, r, bad, func(context.Context) (receipt, error) { return receipt{}, nil }); res.Outcome != idempotency.OutcomeInvalid {
		t.Errorf("a negative Wait: %v %v", res.Outcome, err)
	}
}
