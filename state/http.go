package state

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/go-idempotency/idempotency"
)

// CodeInternal is the code of WriteError's answer to an error that is not
// one of this package's: 500, without the error's text.
const CodeInternal = "internal_error"

// storeRetryAfter is the Retry-After of a store error's problem.
const storeRetryAfter = time.Second

// Problem is the RFC 9457 problem details document of a state error, as
// WriteError answers with it: the members of idempotency.Problem (type,
// title, status, detail, and the stable code of the error) and extension
// members naming the record and, for a conflict or an existing record,
// its state and version as they are now, for the client to decide again.
//
//	error                  status  code                    extension members
//	*ConflictError         409     state_conflict          machine, id, reason, state, version
//	*ExistsError           409     state_exists            machine, id, state, version
//	*NotFoundError         404     state_not_found         machine, id
//	*InvalidArgumentError  422     state_invalid_argument  field
//	*StoreError            503     state_store_error       - (Retry-After: 1)
//
// On a route of the idempotency middleware, the 4xx answers are stored
// and replayed to the request's duplicates; the 503 releases its key and
// rolls its transaction back, so that a retry runs again.
type Problem struct {
	idempotency.Problem
	Machine string `json:"machine,omitempty"`
	ID      string `json:"id,omitempty"`
	// Reason is a conflict's: "version" or "state".
	Reason  string `json:"reason,omitempty"`
	State   string `json:"state,omitempty"`
	Version int64  `json:"version,omitempty"`
	// Field is the argument an invalid argument problem is about.
	Field string `json:"field,omitempty"`
}

// ProblemFor returns the problem that answers err, or nil when err is not
// (and wraps no) error of this package. See Problem for the table.
func ProblemFor(err error) *Problem {
	var (
		conflict *ConflictError
		exists   *ExistsError
		notFound *NotFoundError
		badArg   *InvalidArgumentError
		store    *StoreError
	)
	switch {
	case errors.As(err, &conflict):
		c := conflict.Current
		p := newProblem(http.StatusConflict, CodeConflict, "State conflict", conflictDetail(conflict))
		p.Machine, p.ID, p.Reason, p.State, p.Version = c.Machine, c.ID, conflict.Reason, c.State, c.Version
		return p
	case errors.As(err, &exists):
		c := exists.Current
		p := newProblem(http.StatusConflict, CodeExists, "Record exists",
			"the record exists, in state "+c.State+" at version "+strconv.FormatInt(c.Version, 10))
		p.Machine, p.ID, p.State, p.Version = c.Machine, c.ID, c.State, c.Version
		return p
	case errors.As(err, &notFound):
		p := newProblem(http.StatusNotFound, CodeNotFound, "Record not found", "no record "+notFound.Ref.Machine+" "+strconv.Quote(notFound.Ref.ID))
		p.Machine, p.ID = notFound.Ref.Machine, notFound.Ref.ID
		return p
	case errors.As(err, &badArg):
		p := newProblem(http.StatusUnprocessableEntity, CodeInvalidArgument, "Invalid argument", "invalid "+badArg.Field+": "+badArg.Reason)
		p.Field = badArg.Field
		return p
	case errors.As(err, &store):
		// The database's error stays in the server's logs.
		p := newProblem(http.StatusServiceUnavailable, CodeStoreError, "State store unavailable",
			"the state store could not complete the "+store.Op+"; retry later")
		p.RetryAfter = storeRetryAfter
		return p
	}
	return nil
}

// conflictDetail says what a conflict found, without the scope.
func conflictDetail(e *ConflictError) string {
	c := e.Current
	v := strconv.FormatInt(c.Version, 10)
	if e.Reason == ReasonVersion {
		return "the record is at version " + v + " (state " + c.State + "), not at the expected version " +
			strconv.FormatInt(e.Change.ExpectedVersion, 10)
	}
	return "the record is in state " + c.State + ", not " + e.Change.From + " (version " + v + ")"
}

func newProblem(status int, code, title, detail string) *Problem {
	return &Problem{Problem: idempotency.Problem{
		Type: idempotency.ProblemTypeBase + code, Title: title, Status: status, Detail: detail, Code: idempotency.Code(code),
	}}
}

// WriteError answers err, an error of a Store's method, with its problem
// (see Problem) as application/problem+json, with Retry-After for a store
// error. Any other error is answered 500 with the code CodeInternal, and
// without its text. A handler is then a few lines:
//
//	rec, err := payments.Transition(r.Context(), ref, state.Change{From: "authorized", To: "captured", ExpectedVersion: v})
//	if err != nil {
//		state.WriteError(w, r, err)
//		return
//	}
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	p := ProblemFor(err)
	if p == nil {
		p = newProblem(http.StatusInternalServerError, CodeInternal, "Internal error", "")
	}
	p.Write(w, r)
}

// Write writes p as application/problem+json with p.Status, and
// Retry-After when p.RetryAfter is set.
func (p *Problem) Write(w http.ResponseWriter, _ *http.Request) {
	body, err := json.Marshal(p)
	if err != nil { // cannot happen: Problem holds strings and integers
		body = []byte(`{"status":` + strconv.Itoa(p.Status) + `}`)
	}
	h := w.Header()
	if p.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(int64((p.RetryAfter+time.Second-1)/time.Second), 10))
	}
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}
