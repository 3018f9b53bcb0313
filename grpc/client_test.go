package idemgrpc_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/go-idempotency/idempotency"
	idemgrpc "github.com/go-idempotency/idempotency/grpc"
)

// retryPolicy is a gRPC service config that retries Unavailable calls of
// the test service.
const retryPolicy = `{"methodConfig": [{
	"name": [{"service": "payments.v1.Payments"}],
	"retryPolicy": {
		"maxAttempts": 5,
		"initialBackoff": "0.01s",
		"maxBackoff": "0.05s",
		"backoffMultiplier": 2,
		"retryableStatusCodes": ["UNAVAILABLE"]
	}
}]}`

// TestClientKeys: each logical call gets a fresh random key; a key the
// caller set is kept; methods outside WithMethods get none.
func TestClientKeys(t *testing.T) {
	var log attemptLog
	var runs counter
	conn := serve(t, &payments{charge: runs.charge}, intercepted(log.intercept),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor()))
	for range 2 {
		if res := charge(context.Background(), conn, chargeRequest(100)); res.err != nil {
			t.Fatal(res.err)
		}
	}
	if res := charge(withKey("caller-key"), conn, chargeRequest(100)); res.err != nil {
		t.Fatal(res.err)
	}
	keys := log.attempts()
	if _, err := uuid.Parse(keys[0]); err != nil || keys[0] == keys[1] || keys[2] != "caller-key" {
		t.Fatalf("keys %q: want two fresh UUIDs, then the caller's", keys)
	}

	other := serve(t, &payments{charge: runs.charge}, intercepted(log.intercept),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.WithMethods(refundMethod))))
	if res := charge(context.Background(), other, chargeRequest(100)); res.err != nil {
		t.Fatal(res.err)
	}
	if keys := log.attempts(); keys[3] != "" {
		t.Fatalf("a method outside WithMethods was sent the key %q", keys[3])
	}
}

// TestClientRetryPolicy: with the retries left to a gRPC retry policy, the
// interceptor's key is on every attempt the policy makes, and the handler
// runs once.
func TestClientRetryPolicy(t *testing.T) {
	var runs counter
	lost := attemptLog{loseFirst: true}
	conn := serve(t, &payments{charge: runs.charge},
		intercepted(lost.intercept, idemgrpc.UnaryServerInterceptor(idempotency.NewRunner(newMemstore(t)))),
		grpc.WithDefaultServiceConfig(retryPolicy),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.WithMaxAttempts(1))))

	res := charge(context.Background(), conn, chargeRequest(100))
	keys := lost.attempts()
	if res.err != nil || !res.replayed() || runs.n.Load() != 1 || len(keys) != 2 || keys[0] != keys[1] || keys[0] == "" {
		t.Fatalf("%v, replayed %v, %d runs, keys %q; want the policy's retry replayed under the same key",
			res.err, res.replayed(), runs.n.Load(), keys)
	}
}

// TestClientRetryPolicyPushback: a gRPC retry policy waits out the
// in-flight answer's pushback (the lease's time left) rather than its own
// short backoff, and its retry gets the replay.
func TestClientRetryPolicyPushback(t *testing.T) {
	const lease = time.Second
	arrived := arrive(newMemstore(t), 2) // the first call's Acquire, then the duplicate's
	r := idempotency.NewRunner(arrived, idempotency.WithLease(lease))
	runs := newGate()
	conn := serve(t, &payments{charge: runs.charge}, intercepted(idemgrpc.UnaryServerInterceptor(r)),
		grpc.WithDefaultServiceConfig(retryPolicy),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.WithMaxAttempts(1))))

	ctx := withKey(newKey())
	first := make(chan result, 1)
	go func() { first <- charge(ctx, conn, chargeRequest(100)) }()
	<-runs.entered
	dup := make(chan result, 1)
	start := time.Now()
	go func() { dup <- charge(ctx, conn, chargeRequest(100)) }()
	<-arrived.all
	close(runs.open) // the duplicate was answered in flight; the first completes
	if res := <-first; res.err != nil {
		t.Fatal(res.err)
	}
	res := <-dup
	if res.err != nil || !res.replayed() || runs.n.Load() != 1 {
		t.Fatalf("duplicate: %v, replayed %v, %d runs", res.err, res.replayed(), runs.n.Load())
	}
	if took := time.Since(start); took < lease/2 {
		t.Fatalf("the duplicate was replayed after %v: the policy did not wait for the pushback", took)
	}
}

// TestClientNoRetry: codes outside WithRetryCodes are not retried, nor is a
// replay, whatever its code.
func TestClientNoRetry(t *testing.T) {
	var log attemptLog
	never := idemgrpc.WithReleaseCode(func(codes.Code) bool { return false })
	// The amount asks for the answer.
	answers := map[float64]error{
		1: status.Error(codes.FailedPrecondition, "card declined"),
		2: status.Error(codes.Unavailable, "stored on purpose"),
	}
	conn := serve(t, &payments{charge: func(_ context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		return nil, answers[req.Fields["amount"].GetNumberValue()]
	}},
		intercepted(log.intercept, idemgrpc.UnaryServerInterceptor(idempotency.NewRunner(newMemstore(t)), never)),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.WithBackoff(time.Millisecond, time.Millisecond))))
	if res := charge(context.Background(), conn, chargeRequest(1)); status.Code(res.err) != codes.FailedPrecondition || len(log.attempts()) != 1 {
		t.Fatalf("%v after %d attempts, want FailedPrecondition after 1", res.err, len(log.attempts()))
	}

	// An Unavailable the server stored: the first answer is retried, the
	// replay that comes back is final.
	if res := charge(context.Background(), conn, chargeRequest(2)); status.Code(res.err) != codes.Unavailable || !res.replayed() || len(log.attempts()) != 3 {
		t.Fatalf("%v, replayed %v, after %d attempts in all; want the replay, final, at the second", res.err, res.replayed(), len(log.attempts()))
	}
}
