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
	cfg := newConfig("New", store, opts, Option.applyMiddleware)
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

// request is one covered request with a key: the caller of an attempt at
// its record. The attempt runs the record's lifecycle and calls the
// request back for the HTTP of each step: the handler (work), the response
// to store (result), a replay, and the answer (settle).
type request struct {
	attempt
	h            *handler
	w            http.ResponseWriter
	r            *http.Request
	recorder     recorder
	headerBefore http.Header   // the response headers set before the handler ran (see snapshotHeader)
	served       *http.Request // the request the handler got, once it ran
	replayStatus int           // the status a replay sent
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.covers(r.Method) {
		h.next.ServeHTTP(w, r)
		return
	}
	rq := &request{h: h, w: w, r: r}
	rq.attempt = attempt{store: h.store, cfg: &h.cfg, caller: rq, ctx: r.Context(), start: time.Now(), waitFor: h.cfg.wait}
	key, ok, err := requestKey(r.Header[HeaderKey])
	if !ok {
		if h.cfg.keyRequired {
			rq.refuse(&refusal{answerKeyRequired, nil})
			return
		}
		h.next.ServeHTTP(w, r)
		return
	}
	if err != nil {
		rq.refuse(&refusal{answerKeyInvalid.with(keyDetail(err)), err})
		return
	}
	scope := ""
	if h.cfg.keyScope != nil {
		if scope = h.cfg.keyScope(r); scope == "" && !h.cfg.unscopedKeys {
			rq.refuse(&refusal{answerScopeMissing, nil})
			return
		}
	}

	body, err := readBody(r, h.cfg.maxRequestBody)
	switch {
	case errors.Is(err, errBodyTooLarge):
		rq.refuse(&refusal{answerBodyTooLarge.with(fmt.Sprintf("the request body is larger than %d bytes", h.cfg.maxRequestBody)), nil})
		return
	case err != nil:
		rq.refuse(&refusal{answerBodyUnreadable, nil})
		return
	}
	var content []byte
	if body != nil {
		defer body.free()
		content = *body.buf
	}

	rq.key = key
	rq.claim = h.cfg.claim(scope, key, requestIdentity(r.Method, addressedPath(r), h.cfg.fingerprintOf(r, content)))
	rq.do()
}

// work runs the handler: under the lease, writing through the recorder
// (which holds the whole response on a transactional route); or, failing
// open, straight to the client.
func (rq *request) work(ctx context.Context) {
	if rq.unprotected {
		rq.h.next.ServeHTTP(rq.w, rq.r)
		return
	}
	rq.headerBefore = snapshotHeader(rq.w.Header())
	cfg := &rq.h.cfg
	rq.recorder = recorder{w: rq.w, limit: cfg.maxResponseBody, headerLimit: cfg.maxHeader,
		policy: cfg.headers, before: rq.headerBefore, head: rq.r.Method == http.MethodHead, whole: rq.tx != nil}
	rq.served = rq.r.WithContext(ctx)
	rq.h.next.ServeHTTP(&rq.recorder, rq.served)
}

// result returns the response to store: nil when it must not be replayed
// (a release status, a 1xx final, a hijacked connection; on a transactional
// route, a response over the cap). Without a transaction, the client gets
// the response first: it is sent, and flushed, before the record is
// written.
func (rq *request) result() (*Response, error) {
	if rq.unprotected {
		return &Response{}, nil // the handler answered the client itself
	}
	rec := &rq.recorder
	if !rec.wroteHeader && !rec.hijacked {
		rec.WriteHeader(http.StatusOK) // a handler that wrote nothing answers 200, as net/http has it
	}
	switch {
	case rec.tooLarge:
		return nil, errResponseTooLarge
	case rec.hijacked || rec.status < 200 || rq.h.cfg.releaseStatus(rec.status):
		return nil, nil
	}
	if rq.tx == nil {
		rec.finish()
	}
	return rec.response(), nil
}

// replay writes a stored response to the client.
func (rq *request) replay(resp *Response) error {
	rq.replayStatus = resp.Status
	return replay(rq.w, resp, rq.h.cfg.headers, rq.r.Method == http.MethodHead)
}

// settle answers the client as outcomeAnswers says for e's outcome.
func (rq *request) settle(e ending) int {
	a := outcomeAnswers[e.outcome]
	switch a.send {
	case sendResponse:
		if rq.unprotected {
			return 0
		}
		rq.recorder.finish() // on a transactional route, only now
		return rq.recorder.status
	case sendReplay:
		return rq.replayStatus
	case sendNothing:
		return 0
	}
	switch e.outcome {
	case OutcomeInvalid:
		if refused, ok := e.err.(*refusal); ok {
			a = refused.answer
		}
	case OutcomeStoreUnavailable:
		var slow *slowAcquireError
		if errors.As(e.err, &slow) {
			a = answerStoreSlow
		}
	}
	if rq.ran {
		rq.discardResponse() // a transactional route's held response
	}
	rq.give(a)
	return a.status
}

// describe names the route and method of the request's events.
func (rq *request) describe() (route, method string) { return rq.route(), rq.r.Method }

// discardResponse drops a held response, so that a problem can be written
// instead: the headers the handler set go, those set before it stay.
func (rq *request) discardResponse() {
	h := rq.w.Header()
	clear(h)
	maps.Copy(h, rq.headerBefore)
}
