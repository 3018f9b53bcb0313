package idemgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/go-idempotency/idempotency"
	idemgrpc "github.com/go-idempotency/idempotency/grpc"
)

// TestKeys: malformed keys are refused with InvalidArgument before the
// handler runs; a call without a key passes through, or is refused with
// WithKeyRequired.
func TestKeys(t *testing.T) {
	store := newMemstore(t)
	var runs counter
	conn := serve(t, &payments{charge: runs.charge}, intercepted(idemgrpc.UnaryServerInterceptor(idempotency.NewRunner(store))))
	bad := map[string]context.Context{
		"too long":   withKey(strings.Repeat("k", idempotency.MaxKeyLen+1)),
		"empty":      withKey(""),
		"bad quotes": withKey(`"abc`),
		"two values": metadata.AppendToOutgoingContext(withKey("a"), idemgrpc.MetadataKey, "b"),
	}
	for name, ctx := range bad {
		res := charge(ctx, conn, chargeRequest(100))
		wantAnswer(t, res.err, codes.InvalidArgument, idemgrpc.ReasonKeyInvalid)
		_, _, details := errorInfo(res.err)
		if br, ok := details[0].(*errdetails.BadRequest); !ok || br.FieldViolations[0].Field != idemgrpc.MetadataKey {
			t.Fatalf("%s: details %v, want a BadRequest on %s", name, details, idemgrpc.MetadataKey)
		}
	}
	for range 2 {
		if res := charge(context.Background(), conn, chargeRequest(100)); res.err != nil || res.replayed() {
			t.Fatalf("without a key: %v, replayed %v", res.err, res.replayed())
		}
	}
	if runs.n.Load() != 2 {
		t.Fatalf("%d runs, want the 2 calls without a key only", runs.n.Load())
	}

	required := serve(t, &payments{charge: runs.charge},
		intercepted(idemgrpc.UnaryServerInterceptor(idempotency.NewRunner(store), idemgrpc.WithKeyRequired(true))))
	res := charge(context.Background(), required, chargeRequest(100))
	wantAnswer(t, res.err, codes.InvalidArgument, idemgrpc.ReasonKeyRequired)
	if runs.n.Load() != 2 {
		t.Fatal("the handler ran without the required key")
	}
}

// TestRequestKey: with FieldKey("request_id") the key is AIP-155's field of
// the request message, and the metadata is ignored.
func TestRequestKey(t *testing.T) {
	var runs counter
	refund := func(ctx context.Context, req *errdetails.RequestInfo) (*structpb.Struct, error) {
		info, _ := idempotency.FromContext(ctx)
		runs.n.Add(1)
		return receipt("re_" + info.Key), nil
	}
	icpt := idemgrpc.UnaryServerInterceptor(idempotency.NewRunner(newMemstore(t)),
		idemgrpc.WithRequestKey(idemgrpc.FieldKey("request_id")), idemgrpc.WithMethods(refundMethod))
	conn := serve(t, &payments{refund: refund}, intercepted(icpt))
	call := func(ctx context.Context, req *errdetails.RequestInfo) result {
		var r result
		r.resp = new(structpb.Struct)
		r.err = conn.Invoke(ctx, refundMethod, req, r.resp, grpc.Header(&r.header))
		return r
	}

	id := newKey()
	first := call(withKey("ignored-1"), &errdetails.RequestInfo{RequestId: id, ServingData: "amount=100"})
	again := call(withKey("ignored-2"), &errdetails.RequestInfo{RequestId: id, ServingData: "amount=100"})
	if first.err != nil || again.err != nil || !again.replayed() || !proto.Equal(again.resp, receipt("re_"+id)) {
		t.Fatalf("first %v %v; again %v %v, replayed %v", first.resp, first.err, again.resp, again.err, again.replayed())
	}
	other := call(context.Background(), &errdetails.RequestInfo{RequestId: id, ServingData: "amount=999"})
	wantAnswer(t, other.err, codes.FailedPrecondition, idemgrpc.ReasonFingerprintMismatch)
	if res := call(withKey(id), &errdetails.RequestInfo{ServingData: "amount=100"}); res.err != nil || res.replayed() {
		t.Fatalf("without request_id: %v, replayed %v; want it to pass through", res.err, res.replayed())
	}
	if runs.n.Load() != 2 {
		t.Fatalf("%d runs, want 2", runs.n.Load())
	}
}

type userKey struct{}

