package idempotency

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"time"
)

// New returns middleware that makes the covered requests of the handlers it
// wraps idempotent, keeping records in store. See the package documentation
// and the options for the behaviour; New panics when store is nil.
//
// Options apply to the handlers New wraps; for per-route settings call New
// again with the same store and other options (for example with chi's
// r.With).
func New(store Store, opts ...Option) func(http.Handler) http.Handler {
	if store == nil {
		panic("idempotency: New needs a Store")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if _, ok := store.(TxStore); cfg.transaction && !ok {
		panic("idempotency: WithTransaction needs a TxStore")
	}
	return func(next http.Handler) http.Handler {
		return &handler{store: store, cfg: cfg, next: next}
	}
}

type handler struct {
	store Store
	cfg   config
	next  http.Handler
}

// completeAttempts bounds the attempts of a Complete whose outcome is
// unknown (a store error); each presents the same lease, and all of them end
// at the lease's store deadline (see lease.storeDeadline).
const completeAttempts = 3

func (h *handler) covers(method string) bool {
	return slices.Contains(h.cfg.methods, method)
}

// request is the state of one covered request with a key.
type request struct {
	h            *handler
	w            http.ResponseWriter
	r            *http.Request
	start        time.Time
	claim        AcquireRequest // key, token, fingerprint, lease and TTL of every store call
	sent         time.Time      // when the last Acquire was sent: the lease counts from it
	recorder     recorder
	key          string        // the client's key
	headerBefore http.Header   // the response headers set before the handler ran (see snapshotHeader)
	served       *http.Request // the request the handler got, once it ran
	ran          bool          // the handler started under the lease
}

func (rq *request) event(kind EventKind, status int, err error) Event {
	return Event{Kind: kind, Route: rq.route(), Method: rq.r.Method, Key: rq.claim.Key, Status: status, Err: err}
}

// note reports an event in addition to the request's outcome.
func (rq *request) note(kind EventKind, status int, err error) {
	rq.h.cfg.emit(rq.r.Context(), rq.event(kind, status, err), rq.start)
}

// outcome reports e as the request's outcome: its final event.
func (rq *request) outcome(e Event) {
	e.Final, e.Ran = true, rq.ran
	rq.h.cfg.emit(rq.r.Context(), e, rq.start)
}

// reportLoss notes a lease lost while the handler ran, when the outcome
// does not say so itself.
func (rq *request) reportLoss(lost error) {
	if lost != nil {
		rq.note(EventLeaseLost, 0, lost)
	}
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.covers(r.Method) {
		h.next.ServeHTTP(w, r)
		return
	}
	rq := &request{h: h, w: w, r: r, start: time.Now()}
	key, ok, err := requestKey(r.Header[HeaderKey])
	if !ok {
		if h.cfg.keyRequired {
			rq.give(answerKeyRequired, nil)
			return
		}
		h.next.ServeHTTP(w, r)
		return
	}
	if err != nil {
		rq.give(answerKeyInvalid.with(keyDetail(err)), err)
		return
	}
	scope := ""
	if h.cfg.keyScope != nil {
		if scope = h.cfg.keyScope(r); scope == "" && !h.cfg.unscopedKeys {
			rq.give(answerScopeMissing, nil)
			return
		}
	}

	body, err := readBody(r, h.cfg.maxRequestBody)
	switch {
	case errors.Is(err, errBodyTooLarge):
		rq.give(answerBodyTooLarge.with(fmt.Sprintf("the request body is larger than %d bytes", h.cfg.maxRequestBody)), nil)
		return
	case err != nil:
		rq.give(answerBodyUnreadable, nil)
		return
	}
	var content []byte
	if body != nil {
		defer body.free()
		content = *body.buf
	}

	rq.key = key
	storageKey, token, fingerprint := h.cfg.identity(r, scope, key, content)
	rq.claim = AcquireRequest{
		Key:         storageKey,
		Token:       token,
		Fingerprint: fingerprint,
		Lease:       h.cfg.lease,
		TTL:         h.cfg.ttl,
	}
	acq, err := rq.acquire(r.Context())
	if err == nil && acq.Outcome == InFlight && h.cfg.wait > 0 {
		acq, err = rq.wait(acq)
	}
	if err != nil {
		// A client that went away gets nothing, and above all no
		// unprotected execution in fail-open mode.
		if r.Context().Err() == nil {
			rq.acquireFailed(err)
		}
		return
	}
	rq.serve(acq)
}

// acquire asks the store for the record, noting when the call was sent.
func (rq *request) acquire(ctx context.Context) (Acquisition, error) {
	rq.sent = time.Now()
	return rq.h.store.Acquire(ctx, rq.claim)
}

// serve acts on what Acquire found.
func (rq *request) serve(acq Acquisition) {
	switch acq.Outcome {
	case Acquired, Stolen:
		rq.execute(acq)
	case Completed:
		if acq.Response == nil {
			rq.acquireFailed(fmt.Errorf("%w: COMPLETE record without a payload", ErrCorruptRecord))
			return
		}
		err := replay(rq.w, acq.Response, rq.h.cfg.headers, rq.r.Method == http.MethodHead)
		rq.outcome(rq.event(EventReplayed, acq.Response.Status, err))
	case InFlight:
		rq.give(answerInFlight, nil)
	case Mismatch:
		rq.give(answerMismatch, nil)
	default:
		rq.acquireFailed(fmt.Errorf("idempotency: store returned unknown outcome %v", acq.Outcome))
	}
}

// slowAcquireError reports an acquire that took so much of the lease that
// too little was left to run the handler (see minLeaseToStart).
type slowAcquireError struct{ took, lease time.Duration }

func (e *slowAcquireError) Error() string {
	return fmt.Sprintf("idempotency: the acquire took %v of a %v lease; the lease was released unused", e.took, e.lease)
}

// acquireFailed answers a request whose record could not be looked up: with
// the answer storeErrorAnswer gives, or, with WithFailOpen and a store that
// is unreachable or slow, by running the handler unprotected.
func (rq *request) acquireFailed(err error) {
	a := storeErrorAnswer(err)
	if rq.h.cfg.failOpen && a.code == CodeStoreUnavailable {
		e := rq.event(EventStoreError, 0, err)
		e.FailedOpen = true
		rq.outcome(e)
		rq.h.next.ServeHTTP(rq.w, rq.r)
		return
	}
	rq.give(a, err)
}

// execute runs the handler under the lease just taken and stores or releases
// its outcome.
func (rq *request) execute(acq Acquisition) {
	if took := time.Since(rq.sent); rq.h.cfg.lease-took < minLeaseToStart(rq.h.cfg.lease) {
		rq.refuseSlowLease(took)
		return
	}
	if acq.Outcome == Stolen {
		e := rq.event(EventStolen, 0, nil)
		e.Epoch = acq.Epoch
		rq.h.cfg.emit(rq.r.Context(), e, rq.start) // in addition to the outcome
	}
	var tx Tx
	if rq.h.cfg.transaction {
		var ok bool
		if tx, ok = rq.beginTx(); !ok {
			return
		}
	}
	rq.headerBefore = snapshotHeader(rq.w.Header())
	l, lost := rq.runHandler(acq.Epoch, tx)
	if tx != nil {
		rq.commitOutcome(l, lost, acq.Epoch, tx)
		return
	}
	rq.storeOutcome(l, lost, acq.Epoch)
}

// refuseSlowLease releases a lease whose acquire took so long that too
// little of it is left to run the handler, and answers 503.
func (rq *request) refuseSlowLease(took time.Duration) {
	ctx, cancel := context.WithTimeout(rq.storeContext(), heartbeat(rq.h.cfg.lease))
	err := rq.release(ctx)
	cancel()
	if err != nil {
		rq.note(EventStoreError, 0, fmt.Errorf("idempotency: release: %w", err))
	}
	rq.acquireFailed(&slowAcquireError{took: took, lease: rq.h.cfg.lease})
}

// storeContext is the context of store calls made for the request: its
// values without its cancellation, since the handler's effect happened
// whether or not the client stays.
func (rq *request) storeContext() context.Context { return context.WithoutCancel(rq.r.Context()) }

// runHandler runs the handler under the lease, with a context that the
// lease cancels when it is lost, and the recorder. When the handler panics
// it releases the key and re-raises the panic. It returns the stopped lease
// and the loss, if the lease was lost.
func (rq *request) runHandler(epoch uint64, tx Tx) (*lease, error) {
	cfg := &rq.h.cfg
	info := &Info{Key: rq.key, StorageKey: rq.claim.Key, Epoch: epoch}
	if tx != nil {
		info.Tx = tx.Handle()
	}
	ctx, cancel := context.WithCancelCause(context.WithValue(rq.r.Context(), infoKey{}, info))
	defer cancel(nil)
	l := &lease{store: rq.h.store, ctx: rq.storeContext(), key: rq.claim.Key, token: rq.claim.Token, length: cfg.lease, lose: cancel}
	l.start(rq.sent)
	rq.recorder = recorder{w: rq.w, limit: cfg.maxResponseBody, headerLimit: cfg.maxHeader,
		policy: cfg.headers, before: rq.headerBefore, head: rq.r.Method == http.MethodHead, whole: tx != nil}

	panicked := true
	defer func() {
		if !panicked {
			return
		}
		v := recover()
		lost := rq.stopLease(l)
		sctx, cancel := context.WithDeadline(l.ctx, l.storeDeadline())
		defer cancel()
		if tx != nil {
			_ = tx.Rollback(sctx)
		}
		rq.releaseAfterHandler(sctx, lost)
		if v == nil { // runtime.Goexit: let it go on
			rq.outcome(rq.event(EventReleased, 0, errors.New("idempotency: handler exited")))
			return
		}
		rq.outcome(rq.event(EventReleased, 0, fmt.Errorf("idempotency: handler panicked: %v", v)))
		panic(v)
	}()
	rq.served = rq.r.WithContext(ctx)
	rq.note(EventStarted, 0, nil)
	rq.ran = true
	rq.h.next.ServeHTTP(&rq.recorder, rq.served)
	panicked = false
	return l, rq.stopLease(l)
}

// storeOutcome sends the response to the client and then stores it as the
// record, or releases the key when the response cannot or must not be
// replayed. The store calls end at the lease's store deadline.
func (rq *request) storeOutcome(l *lease, lost error, epoch uint64) {
	rec := &rq.recorder
	rec.finish() // the client has the response before the store is written

	ctx, cancel := context.WithDeadline(l.ctx, l.storeDeadline())
	defer cancel()
	// 1xx finals (101 Switching Protocols) and hijacked connections cannot
	// be replayed.
	if rec.hijacked || rec.status < 200 || rq.h.cfg.releaseStatus(rec.status) {
		rq.releaseAfterHandler(ctx, lost)
		rq.outcome(rq.event(EventReleased, rec.status, nil))
		return
	}
	err := rq.complete(ctx, rec.response())
	switch {
	case errors.Is(err, ErrLeaseLost):
		rq.outcome(rq.event(EventLeaseLost, rec.status, err))
	case err != nil:
		rq.reportLoss(lost)
		rq.outcome(rq.event(EventStoreError, rec.status, fmt.Errorf("idempotency: complete: %w", err)))
	default:
		rq.reportLoss(lost) // nobody took the record over: the completion landed
		e := rq.event(EventExecuted, rec.status, nil)
		e.Epoch = epoch
		rq.outcome(e)
	}
}

// releaseAfterHandler releases the key after the handler ran, reporting a
// lease lost meanwhile and a release that failed.
func (rq *request) releaseAfterHandler(ctx context.Context, lost error) {
	rq.reportLoss(lost)
	err := rq.release(ctx)
	switch {
	case err == nil:
	case errors.Is(err, ErrLeaseLost):
		if lost == nil {
			rq.note(EventLeaseLost, 0, err)
		}
	default:
		rq.note(EventStoreError, 0, fmt.Errorf("idempotency: release: %w", err))
	}
}

// beginTx begins the request's transaction on a transactional route. When
// it cannot, it releases the key, answers 503 and reports false.
func (rq *request) beginTx() (Tx, bool) {
	ctx, cancel := context.WithTimeout(rq.storeContext(), heartbeat(rq.h.cfg.lease))
	defer cancel()
	tx, err := rq.h.store.(TxStore).BeginTx(ctx, rq.claim.Key, rq.claim.Token)
	if err == nil {
		return tx, true
	}
	if rerr := rq.release(ctx); rerr != nil {
		rq.note(EventStoreError, 0, fmt.Errorf("idempotency: release: %w", rerr))
	}
	rq.give(answerStoreUnavailable, fmt.Errorf("idempotency: begin transaction: %w", err))
	return nil, false
}

// commitOutcome ends a transactional route: it completes the record in the
// handler's transaction and commits, then sends the held response; or rolls
// everything back and releases the key (a 5xx, a response over the cap);
// or, when the commit was refused or its outcome is unknown, answers with
// a problem instead of the response.
func (rq *request) commitOutcome(l *lease, lost error, epoch uint64, tx Tx) {
	rec := &rq.recorder
	if !rec.wroteHeader {
		rec.WriteHeader(http.StatusOK) // a handler that wrote nothing answers 200, as net/http has it
	}
	ctx, cancel := context.WithDeadline(l.ctx, l.storeDeadline())
	defer cancel()
	abandon := func() {
		_ = tx.Rollback(ctx)
		rq.releaseAfterHandler(ctx, lost)
	}
	switch {
	case rec.tooLarge:
		abandon()
		rq.discardResponse()
		rq.give(answerResponseTooLarge, errResponseTooLarge)
	case rec.status < 200 || rq.h.cfg.releaseStatus(rec.status):
		abandon()
		rec.finish()
		rq.outcome(rq.event(EventReleased, rec.status, nil))
	default:
		err := tx.Complete(ctx, rec.response(), rq.h.cfg.ttl)
		switch {
		case err == nil:
			rec.finish()
			rq.reportLoss(lost)
			e := rq.event(EventExecuted, rec.status, nil)
			e.Epoch = epoch
			rq.outcome(e)
		case errors.Is(err, ErrLeaseLost):
			_ = tx.Rollback(ctx)
			rq.discardResponse()
			rq.give(answerLeaseLost, err)
		default:
			// Either both the handler's writes and the record landed, or
			// neither did: a release frees the key only in the second case.
			abandon()
			rq.discardResponse()
			rq.give(answerOutcomeUnknown, fmt.Errorf("idempotency: commit: %w", err))
		}
	}
}

// discardResponse drops a held response, so that a problem can be written
// instead: the headers the handler set go, those set before it stay.
func (rq *request) discardResponse() {
	h := rq.w.Header()
	clear(h)
	maps.Copy(h, rq.headerBefore)
}

// complete stores resp, retrying a Complete whose outcome is unknown (a
// store error) with the same lease until ctx ends.
func (rq *request) complete(ctx context.Context, resp *Response) error {
	var err error
	for i := range completeAttempts {
		if i > 0 {
			select {
			case <-time.After(time.Duration(i) * 20 * time.Millisecond):
			case <-ctx.Done():
				return err
			}
		}
		err = rq.h.store.Complete(ctx, rq.claim.Key, rq.claim.Token, resp, rq.h.cfg.ttl)
		if err == nil || errors.Is(err, ErrLeaseLost) || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// release releases the key.
func (rq *request) release(ctx context.Context) error {
	return rq.h.store.Release(ctx, rq.claim.Key, rq.claim.Token)
}

// stopLease stops the heartbeat and returns the loss, if the lease was lost
// (the outcome reports it); a failed extend the lease survived is noted.
func (rq *request) stopLease(l *lease) error {
	lost, extendErr := l.stop()
	if lost == nil && extendErr != nil {
		rq.note(EventStoreError, 0, fmt.Errorf("idempotency: extend: %w", extendErr))
	}
	return lost
}
