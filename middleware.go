package idempotency

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
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
	return func(next http.Handler) http.Handler {
		return &handler{store: store, cfg: cfg, next: next}
	}
}

type handler struct {
	store Store
	cfg   config
	next  http.Handler
	beats heartbeats // of the handlers running under a lease
}

// conflictRetryAfter is the Retry-After of a 409. The original usually ends
// well before its lease would, and a retry costs one store round trip, so
// clients are told to come back soon rather than when the lease runs out.
const conflictRetryAfter = time.Second

// completeAttempts bounds the retries of a Complete whose outcome is unknown
// (a store error); each retry presents the same lease.
const completeAttempts = 3

func (h *handler) covers(method string) bool {
	return slices.Contains(h.cfg.methods, method)
}

// request is the state of one covered request with a key. The parts a
// request needs are fields, so that it is one allocation.
type request struct {
	h     *handler
	w     http.ResponseWriter
	r     *http.Request
	start time.Time
	acq   AcquireRequest

	body     bodyReader      // replaces r.Body
	hb       heartbeat       // while the handler runs
	ctx      handlerContext  // the handler's
	detached detachedContext // for store calls after the handler
}

// detachedContext carries the request's values without its cancellation:
// store calls after the handler must not fail because the client went away,
// since the handler's effect happened and its record must be written. It is
// context.WithoutCancel, as a field.
type detachedContext struct{ parent context.Context }

func (detachedContext) Deadline() (time.Time, bool) { return time.Time{}, false }
func (detachedContext) Done() <-chan struct{}       { return nil }
func (detachedContext) Err() error                  { return nil }
func (d *detachedContext) Value(key any) any        { return d.parent.Value(key) }
func (d *detachedContext) String() string           { return "idempotency.detachedContext" }

func (rq *request) event(kind EventKind, status int, err error) Event {
	return Event{Kind: kind, Route: rq.h.cfg.route(rq.r), Method: rq.r.Method, Key: rq.acq.Key, Status: status, Err: err}
}

func (rq *request) emit(kind EventKind, status int, err error) {
	rq.h.cfg.emit(rq.event(kind, status, err), rq.start)
}

func (rq *request) problem(status int, code Code, detail string, retryAfter time.Duration) {
	p := newProblem(status, code, detail)
	p.RetryAfter = retryAfter
	if retryAfter > 0 {
		rq.w.Header().Set("Retry-After", retryAfterSeconds(retryAfter))
	}
	rq.h.cfg.errorHandler(rq.w, rq.r, p)
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.covers(r.Method) {
		h.next.ServeHTTP(w, r)
		return
	}
	start := time.Now()
	key, ok, err := requestKey(r.Header[HeaderKey])
	rq := &request{h: h, w: w, r: r, start: start, detached: detachedContext{r.Context()}}
	if !ok {
		if h.cfg.keyRequired {
			rq.emit(EventRejected, http.StatusBadRequest, nil)
			rq.problem(http.StatusBadRequest, CodeKeyRequired, "this request needs an Idempotency-Key header", 0)
			return
		}
		h.next.ServeHTTP(w, r)
		return
	}
	if err != nil {
		rq.emit(EventRejected, http.StatusBadRequest, err)
		rq.problem(http.StatusBadRequest, CodeKeyInvalid, err.Error(), 0)
		return
	}

	body, status, code, detail := readBody(r, h.cfg.maxRequestBody, &rq.body)
	defer rq.body.free(r)
	if status != 0 {
		rq.emit(EventRejected, status, nil)
		rq.problem(status, code, detail, 0)
		return
	}

	scope := ""
	if h.cfg.keyScope != nil {
		scope = h.cfg.keyScope(r)
	}
	storageKey, token, fingerprint := h.cfg.identity(r, scope, key, body)
	rq.acq = AcquireRequest{
		Key:         storageKey,
		Token:       token,
		Fingerprint: fingerprint,
		Lease:       h.cfg.lease,
		TTL:         h.cfg.ttl,
	}
	acq, err := h.store.Acquire(r.Context(), rq.acq)
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
		err := replay(rq.w, acq.Response)
		rq.emit(EventReplayed, acq.Response.Status, err)
	case InFlight:
		rq.emit(EventConflict, http.StatusConflict, nil)
		rq.problem(http.StatusConflict, CodeInFlight,
			"a request with this Idempotency-Key is still being processed; retry later", conflictRetryAfter)
	case Mismatch:
		rq.emit(EventMismatch, http.StatusUnprocessableEntity, nil)
		rq.problem(http.StatusUnprocessableEntity, CodeFingerprintMismatch,
			"this Idempotency-Key was used with a different request", 0)
	default:
		rq.acquireFailed(fmt.Errorf("idempotency: store returned unknown outcome %v", acq.Outcome))
	}
}

