package idemgrpc_test

import (
	"context"
	"strconv"
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

// TestStores checks the server and client interceptors on a real gRPC
// server over loopback with each store.
func TestStores(t *testing.T) {
	for _, kind := range storeKinds {
		t.Run(kind.name, func(t *testing.T) {
			store := kind.open(t)
			t.Run("DuplicatesRunOnce", func(t *testing.T) { testDuplicatesRunOnce(t, store) })
			t.Run("ReplayIsByteIdentical", func(t *testing.T) { testReplayIsByteIdentical(t, store) })
			t.Run("StoredError", func(t *testing.T) { testStoredError(t, store) })
			t.Run("Mismatch", func(t *testing.T) { testMismatch(t, store) })
			t.Run("InFlight", func(t *testing.T) { testInFlight(t, store) })
			t.Run("Release", func(t *testing.T) { testRelease(t, store) })
			t.Run("ClientRetries", func(t *testing.T) { testClientRetries(t, store) })
			t.Run("InvalidUTF8Status", func(t *testing.T) { testInvalidUTF8Status(t, store) })
			t.Run("InvalidUTF8Response", func(t *testing.T) { testInvalidUTF8Response(t, store) })
			t.Run("OmittedDecline", func(t *testing.T) { testOmittedDecline(t, store) })
			t.Run("NewerClient", func(t *testing.T) { testNewerClient(t, store) })
			t.Run("LegacyRecords", func(t *testing.T) { testLegacyRecords(t, store) })
		})
	}
}

// testDuplicatesRunOnce: concurrent calls with one key, in wait mode, run
// the handler once; every caller gets its response, all but one replayed.
func testDuplicatesRunOnce(t *testing.T, store idempotency.Store) {
	const calls = 20
	// The first call acquires once; each duplicate acquires, then again
	// from its wait, before it blocks.
	arrived := arrive(store, 2*calls-1)
	r := idempotency.NewRunner(arrived, idempotency.WithWait(10*time.Second))
	runs := newGate()
	conn := serve(t, &payments{charge: runs.charge}, intercepted(idemgrpc.UnaryServerInterceptor(r)))

	ctx := withKey(newKey())
	results := make([]result, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() { results[i] = charge(ctx, conn, chargeRequest(100)) })
	}
	<-arrived.all
	close(runs.open)
	wg.Wait()

	replays := 0
	for i, res := range results {
		if res.err != nil {
			t.Fatalf("call %d: %v", i, res.err)
		}
		if !proto.Equal(res.resp, receipt("ch_1")) {
			t.Fatalf("call %d got %v", i, res.resp)
		}
		if res.replayed() {
			replays++
		}
	}
	if runs.n.Load() != 1 || replays != calls-1 {
		t.Fatalf("%d runs and %d replays, want 1 and %d", runs.n.Load(), replays, calls-1)
	}
}

// testReplayIsByteIdentical: a duplicate gets the response's wire bytes and
// the header and trailer metadata the handler set, plus
// idempotent-replayed: true.
func testReplayIsByteIdentical(t *testing.T, store idempotency.Store) {
	var runs counter
	conn := serve(t, &payments{charge: func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		grpc.SetHeader(ctx, metadata.Pairs("charge-region", "eu-west", "charge-region", "eu-central"))
		grpc.SendHeader(ctx, metadata.Pairs("trace-bin", string([]byte{0, 1, 0xfe})))
		grpc.SetTrailer(ctx, metadata.Pairs("ledger-entry", "le_7"))
		return runs.charge(ctx, req)
	}}, intercepted(idemgrpc.UnaryServerInterceptor(idempotency.NewRunner(store))))

	ctx := withKey(newKey())
	firstCodec, replayCodec := newRecordingCodec(), newRecordingCodec()
	first := charge(ctx, conn, chargeRequest(100), grpc.ForceCodecV2(firstCodec))
	replay := charge(ctx, conn, chargeRequest(100), grpc.ForceCodecV2(replayCodec))
	if first.err != nil || replay.err != nil {
		t.Fatalf("first: %v, replay: %v", first.err, replay.err)
	}
	if runs.n.Load() != 1 || first.replayed() || !replay.replayed() {
		t.Fatalf("%d runs; replayed: first %v, duplicate %v", runs.n.Load(), first.replayed(), replay.replayed())
	}
	if string(firstCodec.last) != string(replayCodec.last) || len(firstCodec.last) == 0 {
		t.Fatalf("response bytes differ:\n first %x\nreplay %x", firstCodec.last, replayCodec.last)
	}
	if !sameMetadata(first.header, replay.header) || !sameMetadata(first.trailer, replay.trailer) {
		t.Fatalf("metadata differs:\n first %v %v\nreplay %v %v", first.header, first.trailer, replay.header, replay.trailer)
	}
	if got := first.header.Get("charge-region"); len(got) != 2 || got[1] != "eu-central" || first.header.Get("trace-bin")[0] != "\x00\x01\xfe" {
		t.Fatalf("the handler's header did not arrive whole: %v", first.header)
	}
}

