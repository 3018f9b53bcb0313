package idemgrpc_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
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

// newerChargeRequest returns the type of a Charge request from a schema
// version ahead of the server's, as a client built during a rolling deploy
// has it: structpb.Struct's field 1 (fields), and a map<string, string>
// field 2 (labels) that the server's type does not know. It is built with
// descriptorpb, as protoc would have generated it.
func newerChargeRequest(t testing.TB) protoreflect.MessageDescriptor {
	t.Helper()
	entry := func(name string, value *descriptorpb.FieldDescriptorProto) *descriptorpb.DescriptorProto {
		value.Name, value.Number, value.Label = proto.String("value"), proto.Int32(2), descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()
		return &descriptorpb.DescriptorProto{
			Name: proto.String(name),
			Field: []*descriptorpb.FieldDescriptorProto{{
				Name: proto.String("key"), Number: proto.Int32(1),
				Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(), Type: descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum(),
			}, value},
			Options: &descriptorpb.MessageOptions{MapEntry: proto.Bool(true)},
		}
	}
	mapField := func(name string, number int32, entry string) *descriptorpb.FieldDescriptorProto {
		return &descriptorpb.FieldDescriptorProto{
			Name: proto.String(name), Number: proto.Int32(number),
			Label: descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum(), Type: descriptorpb.FieldDescriptorProto_TYPE_MESSAGE.Enum(),
			TypeName: proto.String(".payments.v2.ChargeRequest." + entry),
		}
	}
	file := &descriptorpb.FileDescriptorProto{
		Name:       proto.String("payments/v2/charge.proto"),
		Package:    proto.String("payments.v2"),
		Dependency: []string{"google/protobuf/struct.proto"},
		Syntax:     proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{{
			Name:  proto.String("ChargeRequest"),
			Field: []*descriptorpb.FieldDescriptorProto{mapField("fields", 1, "FieldsEntry"), mapField("labels", 2, "LabelsEntry")},
			NestedType: []*descriptorpb.DescriptorProto{
				entry("FieldsEntry", &descriptorpb.FieldDescriptorProto{
					Type: descriptorpb.FieldDescriptorProto_TYPE_MESSAGE.Enum(), TypeName: proto.String(".google.protobuf.Value")}),
				entry("LabelsEntry", &descriptorpb.FieldDescriptorProto{Type: descriptorpb.FieldDescriptorProto_TYPE_STRING.Enum()}),
			},
		}},
	}
	fd, err := protodesc.NewFile(file, protoregistry.GlobalFiles)
	if err != nil {
		t.Fatal(err)
	}
	return fd.Messages().ByName("ChargeRequest")
}

// newerCharge returns a request of the newer type: amount in fields, and
// labels whose order Go's map iteration decides each time the message is
// marshalled without deterministic marshalling.
func newerCharge(md protoreflect.MessageDescriptor, amount float64) proto.Message {
	m := dynamicpb.NewMessage(md)
	fields := m.Mutable(md.Fields().ByName("fields")).Map()
	fields.Set(protoreflect.ValueOfString("amount").MapKey(), protoreflect.ValueOfMessage(structpb.NewNumberValue(amount).ProtoReflect()))
	labels := m.Mutable(md.Fields().ByName("labels")).Map()
	for _, k := range []string{"region", "channel", "tier", "campaign", "device", "locale", "cohort", "source"} {
		labels.Set(protoreflect.ValueOfString(k).MapKey(), protoreflect.ValueOfString(k+"-value"))
	}
	return m
}

// testNewerClient: a client a schema version ahead of the server (a map
// field the server does not know) whose first answer is lost after the
// handler ran: its retry resends the bytes it sent first, so the server
// sees the same request and replays its outcome: each call charged once,
// none refused as a mismatch.
func testNewerClient(t *testing.T, store idempotency.Store) {
	const calls = 40
	md := newerChargeRequest(t)
	var runs counter
	lost := attemptLog{loseFirst: true}
	conn := serve(t, &payments{charge: runs.charge},
		intercepted(lost.intercept, idemgrpc.UnaryServerInterceptor(idempotency.NewRunner(store))),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.WithBackoff(time.Millisecond, 5*time.Millisecond))))

	mismatches, failures := 0, 0
	for i := range calls {
		var header metadata.MD
		err := conn.Invoke(context.Background(), chargeMethod, newerCharge(md, float64(i)), new(structpb.Struct), grpc.Header(&header))
		switch {
		case status.Code(err) == codes.FailedPrecondition:
			mismatches++
		case err != nil || len(header.Get(idemgrpc.MetadataReplayed)) == 0:
			failures++
			t.Errorf("call %d: %v, header %v; want the replay of its first attempt", i, err, header)
		}
	}
	if runs.n.Load() != calls || mismatches != 0 || failures != 0 || len(lost.attempts()) != 2*calls {
		t.Fatalf("%d handler runs, %d of %d calls refused as a mismatch, %d failed, %d attempts; want %d runs, no mismatch, 2 attempts per call",
			runs.n.Load(), mismatches, calls, failures, len(lost.attempts()), calls)
	}
}

// countingCodec is gRPC's proto codec, counting the messages it marshals.
type countingCodec struct {
	encoding.CodecV2
	marshals atomic.Int64
}

func (c *countingCodec) Marshal(v any) (mem.BufferSlice, error) {
	c.marshals.Add(1)
	return c.CodecV2.Marshal(v)
}

// TestClientCodecLeftAlone: a call whose options force a codec is marshalled
// by that codec on every attempt; the interceptor does not replace it.
func TestClientCodecLeftAlone(t *testing.T) {
	var runs counter
	lost := attemptLog{loseFirst: true}
	conn := serve(t, &payments{charge: runs.charge},
		intercepted(lost.intercept, idemgrpc.UnaryServerInterceptor(idempotency.NewRunner(newMemstore(t)))),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(idemgrpc.WithBackoff(time.Millisecond, 5*time.Millisecond))))
	codec := &countingCodec{CodecV2: encoding.GetCodecV2("proto")}
	res := charge(context.Background(), conn, chargeRequest(100), grpc.ForceCodecV2(codec))
	if res.err != nil || !res.replayed() || runs.n.Load() != 1 {
		t.Fatalf("%v, replayed %v, %d runs; want the first run replayed", res.err, res.replayed(), runs.n.Load())
	}
	if n := codec.marshals.Load(); n != 2 {
		t.Fatalf("the forced codec marshalled %d messages, want 2: the request of each attempt", n)
	}
}