// authenticate stands for the server's authentication: it puts the user
// that the bearer token names in the context.
func authenticate(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	users := map[string]string{"Bearer alice-token": "alice", "Bearer bob-token": "bob"}
	if auth := md.Get("authorization"); len(auth) == 1 && users[auth[0]] != "" {
		ctx = context.WithValue(ctx, userKey{}, users[auth[0]])
	}
	return handler(ctx, req)
}

func user(ctx context.Context) string {
	u, _ := ctx.Value(userKey{}).(string)
	return u
}

// TestScope: keys of different principals never meet, and a keyed call
// without a principal is refused, unless WithUnscopedKeys.
func TestScope(t *testing.T) {
	store := newMemstore(t)
	var runs counter
	conn := serve(t, &payments{charge: runs.charge},
		intercepted(authenticate, idemgrpc.UnaryServerInterceptor(idempotency.NewRunner(store), idemgrpc.WithScope(user))))
	key := newKey()
	as := func(token string) context.Context {
		return metadata.AppendToOutgoingContext(withKey(key), "authorization", "Bearer "+token)
	}

	alice, bob := charge(as("alice-token"), conn, chargeRequest(100)), charge(as("bob-token"), conn, chargeRequest(100))
	if alice.err != nil || bob.err != nil || bob.replayed() || proto.Equal(alice.resp, bob.resp) {
		t.Fatalf("alice %v %v, bob %v %v replayed %v; want two runs", alice.resp, alice.err, bob.resp, bob.err, bob.replayed())
	}
	if again := charge(as("alice-token"), conn, chargeRequest(100)); !again.replayed() || !proto.Equal(again.resp, alice.resp) {
		t.Fatalf("alice again: %v %v; want her replay", again.resp, again.err)
	}
	anonymous := charge(withKey(key), conn, chargeRequest(100))
	wantAnswer(t, anonymous.err, codes.PermissionDenied, idemgrpc.ReasonScopeMissing)
	if runs.n.Load() != 2 {
		t.Fatalf("%d runs, want 2", runs.n.Load())
	}

	open := serve(t, &payments{charge: runs.charge}, intercepted(authenticate,
		idemgrpc.UnaryServerInterceptor(idempotency.NewRunner(store), idemgrpc.WithScope(user), idemgrpc.WithUnscopedKeys(true))))
	if res := charge(withKey(key), open, chargeRequest(100)); res.err != nil || runs.n.Load() != 3 {
		t.Fatalf("WithUnscopedKeys: %v, %d runs", res.err, runs.n.Load())
	}
}

// TestPassThrough: streaming calls, and unary methods that WithMethods
// leaves out, run every time, key or not.
func TestPassThrough(t *testing.T) {
	var runs counter
	svc := &payments{
		charge: runs.charge,
		watch: func(req *structpb.Struct, stream grpc.ServerStream) error {
			_, ok := idempotency.FromContext(stream.Context())
			runs.n.Add(1)
			return stream.SendMsg(&structpb.Struct{Fields: map[string]*structpb.Value{"protected": structpb.NewBoolValue(ok)}})
		},
	}
	conn := serve(t, svc, intercepted(idemgrpc.UnaryServerInterceptor(idempotency.NewRunner(newMemstore(t)), idemgrpc.WithMethods(refundMethod))))
	ctx := withKey(newKey())
	for range 2 {
		if res := charge(ctx, conn, chargeRequest(100)); res.err != nil || res.replayed() {
			t.Fatalf("Charge outside WithMethods: %v, replayed %v", res.err, res.replayed())
		}
		stream, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, watchMethod)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.SendMsg(chargeRequest(100)); err != nil {
			t.Fatal(err)
		}
		stream.CloseSend()
		msg := new(structpb.Struct)
		if err := stream.RecvMsg(msg); err != nil || msg.Fields["protected"].GetBoolValue() {
			t.Fatalf("Watch: %v %v", msg, err)
		}
		if err := stream.RecvMsg(msg); err != io.EOF {
			t.Fatalf("Watch end: %v", err)
		}
		if header, _ := stream.Header(); len(header.Get(idemgrpc.MetadataReplayed)) > 0 {
			t.Fatal("a streaming call was replayed")
		}
	}
	if runs.n.Load() != 4 {
		t.Fatalf("%d runs, want 4: two calls of each method", runs.n.Load())
	}
}

