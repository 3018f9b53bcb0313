package client

import "errors"

// ErrBodyNotRewindable is returned (wrapped together with the outcome of the
// last attempt) when a request needs a retry but its body cannot be sent
// again: the request has a Body and no GetBody, or GetBody failed. Requests
// built by http.NewRequest from a *bytes.Buffer, *bytes.Reader or
// *strings.Reader, or without a body, can always be rewound.
var ErrBodyNotRewindable = errors.New("client: request body cannot be rewound")

// ErrCrossHostKey is returned (wrapped, naming both hosts) when http.Client
// follows a redirect to a host other than the first request's and the
// redirected request carries the caller's Idempotency-Key: RoundTrip sends
// nothing rather than hand the key to another host. A redirect that turned
// the request into a GET is sent without the key instead. See
// WithCrossHostKey.
var ErrCrossHostKey = errors.New("client: redirect would carry the caller's Idempotency-Key to another host")

// errNilRequest is returned by RoundTrip for a nil request.
var errNilRequest = errors.New("client: nil request")
