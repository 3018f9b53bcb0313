package idemgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/go-idempotency/idempotency"
	idemgrpc "github.com/go-idempotency/idempotency/grpc"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/go-idempotency/idempotency/pgstore"
	"github.com/go-idempotency/idempotency/redisstore"
)

// The test service, payments.v1.Payments, is written without generated
// code: Charge takes and returns a structpb.Struct, Refund carries AIP-155's
// request_id in an errdetails.RequestInfo, and Watch streams.
const (
	service      = "payments.v1.Payments"
	chargeMethod = "/payments.v1.Payments/Charge"
	refundMethod = "/payments.v1.Payments/Refund"
	watchMethod  = "/payments.v1.Payments/Watch"
)

type payments struct {
	charge func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error)
	refund func(ctx context.Context, req *errdetails.RequestInfo) (*structpb.Struct, error)
	watch  func(req *structpb.Struct, stream grpc.ServerStream) error
}

func (p *payments) desc() *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: service,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{
			unary("Charge", func() *structpb.Struct { return new(structpb.Struct) }, p.charge),
			unary("Refund", func() *errdetails.RequestInfo { return new(errdetails.RequestInfo) }, p.refund),
		},
		Streams: []grpc.StreamDesc{{StreamName: "Watch", ServerStreams: true,
			Handler: func(_ any, stream grpc.ServerStream) error {
				req := new(structpb.Struct)
				if err := stream.RecvMsg(req); err != nil {
					return err
				}
				return p.watch(req, stream)
			}}},
	}
}

// unary is the method description generated code would hold for a unary
// method of the test service.
func unary[Req proto.Message](name string, newReq func() Req, h func(context.Context, Req) (*structpb.Struct, error)) grpc.MethodDesc {
	info := &grpc.UnaryServerInfo{FullMethod: "/" + service + "/" + name}
	return grpc.MethodDesc{MethodName: name,
		Handler: func(_ any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			req := newReq()
			if err := dec(req); err != nil {
				return nil, err
			}
			run := func(ctx context.Context, req any) (any, error) { return h(ctx, req.(Req)) }
			if interceptor == nil {
				return run(ctx, req)
			}
			return interceptor(ctx, req, info, run)
		}}
}

// serve starts a gRPC server for svc on a loopback port, stopped when t
// ends, and returns a client connection to it.
func serve(t testing.TB, svc *payments, serverOpts []grpc.ServerOption, dialOpts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(serverOpts...)
	srv.RegisterService(svc.desc(), svc)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return dial(t, lis.Addr().String(), dialOpts...)
}

func dial(t testing.TB, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// intercepted returns the server options of a server whose unary calls go
// through interceptors, in order.
func intercepted(interceptors ...grpc.UnaryServerInterceptor) []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(interceptors...)}
}

// withKey returns a context whose calls carry key.
func withKey(key string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), idemgrpc.MetadataKey, key)
}

func chargeRequest(amount float64) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		"amount":   structpb.NewNumberValue(amount),
		"currency": structpb.NewStringValue("EUR"),
	}}
}

// receipt is a response with one field: its wire form is the same bytes
// however the map is iterated.
func receipt(id string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{"charge_id": structpb.NewStringValue(id)}}
}

// result is what a client got from one call.
type result struct {
	resp    *structpb.Struct
	err     error
	header  metadata.MD
	trailer metadata.MD
}

func (r result) replayed() bool { return len(r.header.Get(idemgrpc.MetadataReplayed)) > 0 }

// charge calls Charge on conn with ctx.
func charge(ctx context.Context, conn *grpc.ClientConn, req *structpb.Struct, opts ...grpc.CallOption) result {
	var r result
	r.resp = new(structpb.Struct)
	opts = append(opts, grpc.Header(&r.header), grpc.Trailer(&r.trailer))
	r.err = conn.Invoke(ctx, chargeMethod, req, r.resp, opts...)
	return r
}

// counter counts the runs of a handler.
type counter struct{ n atomic.Int64 }

// charge is a Charge handler that answers a receipt numbered by its run.
func (c *counter) charge(ctx context.Context, _ *structpb.Struct) (*structpb.Struct, error) {
	n := c.n.Add(1)
	return receipt(fmt.Sprint("ch_", n)), nil
}

// gate is a Charge handler whose calls wait until the test opens it.
type gate struct {
	counter
	entered chan struct{} // closed when the first call enters
	open    chan struct{} // closed by the test to let the calls run
	once    sync.Once
}

func newGate() *gate { return &gate{entered: make(chan struct{}), open: make(chan struct{})} }

