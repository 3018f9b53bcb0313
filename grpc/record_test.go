package idemgrpc_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/go-idempotency/idempotency"
	idemgrpc "github.com/go-idempotency/idempotency/grpc"
	"github.com/go-idempotency/idempotency/internal/redistest"
	"github.com/go-idempotency/idempotency/memstore"
	"github.com/go-idempotency/idempotency/redisstore"
)

// cutUTF8 is an error text cut in the middle of a multi-byte character:
// "café" without the second byte of its é, which is invalid UTF-8.
const cutUTF8 = "card declined: caf\xc3"

func (r result) omitted() bool { return len(r.header.Get(idemgrpc.MetadataOmitted)) > 0 }

// message returns the message of err's status, as the client got it.
func message(err error) string { return status.Convert(err).Message() }

// testInvalidUTF8Status: a status whose message is invalid UTF-8 cannot be
// marshalled into the stored body; it is stored marked omitted, never
// released: the handler runs once, and the retry gets the same code and
// message bytes the first caller got.
func testInvalidUTF8Status(t *testing.T, store idempotency.Store) {
	var runs counter
	conn := serve(t, &payments{charge: func(ctx context.Context, _ *structpb.Struct) (*structpb.Struct, error) {
		runs.n.Add(1)
		return nil, status.Error(codes.FailedPrecondition, cutUTF8)
	}}, intercepted(idemgrpc.UnaryServerInterceptor(idempotency.NewRunner(store))))

	ctx := withKey(newKey())
	first := charge(ctx, conn, chargeRequest(100))
	retry := charge(ctx, conn, chargeRequest(100))
	if status.Code(first.err) != codes.FailedPrecondition || !strings.HasPrefix(message(first.err), "card declined: caf") {
		t.Fatalf("first call: %v, want the handler's FailedPrecondition", first.err)
	}
	if runs.n.Load() != 1 {
		t.Fatalf("%d runs, want 1: the outcome is stored, not released (first call: %v; retry: %v)", runs.n.Load(), first.err, retry.err)
	}
	if status.Code(retry.err) != codes.FailedPrecondition || message(retry.err) != message(first.err) || !retry.replayed() || !retry.omitted() {
		t.Fatalf("retry: %v (message %q), replayed %v, omitted %v; want the first call's code and message %q, replayed",
			retry.err, message(retry.err), retry.replayed(), retry.omitted(), message(first.err))
	}
}

// testInvalidUTF8Response: a response with invalid UTF-8 in a string field
// cannot be marshalled, by the record or by gRPC: the first caller gets
// gRPC's Internal, the handler runs once, and the retry is told the call
// ran (AlreadyExists RESPONSE_OMITTED).
func testInvalidUTF8Response(t *testing.T, store idempotency.Store) {
	var runs counter
	conn := serve(t, &payments{charge: func(ctx context.Context, _ *structpb.Struct) (*structpb.Struct, error) {
		runs.n.Add(1)
		return receipt(cutUTF8), nil
	}}, intercepted(idemgrpc.UnaryServerInterceptor(idempotency.NewRunner(store))))

	ctx := withKey(newKey())
	first := charge(ctx, conn, chargeRequest(100))
	retry := charge(ctx, conn, chargeRequest(100))
	if status.Code(first.err) != codes.Internal {
		t.Fatalf("first call: %v, want gRPC's Internal: it cannot marshal the response", first.err)
	}
	if runs.n.Load() != 1 {
		t.Fatalf("%d runs, want 1: the outcome is stored, not released (retry: %v)", runs.n.Load(), retry.err)
	}
	wantAnswer(t, retry.err, codes.AlreadyExists, idemgrpc.ReasonResponseOmitted)
	if !retry.replayed() || !retry.omitted() {
		t.Fatalf("retry: replayed %v, omitted %v; want both", retry.replayed(), retry.omitted())
	}
}

