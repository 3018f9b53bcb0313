package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"sync"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/go-idempotency/idempotency"
)

// MetadataKey is the request metadata that carries the idempotency key.
const MetadataKey = "idempotency-key"

// MetadataReplayed is the header metadata a replay carries, with the value
// "true".
const MetadataReplayed = "idempotent-replayed"

// MetadataOmitted is the header metadata a replay carries, with the value
// "true", when the outcome was stored without its body (over the Runner's
// WithMaxResponseBody, over a store's bound, or not marshallable): the
// replay is its status alone.
const MetadataOmitted = "idempotent-omitted"

// UnaryServerInterceptor returns an interceptor that runs each unary call
// carrying a key once per (scope, key) among every server sharing r's
// store, with r's leases, heartbeat, fencing, steal, wait mode and, on a
// transactional Runner, transactional completion (see idempotency.Do).
//
//   - The key is the "idempotency-key" metadata (WithRequestKey: a field of
//     the request message), checked as the HTTP middleware checks its
//     header; a call without one passes through unprotected (WithKeyRequired
//     refuses it). The scope is WithScope's principal.
//   - The record's identity is the full method name with the deterministic
//     marshalling of the request message: the same key with another request
//     or on another method gets FailedPrecondition, and the record is left
//     untouched.
//   - The handler runs with a context that holds idempotency.Info
//     (idempotency.FromContext) and, on a transactional Runner, the
//     transaction (pgstore.TxFromContext), and that is cancelled, with a
//     cause wrapping idempotency.ErrLeaseLost, before another call could
//     take the record over.
//   - The first caller gets what the handler returned. Its outcome is
//     stored: the response message, or the status of its error (code,
//     message, details), with the header and trailer metadata it set
//     (grpc.SetHeader, grpc.SendHeader, grpc.SetTrailer); the code and
//     message are also kept outside the stored body, so that they survive
//     when the body is not stored (over the Runner's WithMaxResponseBody,
//     over a store's bound, or not marshallable, such as a string field
//     holding invalid UTF-8, which gRPC cannot send either: its caller gets
//     Internal from gRPC). An error whose code WithReleaseCode releases (by
//     default the transient ones, Internal and Unavailable among them)
//     releases the key instead, so that a retry runs the handler again; a
//     panic releases it and is re-raised.
//   - A duplicate gets the stored outcome, and "idempotent-replayed: true"
//     in its header metadata; the handler does not run. For an outcome
//     stored without its body it gets the status alone (and
//     "idempotent-omitted: true"): the handler's code and message, or
//     AlreadyExists RESPONSE_OMITTED for a response.
//
// The handler's header metadata goes out with its response, grpc.SendHeader
// included: it is held until the outcome is known. Metadata set before the
// interceptor ran (by interceptors in front of it) is neither stored nor
// replaced. Requests and responses must be protocol buffer messages, and a
// replayed response's type must be registered (generated code registers
// its messages); grpc.SetSendCompressor and grpc.ClientSupportedCompressors
// are not available to the handler, as under any interceptor that wraps the
// server transport stream. Every outcome of idempotency.Do is answered as
// the package's README lists. Events, logs and metrics name the route with
// the full method. A handler's error of package state is answered with its
// status: ABORTED for a state record's conflict, with the record as it is
// now (see ReasonStateConflict and the reasons beside it).
//
// UnaryServerInterceptor panics when r is nil.
func UnaryServerInterceptor(r *idempotency.Runner, opts ...ServerOption) grpc.UnaryServerInterceptor {
	if r == nil {
		panic("idemgrpc: UnaryServerInterceptor needs a Runner")
	}
	s := &server{runner: r, cfg: newConfig("UnaryServerInterceptor", opts, ServerOption.applyServer)}
	return s.intercept
}

type server struct {
	runner *idempotency.Runner
	cfg    config
}

// Why the server refused a call before Do, as its event reports it.
var (
	errKeyRequired  = errors.New("idemgrpc: the method requires an idempotency key")
	errScopeMissing = errors.New("idemgrpc: the caller has no principal to scope its key to")
)

func (s *server) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !s.cfg.covers(info.FullMethod) {
		return handler(ctx, req)
	}
	handler = withStateStatuses(handler)
	key, field, err := s.key(ctx, req)
	switch {
	case err != nil:
		s.runner.Reject(ctx, info.FullMethod, err)
		return nil, keyInvalid(field, err).err(ctx)
	case key == "" && s.cfg.keyRequired:
		s.runner.Reject(ctx, info.FullMethod, errKeyRequired)
		return nil, keyRequired(field).err(ctx)
	case key == "":
		return handler(ctx, req)
	}
	var scope string
	if s.cfg.scope != nil {
		if scope = s.cfg.scope(ctx); scope == "" && !s.cfg.unscopedKeys {
			s.runner.Reject(ctx, info.FullMethod, errScopeMissing)
			return nil, answerScopeMissing.err(ctx)
		}
	}
	msg, ok := req.(proto.Message)
	if !ok {
		return nil, status.Errorf(codes.Internal, "idemgrpc: the request of %s is not a protocol buffer message", info.FullMethod)
	}
	payload, err := deterministic.Marshal(msg)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "idemgrpc: marshal the request: %v", err)
	}

	var ran *answered // the handler's answer, when it ran in this call
	call := idempotency.Call{Name: info.FullMethod, Key: key, Scope: scope, Payload: payload}
	res, err := idempotency.Do(ctx, s.runner, call, func(ctx context.Context) (*idempotency.Response, error) {
		ran = run(ctx, req, info, handler)
		if ran.err != nil && s.cfg.release(statusOf(ran.err).Code()) {
			return nil, ran.err
		}
		return ran.outcome().record(), nil
	})

	r, ok := outcomeReplies[res.Outcome]
	if !ok {
		return nil, status.Errorf(codes.Internal, "idemgrpc: no answer to the outcome %v (%v)", res.Outcome, err)
	}
	return r.give(ctx, res, err, ran, field)
}

