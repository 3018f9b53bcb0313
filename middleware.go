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
// and the options for the behaviour; New panics when store is nil, and when
// an option that applies to functions only (WithCodec) is given.
//
// Options apply to the handlers New wraps; for per-route settings call New
// again with the same store and other options (for example with chi's
// r.With).
func New(store Store, opts ...Option) func(http.Handler) http.Handler {
	cfg := newConfig("New", store, opts)
	if len(cfg.functionOnly) > 0 {
		panic("idempotency: New: " + cfg.functionOnly[0] + " applies to Do only")
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

func (h *handler) covers(method string) bool {
	return slices.Contains(h.cfg.methods, method)
}

// request is the state of one covered request with a key: an attempt at
// its record, and the HTTP around it.
type request struct {
	attempt
	h            *handler
	w            http.ResponseWriter
	r            *http.Request
	recorder     recorder
	headerBefore http.Header   // the response headers set before the handler ran (see snapshotHeader)
	served       *http.Request // the request the handler got, once it ran
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.covers(r.Method) {
		h.next.ServeHTTP(w, r)
		return
	}
	rq := &request{h: h, w: w, r: r}
	rq.attempt = attempt{store: h.store, cfg: &h.cfg, ctx: r.Context(), start: time.Now(),
		describe: func() (string, string) { return rq.route(), r.Method }}
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
	rq.claim = h.cfg.claim(scope, key, requestIdentity(r.Method, addressedPath(r), h.cfg.fingerprintOf(r, content)))
	acq, err := rq.acquire()
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
	tx, err := rq.begin(acq)
	var slow *slowAcquireError
	switch {
	case errors.As(err, &slow):
		rq.acquireFailed(err)
		return
	case err != nil:
		rq.give(answerStoreUnavailable, err)
		return
	}
	rq.headerBefore = snapshotHeader(rq.w.Header())
	cfg := &rq.h.cfg
	rq.recorder = recorder{w: rq.w, limit: cfg.maxResponseBody, headerLimit: cfg.maxHeader,
		policy: cfg.headers, before: rq.headerBefore, head: rq.r.Method == http.MethodHead, whole: tx != nil}
	l, lost := rq.run(acq.Epoch, tx, func(ctx context.Context) {
		rq.served = rq.r.WithContext(ctx)
		rq.h.next.ServeHTTP(&rq.recorder, rq.served)
	})
	if tx != nil {
		rq.commitOutcome(l, lost, acq.Epoch, tx)
		return
	}
	rq.storeOutcome(l, lost, acq.Epoch)
}

// storeOutcome sends the response to the client and then stores it as the
// record, or releases the key when the response cannot or must not be
// replayed.
func (rq *request) storeOutcome(l *lease, lost error, epoch uint64) {
	rec := &rq.recorder
	rec.finish() // the client has the response before the store is written
	// 1xx finals (101 Switching Protocols) and hijacked connections cannot
	// be replayed.
	if rec.hijacked || rec.status < 200 || rq.h.cfg.releaseStatus(rec.status) {
		rq.discard(l, lost, nil, rec.status, nil)
		return
	}
	_ = rq.save(l, lost, epoch, rec.response(), rec.status)
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
	switch {
	case rec.tooLarge:
		rq.abandon(l, lost, tx)
		rq.discardResponse()
		rq.give(answerResponseTooLarge, errResponseTooLarge)
	case rec.status < 200 || rq.h.cfg.releaseStatus(rec.status):
		rq.abandon(l, lost, tx)
		rec.finish()
		rq.outcome(rq.event(EventReleased, rec.status, nil))
	default:
		err := rq.commit(l, lost, tx, rec.response())
		switch {
		case err == nil:
			rec.finish()
			rq.executed(rec.status, epoch, lost)
		case errors.Is(err, ErrLeaseLost):
			rq.discardResponse()
			rq.give(answerLeaseLost, err)
		default:
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