// decline is a FailedPrecondition with a detail of size bytes, so that its
// stored body is at least that large.
func decline(t testing.TB, msg string, size int) *status.Status {
	t.Helper()
	st, err := status.New(codes.FailedPrecondition, msg).WithDetails(
		&errdetails.ErrorInfo{Reason: "CARD_DECLINED", Domain: "payments.example.com"},
		&errdetails.LocalizedMessage{Locale: "en-GB", Message: strings.Repeat("declined ", size/9+1)})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// declining returns a Charge handler that answers st, counting its runs;
// with entered, its first run signals it entered, then waits for open to
// be closed.
func declining(runs *counter, st *status.Status, entered chan<- struct{}, open <-chan struct{}) func(context.Context, *structpb.Struct) (*structpb.Struct, error) {
	return func(ctx context.Context, _ *structpb.Struct) (*structpb.Struct, error) {
		if runs.n.Add(1) == 1 && entered != nil {
			entered <- struct{}{}
			<-open
		}
		grpc.SetTrailer(ctx, metadata.Pairs("decline-id", "dc_1"))
		return nil, st.Err()
	}
}

// wantDeclineReplayed fails t unless the handler ran once, first got its
// decline whole, and retry got its code, and msg, replayed as omitted.
func wantDeclineReplayed(t testing.TB, runs *counter, st *status.Status, first, retry result, msg string) {
	t.Helper()
	if runs.n.Load() != 1 {
		t.Fatalf("%d runs, want 1", runs.n.Load())
	}
	if got := status.Convert(first.err); got.Code() != st.Code() || got.Message() != st.Message() || len(got.Details()) != 2 || first.replayed() {
		t.Fatalf("first call: %v with %d details, replayed %v; want the handler's decline whole", first.err, len(got.Details()), first.replayed())
	}
	if status.Code(retry.err) != codes.FailedPrecondition || message(retry.err) != msg || !retry.replayed() || !retry.omitted() {
		t.Fatalf("retry: %v, replayed %v, omitted %v; want FailedPrecondition %q replayed, omitted",
			retry.err, retry.replayed(), retry.omitted(), msg)
	}
}

// testOmittedDecline: a decline whose stored body is over the Runner's
// WithMaxResponseBody is replayed with its code and message, which the
// record keeps outside the body; over WithMaxResponseHeader too, with its
// code, from the record's status, and a message saying the original's was
// not stored. Never as AlreadyExists, "the call ran".
func testOmittedDecline(t *testing.T, store idempotency.Store) {
	t.Run("Body", func(t *testing.T) {
		var runs counter
		st := decline(t, "card declined: insufficient funds", 256)
		conn := serve(t, &payments{charge: declining(&runs, st, nil, nil)},
			intercepted(idemgrpc.UnaryServerInterceptor(idempotency.NewRunner(store, idempotency.WithMaxResponseBody(64)))))
		ctx := withKey(newKey())
		first := charge(ctx, conn, chargeRequest(100))
		retry := charge(ctx, conn, chargeRequest(100))
		wantDeclineReplayed(t, &runs, st, first, retry, st.Message())
	})
	t.Run("Header", func(t *testing.T) {
		var runs counter
		st := decline(t, "card declined: insufficient funds", 256)
		r := idempotency.NewRunner(store, idempotency.WithMaxResponseBody(64), idempotency.WithMaxResponseHeader(8))
		conn := serve(t, &payments{charge: declining(&runs, st, nil, nil)}, intercepted(idemgrpc.UnaryServerInterceptor(r)))
		ctx := withKey(newKey())
		first := charge(ctx, conn, chargeRequest(100))
		retry := charge(ctx, conn, chargeRequest(100))
		wantDeclineReplayed(t, &runs, st, first, retry, message(retry.err))
		if !strings.Contains(message(retry.err), "FailedPrecondition; its message was not stored") {
			t.Fatalf("retry's message %q, want one saying the original's was not stored", message(retry.err))
		}
	})
}

// TestOmittedDeclineMemstoreBound: memstore near its byte bound completes
// a record with its status alone; the decline is replayed as
// FailedPrecondition, with a message saying the original's was not stored.
func TestOmittedDeclineMemstoreBound(t *testing.T) {
	store := memstore.New(memstore.WithMaxBytes(64 << 10))
	t.Cleanup(func() { store.Close() })
	var runs counter
	// The message is longer than the room a record leaves, so that the
	// headers that carry it do not fit either.
	st := decline(t, "card declined: "+strings.Repeat("insufficient funds; ", 40), 1024)
	entered, open := make(chan struct{}), make(chan struct{})
	conn := serve(t, &payments{charge: declining(&runs, st, entered, open)},
		intercepted(idemgrpc.UnaryServerInterceptor(idempotency.NewRunner(store))))

	ctx := withKey(newKey())
	done := make(chan result, 1)
	go func() { done <- charge(ctx, conn, chargeRequest(100)) }()
	<-entered
	fill(t, store)
	close(open)
	first := <-done
	retry := charge(ctx, conn, chargeRequest(100))
	wantDeclineReplayed(t, &runs, st, first, retry, message(retry.err))
	if !strings.Contains(message(retry.err), "FailedPrecondition; its message was not stored") {
		t.Fatalf("retry's message %q, want one saying the original's was not stored", message(retry.err))
	}
}

// fill acquires records in store until it has no room for another.
func fill(t testing.TB, store idempotency.Store) {
	t.Helper()
	for i := 0; ; i++ {
		_, err := store.Acquire(context.Background(), idempotency.AcquireRequest{
			Key: idempotency.StorageKey("filler", newKey()), Token: "filler", Fingerprint: "filler",
			Lease: time.Hour, TTL: time.Hour,
		})
		switch {
		case errors.Is(err, idempotency.ErrStoreFull):
			return
		case err != nil:
			t.Fatal(err)
		case i > 1<<20:
			t.Fatal("the store never filled up")
		}
	}
}

// TestOmittedDeclineRedisMaxmemory: Redis at maxmemory (noeviction) stores
// a record over its allowance with its status and headers only; the
// decline is replayed as FailedPrecondition with its message.
func TestOmittedDeclineRedisMaxmemory(t *testing.T) {
	srv := redistest.Start(t) // private: the test changes maxmemory
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	store := redisstore.New(c, redisstore.WithPrefix(redistest.Prefix()))
	t.Cleanup(func() { store.Close() })

	var runs counter
	// The body is over the 4 KiB a full server still takes.
	st := decline(t, "card declined: insufficient funds", 8<<10)
	entered, open := make(chan struct{}), make(chan struct{})
	conn := serve(t, &payments{charge: declining(&runs, st, entered, open)},
		intercepted(idemgrpc.UnaryServerInterceptor(idempotency.NewRunner(store))))

	ctx := withKey(newKey())
	done := make(chan result, 1)
	go func() { done <- charge(ctx, conn, chargeRequest(100)) }()
	<-entered
	for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", "1"}} {
		if err := c.ConfigSet(context.Background(), kv[0], kv[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { c.ConfigSet(context.Background(), "maxmemory", "0") })
	close(open)
	first := <-done
	retry := charge(ctx, conn, chargeRequest(100))
	wantDeclineReplayed(t, &runs, st, first, retry, st.Message())
	if _, err := store.Acquire(context.Background(), idempotency.AcquireRequest{
		Key: idempotency.StorageKey("", newKey()), Token: "t", Fingerprint: "f", Lease: time.Second, TTL: time.Second,
	}); !errors.Is(err, idempotency.ErrStoreFull) {
		t.Fatalf("Acquire of a new key = %v, want ErrStoreFull: the server was not full", err)
	}
}

// legacyBody is the stored body of an outcome as records before the code
// was kept outside the body hold it.
func legacyBody(t testing.TB, resp proto.Message, st *spb.Status, header metadata.MD) []byte {
	t.Helper()
	field := func(b []byte, num protowire.Number, m proto.Message) []byte {
		v, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), v)
	}
	var b []byte
	if resp != nil {
		a, err := anypb.New(resp)
		if err != nil {
			t.Fatal(err)
		}
		b = field(b, 1, a)
	}
	b = field(b, 2, st)
	for k, vs := range header {
		for _, v := range vs {
			var pair []byte
			pair = protowire.AppendString(protowire.AppendTag(pair, 1, protowire.BytesType), k)
			pair = protowire.AppendString(protowire.AppendTag(pair, 2, protowire.BytesType), v)
			b = protowire.AppendBytes(protowire.AppendTag(b, 3, protowire.BytesType), pair)
		}
	}
	return b
}