// testStoredError: a handler's deliberate error is stored and replayed
// with its code, message and details, byte for byte.
func testStoredError(t *testing.T, store idempotency.Store) {
	var runs counter
	declined, err := status.New(codes.FailedPrecondition, "card declined").WithDetails(
		&errdetails.ErrorInfo{Reason: "CARD_DECLINED", Domain: "payments.example.com",
			Metadata: map[string]string{"decline_code": "insufficient_funds", "network": "visa"}},
		&errdetails.LocalizedMessage{Locale: "fr-FR", Message: "carte refusée"})
	if err != nil {
		t.Fatal(err)
	}
	conn := serve(t, &payments{charge: func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		runs.n.Add(1)
		grpc.SetTrailer(ctx, metadata.Pairs("decline-id", "dc_1"))
		return nil, declined.Err()
	}}, intercepted(idemgrpc.UnaryServerInterceptor(idempotency.NewRunner(store))))

	ctx := withKey(newKey())
	first := charge(ctx, conn, chargeRequest(100))
	replay := charge(ctx, conn, chargeRequest(100))
	if runs.n.Load() != 1 || !replay.replayed() {
		t.Fatalf("%d runs, replayed %v; want the error stored", runs.n.Load(), replay.replayed())
	}
	a, _ := deterministic(status.Convert(first.err).Proto())
	b, _ := deterministic(status.Convert(replay.err).Proto())
	if status.Code(first.err) != codes.FailedPrecondition || string(a) != string(b) {
		t.Fatalf("statuses differ:\n first %v\nreplay %v", first.err, replay.err)
	}
	// The first answer was Trailers-Only; the replay, which has header
	// metadata, is not: only the transport's content-type moves.
	if !sameMetadata(first.header, replay.header) || !sameMetadata(first.trailer, replay.trailer) {
		t.Fatalf("metadata differs:\n first %v %v\nreplay %v %v", first.header, first.trailer, replay.header, replay.trailer)
	}
	if got := first.trailer.Get("decline-id"); len(got) != 1 || got[0] != "dc_1" || len(first.trailer.Get("grpc-status-details-bin")) != 1 {
		t.Fatalf("trailer %v, want the handler's and the status details", first.trailer)
	}
}

// testMismatch: the same key with another message or on another method is
// refused, and the record is untouched.
func testMismatch(t *testing.T, store idempotency.Store) {
	var runs counter
	svc := &payments{
		charge: runs.charge,
		refund: func(ctx context.Context, _ *errdetails.RequestInfo) (*structpb.Struct, error) {
			runs.n.Add(1)
			return receipt("re_1"), nil
		},
	}
	conn := serve(t, svc, intercepted(idemgrpc.UnaryServerInterceptor(idempotency.NewRunner(store))))
	ctx := withKey(newKey())
	if res := charge(ctx, conn, chargeRequest(100)); res.err != nil {
		t.Fatal(res.err)
	}

	other := charge(ctx, conn, chargeRequest(999))
	wantAnswer(t, other.err, codes.FailedPrecondition, idemgrpc.ReasonFingerprintMismatch)
	if _, _, details := errorInfo(other.err); len(details) != 1 {
		t.Fatalf("details %v, want a PreconditionFailure", details)
	} else if _, ok := details[0].(*errdetails.PreconditionFailure); !ok {
		t.Fatalf("details %v, want a PreconditionFailure", details)
	}
	err := conn.Invoke(ctx, refundMethod, &errdetails.RequestInfo{RequestId: "r"}, new(structpb.Struct))
	wantAnswer(t, err, codes.FailedPrecondition, idemgrpc.ReasonFingerprintMismatch)

	again := charge(ctx, conn, chargeRequest(100))
	if again.err != nil || !again.replayed() || !proto.Equal(again.resp, receipt("ch_1")) || runs.n.Load() != 1 {
		t.Fatalf("after the mismatches: %v %v, %d runs; want the first response replayed", again.resp, again.err, runs.n.Load())
	}
}

// testInFlight: a duplicate while the first call runs gets Unavailable with
// the lease's time left in RetryInfo and in the retry pushback, and, once
// the first call completed, the replay.
func testInFlight(t *testing.T, store idempotency.Store) {
	const lease = 10 * time.Second
	r := idempotency.NewRunner(store, idempotency.WithLease(lease))
	runs := newGate()
	conn := serve(t, &payments{charge: runs.charge}, intercepted(idemgrpc.UnaryServerInterceptor(r)))

	ctx := withKey(newKey())
	done := make(chan result, 1)
	go func() { done <- charge(ctx, conn, chargeRequest(100)) }()
	<-runs.entered
	dup := charge(ctx, conn, chargeRequest(100))
	wantAnswer(t, dup.err, codes.Unavailable, idemgrpc.ReasonInFlight)
	_, retry, _ := errorInfo(dup.err)
	if retry <= 0 || retry > lease {
		t.Fatalf("RetryInfo delay %v, want the lease left, in (0, %v]", retry, lease)
	}
	if ms := dup.trailer.Get(idemgrpc.PushbackKey); len(ms) != 1 || ms[0] != strconv.FormatInt(retry.Milliseconds(), 10) {
		t.Fatalf("pushback %v, want %d", ms, retry.Milliseconds())
	}
	close(runs.open)
	if first := <-done; first.err != nil || first.replayed() {
		t.Fatalf("first call: %v, replayed %v", first.err, first.replayed())
	}
	if again := charge(ctx, conn, chargeRequest(100)); again.err != nil || !again.replayed() || runs.n.Load() != 1 {
		t.Fatalf("after the first call: %v, replayed %v, %d runs", again.err, again.replayed(), runs.n.Load())
	}
}

