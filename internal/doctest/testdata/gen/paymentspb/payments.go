// Package paymentspb stands for the code that protoc-gen-go and
// protoc-gen-go-grpc generate from a service payments.v1.Payments with one
// unary method, Charge, so that the README snippets that register or call a
// service compile without a protoc run. It is written out by hand, as
// generated code would be, with structpb.Struct for the messages.
package paymentspb

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// ChargeRequest and ChargeReply are the method's messages.
type (
	ChargeRequest = structpb.Struct
	ChargeReply   = structpb.Struct
)

// Payments_Charge_FullMethodName is the full name of the Charge method.
const Payments_Charge_FullMethodName = "/payments.v1.Payments/Charge"

// PaymentsServer is the server API of the service.
type PaymentsServer interface {
	Charge(context.Context, *ChargeRequest) (*ChargeReply, error)
}

// UnimplementedPaymentsServer answers every method with Unimplemented;
// embed it in an implementation.
type UnimplementedPaymentsServer struct{}

// Charge answers Unimplemented.
func (UnimplementedPaymentsServer) Charge(context.Context, *ChargeRequest) (*ChargeReply, error) {
	return nil, status.Error(codes.Unimplemented, "method Charge not implemented")
}

// RegisterPaymentsServer registers srv on s.
func RegisterPaymentsServer(s grpc.ServiceRegistrar, srv PaymentsServer) {
	s.RegisterService(&Payments_ServiceDesc, srv)
}

// Payments_ServiceDesc is the service's description for grpc.ServiceRegistrar.
var Payments_ServiceDesc = grpc.ServiceDesc{
	ServiceName: "payments.v1.Payments",
	HandlerType: (*PaymentsServer)(nil),
	Methods:     []grpc.MethodDesc{{MethodName: "Charge", Handler: chargeHandler}},
	Metadata:    "payments/v1/payments.proto",
}

func chargeHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in := new(ChargeRequest)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return srv.(PaymentsServer).Charge(ctx, in)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: Payments_Charge_FullMethodName}
	return interceptor(ctx, in, info, func(ctx context.Context, req any) (any, error) {
		return srv.(PaymentsServer).Charge(ctx, req.(*ChargeRequest))
	})
}

// PaymentsClient is the client API of the service.
type PaymentsClient interface {
	Charge(ctx context.Context, in *ChargeRequest, opts ...grpc.CallOption) (*ChargeReply, error)
}

// NewPaymentsClient returns a client of the service on cc.
func NewPaymentsClient(cc grpc.ClientConnInterface) PaymentsClient {
	return paymentsClient{cc}
}

type paymentsClient struct{ cc grpc.ClientConnInterface }

func (c paymentsClient) Charge(ctx context.Context, in *ChargeRequest, opts ...grpc.CallOption) (*ChargeReply, error) {
	out := new(ChargeReply)
	if err := c.cc.Invoke(ctx, Payments_Charge_FullMethodName, in, out, opts...); err != nil {
		return nil, err
	}
	return out, nil
}