// testLegacyRecords: records in the format before the code was kept
// outside the body (Status 200, Content-Type application/octet-stream,
// the outcome in the body), as Do stores a []byte, still replay.
func testLegacyRecords(t *testing.T, store idempotency.Store) {
	var runs counter
	r := idempotency.NewRunner(store)
	conn := serve(t, &payments{charge: runs.charge}, intercepted(idemgrpc.UnaryServerInterceptor(r)))
	write := func(r *idempotency.Runner, body []byte) context.Context {
		t.Helper()
		key := newKey()
		payload, err := deterministic(chargeRequest(100))
		if err != nil {
			t.Fatal(err)
		}
		call := idempotency.Call{Name: chargeMethod, Key: key, Payload: payload}
		if _, err := idempotency.Do(context.Background(), r, call, func(context.Context) ([]byte, error) { return body, nil }); err != nil {
			t.Fatal(err)
		}
		return withKey(key)
	}

	ok := charge(write(r, legacyBody(t, receipt("ch_legacy"), &spb.Status{}, metadata.Pairs("charge-region", "eu-west"))), conn, chargeRequest(100))
	if ok.err != nil || !proto.Equal(ok.resp, receipt("ch_legacy")) || !ok.replayed() || strings.Join(ok.header.Get("charge-region"), ",") != "eu-west" {
		t.Fatalf("legacy response: %v %v, header %v", ok.resp, ok.err, ok.header)
	}
	declined := charge(write(r, legacyBody(t, nil, &spb.Status{Code: int32(codes.FailedPrecondition), Message: "card declined"}, nil)), conn, chargeRequest(100))
	if status.Code(declined.err) != codes.FailedPrecondition || message(declined.err) != "card declined" || !declined.replayed() {
		t.Fatalf("legacy decline: %v, replayed %v", declined.err, declined.replayed())
	}
	capped := idempotency.NewRunner(store, idempotency.WithMaxResponseBody(1))
	omitted := charge(write(capped, legacyBody(t, receipt("ch_legacy"), &spb.Status{}, nil)), conn, chargeRequest(100))
	wantAnswer(t, omitted.err, codes.AlreadyExists, idemgrpc.ReasonResponseOmitted)
	if runs.n.Load() != 0 {
		t.Fatalf("%d runs, want none: every call was a replay", runs.n.Load())
	}
}
