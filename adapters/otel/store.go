package idemotel

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/go-idempotency/idempotency"
)

// Attribute keys of the spans.
const (
	AcquireOutcomeKey = attribute.Key("idempotency.acquire.outcome") // acquired, stolen, completed, in_flight, mismatch
	EpochKey          = attribute.Key("idempotency.epoch")
	NotifiedKey       = attribute.Key("idempotency.notified")
	ResponseStatusKey = attribute.Key("idempotency.response.status")
	ResponseSizeKey   = attribute.Key("idempotency.response.body_size")
	BodyOmittedKey    = attribute.Key("idempotency.response.body_omitted")
	KeyHashKey        = attribute.Key("idempotency.key_hash")
)

// Span names.
const (
	SpanAcquire  = "idempotency.acquire"
	SpanWait     = "idempotency.wait"
	SpanComplete = "idempotency.complete"
	SpanRelease  = "idempotency.release"
	SpanExtend   = "idempotency.extend"
	SpanBegin    = "idempotency.begin"
	SpanCommit   = "idempotency.commit"
	SpanRollback = "idempotency.rollback"
)

// ErrorType returns the error.type of a failed store call: lease_lost,
// store_full, corrupt_record, store_closed, deadline_exceeded or canceled
// for the errors the store contract names, "_OTHER" for any other.
func ErrorType(err error) string {
	switch {
	case errors.Is(err, idempotency.ErrLeaseLost):
		return "lease_lost"
	case errors.Is(err, idempotency.ErrStoreFull):
		return "store_full"
	case errors.Is(err, idempotency.ErrCorruptRecord):
		return "corrupt_record"
	case errors.Is(err, idempotency.ErrStoreClosed):
		return "store_closed"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return "_OTHER"
}

// Store returns s with a span around each of its calls (see the package
// documentation), started from the context the call gets, with the tracer
// provider of WithTracerProvider (WithKeyHash applies too). Every call goes
// to s unchanged, with its answer returned unchanged; Watch's channel is
// s's own.
//
// When s is an idempotency.TxStore, so is the store returned, and its
// transactions' calls are spans too (Tx.Handle is s's handle, untouched);
// otherwise it is not, so that New with WithTransaction refuses it as it
// would refuse s. TxStore is the only optional interface the middleware
// looks for. The store returned has no other method: keep s for its own
// (Close, memstore's Len, redisstore's Check, pgstore's Purge).
//
// Store panics when s is nil.
func Store(s idempotency.Store, opts ...Option) idempotency.Store {
	if s == nil {
		panic("idemotel: Store needs a Store")
	}
	cfg := newConfig(opts)
	ts := &store{next: s, tracer: cfg.tracerProvider.Tracer(ScopeName), keyHash: cfg.keyHash}
	if txs, ok := s.(idempotency.TxStore); ok {
		return &txStore{store: ts, tx: txs}
	}
	return ts
}

type store struct {
	next    idempotency.Store
	tracer  trace.Tracer
	keyHash bool
}

// start starts the span of a call on the record at key.
func (s *store) start(ctx context.Context, name, key string) (context.Context, trace.Span) {
	if s.keyHash {
		return s.tracer.Start(ctx, name, trace.WithAttributes(KeyHashKey.String(key)))
	}
	return s.tracer.Start(ctx, name)
}

// end records err, if any, and ends span.
func end(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(ErrorTypeKey.String(ErrorType(err)))
	}
	span.End()
}

func responseAttributes(resp *idempotency.Response) []attribute.KeyValue {
	if resp == nil {
		return nil
	}
	attrs := []attribute.KeyValue{ResponseStatusKey.Int(resp.Status), ResponseSizeKey.Int(len(resp.Body))}
	if resp.BodyOmitted {
		attrs = append(attrs, BodyOmittedKey.Bool(true))
	}
	return attrs
}

func (s *store) Acquire(ctx context.Context, req idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	ctx, span := s.start(ctx, SpanAcquire, req.Key)
	acq, err := s.next.Acquire(ctx, req)
	if err == nil {
		span.SetAttributes(AcquireOutcomeKey.String(acq.Outcome.String()))
		if acq.Epoch != 0 {
			span.SetAttributes(EpochKey.Int64(int64(acq.Epoch)))
		}
	}
	end(span, err)
	return acq, err
}

func (s *store) Complete(ctx context.Context, key, token string, resp *idempotency.Response, ttl time.Duration) error {
	ctx, span := s.start(ctx, SpanComplete, key)
	span.SetAttributes(responseAttributes(resp)...)
	err := s.next.Complete(ctx, key, token, resp, ttl)
	end(span, err)
	return err
}

func (s *store) Release(ctx context.Context, key, token string) error {
	ctx, span := s.start(ctx, SpanRelease, key)
	err := s.next.Release(ctx, key, token)
	end(span, err)
	return err
}

func (s *store) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	ctx, span := s.start(ctx, SpanExtend, key)
	err := s.next.Extend(ctx, key, token, lease)
	end(span, err)
	return err
}

// Watch's span lasts until the waiter stops watching, and says whether the
// store notified it by then.
func (s *store) Watch(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	ctx, span := s.start(ctx, SpanWait, key)
	changed, stop, err := s.next.Watch(ctx, key)
	if err != nil {
		end(span, err)
		return changed, stop, err
	}
	return changed, func() {
		notified := false
		select {
		case <-changed:
			notified = true
		default:
		}
		stop()
		span.SetAttributes(NotifiedKey.Bool(notified))
		span.End()
	}, nil
}

// txStore is the store of a TxStore: a TxStore too.
type txStore struct {
	*store
	tx idempotency.TxStore
}

func (s *txStore) BeginTx(ctx context.Context, key, token string) (idempotency.Tx, error) {
	ctx, span := s.start(ctx, SpanBegin, key)
	tx, err := s.tx.BeginTx(ctx, key, token)
	end(span, err)
	if err != nil {
		return tx, err
	}
	return &txn{next: tx, store: s.store, key: key}, nil
}

// txn is a transaction of a txStore.
type txn struct {
	next  idempotency.Tx
	store *store
	key   string
}

// Handle returns the wrapped transaction's handle, untouched: handlers
// reach it through idempotency.FromContext (for pgstore, TxFromContext).
func (t *txn) Handle() any { return t.next.Handle() }

func (t *txn) Complete(ctx context.Context, resp *idempotency.Response, ttl time.Duration) error {
	ctx, span := t.store.start(ctx, SpanCommit, t.key)
	span.SetAttributes(responseAttributes(resp)...)
	err := t.next.Complete(ctx, resp, ttl)
	end(span, err)
	return err
}

func (t *txn) Rollback(ctx context.Context) error {
	ctx, span := t.store.start(ctx, SpanRollback, t.key)
	err := t.next.Rollback(ctx)
	end(span, err)
	return err
}