// acquireFailed answers a request whose record could not be looked up.
func (rq *request) acquireFailed(err error) {
	switch {
	case errors.Is(err, ErrStoreFull):
		rq.emit(EventStoreError, http.StatusServiceUnavailable, err)
		rq.problem(http.StatusServiceUnavailable, CodeStoreFull, "the idempotency store is full; retry later", time.Second)
	case errors.Is(err, ErrCorruptRecord):
		rq.emit(EventStoreError, http.StatusInternalServerError, err)
		rq.problem(http.StatusInternalServerError, CodeRecordUnreadable,
			"the response stored for this Idempotency-Key cannot be read", 0)
	case rq.h.cfg.failOpen:
		e := rq.event(EventStoreError, 0, err)
		e.FailedOpen = true
		rq.h.cfg.emit(e, rq.start)
		rq.h.next.ServeHTTP(rq.w, rq.r)
	default:
		rq.emit(EventStoreError, http.StatusServiceUnavailable, err)
		rq.problem(http.StatusServiceUnavailable, CodeStoreUnavailable,
			"the idempotency store cannot be reached; retry later", time.Second)
	}
}

// wait is wait mode: it waits for the record held by another request to be
// completed or released, re-checking on every notification and, as a
// fallback, when the holder's lease runs out. It returns the last
// acquisition, which is still InFlight when the wait bound passed.
func (rq *request) wait(acq Acquisition) (Acquisition, error) {
	ctx := rq.r.Context()
	deadline := time.NewTimer(rq.h.cfg.wait)
	defer deadline.Stop()
	recheck := time.NewTimer(acq.LeaseRemaining)
	defer recheck.Stop()
	for {
		changed, stop, err := rq.h.store.Watch(ctx, rq.acq.Key)
		if err != nil {
			// Without notifications, fall back to re-checking when the
			// holder's lease runs out.
			changed, stop = nil, func() {}
		}
		acq, err = rq.h.store.Acquire(ctx, rq.acq)
		if err != nil || acq.Outcome != InFlight {
			stop()
			return acq, err
		}
		recheck.Reset(acq.LeaseRemaining)
		select {
		case <-changed:
		case <-recheck.C:
		case <-deadline.C:
			stop()
			return acq, nil
		case <-ctx.Done():
			stop()
			return acq, context.Cause(ctx)
		}
		stop()
	}
}

// execute runs the handler under the lease just taken and stores or releases
// its outcome.
func (rq *request) execute(acq Acquisition) {
	if acq.Outcome == Stolen {
		e := rq.event(EventStolen, 0, nil)
		e.Epoch = acq.Epoch
		rq.h.cfg.emit(e, rq.start)
	}
	ctx := &rq.ctx
	ctx.parent = rq.r.Context()
	defer ctx.end()
	hb := &rq.hb
	*hb = heartbeat{rq: rq, lastOK: time.Now()}
	hb.start()

	rec := newRecorder(rq.w, rq.h.cfg.maxResponseBody, rq.h.cfg.storeSetCookie)
	defer rec.free()
	storeCtx := &rq.detached

	panicked := true
	defer func() {
		if !panicked {
			return
		}
		hb.stop()
		v := recover()
		if err := rq.h.store.Release(storeCtx, rq.acq.Key, rq.acq.Token); err != nil {
			rq.storeFailed(err, "release", hb)
		}
		if v == nil { // runtime.Goexit: let it go on
			rq.emit(EventReleased, 0, errors.New("idempotency: handler exited"))
			return
		}
		rq.emit(EventReleased, 0, fmt.Errorf("idempotency: handler panicked: %v", v))
		panic(v)
	}()
	rq.h.next.ServeHTTP(rec, rq.r.WithContext(ctx))
	panicked = false
	hb.stop()
	rec.finish()

	// 1xx finals (101 Switching Protocols) and hijacked connections cannot
	// be replayed.
	if rec.hijacked || rec.status < 200 || rq.h.cfg.releaseStatus(rec.status) {
		if err := rq.h.store.Release(storeCtx, rq.acq.Key, rq.acq.Token); err != nil {
			rq.storeFailed(err, "release", hb)
		}
		rq.emit(EventReleased, rec.status, nil)
		return
	}
	resp := rec.response()
	var err error
	for i := 0; i < completeAttempts; i++ {
		err = rq.h.store.Complete(storeCtx, rq.acq.Key, rq.acq.Token, resp, rq.h.cfg.ttl)
		if err == nil || errors.Is(err, ErrLeaseLost) {
			break
		}
		time.Sleep(time.Duration(i+1) * 20 * time.Millisecond)
	}
	if err != nil {
		rq.storeFailed(err, "complete", hb)
		return
	}
	e := rq.event(EventExecuted, rec.status, nil)
	e.Epoch = acq.Epoch
	rq.h.cfg.emit(e, rq.start)
}

