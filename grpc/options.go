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

// Option configures UnaryServerInterceptor or UnaryClientInterceptor. Each
// option's comment says which one it applies to; the other panics on it.
type Option func(*config)

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

	// The names of the options given that apply to one interceptor only:
	// the other refuses them.
	serverOnly, clientOnly []string
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

// newConfig applies opts for the constructor named ctor, panicking on a nil
// option and on an option of the other interceptor.
func newConfig(ctor string, server bool, opts []Option) config {
	cfg := defaultConfig()
	for _, o := range opts {
		if o == nil {
			panic("idemgrpc: " + ctor + ": nil Option")
		}
		o(&cfg)
	}
	switch {
	case server && len(cfg.clientOnly) > 0:
		panic("idemgrpc: " + ctor + ": " + cfg.clientOnly[0] + " applies to the client interceptor only")
	case !server && len(cfg.serverOnly) > 0:
		panic("idemgrpc: " + ctor + ": " + cfg.serverOnly[0] + " applies to the server interceptor only")
	}
	return cfg
}

func serverOption(name string, set func(*config)) Option {
	return func(c *config) {
		c.serverOnly = append(c.serverOnly, name)
		set(c)
	}
}

func clientOption(name string, set func(*config)) Option {
	return func(c *config) {
		c.clientOnly = append(c.clientOnly, name)
		set(c)
	}
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
func WithMethods(fullMethods ...string) Option {
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
// request_id. Server interceptor only; WithRequestKey panics on nil.
// Default: the "idempotency-key" metadata.
func WithRequestKey(key func(req any) string) Option {
	if key == nil {
		panic("idemgrpc: WithRequestKey needs a function")
	}
	return serverOption("WithRequestKey", func(c *config) { c.requestKey = key })
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
// space, and anyone who learns a key can read its stored outcome. Server
// interceptor only; WithScope panics on nil.
// Default: none (one shared scope).
func WithScope(scope func(ctx context.Context) string) Option {
	if scope == nil {
		panic("idemgrpc: WithScope needs a function")
	}
	return serverOption("WithScope", func(c *config) { c.scope = scope })
}

// WithUnscopedKeys lets keyed calls for which the WithScope function finds
// no principal share the unscoped key space instead of being refused.
// Server interceptor only.
// Default: false (such a call gets PermissionDenied).
func WithUnscopedKeys(allow bool) Option {
	return serverOption("WithUnscopedKeys", func(c *config) { c.unscopedKeys = allow })
}

// WithKeyRequired makes the key mandatory: a call without one gets
// InvalidArgument and the handler does not run. Server interceptor only.
// Default: false (a call without a key passes through unprotected).
func WithKeyRequired(required bool) Option {
	return serverOption("WithKeyRequired", func(c *config) { c.keyRequired = required })
}

// WithReleaseCode sets which status codes of the handler's errors release
// the key instead of being stored: a released call runs again when retried,
// a stored one is replayed. Release only codes the handler returns before
// it has any effect (on a transactional Runner its writes are rolled back
// with the release, and committed with a stored error). Server interceptor
// only; WithReleaseCode panics on nil.
// Default: DefaultReleaseCode.
func WithReleaseCode(release func(codes.Code) bool) Option {
	if release == nil {
		panic("idemgrpc: WithReleaseCode needs a function")
	}
	return serverOption("WithReleaseCode", func(c *config) { c.release = release })
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
// key (for a gRPC retry policy to retry with). Client interceptor only;
// WithMaxAttempts panics when n < 1.
// Default: 5.
func WithMaxAttempts(n int) Option {
	if n < 1 {
		panic(fmt.Sprintf("idemgrpc: WithMaxAttempts(%d): need n >= 1", n))
	}
	return clientOption("WithMaxAttempts", func(c *config) { c.maxAttempts = n })
}

// WithBackoff sets the wait before retry n (n = 1 for the second attempt):
// a random duration between 0 and min(max, base·2^(n-1)), or the
// google.rpc.RetryInfo delay of the error when that is longer. Client
// interceptor only; WithBackoff panics unless 0 < base <= max.
// Default: 100ms base, 5s max.
func WithBackoff(base, max time.Duration) Option {
	if base <= 0 || max < base {
		panic(fmt.Sprintf("idemgrpc: WithBackoff(%v, %v): need 0 < base <= max", base, max))
	}
	return clientOption("WithBackoff", func(c *config) { c.baseDelay, c.maxDelay = base, max })
}

// WithMaxElapsed bounds the time a call spends retrying: no retry starts
// later than d after the first attempt started, and a wait that would end
// past that point, or past the context's deadline, ends the retries at
// once with the last error. Client interceptor only; WithMaxElapsed panics
// when d <= 0.
// Default: 30s.
func WithMaxElapsed(d time.Duration) Option {
	if d <= 0 {
		panic(fmt.Sprintf("idemgrpc: WithMaxElapsed(%v): need d > 0", d))
	}
	return clientOption("WithMaxElapsed", func(c *config) { c.maxElapsed = d })
}

// WithRetryCodes sets the status codes the client interceptor retries, with
// the same key. A replayed outcome (idempotent-replayed: true) is never
// retried, whatever its code. Client interceptor only; WithRetryCodes
// panics when given no code, or OK.
// Default: Unavailable (what the server interceptor answers while the
// original runs and when its store cannot be reached, and what gRPC
// answers for a broken connection).
func WithRetryCodes(retry ...codes.Code) Option {
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
	return clientOption("WithRetryCodes", func(c *config) { c.retryCodes = set })
}
