package idemgrpc_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/go-idempotency/idempotency"
	idemgrpc "github.com/go-idempotency/idempotency/grpc"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/state"
)

// TestStateErrors: a handler on a transactional Runner that returns the
// error of package state as it is gets its status through the
// interceptor: a conflict ABORTED, with the record as it is now in the
// ErrorInfo (released, so a retry runs again and is refused again, the
// transition never made twice); not found NOT_FOUND, invalid
// INVALID_ARGUMENT with a BadRequest, exists ALREADY_EXISTS (stored and
// replayed, as any deliberate answer); a store error UNAVAILABLE with
// RetryInfo, without the database's text. A status the handler chose is
// its own, and a call without a key gets the mapping too.
func TestStateErrors(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	runner := idempotency.NewRunner(openPgstore(t, pool), idempotency.WithTransaction(true))
	records := state.New(pool)
	broken := state.New(pool, state.WithTable("no_such_table"))
	scope := "grpc-" + newKey()
	ref := func(id string) state.Ref { return state.Ref{Scope: scope, Machine: "payments.payment", ID: id} }
	if _, err := records.Create(ctx, ref("pay_1"), "authorized", nil); err != nil {
		t.Fatal(err)
	}

	var runs atomic.Int64
	var chosen atomic.Bool
	conn := serve(t, &payments{charge: func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		runs.Add(1)
		f := req.GetFields()
		s := records
		if f["broken"].GetBoolValue() {
			s = broken
		}
		if chosen.Load() {
			return nil, status.Error(codes.FailedPrecondition, "chosen by the handler")
		}
		r := state.Ref{Scope: scope, Machine: f["machine"].GetStringValue(), ID: f["id"].GetStringValue()}
		var err error
		if f["create"].GetBoolValue() {
			_, err = s.Create(ctx, r, "authorized", nil)
		} else {
			_, err = s.Transition(ctx, r, state.Change{From: "authorized", To: f["to"].GetStringValue(), ExpectedVersion: 1})
		}
		if err != nil {
			return nil, err
		}
		return receipt(r.ID), nil
	}}, intercepted(idemgrpc.UnaryServerInterceptor(runner)))
	call := func(key string, fields map[string]any) result {
		t.Helper()
		if fields["machine"] == nil {
			fields["machine"] = "payments.payment"
		}
		req, err := structpb.NewStruct(fields)
		if err != nil {
			t.Fatal(err)
		}
		c := context.Background()
		if key != "" {
			c = withKey(key)
		}
		return charge(c, conn, req)
	}

	if res := call("capture", map[string]any{"id": "pay_1", "to": "captured"}); res.err != nil {
		t.Fatalf("capture: %v", res.err)
	}
	for i := range 2 {
		res := call("cancel", map[string]any{"id": "pay_1", "to": "canceled"})
		wantAnswer(t, res.err, codes.Aborted, idemgrpc.ReasonStateConflict)
		info, _, _ := errorInfo(res.err)
		md := info.GetMetadata()
		if md["state"] != "captured" || md["version"] != "2" || md["reason"] != state.ReasonVersion || md["id"] != "pay_1" || res.replayed() {
			t.Errorf("cancel %d: metadata %v, replayed %v; want the capture's record, run again", i, md, res.replayed())
		}
		if !strings.Contains(status.Convert(res.err).Message(), "captured") {
			t.Errorf("cancel %d: message %q", i, status.Convert(res.err).Message())
		}
	}
	if n := runs.Load(); n != 3 {
		t.Errorf("the handler ran %d times, want 3: a conflict releases its key", n)
	}
	if h, err := records.History(ctx, ref("pay_1"), 0, 0); err != nil || len(h) != 1 {
		t.Errorf("history %+v, %v; want the capture alone", h, err)
	}

	for i := range 2 {
		res := call("missing", map[string]any{"id": "pay_missing", "to": "captured"})
		wantAnswer(t, res.err, codes.NotFound, idemgrpc.ReasonStateNotFound)
		if res.replayed() != (i == 1) {
			t.Errorf("not found, call %d: replayed %v", i, res.replayed())
		}
	}
	res := call("invalid", map[string]any{"id": "pay_1", "to": "captured", "machine": "Payments"})
	wantAnswer(t, res.err, codes.InvalidArgument, idemgrpc.ReasonStateInvalidArgument)
	if _, _, others := errorInfo(res.err); len(others) != 1 || others[0].(*errdetails.BadRequest).GetFieldViolations()[0].GetField() != "machine" {
		t.Errorf("invalid: details %v; want a BadRequest on machine", others)
	}
	wantAnswer(t, call("exists", map[string]any{"id": "pay_1", "create": true}).err, codes.AlreadyExists, idemgrpc.ReasonStateExists)

	res = call("broken", map[string]any{"id": "pay_1", "to": "captured", "broken": true})
	wantAnswer(t, res.err, codes.Unavailable, idemgrpc.ReasonStateStoreError)
	if _, retry, _ := errorInfo(res.err); retry != time.Second || strings.Contains(status.Convert(res.err).Message(), "no_such_table") {
		t.Errorf("store error: retry %v, message %q", retry, status.Convert(res.err).Message())
	}

	wantAnswer(t, call("", map[string]any{"id": "pay_1", "to": "canceled"}).err, codes.Aborted, idemgrpc.ReasonStateConflict)

	chosen.Store(true)
	if err := call("chosen", map[string]any{"id": "pay_1", "to": "canceled"}).err; status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a status of the handler's: %v", err)
	}
}