// key returns the call's key, "" when it has none, and the name of where it
// was looked for (for a BadRequest detail); err says what is wrong with a
// malformed key.
func (s *server) key(ctx context.Context, req any) (key, field string, err error) {
	var raw string
	if s.cfg.requestKey != nil {
		field = "request"
		if raw = s.cfg.requestKey(req); raw == "" {
			return "", field, nil
		}
	} else {
		field = MetadataKey
		md, _ := metadata.FromIncomingContext(ctx)
		switch values := md.Get(MetadataKey); len(values) {
		case 0:
			return "", field, nil
		case 1:
			raw = values[0]
		default:
			return "", field, fmt.Errorf("%w: more than one %s value", idempotency.ErrInvalidKey, MetadataKey)
		}
	}
	key, err = idempotency.ParseKey(raw)
	return key, field, err
}

// answered is what the handler returned in this call, and the metadata it
// set: what its caller gets.
type answered struct {
	resp            any
	err             error
	header, trailer metadata.MD
}

// run runs the handler with a stream that records the metadata it sets.
func run(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) *answered {
	rec := &recorder{method: info.FullMethod, header: metadata.MD{}, trailer: metadata.MD{}}
	resp, err := handler(grpc.NewContextWithServerTransportStream(ctx, rec), req)
	header, trailer := rec.metadata()
	return &answered{resp: resp, err: err, header: header, trailer: trailer}
}

// outcome returns the handler's answer as its record stores it.
func (a *answered) outcome() *outcome {
	o := &outcome{status: &spb.Status{}, header: a.header, trailer: a.trailer}
	if a.err != nil {
		o.status = statusOf(a.err).Proto()
	} else if a.resp != nil {
		o.response = a.resp
	}
	return o
}

// statusOf is the status the gRPC server sends for a handler's error.
func statusOf(err error) *status.Status {
	if st, ok := status.FromError(err); ok {
		return st
	}
	return status.FromContextError(err)
}

// send gives the caller the handler's own answer, as it returned it.
func (a *answered) send(ctx context.Context) (any, error) {
	setMetadata(ctx, a.header, a.trailer)
	return a.resp, a.err
}

// replay gives the caller the stored outcome, marked replayed: for an
// outcome stored without its body, its status alone, with
// AlreadyExists RESPONSE_OMITTED in place of a response.
func (o *outcome) replay(ctx context.Context) (any, error) {
	header := o.header.Copy()
	header.Set(MetadataReplayed, "true")
	if o.omitted {
		header.Set(MetadataOmitted, "true")
	}
	setMetadata(ctx, header, o.trailer)
	switch {
	case o.status.GetCode() != int32(codes.OK):
		return nil, status.ErrorProto(o.status)
	case o.omitted:
		return nil, answerResponseOmitted.err(ctx)
	}
	return o.response, nil
}

// setMetadata sets the header and trailer metadata of the call. Metadata
// that cannot be set (an interceptor in front already sent the header) is
// dropped, as it would have been for the handler.
func setMetadata(ctx context.Context, header, trailer metadata.MD) {
	_ = grpc.SetHeader(ctx, header)
	_ = grpc.SetTrailer(ctx, trailer)
}

// recorder is the server transport stream of a handler the interceptor
// runs: it records the metadata the handler sets, for the interceptor to
// store and send.
type recorder struct {
	method string

	mu              sync.Mutex
	header, trailer metadata.MD
	headerSent      bool
}

func (r *recorder) Method() string { return r.method }

// metadata returns the header and trailer metadata recorded so far.
func (r *recorder) metadata() (header, trailer metadata.MD) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.header, r.trailer
}

func (r *recorder) SetHeader(md metadata.MD) error { return r.addHeader(md, false) }

// SendHeader records md like SetHeader: the header goes out with the
// response.
func (r *recorder) SendHeader(md metadata.MD) error { return r.addHeader(md, true) }

func (r *recorder) addHeader(md metadata.MD, send bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.headerSent {
		return status.Error(codes.Internal, "idemgrpc: the header was sent already")
	}
	r.header = metadata.Join(r.header, md)
	r.headerSent = send
	return nil
}

func (r *recorder) SetTrailer(md metadata.MD) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.trailer = metadata.Join(r.trailer, md)
	return nil
}
