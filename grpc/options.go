package idemgrpc

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// ServerOption configures UnaryServerInterceptor. The options of the server
// interceptor only (WithScope, WithReleaseCode...) are ServerOptions, those
// of the client interceptor only (WithMaxAttempts, WithBackoff...) are
// ClientOptions, and WithMethods, which both take, is a CommonOption, which
// is both: the compiler refuses an option given to the interceptor it does
// not apply to.
type ServerOption interface{ applyServer(*config) }

// ClientOption configures UnaryClientInterceptor (see ServerOption).
type ClientOption interface{ applyClient(*config) }

// CommonOption is an option of both interceptors: it is a ServerOption and
// a ClientOption.
type CommonOption func(*config)

func (o CommonOption) applyServer(c *config) { o(c) }
func (o CommonOption) applyClient(c *config) { o(c) }

// serverOption is an option of the server interceptor only.
type serverOption func(*config)

func (o serverOption) applyServer(c *config) { o(c) }

// clientOption is an option of the client interceptor only.
type clientOption func(*config)

func (o clientOption) applyClient(c *config) { o(c) }

type config struct {
	methods map[string]bool // nil: every unary method

	// The server interceptor's.
	requestKey   func(req any) string // nil: the idempotency-key metadata
	scope        func(ctx context.Context) string
	unscopedKeys bool
	keyRequired  bool
	release      func(codes.Code) bool

	// The client interceptor's.
	maxAttempts         int
	baseDelay, maxDelay time.Duration
	maxElapsed          time.Duration
	retryCodes          map[codes.Code]bool
}

func defaultConfig() config {
	return config{
		release:     DefaultReleaseCode,
		maxAttempts: 5,
		baseDelay:   100 * time.Millisecond,
		maxDelay:    5 * time.Second,
		maxElapsed:  30 * time.Second,
		retryCodes:  map[codes.Code]bool{codes.Unavailable: true},
	}
}

// newConfig applies opts, with apply, to the defaults for the constructor
// named ctor, panicking on a nil option.
func newConfig[O any](ctor string, opts []O, apply func(O, *config)) config {
	cfg := defaultConfig()
	for _, o := range opts {
		if any(o) == nil {
			panic("idemgrpc: " + ctor + ": nil option")
		}
		apply(o, &cfg)
	}
	return cfg
}

// covers reports whether the interceptors handle calls of fullMethod.
func (c *config) covers(fullMethod string) bool {
	return c.methods == nil || c.methods[fullMethod]
}

// WithMethods restricts either interceptor to the unary methods named, by
// their full names ("/payments.v1.Payments/Charge"); calls of other methods
// pass through untouched. Leave out methods without side effects: a key
// sent to them would store their answers for the TTL. WithMethods panics
// when given no method or a name that does not start with "/".
// Default: every unary method.
func WithMethods(fullMethods ...string) CommonOption {
	if len(fullMethods) == 0 {
		panic("idemgrpc: WithMethods needs at least one method")
	}
	set := make(map[string]bool, len(fullMethods))
	for _, m := range fullMethods {
		if !strings.HasPrefix(m, "/") || strings.Count(m, "/") != 2 {
			panic(fmt.Sprintf("idemgrpc: WithMethods(%q): want a full method name, /package.Service/Method", m))
		}
		set[m] = true
	}
	return func(c *config) { c.methods = set }
}

// WithRequestKey makes the server interceptor take the key from the request
// message: key returns it, or "" for a request without one (which passes
// through unprotected, or is refused with WithKeyRequired). The key is
// checked as the metadata's is (1 to 255 visible ASCII characters), and the
// metadata is then ignored. FieldKey reads a string field, such as AIP-155's
// request_id. WithRequestKey panics on nil.
// Default: the "idempotency-key" metadata.
func WithRequestKey(key func(req any) string) ServerOption {
	if key == nil {
		panic("idemgrpc: WithRequestKey needs a function")
	}
	return serverOption(func(c *config) { c.requestKey = key })
}

// FieldKey returns a function for WithRequestKey that reads the key from
// the request message's string field name: FieldKey("request_id") for
// AIP-155. A request whose message has no such field, or leaves it empty,
// has no key. FieldKey panics on an empty name.
func FieldKey(name string) func(req any) string {
	if name == "" {
		panic("idemgrpc: FieldKey needs a field name")
	}
	field := protoreflect.Name(name)
	return func(req any) string {
		m, ok := req.(proto.Message)
		if !ok {
			return ""
		}
		r := m.ProtoReflect()
		fd := r.Descriptor().Fields().ByName(field)
		if fd == nil || fd.Kind() != protoreflect.StringKind || fd.Cardinality() == protoreflect.Repeated {
			return ""
		}
		return r.Get(fd).String()
	}
}

