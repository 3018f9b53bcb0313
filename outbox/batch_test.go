package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/go-idempotency/idempotency/outbox"
)

func envelopes(n int) []outbox.Envelope {
	es := make([]outbox.Envelope, n)
	for i := range es {
		es[i] = outbox.Envelope{ID: fmt.Sprint("k/", i+1), Topic: "t", OrderingKey: fmt.Sprint("key-", i)}
	}
	return es
}

// TestAsBatchSinkOutcomes: each envelope gets its own Publish's outcome,
// in the order of the envelopes, and a panic fails its envelope only.
func TestAsBatchSinkOutcomes(t *testing.T) {
	refused := errors.New("refused")
	var mu sync.Mutex
	published := map[string]int{}
	sink := outbox.SinkFunc(func(ctx context.Context, e outbox.Envelope) error {
		mu.Lock()
		published[e.ID]++
		mu.Unlock()
		switch e.ID {
		case "k/3":
			return refused
		case "k/5":
			panic("the sink broke")
		}
		return nil
	})
	es := envelopes(8)
	errs := outbox.AsBatchSink(sink, 3).PublishBatch(context.Background(), es)
	if len(errs) != len(es) {
		t.Fatalf("%d errors for %d envelopes", len(errs), len(es))
	}
	for i, err := range errs {
		switch es[i].ID {
		case "k/3":
			if !errors.Is(err, refused) {
				t.Errorf("%s: %v, want the sink's error", es[i].ID, err)
			}
		case "k/5":
			if !errors.Is(err, outbox.ErrSinkPanicked) || !strings.Contains(err.Error(), "the sink broke") {
				t.Errorf("%s: %v, want ErrSinkPanicked with the panic's value", es[i].ID, err)
			}
		default:
			if err != nil {
				t.Errorf("%s: %v", es[i].ID, err)
			}
		}
		if published[es[i].ID] != 1 {
			t.Errorf("%s published %d times, want once", es[i].ID, published[es[i].ID])
		}
	}
}

// TestAsBatchSinkConcurrency: the envelopes are published from as many
// goroutines at once as asked, never more.
func TestAsBatchSinkConcurrency(t *testing.T) {
	const concurrency = 3
	var mu sync.Mutex
	inFlight, most := 0, 0
	entered := make(chan struct{}, 20)
	release := make(chan struct{})
	sink := outbox.SinkFunc(func(ctx context.Context, e outbox.Envelope) error {
		mu.Lock()
		inFlight++
		most = max(most, inFlight)
		mu.Unlock()
		entered <- struct{}{}
		<-release
		mu.Lock()
		inFlight--
		mu.Unlock()
		return nil
	})
	done := make(chan []error)
	go func() {
		done <- outbox.AsBatchSink(sink, concurrency).PublishBatch(context.Background(), envelopes(20))
	}()
	// Three publications under way together before any may end.
	for range concurrency {
		<-entered
	}
	close(release)
	for _, err := range <-done {
		if err != nil {
			t.Fatal(err)
		}
	}
	if most != concurrency {
		t.Fatalf("%d publications at once, want %d", most, concurrency)
	}
}

// TestAsBatchSinkContextEnds: once ctx has ended, the envelopes whose
// turn comes are not published, and their errors carry ctx's cause.
func TestAsBatchSinkContextEnds(t *testing.T) {
	stop := errors.New("relay stopping")
	ctx, cancel := context.WithCancelCause(context.Background())
	var calls atomic.Int64
	sink := outbox.SinkFunc(func(ctx context.Context, e outbox.Envelope) error {
		if calls.Add(1) == 2 {
			cancel(stop)
		}
		return nil
	})
	errs := outbox.AsBatchSink(sink, 1).PublishBatch(ctx, envelopes(5))
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("the envelopes published before ctx ended: %v, %v", errs[0], errs[1])
	}
	for i, err := range errs[2:] {
		if !errors.Is(err, stop) {
			t.Errorf("envelope %d after ctx ended: %v, want its cause", i+2, err)
		}
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("Publish called %d times, want 2", n)
	}
}

// batchSink is a Sink that is a BatchSink too.
type batchSink struct{ outbox.SinkFunc }

func (batchSink) PublishBatch(ctx context.Context, es []outbox.Envelope) []error {
	return make([]error, len(es))
}

// TestAsBatchSinkKeepsABatchSink: a sink with its own PublishBatch is
// used as it is.
func TestAsBatchSinkKeepsABatchSink(t *testing.T) {
	s := batchSink{func(context.Context, outbox.Envelope) error { return errors.New("Publish called") }}
	b := outbox.AsBatchSink(s, 4)
	if _, ok := b.(batchSink); !ok {
		t.Fatalf("got %T, want the sink itself", b)
	}
	if errs := b.PublishBatch(context.Background(), envelopes(2)); errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
}

func TestAsBatchSinkMisconfigurationPanics(t *testing.T) {
	nop := outbox.SinkFunc(func(context.Context, outbox.Envelope) error { return nil })
	for name, f := range map[string]func(){
		"nil sink":      func() { outbox.AsBatchSink(nil, 1) },
		"concurrency 0": func() { outbox.AsBatchSink(nop, 0) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			f()
		})
	}
}

func TestSuspendReason(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{errors.New("no route"), "no route"},
		{outbox.Suspend("closed for the night"), "closed for the night"},
		{fmt.Errorf("ledger: %w", outbox.Suspend("budget spent")), "budget spent"},
	} {
		if got := outbox.SuspendReason(c.err); got != c.want {
			t.Errorf("SuspendReason(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}
