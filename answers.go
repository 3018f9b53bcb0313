package idempotency

import (
	"net/http"
	"time"
)

// answer is what a client gets: the handler's response, a replay, or a
// response the middleware gives of its own (a problem: its status, code,
// detail and Retry-After).
type answer struct {
	status     int
	code       Code
	detail     string
	retryAfter time.Duration
	send       send
}

// send says what an answer sends.
type send uint8

const (
	sendProblem  send = iota // the answer's problem document
	sendResponse             // the handler's response (sent already, unless held)
	sendReplay               // the stored response (written by the replay)
	sendNothing              // nothing: the client went away
)

// outcomeAnswers is the middleware's translation of the core's outcomes:
// what the client gets for each. Every Outcome has a row.
var outcomeAnswers = [outcomeEnd]answer{
	OutcomeStored:           {send: sendResponse},
	OutcomeOmitted:          {send: sendResponse},
	OutcomeCommitted:        {send: sendResponse},
	OutcomeUnrecorded:       {send: sendResponse},
	OutcomeUnprotected:      {send: sendResponse},
	OutcomeReleased:         {send: sendResponse},
	OutcomeRefused:          {send: sendResponse}, // Do's; a handler answers for itself
	OutcomeReplayed:         {send: sendReplay},
	OutcomeReplayedOmitted:  {send: sendReplay},
	OutcomeCanceled:         {send: sendNothing},
	OutcomeInFlight:         answerInFlight,
	OutcomeMismatch:         answerMismatch,
	OutcomeLeaseLost:        answerLeaseLost,
	OutcomeCommitUnknown:    answerOutcomeUnknown,
	OutcomeTooLarge:         answerResponseTooLarge,
	OutcomeStoreUnavailable: answerStoreUnavailable, // answerStoreSlow for a slow acquire
	OutcomeStoreFull:        answerStoreFull,
	OutcomeCorrupt:          answerRecordUnreadable,
	OutcomeInvalid:          answerKeyInvalid, // the refusal's own answer (see refusal)
}

// refusal is the error of a request the middleware refused before the
// store was asked (OutcomeInvalid): the answer it gets, and the error
// behind it, if any.
type refusal struct {
	answer
	err error
}

func (r *refusal) Error() string {
	if r.err != nil {
		return r.err.Error()
	}
	return "idempotency: " + string(r.code)
}

func (r *refusal) Unwrap() error { return r.err }

// The middleware's own answers: every response it can give besides the
// handler's and a replay. (A replay is the stored status, headers and body
// with Idempotent-Replayed: true.)
var (
	answerKeyRequired = answer{http.StatusBadRequest, CodeKeyRequired,
		"this request needs an Idempotency-Key header", 0, sendProblem}
	answerKeyInvalid = answer{http.StatusBadRequest, CodeKeyInvalid,
		"", 0, sendProblem} // the detail says what is wrong with the key
	answerScopeMissing = answer{http.StatusForbidden, CodeScopeMissing,
		"this request has no authenticated principal to scope its Idempotency-Key to", 0, sendProblem}
	answerBodyUnreadable = answer{http.StatusBadRequest, CodeBodyUnreadable,
		"the request body could not be read", 0, sendProblem}
	answerBodyTooLarge = answer{http.StatusRequestEntityTooLarge, CodeBodyTooLarge,
		"", 0, sendProblem} // the detail names the limit
	answerInFlight = answer{http.StatusConflict, CodeInFlight,
		"a request with this Idempotency-Key is still being processed; retry later", conflictRetryAfter, sendProblem}
	answerMismatch = answer{http.StatusUnprocessableEntity, CodeFingerprintMismatch,
		"this Idempotency-Key was used with a different request (another route, or another payload)", 0, sendProblem}
	answerStoreFull = answer{http.StatusServiceUnavailable, CodeStoreFull,
		"the idempotency store is full; retry later", time.Second, sendProblem}
	answerRecordUnreadable = answer{http.StatusInternalServerError, CodeRecordUnreadable,
		"the response stored for this Idempotency-Key cannot be read", 0, sendProblem}
	answerStoreSlow = answer{http.StatusServiceUnavailable, CodeStoreUnavailable,
		"the idempotency store answered too slowly; retry later", time.Second, sendProblem}
	answerStoreUnavailable = answer{http.StatusServiceUnavailable, CodeStoreUnavailable,
		"the idempotency store cannot be reached; retry later", time.Second, sendProblem}

	// Transactional routes (WithTransaction): nothing was committed, or the
	// commit's outcome is unknown.
	answerLeaseLost = answer{http.StatusServiceUnavailable, CodeLeaseLost,
		"another request took this Idempotency-Key over; nothing was committed; retry later", time.Second, sendProblem}
	answerOutcomeUnknown = answer{http.StatusServiceUnavailable, CodeOutcomeUnknown,
		"the outcome could not be confirmed; retry with the same Idempotency-Key: a retry replays the response if it was stored, or runs the request again if nothing was", time.Second, sendProblem}
	answerResponseTooLarge = answer{http.StatusInternalServerError, CodeResponseTooLarge,
		"the response is too large to be stored; nothing was committed", 0, sendProblem}
)

// conflictRetryAfter is the Retry-After of a 409. The original usually ends
// well before its lease would, and a retry costs one store round trip, so
// clients are told to come back soon rather than when the lease runs out.
const conflictRetryAfter = time.Second

// with returns a copy of a with detail.
func (a answer) with(detail string) answer {
	a.detail = detail
	return a
}

// give writes a to the client as a problem document through the error
// handler.
func (rq *request) give(a answer) {
	p := newProblem(rq.h.cfg.problemTypeBase, a.status, a.code, a.detail)
	p.RetryAfter = a.retryAfter
	if a.retryAfter > 0 {
		rq.w.Header().Set("Retry-After", retryAfterSeconds(a.retryAfter))
	}
	rq.h.cfg.errorHandler(rq.w, rq.r, p)
}
