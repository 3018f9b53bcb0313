package idempotency

import (
	"context"
	"log/slog"
	"math"
	"net/http"
	"net/textproto"
	"time"
)

// Option configures the middleware New returns. The options of the
// middleware only (WithMethods, WithKeyScope...) are Options; those of Do
// only (WithCodec) are RunnerOptions; those of both (WithTTL, WithLease,
// WithWait...) are CommonOptions, which are both: the compiler refuses an
// option given to the constructor it does not apply to.
type Option interface{ applyMiddleware(*config) }

// RunnerOption configures the Runner NewRunner returns (see Option).
type RunnerOption interface{ applyRunner(*config) }

// CommonOption is an option of both the middleware and a Runner: it is an
// Option and a RunnerOption.
type CommonOption func(*config)

func (o CommonOption) applyMiddleware(c *config) { o(c) }
func (o CommonOption) applyRunner(c *config)     { o(c) }

// middlewareOption is an option of the middleware only.
type middlewareOption func(*config)

func (o middlewareOption) applyMiddleware(c *config) { o(c) }

// runnerOption is an option of a Runner only.
type runnerOption func(*config)

func (o runnerOption) applyRunner(c *config) { o(c) }

type config struct {
	ttl             time.Duration
	lease           time.Duration
	wait            time.Duration
	methods         []string
	keyRequired     bool
	keyScope        func(*http.Request) string
	unscopedKeys    bool
	fingerprint     FingerprintFunc // nil: DefaultFingerprint
	maxRequestBody  int64
	maxResponseBody int
	maxHeader       int
	headers         headerPolicy
	releaseStatus   func(int) bool
	failOpen        bool
	transaction     bool
	problemTypeBase string
	errorHandler    ErrorHandler
	observer        func(context.Context, Event)
	logger          *slog.Logger
	route           func(*http.Request) string
	codec           Codec
}

// Defaults of WithTTL and WithLease.
const (
	DefaultTTL   = 24 * time.Hour
	DefaultLease = 10 * time.Second
)

// newConfig applies opts, with apply, to the defaults for the constructor
// named ctor. It panics when store is nil or an option is, and when a
// transactional route has a store that is not a TxStore.
func newConfig[O any](ctor string, store Store, opts []O, apply func(O, *config)) config {
	if store == nil {
		panic("idempotency: " + ctor + " needs a Store")
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if any(o) == nil {
			panic("idempotency: " + ctor + ": nil option")
		}
		apply(o, &cfg)
	}
	if _, ok := store.(TxStore); cfg.transaction && !ok {
		panic("idempotency: WithTransaction needs a TxStore")
	}
	return cfg
}

func defaultConfig() config {
	return config{
		ttl:             DefaultTTL,
		lease:           DefaultLease,
		methods:         []string{http.MethodPost, http.MethodPatch},
		maxRequestBody:  1 << 20,
		maxResponseBody: 1 << 20,
		maxHeader:       64 << 10,
		releaseStatus:   func(status int) bool { return status >= 500 },
		errorHandler:    WriteProblem,
		problemTypeBase: ProblemTypeBase,
	}
}

// WithTTL sets how long a COMPLETE record is replayed, counted from
// completion. It also bounds an abandoned IN_PROGRESS record, which is purged
// once both its TTL and its lease have passed.
// Default: 24h.
func WithTTL(d time.Duration) CommonOption {
	if d <= 0 {
		panic("idempotency: WithTTL needs a positive duration")
	}
	return func(c *config) { c.ttl = d }
}

// WithLease sets the lease an attempt holds while the handler runs. A
// heartbeat extends it every lease/3 for handlers that run that long; a
// duplicate arriving after the lease expired (the owner died) steals the
// record and runs the handler.
//
// The middleware counts the lease from before the call that took or
// extended it was sent and ends it lease/10 early. A handler starts only
// with at least half of it left (a slower acquire is released and answered
// 503); each extend gets the lease's end as its deadline; when none has
// succeeded by then the handler's context is cancelled with a cause
// wrapping ErrLeaseLost. Complete and release after the handler end at the
// lease's end too, and at least lease/3 after the handler returned.
// Choose a lease well above the store's round trip and the longest pause
// you expect.
// Default: 10s.
func WithLease(d time.Duration) CommonOption {
	if d < 3*time.Millisecond {
		panic("idempotency: WithLease needs at least 3ms")
	}
	return func(c *config) { c.lease = d }
}

// WithWait turns on wait mode: a duplicate that arrives while the original
// runs waits up to d for it, then replays its response (or takes over when
// the original released the key). Past d it gets 409 as without wait mode.
// Default: 0 (off: answer 409 at once).
func WithWait(d time.Duration) CommonOption {
	if d < 0 {
		panic("idempotency: WithWait needs a non-negative duration")
	}
	return func(c *config) { c.wait = d }
}

