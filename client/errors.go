package client

import "errors"

// ErrBodyNotRewindable is returned (wrapped together with the outcome of the
// last attempt) when a request needs a retry but its body cannot be sent
// again: the request has a Body and no GetBody, or GetBody failed. Requests
// built by http.NewRequest from a *bytes.Buffer, *bytes.Reader or
// *strings.Reader, or without a body, can always be rewound.
var ErrBodyNotRewindable = errors.New("client: request body cannot be rewound")

// errNilRequest is returned by RoundTrip for a nil request.
var errNilRequest = errors.New("client: nil request")
