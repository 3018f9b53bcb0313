package idemgrpc_test

import (
	"context"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/go-idempotency/idempotency"
	idemgrpc "github.com/go-idempotency/idempotency/grpc"
	"github.com/go-idempotency/idempotency/internal/pgtest"
	"github.com/go-idempotency/idempotency/pgstore"
)

// TestTransaction: on a transactional Runner the handler writes through
// pgstore.TxFromContext, and its writes commit with the record: once for a
// stored outcome, never for a released one.
func TestTransaction(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE charges (key text NOT NULL, epoch bigint NOT NULL, outcome text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	r := idempotency.NewRunner(openPgstore(t, pool), idempotency.WithTransaction(true))
	var failNext atomic.Bool
	conn := serve(t, &payments{charge: func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		tx, ok := pgstore.TxFromContext(ctx)
		info, _ := idempotency.FromContext(ctx)
		if !ok {
			return nil, status.Error(codes.Internal, "no transaction")
		}
		outcome := req.Fields["outcome"].GetStringValue()
		if _, err := tx.Exec(ctx, `INSERT INTO charges VALUES ($1, $2, $3)`, info.Key, info.Epoch, outcome); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		switch {
		case failNext.CompareAndSwap(true, false):
			return nil, status.Error(codes.Unavailable, "provider down: rolled back")
		case outcome == "declined":
			return nil, status.Error(codes.FailedPrecondition, "card declined")
		}
		return receipt("ch_" + info.Key), nil
	}}, intercepted(idemgrpc.UnaryServerInterceptor(r)))

	rows := func(key string) (n int) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM charges WHERE key = $1`, key).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	request := func(outcome string) *structpb.Struct {
		return &structpb.Struct{Fields: map[string]*structpb.Value{"outcome": structpb.NewStringValue(outcome)}}
	}

	paid := newKey()
	failNext.Store(true)
	if res := charge(withKey(paid), conn, request("paid")); status.Code(res.err) != codes.Unavailable || rows(paid) != 0 {
		t.Fatalf("released: %v, %d rows; want Unavailable and the row rolled back", res.err, rows(paid))
	}
	for i := range 2 {
		res := charge(withKey(paid), conn, request("paid"))
		if res.err != nil || res.replayed() != (i == 1) || !proto.Equal(res.resp, receipt("ch_"+paid)) {
			t.Fatalf("call %d: %v %v, replayed %v", i, res.resp, res.err, res.replayed())
		}
	}
	if rows(paid) != 1 {
		t.Fatalf("%d rows after a released call, a run and a replay; want 1", rows(paid))
	}

	declined := newKey()
	for i := range 2 {
		res := charge(withKey(declined), conn, request("declined"))
		if status.Code(res.err) != codes.FailedPrecondition || res.replayed() != (i == 1) {
			t.Fatalf("call %d: %v, replayed %v", i, res.err, res.replayed())
		}
	}
	if rows(declined) != 1 {
		t.Fatalf("%d rows for a stored error, want 1: its writes commit with it", rows(declined))
	}
}