// TestHandlerContext: the handler's context holds the call's Info and its
// method, and the observer's events name the full method as the route.
func TestHandlerContext(t *testing.T) {
	var (
		mu     sync.Mutex
		events []idempotency.Event
	)
	observe := func(_ context.Context, e idempotency.Event) {
		mu.Lock()
		defer mu.Unlock()
		if e.Final {
			events = append(events, e)
		}
	}
	r := idempotency.NewRunner(newMemstore(t), idempotency.WithObserver(observe))
	type seen struct {
		info   idempotency.Info
		method string
	}
	handled := make(chan seen, 1)
	conn := serve(t, &payments{charge: func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		var s seen
		s.info, _ = idempotency.FromContext(ctx)
		s.method, _ = grpc.Method(ctx)
		handled <- s
		return receipt("ch_1"), nil
	}}, intercepted(authenticate, idemgrpc.UnaryServerInterceptor(r, idemgrpc.WithScope(user))))

	key := newKey()
	ctx := metadata.AppendToOutgoingContext(withKey(key), "authorization", "Bearer alice-token")
	for range 2 {
		if res := charge(ctx, conn, chargeRequest(100)); res.err != nil {
			t.Fatal(res.err)
		}
	}
	if s := <-handled; s.info.Key != key || s.info.StorageKey != idempotency.StorageKey("alice", key) || s.info.Epoch != 1 || s.method != chargeMethod {
		t.Fatalf("the handler saw %+v and method %q", s.info, s.method)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 2 || events[0].Kind != idempotency.EventExecuted || events[1].Kind != idempotency.EventReplayed {
		t.Fatalf("final events %+v, want executed then replayed", events)
	}
	for _, e := range events {
		if e.Route != chargeMethod {
			t.Fatalf("event %v has route %q, want the full method %q", e.Kind, e.Route, chargeMethod)
		}
	}
}

// failingExtends is a Store whose heartbeat cannot reach it.
type failingExtends struct{ idempotency.Store }

func (failingExtends) Extend(context.Context, string, string, time.Duration) error {
	return errUnreachable
}

// TestLeaseLost: when no extend succeeds, the handler's context is
// cancelled, with a cause wrapping ErrLeaseLost, before another call could
// take the record over; the handler's cancelled answer releases the key.
func TestLeaseLost(t *testing.T) {
	const lease = 300 * time.Millisecond
	store := failingExtends{newMemstore(t)}
	r := idempotency.NewRunner(store, idempotency.WithLease(lease))
	causes := make(chan error, 1)
	var runs counter
	conn := serve(t, &payments{charge: func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		if runs.n.Add(1) > 1 {
			return receipt("ch_2"), nil
		}
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return nil, status.FromContextError(ctx.Err()).Err()
	}}, intercepted(idemgrpc.UnaryServerInterceptor(r)))

	ctx := withKey(newKey())
	start := time.Now()
	res := charge(ctx, conn, chargeRequest(100))
	if cause := <-causes; !errors.Is(cause, idempotency.ErrLeaseLost) || time.Since(start) > 2*lease {
		t.Fatalf("cancelled after %v with cause %v, want ErrLeaseLost within the lease", time.Since(start), cause)
	}
	if status.Code(res.err) != codes.Canceled {
		t.Fatalf("first call: %v, want the handler's Canceled", res.err)
	}
	if again := charge(ctx, conn, chargeRequest(100)); again.err != nil || again.replayed() {
		t.Fatalf("retry: %v, replayed %v; want a run: the key was released", again.err, again.replayed())
	}
}

// failingStore is a Store whose Acquire fails with err.
type failingStore struct {
	idempotency.Store
	err error
}

func (s failingStore) Acquire(context.Context, idempotency.AcquireRequest) (idempotency.Acquisition, error) {
	return idempotency.Acquisition{}, s.err
}

// TestStoreErrors: what a caller gets when the store fails before the
// handler ran, which then does not run.
func TestStoreErrors(t *testing.T) {
	cases := []struct {
		err    error
		code   codes.Code
		reason string
		retry  bool
	}{
		{errUnreachable, codes.Unavailable, idemgrpc.ReasonStoreUnavailable, true},
		{idempotency.ErrStoreFull, codes.ResourceExhausted, idemgrpc.ReasonStoreFull, true},
		{idempotency.ErrCorruptRecord, codes.DataLoss, idemgrpc.ReasonRecordUnreadable, false},
	}
	store := newMemstore(t)
	for _, c := range cases {
		var runs counter
		r := idempotency.NewRunner(failingStore{store, c.err})
		conn := serve(t, &payments{charge: runs.charge}, intercepted(idemgrpc.UnaryServerInterceptor(r)))
		res := charge(withKey(newKey()), conn, chargeRequest(100))
		wantAnswer(t, res.err, c.code, c.reason)
		if _, retry, _ := errorInfo(res.err); (retry == time.Second) != c.retry || runs.n.Load() != 0 {
			t.Fatalf("%v: RetryInfo %v, %d runs", c.err, retry, runs.n.Load())
		}
	}
}