// WithMethods sets the methods the middleware covers; requests with other
// methods pass through and any key on them is ignored.
// Default: POST, PATCH.
func WithMethods(methods ...string) Option {
	if len(methods) == 0 {
		panic("idempotency: WithMethods needs at least one method")
	}
	m := append([]string(nil), methods...)
	return middlewareOption(func(c *config) { c.methods = m })
}

// WithKeyRequired makes the key mandatory on covered methods: a request
// without one gets 400 (code key_required).
// Default: false (a request without a key passes through unprotected).
func WithKeyRequired(required bool) Option {
	return middlewareOption(func(c *config) { c.keyRequired = required })
}

// WithKeyScope maps a request to the principal that owns its keys (a user or
// tenant id, taken from authentication that ran before the middleware and
// left it in the request's context; never from a header the client
// chooses). Keys of different scopes never meet.
//
// A keyed request for which scope returns "" has no principal: it is
// answered 403 (code scope_missing) and the handler does not run, rather
// than sharing one key space with every other request without a principal
// (WithUnscopedKeys opts in to that).
//
// Without WithKeyScope every client shares one key space: anyone who learns
// a key can read the response stored under it.
// Default: none (one shared scope).
func WithKeyScope(scope func(*http.Request) string) Option {
	if scope == nil {
		panic("idempotency: WithKeyScope needs a function")
	}
	return middlewareOption(func(c *config) { c.keyScope = scope })
}

// WithUnscopedKeys lets keyed requests for which the WithKeyScope function
// returns "" (anonymous ones, on a route that allows them) run in the one
// key space they all share, where anyone who learns a key can read the
// response stored under it. Keys of principals never meet it.
// Default: false (such a request gets 403 scope_missing).
func WithUnscopedKeys(allow bool) Option {
	return middlewareOption(func(c *config) { c.unscopedKeys = allow })
}

// WithFingerprint replaces the function that identifies a request's
// payload. Whatever it returns, the route the client addressed (the method
// and the path of the request as the client sent it, before a router or
// http.StripPrefix rewrote it) is part of the record's identity as well: a
// key sent to another route is answered 422 fingerprint_mismatch, never
// with the other route's response.
// Default: DefaultFingerprint (SHA-256 over method, path, query and body).
func WithFingerprint(f FingerprintFunc) Option {
	if f == nil {
		panic("idempotency: WithFingerprint needs a function")
	}
	return middlewareOption(func(c *config) { c.fingerprint = f })
}

// WithMaxRequestBody caps the request body the middleware reads to
// fingerprint it; a larger body gets 413 and the handler does not run.
// Default: 1 MiB.
func WithMaxRequestBody(n int64) Option {
	if n < 0 {
		panic("idempotency: WithMaxRequestBody needs a non-negative size")
	}
	return middlewareOption(func(c *config) { c.maxRequestBody = n })
}

// WithMaxResponseBody caps the response body that is stored. A larger
// response still reaches the first client in full; the record is stored
// without its body and duplicates get the status and headers, an empty body
// and the header Idempotent-Body-Omitted: true. The handler never runs twice.
// The same happens to a body that is not known to be whole because the
// first client hung up (or the server's WriteTimeout passed) while the
// handler wrote it, unless the handler wrote all of its Content-Length.
// For Do it caps the encoded result (the body of a *Response result): a
// larger one is stored marked omitted (OutcomeOmitted), and duplicates get
// ErrResultOmitted.
// Default: 1 MiB.
func WithMaxResponseBody(n int64) CommonOption {
	if n < 0 || n > math.MaxInt32 {
		panic("idempotency: WithMaxResponseBody needs a size from 0 to 2 GiB")
	}
	return func(c *config) { c.maxResponseBody = int(n) }
}

// WithMaxResponseHeader caps the headers that are stored with a response:
// the bytes of every value, and of its name once per value, of the headers
// the handler set that are kept (see WithStoredHeaders). A response whose
// headers are over the cap still reaches the first client in full; its
// record keeps the status alone, and duplicates get the status with an
// empty body and the headers Idempotent-Header-Omitted: true and
// Idempotent-Body-Omitted: true. The handler never runs twice. On a
// transactional route such a response rolls everything back, as a body
// over WithMaxResponseBody does. A stored response is thus at most
// WithMaxResponseHeader plus WithMaxResponseBody bytes. For Do it caps the
// headers of a *Response result the same way.
// Default: 64 KiB.
func WithMaxResponseHeader(n int64) CommonOption {
	if n < 0 || n > math.MaxInt32 {
		panic("idempotency: WithMaxResponseHeader needs a size from 0 to 2 GiB")
	}
	return func(c *config) { c.maxHeader = int(n) }
}

