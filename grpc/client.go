package idemgrpc

import (
	"context"
	"math/rand/v2"
	"reflect"
	"time"

	"github.com/google/uuid"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
)

// UnaryClientInterceptor returns an interceptor that gives each unary call
// an idempotency key and retries it with that same key. It is the client
// package's Transport for gRPC:
//
//   - a call whose outgoing metadata has no "idempotency-key" gets a fresh
//     random (version 4) UUID, one per logical call: every attempt the
//     interceptor makes, and every retry a gRPC retry policy makes beneath
//     it, carries the same key, so the server runs the handler once and
//     replays its outcome to the others; a key the caller set
//     (metadata.AppendToOutgoingContext) is kept;
//   - the request is marshalled once, deterministically, and every attempt
//     sends those same bytes, so that a retry is the same request to the
//     server, never refused as another one under its key: Go writes the
//     entries of a map in random order, and a server keeps the fields it
//     does not know (those of a newer schema) in the order they came. A
//     call whose options choose a codec or a content-subtype
//     (grpc.ForceCodec, grpc.ForceCodecV2, grpc.CallContentSubtype) is
//     marshalled by that codec on each attempt instead;
//   - a call that fails with a code of WithRetryCodes (Unavailable) is
//     retried, unless the failure is a replay (idempotent-replayed: true),
//     which is the call's stored outcome;
//   - it waits between attempts as WithBackoff says, or for the error's
//     google.rpc.RetryInfo delay when that is longer, gives up when
//     WithMaxAttempts or WithMaxElapsed would be exceeded or the wait would
//     outlast the context's deadline (returning the last error), and
//     returns the context's status at once when the context ends during a
//     wait.
//
// Combine it with a gRPC retry policy, or let one of them retry
// (WithMaxAttempts(1) keeps the keys and leaves the retries to the policy):
// both together multiply the attempts. Only send keys to servers that
// honour them, such as one using UnaryServerInterceptor: a server that
// ignores the key runs every attempt. A key in the request message
// (AIP-155's request_id) is the caller's to set, once per logical call.
func UnaryClientInterceptor(opts ...ClientOption) grpc.UnaryClientInterceptor {
	c := &retrier{
		cfg:    newConfig("UnaryClientInterceptor", opts, ClientOption.applyClient),
		now:    time.Now,
		sleep:  sleep,
		jitter: fullJitter,
	}
	return c.intercept
}

type retrier struct {
	cfg config
	// Seams for tests; set by UnaryClientInterceptor, never changed after.
	now    func() time.Time
	sleep  func(ctx context.Context, d time.Duration) error
	jitter func(ceiling time.Duration) time.Duration // uniform in [0, ceiling]
}

func (c *retrier) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if !c.cfg.covers(method) {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	if md, _ := metadata.FromOutgoingContext(ctx); len(md.Get(MetadataKey)) == 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, MetadataKey, uuid.NewString())
	}
	var header metadata.MD
	opts = append(opts[:len(opts):len(opts)], grpc.Header(&header))
	if codec := encodeOnce(req, opts); codec != nil {
		opts = append(opts, grpc.ForceCodecV2(codec))
	}
	start := c.now()
	for attempt := 1; ; attempt++ {
		header = nil
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err == nil || ctx.Err() != nil || !c.cfg.retryCodes[status.Code(err)] ||
			len(header.Get(MetadataReplayed)) > 0 || attempt >= c.cfg.maxAttempts {
			return err
		}
		delay := max(c.jitter(backoffCeiling(c.cfg.baseDelay, c.cfg.maxDelay, attempt)), retryDelay(err))
		now := c.now()
		if now.Add(delay).Sub(start) > c.cfg.maxElapsed {
			return err
		}
		if dl, ok := ctx.Deadline(); ok && !now.Add(delay).Before(dl) {
			return err
		}
		if err := c.sleep(ctx, delay); err != nil {
			return status.FromContextError(err).Err()
		}
	}
}

// encodedCodec is the codec of a call whose request the client
// interceptor marshalled once: it gives every attempt those bytes, and
// leaves everything else (the response) to gRPC's proto codec, whose name
// it has.
type encodedCodec struct {
	encoding.CodecV2
	req  any
	data []byte
}

func (c *encodedCodec) Marshal(v any) (mem.BufferSlice, error) {
	if v == c.req {
		// A SliceBuffer is never recycled: each attempt can send it.
		return mem.BufferSlice{mem.SliceBuffer(c.data)}, nil
	}
	return c.CodecV2.Marshal(v)
}

// encodeOnce returns the codec that sends req as it is marshalled now, or
// nil to leave the call to its own codec: the call's options choose one
// (or a content-subtype, which selects one), req is not a protocol buffer
// message gRPC's proto codec would marshal, or it cannot be marshalled (the
// call then fails as it would have).
func encodeOnce(req any, opts []grpc.CallOption) encoding.CodecV2 {
	for _, o := range opts {
		switch o.(type) {
		case grpc.ForceCodecCallOption, grpc.ForceCodecV2CallOption, grpc.CustomCodecCallOption, grpc.ContentSubtypeCallOption:
			return nil
		}
	}
	var m proto.Message
	switch v := req.(type) {
	case proto.Message:
		m = v
	case protoadapt.MessageV1:
		m = protoadapt.MessageV2Of(v)
	default:
		return nil
	}
	// The codec recognizes the request by ==, which panics on a type that
	// is not comparable; messages are pointers, but nothing requires it.
	if !reflect.TypeOf(req).Comparable() {
		return nil
	}
	codec := encoding.GetCodecV2(grpcproto.Name)
	data, err := deterministic.Marshal(m)
	if codec == nil || err != nil {
		return nil
	}
	return &encodedCodec{CodecV2: codec, req: req, data: data}
}

// retryDelay returns the google.rpc.RetryInfo delay of err, or 0.
func retryDelay(err error) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay().IsValid() {
			return max(ri.GetRetryDelay().AsDuration(), 0)
		}
	}
	return 0
}

// backoffCeiling is the ceiling of the wait before retry n: base·2^(n-1),
// at most max.
func backoffCeiling(base, max time.Duration, n int) time.Duration {
	d := base
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	return min(d, max)
}

func fullJitter(ceiling time.Duration) time.Duration {
	if ceiling <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(ceiling) + 1))
}

// sleep waits for d, or until ctx ends, whose error it returns.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
