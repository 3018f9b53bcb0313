package idemgrpc

import (
	"context"
	"errors"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Reasons of the ErrorInfo in the statuses of the errors of package state
// that a handler returns: the errors' codes, in upper case.
const (
	ReasonStateConflict        = "STATE_CONFLICT"         // Aborted
	ReasonStateNotFound        = "STATE_NOT_FOUND"        // NotFound
	ReasonStateInvalidArgument = "STATE_INVALID_ARGUMENT" // InvalidArgument, with BadRequest
	ReasonStateExists          = "STATE_EXISTS"           // AlreadyExists
	ReasonStateStoreError      = "STATE_STORE_ERROR"      // Unavailable, with RetryInfo
)

// stateError is an error of package state (state.ConflictError,
// NotFoundError, InvalidArgumentError, ExistsError, StoreError), known by
// its methods, so that every server with this interceptor does not link
// package state and its PostgreSQL driver in.
type stateError interface {
	error
	// Code returns the error's stable code: state_conflict, ...
	Code() string
	// Metadata returns the error's members as strings: machine, id,
	// reason, state, version, field, op, as the error has them.
	Metadata() map[string]string
}

// stateStatus is the status of a state error's code.
type stateStatus struct {
	code   codes.Code
	reason string
}

// stateStatuses are the statuses of the codes of package state's errors.
var stateStatuses = map[string]stateStatus{
	"state_conflict":         {codes.Aborted, ReasonStateConflict},
	"state_not_found":        {codes.NotFound, ReasonStateNotFound},
	"state_invalid_argument": {codes.InvalidArgument, ReasonStateInvalidArgument},
	"state_exists":           {codes.AlreadyExists, ReasonStateExists},
	"state_store_error":      {codes.Unavailable, ReasonStateStoreError},
}

// stateRetryDelay is the RetryInfo delay of a state store error: the HTTP
// helper's Retry-After.
const stateRetryDelay = time.Second

// withStateStatuses returns handler, answering an error of package state
// it returns (and that is not a status already) with the error's status:
//
//	state.ConflictError        ABORTED           STATE_CONFLICT, metadata machine, id, reason, state, version
//	state.NotFoundError        NOT_FOUND         STATE_NOT_FOUND, metadata machine, id
//	state.InvalidArgumentError INVALID_ARGUMENT  STATE_INVALID_ARGUMENT, metadata field, reason; a BadRequest
//	state.ExistsError          ALREADY_EXISTS    STATE_EXISTS, metadata machine, id, state, version
//	state.StoreError           UNAVAILABLE       STATE_STORE_ERROR; RetryInfo 1s; the database's error stays here
//
// The message is the error's text (a store error's says no more than
// which operation failed). The error still wraps the state error, so
// that idempotency.Do sees it: a conflict, released as any ABORTED is by
// default (DefaultReleaseCode), is reported as idempotency.OutcomeRefused.
func withStateStatuses(handler grpc.UnaryHandler) grpc.UnaryHandler {
	return func(ctx context.Context, req any) (any, error) {
		resp, err := handler(ctx, req)
		if err != nil {
			err = stateStatusOf(err)
		}
		return resp, err
	}
}

// stateStatusOf returns err as its status when it is an error of package
// state, and err as it is otherwise.
func stateStatusOf(err error) error {
	if _, ok := status.FromError(err); ok {
		return err // the handler chose its status
	}
	var se stateError
	if !errors.As(err, &se) {
		return err
	}
	s, ok := stateStatuses[se.Code()]
	if !ok {
		return err
	}
	md := se.Metadata()
	msg := se.Error()
	details := []proto.Message{&errdetails.ErrorInfo{Reason: s.reason, Domain: ErrorDomain, Metadata: md}}
	switch s.code {
	case codes.InvalidArgument:
		details = append(details, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{
			Field: md["field"], Description: md["reason"]}}})
	case codes.Unavailable:
		msg = "state: the state store could not complete the " + md["op"] + "; retry later"
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(stateRetryDelay)})
	}
	st := &spb.Status{Code: int32(s.code), Message: msg}
	for _, d := range details {
		if packed, perr := anypb.New(d); perr == nil {
			st.Details = append(st.Details, packed)
		}
	}
	return &stateStatusError{status: status.FromProto(st), err: err}
}

// stateStatusError is a state error answered with its status: gRPC sends
// GRPCStatus, and errors.Is and errors.As find the state error.
type stateStatusError struct {
	status *status.Status
	err    error
}

func (e *stateStatusError) Error() string              { return e.err.Error() }
func (e *stateStatusError) Unwrap() error              { return e.err }
func (e *stateStatusError) GRPCStatus() *status.Status { return e.status }
