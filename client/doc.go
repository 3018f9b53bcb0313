// Package client is the client half of the Idempotency-Key protocol: an
// http.RoundTripper that gives every unsafe request a key and retries it,
// with that same key, when the answer is lost or the server asks to come back
// later.
//
// A payment sent over a flaky network has three possible fates: it never
// reached the server, it ran and the answer was lost, or it is still running.
// A plain retry cannot tell these apart and risks charging twice. Sent with
// an Idempotency-Key to a server that honours it (such as one using package
// idempotency), every retry is safe: the server runs the handler at most once
// and replays the stored response to later attempts.
//
// Wrap any transport:
//
//	hc := &http.Client{Transport: client.NewTransport(nil)}
//
// Requests whose method is covered (POST and PATCH by default, see
// WithMethods) get an Idempotency-Key holding a fresh random UUID unless the
// caller set one, and are retried on network errors and on 409, 429, 502,
// 503 and 504 responses, with capped exponential backoff and full jitter,
// honouring Retry-After, within WithMaxAttempts and WithMaxElapsed and the
// request's context. Other requests pass through untouched. A key the
// caller set is not handed to another host when http.Client follows a
// redirect there (see WithCrossHostKey and ErrCrossHostKey).
//
// Attempts, Replayed and Key report, for a response, how many attempts were
// made, whether the server replayed a stored answer and which key was sent;
// WithInfo collects the same facts for calls that end in an error.
//
// Only point a Transport at servers that honour Idempotency-Key: against a
// server that ignores the header, a retry after a lost answer executes the
// request a second time.
package client
