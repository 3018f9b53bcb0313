package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/memstore"
)

// faultStore fails the calls it is told to.
type faultStore struct {
	idempotency.Store
	acquireErr, completeErr error
}

func (s *faultStore) Acquire(ctx context.Context, req idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	if s.acquireErr != nil {
		return idempotency.Acquisition{}, s.acquireErr
	}
	return s.Store.Acquire(ctx, req)
}

func (s *faultStore) Complete(ctx context.Context, key, token string, resp *idempotency.Response, ttl time.Duration) error {
	if s.completeErr != nil {
		return s.completeErr
	}
	return s.Store.Complete(ctx, key, token, resp, ttl)
}

// lostLedger is a ledger whose commits find the record taken over.
type lostLedger struct{ *ledger }

func (l lostLedger) BeginTx(ctx context.Context, key, token string) (idempotency.Tx, error) {
	return lostTx{&ledgerTx{l: l.ledger, key: key, token: token}}, nil
}

type lostTx struct{ *ledgerTx }

func (lostTx) Complete(context.Context, *idempotency.Response, time.Duration) error {
	return fmt.Errorf("commit: %w", idempotency.ErrLeaseLost)
}

// TestDoReportsEveryOutcome: Do reports each Outcome where it happens, with
// its class, its error and its RetryAfter. Every outcome has a case here but
// OutcomeTooLarge, which only a transactional route of the middleware
// answers (checked with the middleware below): a new Outcome fails this test
// until it has one.
func TestDoReportsEveryOutcome(t *testing.T) {
	ctx := context.Background()
	ok := func(context.Context) (string, error) { return "receipt", nil }
	type want struct {
		value   string
		err     error // errors.Is target; nil: no error
		retries bool  // RetryAfter > 0
	}
	cases := map[idempotency.Outcome]func(t *testing.T) (idempotency.Result[string], error, want){
		idempotency.OutcomeStored: func(t *testing.T) (idempotency.Result[string], error, want) {
			res, err := idempotency.Do(ctx, idempotency.NewRunner(newMemStore(t)), call("k"), ok)
			return res, err, want{value: "receipt"}
		},
		idempotency.OutcomeOmitted: func(t *testing.T) (idempotency.Result[string], error, want) {
			r := idempotency.NewRunner(newMemStore(t), idempotency.WithMaxResponseBody(4))
			res, err := idempotency.Do(ctx, r, call("k"), ok)
			return res, err, want{value: "receipt"}
		},
		idempotency.OutcomeCommitted: func(t *testing.T) (idempotency.Result[string], error, want) {
			r := idempotency.NewRunner(newLedger(t), idempotency.WithTransaction(true))
			res, err := idempotency.Do(ctx, r, call("k"), ok)
			return res, err, want{value: "receipt"}
		},
		idempotency.OutcomeReplayed: func(t *testing.T) (idempotency.Result[string], error, want) {
			r := idempotency.NewRunner(newMemStore(t))
			idempotency.Do(ctx, r, call("k"), ok)
			res, err := idempotency.Do(ctx, r, call("k"), ok)
			return res, err, want{value: "receipt"}
		},
		idempotency.OutcomeReplayedOmitted: func(t *testing.T) (idempotency.Result[string], error, want) {
			r := idempotency.NewRunner(newMemStore(t), idempotency.WithMaxResponseBody(4))
			idempotency.Do(ctx, r, call("k"), ok)
			res, err := idempotency.Do(ctx, r, call("k"), ok)
			return res, err, want{err: idempotency.ErrResultOmitted}
		},
		idempotency.OutcomeUnrecorded: func(t *testing.T) (idempotency.Result[string], error, want) {
			s := &faultStore{Store: newMemStore(t), completeErr: errors.New("connection reset")}
			res, err := idempotency.Do(ctx, idempotency.NewRunner(s), call("k"), ok)
			return res, err, want{value: "receipt", err: err} // fn's value, and why it was not stored
		},
		idempotency.OutcomeUnprotected: func(t *testing.T) (idempotency.Result[string], error, want) {
			s := &faultStore{Store: newMemStore(t), acquireErr: errors.New("dial tcp: connection refused")}
			res, err := idempotency.Do(ctx, idempotency.NewRunner(s, idempotency.WithFailOpen(true)), call("k"), ok)
			return res, err, want{value: "receipt"}
		},
		idempotency.OutcomeReleased: func(t *testing.T) (idempotency.Result[string], error, want) {
			declined := errors.New("provider down")
			res, err := idempotency.Do(ctx, idempotency.NewRunner(newMemStore(t)), call("k"), func(context.Context) (string, error) {
				return "", declined
			})
			return res, err, want{err: declined}
		},
		idempotency.OutcomeRefused: func(t *testing.T) (idempotency.Result[string], error, want) {
			conflict := errors.New("the payment was canceled meanwhile")
			r := idempotency.NewRunner(newMemStore(t))
			res, err := idempotency.Do(ctx, r, call("k"), func(context.Context) (string, error) {
				return "", idempotency.Permanent(conflict)
			})
			// The key was released: another call with it runs.
			if again, _ := idempotency.Do(ctx, r, call("k"), ok); again.Outcome != idempotency.OutcomeStored {
				t.Errorf("after a refusal the key's next call got %v, want it run", again.Outcome)
			}
			return res, err, want{err: conflict}
		},
		idempotency.OutcomeInFlight: func(t *testing.T) (idempotency.Result[string], error, want) {
			r := idempotency.NewRunner(newMemStore(t))
			started, release := make(chan struct{}), make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				idempotency.Do(ctx, r, call("k"), func(context.Context) (string, error) {
					close(started)
					<-release
					return "receipt", nil
				})
			}()
			<-started
			res, err := idempotency.Do(ctx, r, call("k"), ok)
			close(release)
			<-done
			return res, err, want{err: idempotency.ErrInFlight, retries: true}
		},
		idempotency.OutcomeLeaseLost: func(t *testing.T) (idempotency.Result[string], error, want) {
			r := idempotency.NewRunner(lostLedger{newLedger(t)}, idempotency.WithTransaction(true))
			res, err := idempotency.Do(ctx, r, call("k"), ok)
			return res, err, want{err: idempotency.ErrLeaseLost, retries: true}
		},
		idempotency.OutcomeCommitUnknown: func(t *testing.T) (idempotency.Result[string], error, want) {
			l := newLedger(t)
			l.commitFails.Store("before")
			res, err := idempotency.Do(ctx, idempotency.NewRunner(l, idempotency.WithTransaction(true)), call("k"), ok)
			return res, err, want{err: idempotency.ErrOutcomeUnknown, retries: true}
		},
		idempotency.OutcomeStoreUnavailable: func(t *testing.T) (idempotency.Result[string], error, want) {
			s := &faultStore{Store: newMemStore(t), acquireErr: errors.New("dial tcp: connection refused")}
			res, err := idempotency.Do(ctx, idempotency.NewRunner(s), call("k"), ok)
			return res, err, want{err: s.acquireErr, retries: true}
		},
		idempotency.OutcomeStoreFull: func(t *testing.T) (idempotency.Result[string], error, want) {
			r := idempotency.NewRunner(newMemStore(t, memstore.WithMaxEntries(1)))
			idempotency.Do(ctx, r, call("first"), ok)
			res, err := idempotency.Do(ctx, r, call("k"), ok)
			return res, err, want{err: idempotency.ErrStoreFull, retries: true}
		},
		idempotency.OutcomeCanceled: func(t *testing.T) (idempotency.Result[string], error, want) {
			cctx, cancel := context.WithCancelCause(ctx)
			gone := errors.New("client went away")
			cancel(gone)
			res, err := idempotency.Do(cctx, idempotency.NewRunner(newMemStore(t)), call("k"), ok)
			return res, err, want{err: gone}
		},
		idempotency.OutcomeMismatch: func(t *testing.T) (idempotency.Result[string], error, want) {
			r := idempotency.NewRunner(newMemStore(t))
			idempotency.Do(ctx, r, call("k"), ok)
			other := call("k")
			other.Payload = []byte("another payload")
			res, err := idempotency.Do(ctx, r, other, ok)
			return res, err, want{err: idempotency.ErrFingerprintMismatch}
		},
		idempotency.OutcomeCorrupt: func(t *testing.T) (idempotency.Result[string], error, want) {
			s := &faultStore{Store: newMemStore(t), acquireErr: fmt.Errorf("%w: not a record", idempotency.ErrCorruptRecord)}
			res, err := idempotency.Do(ctx, idempotency.NewRunner(s, idempotency.WithFailOpen(true)), call("k"), ok)
			return res, err, want{err: idempotency.ErrCorruptRecord} // never run unprotected
		},
		idempotency.OutcomeInvalid: func(t *testing.T) (idempotency.Result[string], error, want) {
			res, err := idempotency.Do(ctx, idempotency.NewRunner(newMemStore(t)), call(strings.Repeat("k", 256)), ok)
			return res, err, want{err: idempotency.ErrInvalidKey}
		},
	}
	for _, o := range idempotency.Outcomes() {
		if o == idempotency.OutcomeTooLarge {
			continue
		}
		t.Run(o.String(), func(t *testing.T) {
			run, found := cases[o]
			if !found {
				t.Fatalf("no case for %v", o)
			}
			res, err, w := run(t)
			if res.Outcome != o {
				t.Fatalf("Outcome %v (err %v), want %v", res.Outcome, err, o)
			}
			if res.Value != w.value {
				t.Errorf("Value %q, want %q", res.Value, w.value)
			}
			switch {
			case w.err == nil && err != nil:
				t.Errorf("err %v, want none", err)
			case w.err != nil && !errors.Is(err, w.err):
				t.Errorf("err %v, want one wrapping %v", err, w.err)
			}
			if (res.RetryAfter > 0) != w.retries {
				t.Errorf("RetryAfter %v", res.RetryAfter)
			}
			if (res.RetryAfter > 0) && o.Class() != idempotency.ClassRetry {
				t.Errorf("RetryAfter %v on an outcome of class %v", res.RetryAfter, o.Class())
			}
			if stands := res.Epoch != 0; stands != (o.Ran() && o.Class() == idempotency.ClassDone && o != idempotency.OutcomeUnprotected) {
				t.Errorf("Epoch %d for %v (ran %v, class %v)", res.Epoch, o, o.Ran(), o.Class())
			}
			if res.Replayed != (o == idempotency.OutcomeReplayed) {
				t.Errorf("Replayed %v", res.Replayed)
			}
		})
	}

	// OutcomeTooLarge: the middleware's transactional route whose response
	// is over the cap answers 500 response_too_large and commits nothing.
	l := newLedger(t)
	h := idempotency.New(l, idempotency.WithTransaction(true), idempotency.WithMaxResponseBody(4))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			info, _ := idempotency.FromContext(r.Context())
			info.Tx.(*ledgerTx).Insert("row")
			w.Write([]byte("a response over the cap"))
		}))
	req := httptest.NewRequest(http.MethodPost, "/payments", nil)
	req.Header.Set("Idempotency-Key", "big")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if got := problemCode(t, rec.Result()); got != idempotency.CodeResponseTooLarge || l.total() != 0 {
		t.Errorf("too large: %v, %d rows; want response_too_large and none", got, l.total())
	}
}

