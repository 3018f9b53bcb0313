package client

import (
	"context"
	"net/http"
)

const (
	// HeaderKey is the request header that carries the idempotency key.
	HeaderKey = "Idempotency-Key"
	// headerReplayed marks a response replayed from a stored record.
	headerReplayed = "Idempotent-Replayed"
)

// Info describes what a Transport did for one request. Attach one to the
// request's context with WithInfo; the Transport fills it in before
// RoundTrip returns, whether with a response or an error.
type Info struct {
	// Key is the Idempotency-Key that every attempt carried: the caller's,
	// or the one the Transport generated. For a request refused with
	// ErrCrossHostKey it is the caller's key, which was not sent.
	Key string
	// Attempts is the number of attempts the Transport made, the first one
	// included. It is 0 when the request's method is not covered, or when
	// RoundTrip refused to send the request (ErrCrossHostKey).
	Attempts int
	// Replayed reports that the final response carried
	// Idempotent-Replayed: true: the server answered from a stored record
	// rather than by running its handler for this attempt.
	Replayed bool
}

type infoKey struct{}

// WithInfo returns a copy of ctx that makes a Transport record in info what
// it did for a request sent with that context, in the way httptrace attaches
// a ClientTrace. Use it when you need the key or the attempt count of a call
// that ended in an error; for a response, Attempts and Replayed are enough.
// With http.Client following redirects, info describes the last round trip.
func WithInfo(ctx context.Context, info *Info) context.Context {
	return context.WithValue(ctx, infoKey{}, info)
}

// record is what a Transport notes for each covered round trip. It travels in
// the context of every attempt's request, so the final response's Request
// leads back to it.
type record struct {
	final    *http.Request // the request of the attempt whose response is returned
	attempts int
}

type recordKey struct{}

// Attempts reports how many attempts a Transport made to obtain resp, the
// first one included. It returns 0 for a response that did not come through a
// Transport's retry loop (a method not covered, or another RoundTripper).
// The count covers the Transport's own attempts; the base transport may in
// addition resend a request on a keep-alive connection that broke before
// anything was written back (net/http does so for requests carrying an
// Idempotency-Key), which is equally safe.
func Attempts(resp *http.Response) int {
	if resp == nil || resp.Request == nil {
		return 0
	}
	rec, _ := resp.Request.Context().Value(recordKey{}).(*record)
	if rec == nil || rec.final != resp.Request {
		return 0
	}
	return rec.attempts
}

// Replayed reports whether resp carries Idempotent-Replayed: true, that is,
// whether the server answered from the key's stored record instead of running
// the request. After a lost answer, the retry that succeeds is typically a
// replay of the first execution.
func Replayed(resp *http.Response) bool {
	return replayed(resp)
}

// Key returns the Idempotency-Key that was sent for resp, as recorded in
// resp.Request, or "" when there is none.
func Key(resp *http.Response) string {
	if resp == nil || resp.Request == nil {
		return ""
	}
	return resp.Request.Header.Get(HeaderKey)
}