// TestResponseOmitted: a response over the Runner's cap reaches the first
// caller whole; duplicates are told the call ran, and it never runs again.
func TestResponseOmitted(t *testing.T) {
	var runs counter
	r := idempotency.NewRunner(newMemstore(t), idempotency.WithMaxResponseBody(16))
	conn := serve(t, &payments{charge: runs.charge}, intercepted(idemgrpc.UnaryServerInterceptor(r)))
	ctx := withKey(newKey())
	if first := charge(ctx, conn, chargeRequest(100)); first.err != nil || !proto.Equal(first.resp, receipt("ch_1")) {
		t.Fatalf("first: %v %v", first.resp, first.err)
	}
	dup := charge(ctx, conn, chargeRequest(100))
	wantAnswer(t, dup.err, codes.AlreadyExists, idemgrpc.ReasonResponseOmitted)
	if runs.n.Load() != 1 {
		t.Fatalf("%d runs, want 1", runs.n.Load())
	}
}

// TestPanicReleases: a handler's panic releases the key and reaches the
// interceptor in front.
func TestPanicReleases(t *testing.T) {
	var runs counter
	conn := serve(t, &payments{charge: func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		if runs.n.Add(1) == 1 {
			panic("boom")
		}
		return receipt("ch_2"), nil
	}}, intercepted(recoverPanics, idemgrpc.UnaryServerInterceptor(idempotency.NewRunner(newMemstore(t)))))
	ctx := withKey(newKey())
	if res := charge(ctx, conn, chargeRequest(100)); status.Code(res.err) != codes.Internal || !strings.Contains(res.err.Error(), "boom") {
		t.Fatalf("panic: %v, want it re-raised to the recovery interceptor", res.err)
	}
	if res := charge(ctx, conn, chargeRequest(100)); res.err != nil || res.replayed() || runs.n.Load() != 2 {
		t.Fatalf("after the panic: %v, replayed %v, %d runs", res.err, res.replayed(), runs.n.Load())
	}
}

// TestOptions: the compiler keeps each option to the interceptor it
// applies to: the server interceptor's options are ServerOptions and no
// ClientOptions, the client interceptor's the reverse, and WithMethods,
// the one option of both, both.
func TestOptions(t *testing.T) {
	serverOption := reflect.TypeFor[idemgrpc.ServerOption]()
	clientOption := reflect.TypeFor[idemgrpc.ClientOption]()
	for _, c := range []struct {
		name           string
		opt            any
		server, client bool
	}{
		{"WithMethods", idemgrpc.WithMethods(chargeMethod), true, true},
		{"WithRequestKey", idemgrpc.WithRequestKey(idemgrpc.FieldKey("request_id")), true, false},
		{"WithScope", idemgrpc.WithScope(user), true, false},
		{"WithUnscopedKeys", idemgrpc.WithUnscopedKeys(true), true, false},
		{"WithKeyRequired", idemgrpc.WithKeyRequired(true), true, false},
		{"WithReleaseCode", idemgrpc.WithReleaseCode(idemgrpc.DefaultReleaseCode), true, false},
		{"WithMaxAttempts", idemgrpc.WithMaxAttempts(2), false, true},
		{"WithBackoff", idemgrpc.WithBackoff(time.Millisecond, time.Second), false, true},
		{"WithMaxElapsed", idemgrpc.WithMaxElapsed(time.Second), false, true},
		{"WithRetryCodes", idemgrpc.WithRetryCodes(codes.Unavailable), false, true},
	} {
		typ := reflect.TypeOf(c.opt)
		if got := typ.Implements(serverOption); got != c.server {
			t.Errorf("%s (%v) is a ServerOption: %v, want %v", c.name, typ, got, c.server)
		}
		if got := typ.Implements(clientOption); got != c.client {
			t.Errorf("%s (%v) is a ClientOption: %v, want %v", c.name, typ, got, c.client)
		}
	}
}

