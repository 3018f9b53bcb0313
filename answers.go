package idempotency

import (
	"errors"
	"net/http"
	"time"
)

// answer is a response the middleware gives of its own, instead of the
// handler's or a replay: its status, problem code, detail, Retry-After and
// the event that reports it.
type answer struct {
	status     int
	code       Code
	detail     string
	retryAfter time.Duration
	event      EventKind
}

// The middleware's own answers: every response it can give besides the
// handler's and a replay. (A replay is the stored status, headers and body
// with Idempotent-Replayed: true.)
var (
	answerKeyRequired = answer{http.StatusBadRequest, CodeKeyRequired,
		"this request needs an Idempotency-Key header", 0, EventRejected}
	answerKeyInvalid = answer{http.StatusBadRequest, CodeKeyInvalid,
		"", 0, EventRejected} // the detail says what is wrong with the key
	answerScopeMissing = answer{http.StatusForbidden, CodeScopeMissing,
		"this request has no authenticated principal to scope its Idempotency-Key to", 0, EventRejected}
	answerBodyUnreadable = answer{http.StatusBadRequest, CodeBodyUnreadable,
		"the request body could not be read", 0, EventRejected}
	answerBodyTooLarge = answer{http.StatusRequestEntityTooLarge, CodeBodyTooLarge,
		"", 0, EventRejected} // the detail names the limit
	answerInFlight = answer{http.StatusConflict, CodeInFlight,
		"a request with this Idempotency-Key is still being processed; retry later", conflictRetryAfter, EventConflict}
	answerMismatch = answer{http.StatusUnprocessableEntity, CodeFingerprintMismatch,
		"this Idempotency-Key was used with a different request (another route, or another payload)", 0, EventMismatch}
	answerStoreFull = answer{http.StatusServiceUnavailable, CodeStoreFull,
		"the idempotency store is full; retry later", time.Second, EventStoreError}
	answerRecordUnreadable = answer{http.StatusInternalServerError, CodeRecordUnreadable,
		"the response stored for this Idempotency-Key cannot be read", 0, EventStoreError}
	answerStoreSlow = answer{http.StatusServiceUnavailable, CodeStoreUnavailable,
		"the idempotency store answered too slowly; retry later", time.Second, EventStoreError}
	answerStoreUnavailable = answer{http.StatusServiceUnavailable, CodeStoreUnavailable,
		"the idempotency store cannot be reached; retry later", time.Second, EventStoreError}

	// Transactional routes (WithTransaction): nothing was committed, or the
	// commit's outcome is unknown.
	answerLeaseLost = answer{http.StatusServiceUnavailable, CodeLeaseLost,
		"another request took this Idempotency-Key over; nothing was committed; retry later", time.Second, EventLeaseLost}
	answerOutcomeUnknown = answer{http.StatusServiceUnavailable, CodeOutcomeUnknown,
		"the outcome could not be confirmed; retry with the same Idempotency-Key: a retry replays the response if it was stored, or runs the request again if nothing was", time.Second, EventStoreError}
	answerResponseTooLarge = answer{http.StatusInternalServerError, CodeResponseTooLarge,
		"the response is too large to be stored; nothing was committed", 0, EventReleased}
)

// conflictRetryAfter is the Retry-After of a 409. The original usually ends
// well before its lease would, and a retry costs one store round trip, so
// clients are told to come back soon rather than when the lease runs out.
const conflictRetryAfter = time.Second

// storeErrorAnswer is the answer to a request whose record could not be
// looked up because of err (with WithFailOpen, an unreachable or slow store
// runs the handler instead: see request.acquireFailed).
func storeErrorAnswer(err error) answer {
	var slow *slowAcquireError
	switch {
	case errors.Is(err, ErrStoreFull):
		return answerStoreFull
	case errors.Is(err, ErrCorruptRecord):
		return answerRecordUnreadable
	case errors.As(err, &slow):
		return answerStoreSlow
	}
	return answerStoreUnavailable
}

// with returns a copy of a with detail.
func (a answer) with(detail string) answer {
	a.detail = detail
	return a
}

// give reports a (with err, if any) and writes it to the client as a
// problem document through the error handler.
func (rq *request) give(a answer, err error) {
	rq.outcome(rq.event(a.event, a.status, err))
	p := newProblem(rq.h.cfg.problemTypeBase, a.status, a.code, a.detail)
	p.RetryAfter = a.retryAfter
	if a.retryAfter > 0 {
		rq.w.Header().Set("Retry-After", retryAfterSeconds(a.retryAfter))
	}
	rq.h.cfg.errorHandler(rq.w, rq.r, p)
}
