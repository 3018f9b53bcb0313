// Package idemgrpc brings the idempotency guarantees of package idempotency
// to gRPC: a unary server interceptor that runs each call carrying a key
// once per (scope, key) and replays its outcome to every duplicate, and a
// unary client interceptor that gives each logical call a fresh key and
// keeps it across retries.
//
// Server:
//
//	runner := idempotency.NewRunner(store, idempotency.WithWait(5*time.Second))
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(
//		authenticate, // puts the caller's identity in the context
//		idemgrpc.UnaryServerInterceptor(runner, idemgrpc.WithScope(callerID)),
//	))
//
// The key comes from the request's "idempotency-key" metadata, or, with
// WithRequestKey, from the request message (FieldKey("request_id") for
// AIP-155's request_id). The record's identity holds the full method name
// and a fingerprint of the request message (deterministic marshalling), so
// the same key with another request or on another method is refused, and
// the record is left untouched. The stored outcome is the response message,
// or the status (code, message and details), with the header and trailer
// metadata the handler set; a replay returns them and adds
// "idempotent-replayed: true" to the header metadata. The code and message
// are also kept outside the stored body, so that they survive when the
// body cannot be stored (over a cap or a store's bound, or not
// marshallable): a decline is replayed as the decline it was, never as "the
// call ran". The interceptor answers each outcome of idempotency.Do
// (Result.Outcome) through one table, which the README lists.
//
// Client:
//
//	conn, err := grpc.NewClient(target,
//		grpc.WithTransportCredentials(creds),
//		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor()),
//	)
//
// The client interceptor marshals each request once and resends those
// bytes on every attempt, so that a retry is never refused as another
// request under its key.
//
// The options are typed: ServerOption for UnaryServerInterceptor,
// ClientOption for UnaryClientInterceptor, and WithMethods, a CommonOption,
// for both.
//
// Streaming RPCs are not intercepted: the package has no stream
// interceptors, and a key on a streaming call is ignored.
package idemgrpc