// TestMisconfiguration: constructors panic on the values no type rules
// out.
func TestMisconfiguration(t *testing.T) {
	r := idempotency.NewRunner(newMemstore(t))
	cases := map[string]func(){
		"nil Runner":           func() { idemgrpc.UnaryServerInterceptor(nil) },
		"nil server option":    func() { idemgrpc.UnaryServerInterceptor(r, nil) },
		"nil client option":    func() { idemgrpc.UnaryClientInterceptor(nil) },
		"nil scope":            func() { idemgrpc.WithScope(nil) },
		"short method name":    func() { idemgrpc.WithMethods("Charge") },
		"no retry code":        func() { idemgrpc.WithRetryCodes() },
		"OK as a retry code":   func() { idemgrpc.WithRetryCodes(codes.OK) },
		"backoff out of order": func() { idemgrpc.WithBackoff(time.Second, time.Millisecond) },
	}
	for name, construct := range cases {
		func() {
			defer func() {
				if v := recover(); v == nil || !strings.HasPrefix(v.(string), "idemgrpc: ") {
					t.Errorf("%s: recovered %v, want an idemgrpc panic", name, v)
				}
			}()
			construct()
		}()
	}
}

// failingCompletes is a Store that cannot record a completion.
type failingCompletes struct{ idempotency.Store }

func (failingCompletes) Complete(context.Context, string, string, *idempotency.Response, time.Duration) error {
	return errUnreachable
}

// TestCompleteFails: when the outcome cannot be recorded after the handler
// ran, the caller still gets the handler's response (its effects
// happened), and the store error is reported to the observer.
func TestCompleteFails(t *testing.T) {
	storeErrors := make(chan error, 8)
	r := idempotency.NewRunner(failingCompletes{newMemstore(t)}, idempotency.WithObserver(func(_ context.Context, e idempotency.Event) {
		if e.Kind == idempotency.EventStoreError {
			storeErrors <- e.Err
		}
	}))
	var runs counter
	conn := serve(t, &payments{charge: runs.charge}, intercepted(idemgrpc.UnaryServerInterceptor(r)))
	res := charge(withKey(newKey()), conn, chargeRequest(100))
	if res.err != nil || !proto.Equal(res.resp, receipt("ch_1")) {
		t.Fatalf("%v %v, want the handler's response", res.resp, res.err)
	}
	if err := <-storeErrors; !errors.Is(err, errUnreachable) {
		t.Fatalf("observed %v, want the failed completion", err)
	}
}

// TestNotProto: a keyed request that is not a protocol buffer message (a
// server with another codec) is refused rather than run unprotected.
func TestNotProto(t *testing.T) {
	icpt := idemgrpc.UnaryServerInterceptor(idempotency.NewRunner(newMemstore(t)))
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(idemgrpc.MetadataKey, newKey()))
	ran := false
	_, err := icpt(ctx, struct{ Amount int }{100}, &grpc.UnaryServerInfo{FullMethod: chargeMethod}, func(context.Context, any) (any, error) {
		ran = true
		return nil, nil
	})
	if status.Code(err) != codes.Internal || ran {
		t.Fatalf("%v, ran %v; want Internal and no run", err, ran)
	}
}

// TestFailOpen: with WithFailOpen, an unreachable store runs the handler
// unprotected, and its caller gets the handler's answer.
func TestFailOpen(t *testing.T) {
	var runs counter
	r := idempotency.NewRunner(failingStore{newMemstore(t), errUnreachable}, idempotency.WithFailOpen(true))
	conn := serve(t, &payments{charge: runs.charge}, intercepted(idemgrpc.UnaryServerInterceptor(r)))
	ctx := withKey(newKey())
	for i := range 2 {
		res := charge(ctx, conn, chargeRequest(100))
		if res.err != nil || res.replayed() || !proto.Equal(res.resp, receipt(fmt.Sprint("ch_", i+1))) {
			t.Fatalf("call %d: %v %v, replayed %v; want the handler's answer", i+1, res.resp, res.err, res.replayed())
		}
	}
}

// TestCanceled: a call whose context ended before its record was taken
// gets its context's status, and the handler does not run.
func TestCanceled(t *testing.T) {
	icpt := idemgrpc.UnaryServerInterceptor(idempotency.NewRunner(newMemstore(t)))
	ctx, cancel := context.WithCancel(metadata.NewIncomingContext(context.Background(), metadata.Pairs(idemgrpc.MetadataKey, newKey())))
	cancel()
	ran := false
	_, err := icpt(ctx, chargeRequest(100), &grpc.UnaryServerInfo{FullMethod: chargeMethod}, func(context.Context, any) (any, error) {
		ran = true
		return nil, nil
	})
	if status.Code(err) != codes.Canceled || ran {
		t.Fatalf("%v, ran %v; want Canceled and no run", err, ran)
	}
}
