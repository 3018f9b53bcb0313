package client

import (
	"fmt"
	"net/http"
	"time"
)

// Option configures a Transport. Options are applied in order by
// NewTransport, which panics on a misconfiguration.
type Option func(*config)

type config struct {
	methods     map[string]bool
	baseDelay   time.Duration
	maxDelay    time.Duration
	maxAttempts int
	maxElapsed  time.Duration
	// crossHostKey lets a caller's key follow a redirect to another host.
	crossHostKey bool
}

func defaultConfig() config {
	return config{
		methods:     map[string]bool{http.MethodPost: true, http.MethodPatch: true},
		baseDelay:   100 * time.Millisecond,
		maxDelay:    5 * time.Second,
		maxAttempts: 5,
		maxElapsed:  30 * time.Second,
	}
}

// WithMethods sets the request methods the Transport covers: requests with
// one of these methods get an Idempotency-Key and are retried. Methods are
// matched exactly (HTTP methods are case-sensitive). Requests with any other
// method are passed to the base transport untouched and are never retried:
// the Transport cannot know whether the server deduplicates them, and net/http
// already resends idempotent methods on a broken keep-alive connection.
// WithMethods panics when given no method or an empty one.
//
// Default: POST, PATCH.
func WithMethods(methods ...string) Option {
	if len(methods) == 0 {
		panic("client: WithMethods needs at least one method")
	}
	set := make(map[string]bool, len(methods))
	for _, m := range methods {
		if m == "" {
			panic("client: WithMethods: empty method")
		}
		set[m] = true
	}
	return func(c *config) { c.methods = set }
}

// WithBackoff sets the backoff between attempts: before retry n (n = 1 for
// the second attempt) the Transport waits a random duration between 0 and
// min(max, base·2^(n-1)) ("full jitter"), or the response's Retry-After when
// that is longer. WithBackoff panics unless 0 < base <= max.
//
// Default: 100ms base, 5s max.
func WithBackoff(base, max time.Duration) Option {
	if base <= 0 || max < base {
		panic(fmt.Sprintf("client: WithBackoff(%v, %v): need 0 < base <= max", base, max))
	}
	return func(c *config) { c.baseDelay, c.maxDelay = base, max }
}

// WithMaxAttempts bounds the number of attempts per request, the first one
// included; 1 turns retries off while still setting the key. WithMaxAttempts
// panics when n < 1.
//
// Default: 5.
func WithMaxAttempts(n int) Option {
	if n < 1 {
		panic(fmt.Sprintf("client: WithMaxAttempts(%d): need n >= 1", n))
	}
	return func(c *config) { c.maxAttempts = n }
}

// WithMaxElapsed bounds the time a request spends retrying: no retry starts
// later than d after the first attempt started, and a Retry-After that would
// end past that point ends the retries at once, returning the last response.
// An attempt in flight is not interrupted; bound it with the request's
// context or http.Client.Timeout. WithMaxElapsed panics when d <= 0.
//
// Default: 30s.
func WithMaxElapsed(d time.Duration) Option {
	if d <= 0 {
		panic(fmt.Sprintf("client: WithMaxElapsed(%v): need d > 0", d))
	}
	return func(c *config) { c.maxElapsed = d }
}

// WithCrossHostKey sets whether the caller's Idempotency-Key may follow a
// redirect to another host. http.Client copies the first request's headers,
// the key included, to every request it makes to follow a redirect, and strips
// only credentials (Authorization, Cookie) on the way to another host; on a
// server that does not scope keys to the caller, whoever presents a key may
// read its stored response. Unless allow is true, RoundTrip therefore refuses
// a redirected request that carries a key to a host other than the first
// request's: it sends nothing and returns an error wrapping ErrCrossHostKey.
// When the redirect has turned the request into a GET (301, 302 and 303 do so
// for a POST), the key belongs to the request that was answered with the
// redirect and means nothing to the GET: RoundTrip removes it and sends the
// GET. Hosts are compared as host:port, case-insensitively, with the scheme's
// default port filled in, so http://api.example.com and
// https://api.example.com are different hosts. Redirects to the same host
// carry a key derived from the caller's and the redirect's target (see
// Transport), and a key the Transport made is never carried by a redirect.
// With allow true, the derived key goes wherever http.Client sends it.
//
// Default: false.
func WithCrossHostKey(allow bool) Option {
	return func(c *config) { c.crossHostKey = allow }
}