// WithStoredHeaders restricts the response headers that are stored, and so
// replayed, to names (compared in canonical form). The other rules still
// apply: hop-by-hop headers, Date and trailers are never stored, and
// Set-Cookie only with WithStoreSetCookie. Headers that middleware in front
// of this one set before it ran are never stored (unless the handler
// changed them), whatever the list.
// Default: every header the handler set.
func WithStoredHeaders(names ...string) Option {
	if len(names) == 0 {
		panic("idempotency: WithStoredHeaders needs at least one name")
	}
	only := make(map[string]bool, len(names))
	for _, n := range names {
		if n == "" {
			panic("idempotency: WithStoredHeaders: empty header name")
		}
		only[textproto.CanonicalMIMEHeaderKey(n)] = true
	}
	return middlewareOption(func(c *config) { c.headers.only = only })
}

// WithStoreSetCookie stores Set-Cookie headers with the response, so that
// replays send them too. Only turn it on for keys scoped to one principal.
// Default: false.
func WithStoreSetCookie(store bool) Option {
	return middlewareOption(func(c *config) { c.headers.setCookie = store })
}

// WithReleaseStatus sets which response statuses release the key instead of
// storing the response, so that the client's retry runs the handler again.
// Default: status >= 500.
func WithReleaseStatus(release func(status int) bool) Option {
	if release == nil {
		panic("idempotency: WithReleaseStatus needs a function")
	}
	return middlewareOption(func(c *config) { c.releaseStatus = release })
}

// WithFailOpen sets what happens when the store cannot be reached at
// acquire: fail closed answers 503 with Retry-After; fail open runs the
// handler unprotected and reports an EventStoreError with FailedOpen set.
// Default: false (fail closed).
func WithFailOpen(open bool) CommonOption {
	return func(c *config) { c.failOpen = open }
}

// WithTransaction makes the route's handler run in a transaction of the
// store, which must be a TxStore (New panics otherwise): the handler writes
// through Info.Tx (FromContext), and the middleware completes the record
// in the same transaction and commits. The client gets the response only
// after the commit: the response is held in full (streaming and Flush wait
// for the commit; Hijack is refused), and one over WithMaxResponseBody
// rolls everything back and answers 500 response_too_large. A 5xx or a
// panic rolls the transaction back and releases the key; a lost lease or a
// commit of unknown outcome answer 503 (lease_lost, outcome_unknown), and
// a retry with the same key then replays or runs once more, never twice.
// Default: false.
func WithTransaction(on bool) CommonOption {
	return func(c *config) { c.transaction = on }
}

// WithProblemTypeBase sets the URL prefix of the "type" member of problem
// documents; the problem's code follows it. RFC 9457 wants a type that
// points at documentation: set it to your API's own page on these errors
// (for example "https://api.example.com/docs/errors#").
// Default: ProblemTypeBase (this project's README, whose anchors are the
// codes).
func WithProblemTypeBase(base string) Option {
	if base == "" {
		panic("idempotency: WithProblemTypeBase needs a URL")
	}
	return middlewareOption(func(c *config) { c.problemTypeBase = base })
}

// WithErrorHandler replaces the function that writes problem responses.
// Default: WriteProblem (application/problem+json).
func WithErrorHandler(h ErrorHandler) Option {
	if h == nil {
		panic("idempotency: WithErrorHandler needs a function")
	}
	return middlewareOption(func(c *config) { c.errorHandler = h })
}

// WithObserver sets a function called with every Event (see EventKind) and
// the request's context (its trace, its request id: for exemplars and
// spans). It runs on the request's goroutine, never on the heartbeat's, and
// must be fast and safe for concurrent use.
// Default: none.
func WithObserver(observe func(ctx context.Context, e Event)) CommonOption {
	if observe == nil {
		panic("idempotency: WithObserver needs a function")
	}
	return func(c *config) { c.observer = observe }
}

// WithLogger logs store errors, lost leases and released keys. Log records
// carry the storage key (a hash), never the client's key or any body.
// Default: none (nothing is logged).
func WithLogger(l *slog.Logger) CommonOption {
	return func(c *config) { c.logger = l }
}

// WithRoute sets how an Event (and a log record) names the route, for
// metrics. It is given the request the handler got when the handler ran (a
// router beneath the middleware has then set its pattern on it), else the
// request the middleware got.
// Default: the pattern of the route that served the request, however the
// middleware is mounted: set by http.ServeMux or chi on the handler's
// request, by a router above the middleware, or, when the middleware wraps
// an http.ServeMux, the pattern the mux chooses. For chi's r.Use, where chi
// routes only after the middleware, package chiroute names the routes of
// requests the handler did not serve (replays, conflicts).
func WithRoute(route func(*http.Request) string) Option {
	if route == nil {
		panic("idempotency: WithRoute needs a function")
	}
	return middlewareOption(func(c *config) { c.route = route })
}