func (g *gate) charge(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
	g.once.Do(func() { close(g.entered) })
	<-g.open
	return g.counter.charge(ctx, req)
}

// errorInfo returns the google.rpc.ErrorInfo, RetryInfo delay (or -1) and
// the other details of err's status.
func errorInfo(err error) (info *errdetails.ErrorInfo, retry time.Duration, others []any) {
	retry = -1
	for _, d := range status.Convert(err).Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.RetryInfo:
			retry = d.GetRetryDelay().AsDuration()
		default:
			others = append(others, d)
		}
	}
	return info, retry, others
}

// wantAnswer fails t unless err is a status with code and an ErrorInfo of
// the package's domain with reason.
func wantAnswer(t testing.TB, err error, code codes.Code, reason string) {
	t.Helper()
	info, _, _ := errorInfo(err)
	if status.Code(err) != code || info.GetReason() != reason || info.GetDomain() != idemgrpc.ErrorDomain {
		t.Fatalf("got %v (ErrorInfo %v), want %v with reason %s", err, info, code, reason)
	}
}

// storeKinds are the stores every behaviour is checked on.
var storeKinds = []struct {
	name string
	open func(t *testing.T) idempotency.Store
}{
	{"memstore", func(t *testing.T) idempotency.Store {
		s := memstore.New()
		t.Cleanup(func() { s.Close() })
		return s
	}},
	{"redis", func(t *testing.T) idempotency.Store {
		c := redis.NewClient(&redis.Options{Addr: redistest.Addr(t), ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		s := redisstore.New(c, redisstore.WithPrefix(redistest.Prefix()))
		t.Cleanup(func() { s.Close() })
		return s
	}},
	{"postgres", openPostgres},
}

func openPostgres(t *testing.T) idempotency.Store {
	return openPgstore(t, pgtest.Pool(t))
}

func newMemstore(t *testing.T) idempotency.Store { return storeKinds[0].open(t) }

// openPgstore returns a pgstore on pool, its table created, closed when t
// ends.
func openPgstore(t *testing.T, pool *pgxpool.Pool) *pgstore.Store {
	t.Helper()
	if err := pgstore.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	s := pgstore.New(pool)
	t.Cleanup(func() { s.Close() })
	return s
}

// arrivals is a Store that closes all once want Acquires have been made.
type arrivals struct {
	idempotency.Store
	want int64
	n    atomic.Int64
	all  chan struct{}
}

func arrive(s idempotency.Store, want int64) *arrivals {
	return &arrivals{Store: s, want: want, all: make(chan struct{})}
}

func (s *arrivals) Acquire(ctx context.Context, req idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	a, err := s.Store.Acquire(ctx, req)
	if s.n.Add(1) == s.want {
		close(s.all)
	}
	return a, err
}

// attemptLog is a server interceptor that records the key of every
// attempt. With loseFirst, in front of the idempotency interceptor, it
// loses the answer to the first attempt of each key: the handler ran, and
// the client gets Unavailable, as when a connection breaks after the
// server's work.
type attemptLog struct {
	loseFirst bool

	mu   sync.Mutex
	keys []string
}

func (l *attemptLog) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	key := strings.Join(md.Get(idemgrpc.MetadataKey), ",")
	l.mu.Lock()
	first := !slices.Contains(l.keys, key)
	l.keys = append(l.keys, key)
	l.mu.Unlock()
	resp, err := handler(ctx, req)
	if first && l.loseFirst {
		return nil, status.Error(codes.Unavailable, "connection lost after the handler ran")
	}
	return resp, err
}

func (l *attemptLog) attempts() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.keys)
}

// recordingCodec is the client's proto codec, keeping the wire bytes of the
// last message it decoded.
type recordingCodec struct {
	encoding.CodecV2
	last []byte
}

func newRecordingCodec() *recordingCodec {
	return &recordingCodec{CodecV2: encoding.GetCodecV2("proto")}
}

func (c *recordingCodec) Unmarshal(data mem.BufferSlice, v any) error {
	c.last = data.Materialize()
	return c.CodecV2.Unmarshal(data, v)
}

// recoverPanics is a server interceptor that answers a handler's panic
// with Internal, as a recovery interceptor in production would.
func recoverPanics(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if v := recover(); v != nil {
			resp, err = nil, status.Errorf(codes.Internal, "panic: %v", v)
		}
	}()
	return handler(ctx, req)
}

func newKey() string { return uuid.NewString() }

var errUnreachable = errors.New("store unreachable")