// WithScope maps a call to the principal that owns its key (a user, a
// tenant), from the identity that authentication, running before the
// interceptor, left in the context: keys of different scopes never meet. A
// keyed call for which scope returns "" is refused with PermissionDenied,
// unless WithUnscopedKeys. Without WithScope every caller shares one key
// space, and anyone who learns a key can read its stored outcome.
// WithScope panics on nil.
// Default: none (one shared scope).
func WithScope(scope func(ctx context.Context) string) ServerOption {
	if scope == nil {
		panic("idemgrpc: WithScope needs a function")
	}
	return serverOption(func(c *config) { c.scope = scope })
}

// WithUnscopedKeys lets keyed calls for which the WithScope function finds
// no principal share the unscoped key space instead of being refused.
// Default: false (such a call gets PermissionDenied).
func WithUnscopedKeys(allow bool) ServerOption {
	return serverOption(func(c *config) { c.unscopedKeys = allow })
}

// WithKeyRequired makes the key mandatory: a call without one gets
// InvalidArgument and the handler does not run.
// Default: false (a call without a key passes through unprotected).
func WithKeyRequired(required bool) ServerOption {
	return serverOption(func(c *config) { c.keyRequired = required })
}

// WithReleaseCode sets which status codes of the handler's errors release
// the key instead of being stored: a released call runs again when retried,
// a stored one is replayed. Release only codes the handler returns before
// it has any effect (on a transactional Runner its writes are rolled back
// with the release, and committed with a stored error). WithReleaseCode
// panics on nil.
// Default: DefaultReleaseCode.
func WithReleaseCode(release func(codes.Code) bool) ServerOption {
	if release == nil {
		panic("idemgrpc: WithReleaseCode needs a function")
	}
	return serverOption(func(c *config) { c.release = release })
}

// DefaultReleaseCode reports whether a handler's error with code c releases
// the key by default: the codes that say the outcome is transient or
// unknown (Canceled, Unknown, DeadlineExceeded, ResourceExhausted, Aborted,
// Internal, Unavailable, DataLoss, Unimplemented). A handler's deliberate
// answer (InvalidArgument, NotFound, AlreadyExists, PermissionDenied,
// FailedPrecondition, OutOfRange, Unauthenticated) is stored and replayed.
func DefaultReleaseCode(c codes.Code) bool {
	switch c {
	case codes.Canceled, codes.Unknown, codes.DeadlineExceeded, codes.ResourceExhausted,
		codes.Aborted, codes.Internal, codes.Unavailable, codes.DataLoss, codes.Unimplemented:
		return true
	}
	return false
}

// WithMaxAttempts bounds the attempts of each call, the first one
// included; 1 turns the interceptor's retries off while it still sets the
// key (for a gRPC retry policy to retry with). WithMaxAttempts panics when
// n < 1.
// Default: 5.
func WithMaxAttempts(n int) ClientOption {
	if n < 1 {
		panic(fmt.Sprintf("idemgrpc: WithMaxAttempts(%d): need n >= 1", n))
	}
	return clientOption(func(c *config) { c.maxAttempts = n })
}

// WithBackoff sets the wait before retry n (n = 1 for the second attempt):
// a random duration between 0 and min(max, base·2^(n-1)), or the
// google.rpc.RetryInfo delay of the error when that is longer. WithBackoff
// panics unless 0 < base <= max.
// Default: 100ms base, 5s max.
func WithBackoff(base, max time.Duration) ClientOption {
	if base <= 0 || max < base {
		panic(fmt.Sprintf("idemgrpc: WithBackoff(%v, %v): need 0 < base <= max", base, max))
	}
	return clientOption(func(c *config) { c.baseDelay, c.maxDelay = base, max })
}

// WithMaxElapsed bounds the time a call spends retrying: no retry starts
// later than d after the first attempt started, and a wait that would end
// past that point, or past the context's deadline, ends the retries at
// once with the last error. WithMaxElapsed panics when d <= 0.
// Default: 30s.
func WithMaxElapsed(d time.Duration) ClientOption {
	if d <= 0 {
		panic(fmt.Sprintf("idemgrpc: WithMaxElapsed(%v): need d > 0", d))
	}
	return clientOption(func(c *config) { c.maxElapsed = d })
}

// WithRetryCodes sets the status codes the client interceptor retries, with
// the same key. A replayed outcome (idempotent-replayed: true) is never
// retried, whatever its code. WithRetryCodes panics when given no code, or
// OK.
// Default: Unavailable (what the server interceptor answers while the
// original runs and when its store cannot be reached, and what gRPC
// answers for a broken connection).
func WithRetryCodes(retry ...codes.Code) ClientOption {
	if len(retry) == 0 {
		panic("idemgrpc: WithRetryCodes needs at least one code")
	}
	set := make(map[codes.Code]bool, len(retry))
	for _, c := range retry {
		if c == codes.OK {
			panic("idemgrpc: WithRetryCodes: OK is not an error")
		}
		set[c] = true
	}
	return clientOption(func(c *config) { c.retryCodes = set })
}
