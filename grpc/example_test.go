package idemgrpc_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/go-idempotency/idempotency"
	idemgrpc "github.com/go-idempotency/idempotency/grpc"
	"github.com/go-idempotency/idempotency/memstore"
)

// charges is the example's service. Generated code (RegisterXServer) would
// hold this description; the example writes it out so that it needs no
// protoc run.
var charges = grpc.ServiceDesc{
	ServiceName: "payments.v1.Payments",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Charge",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			req := new(structpb.Struct)
			if err := dec(req); err != nil {
				return nil, err
			}
			info := &grpc.UnaryServerInfo{Server: srv, FullMethod: "/payments.v1.Payments/Charge"}
			return interceptor(ctx, req, info, func(ctx context.Context, req any) (any, error) {
				return srv.(charger).Charge(ctx, req.(*structpb.Struct))
			})
		},
	}},
}

// charger is the service's server API, which generated code would declare
// as PaymentsServer.
type charger interface {
	Charge(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error)
}

type chargeServer struct{ charged atomic.Int64 }

func (s *chargeServer) Charge(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
	n := s.charged.Add(1)
	return structpb.NewStruct(map[string]any{"charge_id": fmt.Sprint("ch_", n)})
}

// Example runs a payments server behind the server interceptor and calls
// it twice with one key, as a client that lost the first answer would: the
// charge happens once, and the second call gets its replay.
func Example() {
	store := memstore.New()
	defer store.Close()
	runner := idempotency.NewRunner(store)

	svc := &chargeServer{}
	srv := grpc.NewServer(grpc.UnaryInterceptor(idemgrpc.UnaryServerInterceptor(runner)))
	srv.RegisterService(&charges, svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()

	// The client interceptor gives each call a key of its own and retries
	// it with that key; this caller sets its key itself, to send it twice.
	conn, err := grpc.NewClient(lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	ctx := metadata.AppendToOutgoingContext(context.Background(), idemgrpc.MetadataKey, "order-1001")
	req, _ := structpb.NewStruct(map[string]any{"amount": 1999, "currency": "EUR"})
	for range 2 {
		var header metadata.MD
		resp := new(structpb.Struct)
		if err := conn.Invoke(ctx, "/payments.v1.Payments/Charge", req, resp, grpc.Header(&header)); err != nil {
			log.Fatal(err)
		}
		fmt.Println(resp.Fields["charge_id"].GetStringValue(), "replayed:", header.Get(idemgrpc.MetadataReplayed))
	}
	fmt.Println("charged", svc.charged.Load(), "time(s)")
	// Output:
	// ch_1 replayed: []
	// ch_1 replayed: [true]
	// charged 1 time(s)
}

// busyServer answers its first call UNAVAILABLE, as a service whose card
// processor was busy would, and charges on the next; it says whether that
// call came with the first one's key.
type busyServer struct {
	mu       sync.Mutex
	firstKey string
}

func (s *busyServer) Charge(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
	info, _ := idempotency.FromContext(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.firstKey == "" {
		s.firstKey = info.Key
		fmt.Println("call 1: busy")
		return nil, status.Error(codes.Unavailable, "card processor busy")
	}
	fmt.Println("call 2: charged, under the key of call 1:", info.Key == s.firstKey)
	return structpb.NewStruct(map[string]any{"charge_id": "ch_1"})
}

// The client interceptor gives a call a key of its own (a random UUID)
// and retries it with that key when the server answers UNAVAILABLE: here
// the server released the key, as its handler's code asks, and runs the
// retry; had the first answer been lost instead, the retry would get its
// replay.
func ExampleUnaryClientInterceptor() {
	store := memstore.New()
	defer store.Close()
	srv := grpc.NewServer(grpc.UnaryInterceptor(idemgrpc.UnaryServerInterceptor(idempotency.NewRunner(store))))
	srv.RegisterService(&charges, &busyServer{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()

	conn, err := grpc.NewClient(lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(
			idemgrpc.WithBackoff(time.Millisecond, 10*time.Millisecond))))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	req, _ := structpb.NewStruct(map[string]any{"amount": 1999, "currency": "EUR"})
	resp := new(structpb.Struct)
	if err := conn.Invoke(context.Background(), "/payments.v1.Payments/Charge", req, resp); err != nil {
		log.Fatal(err)
	}
	fmt.Println(resp.Fields["charge_id"].GetStringValue())
	// Output:
	// call 1: busy
	// call 2: charged, under the key of call 1: true
	// ch_1
}
