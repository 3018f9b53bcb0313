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
//   - Its outcome is stored: the response message, or the status of its
//     error (code, message, details), with the header and trailer metadata
//     it set (grpc.SetHeader, grpc.SendHeader, grpc.SetTrailer). An error
//     whose code WithReleaseCode releases (by default the transient ones,
//     Internal and Unavailable among them) releases the key instead, so that
//     a retry runs the handler again; a panic releases it and is re-raised.
//   - A duplicate gets the stored outcome, and "idempotent-replayed: true"
//     in its header metadata; the handler does not run.
//
// The handler's header metadata goes out with its response, grpc.SendHeader
// included: it is held until the outcome is known. Metadata set before the
// interceptor ran (by interceptors in front of it) is neither stored nor
// replaced. Requests and responses must be protocol buffer messages, and a
// replayed response's type must be registered (generated code registers
// its messages); grpc.SetSendCompressor and grpc.ClientSupportedCompressors
// are not available to the handler, as under any interceptor that wraps the
// server transport stream. Errors are answered with the statuses the
// package's README lists. Events, logs and metrics name the route with the
// full method.
//
// UnaryServerInterceptor panics when r is nil and on an option of the client
// interceptor.
func UnaryServerInterceptor(r *idempotency.Runner, opts ...Option) grpc.UnaryServerInterceptor {
	if r == nil {
		panic("idemgrpc: UnaryServerInterceptor needs a Runner")
	}
	s := &server{runner: r, cfg: newConfig("UnaryServerInterceptor", true, opts)}
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

	var run *execution // the handler's, when it ran in this call
	call := idempotency.Call{Name: info.FullMethod, Key: key, Scope: scope, Payload: payload}
	res, err := idempotency.Do(ctx, s.runner, call, func(ctx context.Context) ([]byte, error) {
		run = s.execute(ctx, req, info, handler)
		if run.released {
			return nil, errReleased
		}
		return run.stored, run.storeErr
	})
	switch {
	case run != nil && (len(res.Value) > 0 || errors.Is(err, errReleased)):
		// The handler's outcome: stored, released, or (after a store
		// failure the Runner reports) its effects stand unrecorded.
		return run.send(ctx)
	case run != nil && run.storeErr != nil:
		return nil, status.Error(codes.Internal, run.storeErr.Error())
	case err == nil && res.Replayed:
		o, err := unmarshalOutcome(res.Value)
		if err != nil {
			return nil, doAnswer(err).err(ctx)
		}
		return o.replay(ctx)
	case ctx.Err() != nil:
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return nil, doAnswer(err).err(ctx)
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

// errReleased is the error of Do's function when the handler's error
// released the key: Do returns it as it is.
var errReleased = errors.New("idemgrpc: released")

// execution is one run of the handler.
type execution struct {
	resp     any
	err      error
	rec      *recorder
	released bool   // the error's code releases the key
	stored   []byte // the outcome's stored form, when it is kept
	storeErr error  // why the outcome cannot be stored (and the key is released)
}

// execute runs the handler with a stream that records its metadata, and
// prepares its outcome for the record.
func (s *server) execute(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) *execution {
	rec := &recorder{method: info.FullMethod, header: metadata.MD{}, trailer: metadata.MD{}}
	resp, err := handler(grpc.NewContextWithServerTransportStream(ctx, rec), req)
	run := &execution{resp: resp, err: err, rec: rec}
	header, trailer := rec.metadata()
	o := &outcome{status: &spb.Status{}, header: header, trailer: trailer}
	if err != nil {
		st := statusOf(err)
		if run.released = s.cfg.release(st.Code()); run.released {
			return run
		}
		o.status = st.Proto()
	} else if resp != nil {
		m, ok := resp.(proto.Message)
		if !ok {
			run.storeErr = errors.New("idemgrpc: the response of " + info.FullMethod + " is not a protocol buffer message")
			return run
		}
		o.response = m
	}
	run.stored, run.storeErr = o.marshal()
	return run
}

// statusOf is the status the gRPC server sends for a handler's error.
func statusOf(err error) *status.Status {
	if st, ok := status.FromError(err); ok {
		return st
	}
	return status.FromContextError(err)
}

// send gives the client the handler's own outcome, as it returned it.
func (run *execution) send(ctx context.Context) (any, error) {
	header, trailer := run.rec.metadata()
	setMetadata(ctx, header, trailer)
	return run.resp, run.err
}

// replay gives the client the stored outcome, marked replayed.
func (o *outcome) replay(ctx context.Context) (any, error) {
	header := o.header.Copy()
	header.Set(MetadataReplayed, "true")
	setMetadata(ctx, header, o.trailer)
	if o.status.GetCode() != int32(codes.OK) {
		return nil, status.ErrorProto(o.status)
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