// testRelease: transient codes release the key so that a retry runs again,
// deliberate ones are stored, and WithReleaseCode changes which are which.
func testRelease(t *testing.T, store idempotency.Store) {
	var runs counter
	answers := map[int64]error{1: status.Error(codes.Unavailable, "provider down"), 2: status.Error(codes.Internal, "bug")}
	svc := &payments{charge: func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		n := runs.n.Add(1)
		grpc.SetTrailer(ctx, metadata.Pairs("attempt", strconv.FormatInt(n, 10)))
		if err := answers[n]; err != nil {
			return nil, err
		}
		return receipt("ch_ok"), nil
	}}
	conn := serve(t, svc, intercepted(idemgrpc.UnaryServerInterceptor(idempotency.NewRunner(store))))
	ctx := withKey(newKey())
	for i, want := range []codes.Code{codes.Unavailable, codes.Internal, codes.OK, codes.OK} {
		res := charge(ctx, conn, chargeRequest(100))
		if status.Code(res.err) != want || res.replayed() != (i == 3) {
			t.Fatalf("call %d: %v, replayed %v; want %v", i+1, res.err, res.replayed(), want)
		}
		if got := res.trailer.Get("attempt"); len(got) != 1 || got[0] != strconv.Itoa(min(i+1, 3)) {
			t.Fatalf("call %d: trailer %v, want the handler's", i+1, res.trailer)
		}
	}
	if runs.n.Load() != 3 {
		t.Fatalf("%d runs, want 3: two released, one stored", runs.n.Load())
	}

	t.Run("WithReleaseCode", func(t *testing.T) {
		var runs counter
		icpt := idemgrpc.UnaryServerInterceptor(idempotency.NewRunner(store), idemgrpc.WithReleaseCode(func(c codes.Code) bool {
			return idemgrpc.DefaultReleaseCode(c) || c == codes.InvalidArgument
		}))
		conn := serve(t, &payments{charge: func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
			runs.n.Add(1)
			return nil, status.Error(codes.InvalidArgument, "amount missing")
		}}, intercepted(icpt))
		ctx := withKey(newKey())
		for range 2 {
			if res := charge(ctx, conn, chargeRequest(100)); status.Code(res.err) != codes.InvalidArgument || res.replayed() {
				t.Fatalf("%v, replayed %v", res.err, res.replayed())
			}
		}
		if runs.n.Load() != 2 {
			t.Fatalf("%d runs, want 2 (InvalidArgument released)", runs.n.Load())
		}
	})
}

// testClientRetries: the client interceptor retries a call whose answer
// was lost with the same key, and the server replays instead of running
// the handler again.
func testClientRetries(t *testing.T, store idempotency.Store) {
	var runs counter
	lost := attemptLog{loseFirst: true}
	conn := serve(t, &payments{charge: runs.charge},
		intercepted(lost.intercept, idemgrpc.UnaryServerInterceptor(idempotency.NewRunner(store))),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.WithBackoff(time.Millisecond, 10*time.Millisecond))))

	res := charge(context.Background(), conn, chargeRequest(100))
	if res.err != nil || !res.replayed() || !proto.Equal(res.resp, receipt("ch_1")) {
		t.Fatalf("%v %v, replayed %v; want the first run's response, replayed", res.resp, res.err, res.replayed())
	}
	keys := lost.attempts()
	if runs.n.Load() != 1 || len(keys) != 2 || keys[0] != keys[1] || keys[0] == "" {
		t.Fatalf("%d runs, attempts with keys %q; want 1 run, two attempts with one key", runs.n.Load(), keys)
	}
}

func deterministic(m proto.Message) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(m)
}

// sameMetadata reports whether a and b hold the same keys and values,
// leaving out the replay's marker and the transport's content-type.
func sameMetadata(a, b metadata.MD) bool {
	a, b = a.Copy(), b.Copy()
	for _, md := range []metadata.MD{a, b} {
		delete(md, idemgrpc.MetadataReplayed)
		delete(md, "content-type")
	}
	if len(a) != len(b) {
		return false
	}
	for k, av := range a {
		bv := b[k]
		if len(av) != len(bv) {
			return false
		}
		for i := range av {
			if av[i] != bv[i] {
				return false
			}
		}
	}
	return true
}