// TestOutcomeClasses: every outcome has a name and a class, and the classes
// are those of Outcome's table.
func TestOutcomeClasses(t *testing.T) {
	want := map[idempotency.Class][]idempotency.Outcome{
		idempotency.ClassDone: {idempotency.OutcomeStored, idempotency.OutcomeOmitted, idempotency.OutcomeCommitted,
			idempotency.OutcomeReplayed, idempotency.OutcomeReplayedOmitted, idempotency.OutcomeUnrecorded, idempotency.OutcomeUnprotected},
		idempotency.ClassRetry: {idempotency.OutcomeReleased, idempotency.OutcomeInFlight, idempotency.OutcomeLeaseLost,
			idempotency.OutcomeCommitUnknown, idempotency.OutcomeStoreUnavailable, idempotency.OutcomeStoreFull, idempotency.OutcomeCanceled},
		idempotency.ClassPermanent: {idempotency.OutcomeRefused, idempotency.OutcomeMismatch, idempotency.OutcomeCorrupt,
			idempotency.OutcomeTooLarge, idempotency.OutcomeInvalid},
	}
	seen := map[idempotency.Outcome]bool{}
	for class, os := range want {
		for _, o := range os {
			seen[o] = true
			if o.Class() != class {
				t.Errorf("%v: class %v, want %v", o, o.Class(), class)
			}
		}
	}
	names := map[string]bool{}
	for _, o := range idempotency.Outcomes() {
		if !seen[o] {
			t.Errorf("%v has no class here", o)
		}
		if name := o.String(); name == "" || strings.HasPrefix(name, "outcome(") || names[name] {
			t.Errorf("%v: name %q", o, name)
		}
		names[o.String()] = true
	}
	if n := len(idempotency.Outcomes()); n != len(seen) {
		t.Errorf("%d outcomes, %d classified", n, len(seen))
	}
}