// storeFailed reports a failed Complete or Release; a lease loss the
// heartbeat reported already is not reported again.
func (rq *request) storeFailed(err error, op string, hb *heartbeat) {
	if errors.Is(err, ErrLeaseLost) {
		if hb.lost == nil {
			rq.emit(EventLeaseLost, 0, err)
		}
		return
	}
	rq.emit(EventStoreError, 0, fmt.Errorf("idempotency: %s: %w", op, err))
}

// bodyReader replaces the request body the middleware read, so that the
// handler reads it again. Its buffer comes from a pool and goes back when the
// middleware returns; r.Body is then http.NoBody, so nothing can read a
// buffer that another request reuses.
type bodyReader struct {
	b    []byte
	off  int
	pool *[]byte
}

func (br *bodyReader) Read(p []byte) (int, error) {
	if br.off >= len(br.b) {
		return 0, io.EOF
	}
	n := copy(p, br.b[br.off:])
	br.off += n
	return n, nil
}

func (br *bodyReader) Close() error { return nil }

// free returns the buffer to the pool.
func (br *bodyReader) free(r *http.Request) {
	if br.pool == nil {
		return
	}
	if r.Body == br {
		r.Body = http.NoBody
	}
	bodyPool.Put(br.pool)
	*br = bodyReader{}
}

// maxPooledBody keeps unusually large buffers out of the pool; a 64 KiB
// body (plus the byte that sees EOF) still fits.
const maxPooledBody = 64<<10 + 1

var bodyPool = sync.Pool{New: func() any { b := make([]byte, 0, 2<<10); return &b }}

// readBody reads the request body (at most limit bytes) into dst and
// replaces r.Body with dst. A non-zero status means the request is refused
// with that status.
func readBody(r *http.Request, limit int64, dst *bodyReader) (body []byte, status int, code Code, detail string) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, 0, "", ""
	}
	tooLarge := func() ([]byte, int, Code, string) {
		return nil, http.StatusRequestEntityTooLarge, CodeBodyTooLarge,
			fmt.Sprintf("the request body is larger than %d bytes", limit)
	}
	if r.ContentLength > limit {
		return tooLarge()
	}
	dst.pool = bodyPool.Get().(*[]byte)
	b := (*dst.pool)[:0]
	// One byte over the known length lets the read see EOF without growing.
	if r.ContentLength >= 0 && int64(cap(b)) <= r.ContentLength {
		b = make([]byte, 0, r.ContentLength+1)
	}
	// A buffer that grew past the pool's bound is left to the collector;
	// the pooled one goes back as it was.
	defer func() {
		if cap(b) <= maxPooledBody {
			*dst.pool = b[:0]
		}
	}()
	for {
		if len(b) == cap(b) {
			if int64(len(b)) > limit {
				return tooLarge()
			}
			b = slices.Grow(b, int(min(int64(cap(b)), limit+1-int64(len(b)))))
		}
		n, err := r.Body.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if int64(len(b)) > limit {
			return tooLarge()
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, http.StatusBadRequest, CodeBodyUnreadable, "the request body could not be read"
		}
	}
	dst.b = b
	r.Body = dst
	return b, 0, "", ""
}
