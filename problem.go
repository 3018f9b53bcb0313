package idempotency

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// Code is the stable, machine-readable identifier of a problem the middleware
// answers with. It is sent as the "code" member of the problem document and
// never changes meaning.
type Code string

// Problem codes.
const (
	CodeKeyRequired         Code = "key_required"         // 400: the route requires a key and none was sent
	CodeKeyInvalid          Code = "key_invalid"          // 400: malformed key or several header lines
	CodeScopeMissing        Code = "scope_missing"        // 403: WithKeyScope found no principal for a keyed request
	CodeBodyUnreadable      Code = "body_unreadable"      // 400: the request body could not be read
	CodeBodyTooLarge        Code = "body_too_large"       // 413: request body over the fingerprint cap
	CodeInFlight            Code = "request_in_flight"    // 409: the original request still runs
	CodeFingerprintMismatch Code = "fingerprint_mismatch" // 422: key reused with another request
	CodeStoreUnavailable    Code = "store_unavailable"    // 503: the store could not be reached
	CodeStoreFull           Code = "store_full"           // 503: the store has no room for a new record
	CodeRecordUnreadable    Code = "record_unreadable"    // 500: the stored record cannot be decoded
	CodeLeaseLost           Code = "lease_lost"           // 503: transactional route: another request took the key over; nothing was committed
	CodeOutcomeUnknown      Code = "outcome_unknown"      // 503: transactional route: the commit's outcome is unknown; retry with the same key
	CodeResponseTooLarge    Code = "response_too_large"   // 500: transactional route: the response is over the store cap; nothing was committed
)

// ProblemTypeBase prefixes the code in a Problem's Type unless
// WithProblemTypeBase sets another base.
const ProblemTypeBase = "https://github.com/go-idempotency/idempotency#"

// Problem is an RFC 9457 problem details document with the extension member
// "code". The middleware answers every error with one.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	Code   Code   `json:"code"`
	// RetryAfter, when positive, is also sent (rounded up to whole seconds)
	// as the Retry-After header, set before the error handler runs.
	RetryAfter time.Duration `json:"-"`
}

// ErrorHandler writes a problem to the client. The middleware has set the
// Retry-After header already when the problem carries one.
type ErrorHandler func(w http.ResponseWriter, r *http.Request, p *Problem)

var problemTitles = map[Code]string{
	CodeKeyRequired:         "Idempotency-Key required",
	CodeKeyInvalid:          "Invalid Idempotency-Key",
	CodeScopeMissing:        "No principal for Idempotency-Key",
	CodeBodyUnreadable:      "Request body unreadable",
	CodeBodyTooLarge:        "Request body too large",
	CodeInFlight:            "Request in progress",
	CodeFingerprintMismatch: "Idempotency-Key reused with a different request",
	CodeStoreUnavailable:    "Idempotency store unavailable",
	CodeStoreFull:           "Idempotency store full",
	CodeRecordUnreadable:    "Stored response unreadable",
	CodeLeaseLost:           "Request taken over",
	CodeOutcomeUnknown:      "Outcome unknown",
	CodeResponseTooLarge:    "Response too large to store",
}

func newProblem(typeBase string, status int, code Code, detail string) *Problem {
	return &Problem{
		Type:   typeBase + string(code),
		Title:  problemTitles[code],
		Status: status,
		Detail: detail,
		Code:   code,
	}
}

// WriteProblem is the default ErrorHandler: it writes p as
// application/problem+json with p.Status.
func WriteProblem(w http.ResponseWriter, _ *http.Request, p *Problem) {
	body, err := json.Marshal(p)
	if err != nil { // cannot happen: Problem holds strings and ints
		body = []byte(`{"status":` + strconv.Itoa(p.Status) + `}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}

// retryAfterSeconds rounds d up to whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) string {
	s := (d + time.Second - 1) / time.Second
	if s < 1 {
		s = 1
	}
	return strconv.FormatInt(int64(s), 10)
}