// TestDoResponseResult: a *Response result is stored as the response it
// is; over a cap it is stored marked omitted, and a duplicate gets what
// survived (the status, and the headers when only the body was over),
// never a second run.
func TestDoResponseResult(t *testing.T) {
	ctx := context.Background()
	r := idempotency.NewRunner(newMemStore(t), idempotency.WithMaxResponseBody(8), idempotency.WithMaxResponseHeader(64))
	runs := 0
	answer := func(body string, header http.Header) func(context.Context) (*idempotency.Response, error) {
		return func(context.Context) (*idempotency.Response, error) {
			runs++
			return &idempotency.Response{Status: http.StatusPreconditionFailed, Header: header, Body: []byte(body)}, nil
		}
	}
	small := http.Header{"Grpc-Status": {"9"}}
	for i, c := range []struct {
		key, body    string
		header       http.Header
		outcome      idempotency.Outcome
		bodyOmitted  bool
		headerOmited bool
	}{
		{"whole", "declined", small, idempotency.OutcomeStored, false, false},
		{"body over", "declined: insufficient funds", small, idempotency.OutcomeOmitted, true, false},
		{"header over", "declined", http.Header{"Grpc-Message": {strings.Repeat("m", 100)}}, idempotency.OutcomeOmitted, true, true},
	} {
		first, err := idempotency.Do(ctx, r, call(c.key), answer(c.body, c.header))
		if err != nil || first.Outcome != c.outcome || string(first.Value.Body) != c.body {
			t.Fatalf("%s: first %v %v %q", c.key, first.Outcome, err, first.Value.Body)
		}
		again, err := idempotency.Do(ctx, r, call(c.key), answer("other", nil))
		if runs != i+1 {
			t.Fatalf("%s: the function ran %d times in all, want %d", c.key, runs, i+1)
		}
		v := again.Value
		if v == nil || v.Status != http.StatusPreconditionFailed || v.BodyOmitted != c.bodyOmitted || v.HeaderOmitted != c.headerOmited {
			t.Fatalf("%s: replay %+v (%v, %v)", c.key, v, again.Outcome, err)
		}
		switch {
		case !c.bodyOmitted:
			if again.Outcome != idempotency.OutcomeReplayed || err != nil || string(v.Body) != c.body || v.Header.Get("Grpc-Status") != "9" {
				t.Errorf("%s: replay %v %v %+v", c.key, again.Outcome, err, v)
			}
		case !c.headerOmited:
			if again.Outcome != idempotency.OutcomeReplayedOmitted || !errors.Is(err, idempotency.ErrResultOmitted) ||
				len(v.Body) != 0 || v.Header.Get("Grpc-Status") != "9" {
				t.Errorf("%s: replay %v %v %+v, want the status and headers without the body", c.key, again.Outcome, err, v)
			}
		default:
			if again.Outcome != idempotency.OutcomeReplayedOmitted || len(v.Header) != 0 {
				t.Errorf("%s: replay %v %+v, want the status alone", c.key, again.Outcome, v)
			}
		}
	}
	// A *Response record is not read as a result of another type.
	if _, err := idempotency.Do(ctx, r, call("whole"), func(context.Context) (string, error) { return "", nil }); !errors.Is(err, idempotency.ErrCorruptRecord) {
		t.Errorf("a *Response record read as a string: %v", err)
	}
	bad, err := idempotency.Do(ctx, r, call("bad"), func(context.Context) (*idempotency.Response, error) {
		return &idempotency.Response{Status: 700}, nil
	})
	if bad.Outcome != idempotency.OutcomeOmitted || !errors.Is(err, idempotency.ErrResultOmitted) {
		t.Errorf("a status outside 200..599: %v %v, want stored marked omitted", bad.Outcome, err)
	}
}
