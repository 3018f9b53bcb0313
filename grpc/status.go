package idemgrpc

import (
	"context"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo that every status
// the server interceptor answers with of its own carries; its Reason is one
// of the Reason constants.
const ErrorDomain = "github.com/go-idempotency/idempotency"

// Reasons of the ErrorInfo in the server interceptor's own statuses: the
// problem codes of the HTTP middleware, in upper case, and
// RESPONSE_OMITTED.
const (
	ReasonKeyRequired         = "KEY_REQUIRED"         // InvalidArgument
	ReasonKeyInvalid          = "KEY_INVALID"          // InvalidArgument
	ReasonScopeMissing        = "SCOPE_MISSING"        // PermissionDenied
	ReasonInFlight            = "REQUEST_IN_FLIGHT"    // Unavailable, with RetryInfo
	ReasonFingerprintMismatch = "FINGERPRINT_MISMATCH" // FailedPrecondition
	ReasonStoreUnavailable    = "STORE_UNAVAILABLE"    // Unavailable, with RetryInfo
	ReasonStoreFull           = "STORE_FULL"           // ResourceExhausted, with RetryInfo
	ReasonRecordUnreadable    = "RECORD_UNREADABLE"    // DataLoss
	ReasonResponseOmitted     = "RESPONSE_OMITTED"     // AlreadyExists: a replay of a response that was not stored
	ReasonLeaseLost           = "LEASE_LOST"           // Unavailable, with RetryInfo
	ReasonOutcomeUnknown      = "OUTCOME_UNKNOWN"      // Unavailable, with RetryInfo
	ReasonResponseTooLarge    = "RESPONSE_TOO_LARGE"   // Internal; idempotency.Do never reports it
)

// PushbackKey is the trailer metadata that carries, in milliseconds, the
// delay of a status with RetryInfo, for the retry policy of gRPC's own
// clients, which reads it instead of the details.
const PushbackKey = "grpc-retry-pushback-ms"

// answer is a status the server interceptor answers with of its own.
type answer struct {
	code   codes.Code
	reason string
	msg    string
	retry  time.Duration // the RetryInfo delay; 0: none
	// detail is a further google.rpc detail: BadRequest for a key,
	// PreconditionFailure for a mismatch.
	detail proto.Message
}

// err returns the answer as a status error, setting the pushback trailer
// on ctx's stream when the answer asks for a retry.
func (a answer) err(ctx context.Context) error {
	details := []proto.Message{&errdetails.ErrorInfo{Reason: a.reason, Domain: ErrorDomain}}
	if a.retry > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(a.retry)})
		_ = grpc.SetTrailer(ctx, metadata.Pairs(PushbackKey, strconv.FormatInt(a.retry.Milliseconds(), 10)))
	}
	if a.detail != nil {
		details = append(details, a.detail)
	}
	st := &spb.Status{Code: int32(a.code), Message: a.msg}
	for _, d := range details {
		packed, err := anypb.New(d)
		if err != nil {
			return status.Error(a.code, a.msg)
		}
		st.Details = append(st.Details, packed)
	}
	return status.ErrorProto(st)
}

// keyInvalid answers a malformed key, err wrapping idempotency.ErrInvalidKey.
func keyInvalid(field string, err error) answer {
	return answer{codes.InvalidArgument, ReasonKeyInvalid, err.Error(), 0,
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: err.Error()}}}}
}

func keyRequired(field string) answer {
	const why = "this call needs an idempotency key"
	return answer{codes.InvalidArgument, ReasonKeyRequired, "idemgrpc: " + why, 0,
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: why}}}}
}

var answerScopeMissing = answer{codes.PermissionDenied, ReasonScopeMissing,
	"idemgrpc: this call has no authenticated principal to scope its idempotency key to", 0, nil}

// The interceptor's answers to the outcomes of idempotency.Do that are
// neither the handler's answer nor a replay (see outcomeReplies). Those
// that ask for a retry get their RetryInfo delay from the Result.
var (
	answerInFlight = answer{codes.Unavailable, ReasonInFlight,
		"idemgrpc: a call with this idempotency key is still running; retry with the same key", 0, nil}
	answerMismatch = answer{codes.FailedPrecondition, ReasonFingerprintMismatch,
		"idemgrpc: this idempotency key was used with a different request (another message, or another method), " +
			"which may have run: retry that request with this key to learn its outcome; " +
			"a new key runs this request as a call of its own", 0,
		&errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{{
			Type: ReasonFingerprintMismatch, Subject: MetadataKey,
			Description: "the key belongs to another request, which may have run; " +
				"a new key makes this request a call of its own, to send only if it is not a retry of that one"}}}}
	answerOutcomeUnknown = answer{codes.Unavailable, ReasonOutcomeUnknown,
		"idemgrpc: the outcome could not be confirmed; a retry with the same key replays it if it was committed, or runs the call again if nothing was", 0, nil}
	answerResponseTooLarge = answer{codes.Internal, ReasonResponseTooLarge,
		"idemgrpc: the response is too large to be stored; nothing was committed", 0, nil}
	answerResponseOmitted = answer{codes.AlreadyExists, ReasonResponseOmitted,
		"idemgrpc: the call with this idempotency key ran, but its response was not stored", 0, nil}
	answerLeaseLost = answer{codes.Unavailable, ReasonLeaseLost,
		"idemgrpc: another call took this idempotency key over; nothing was committed; retry with the same key", 0, nil}
	answerStoreFull = answer{codes.ResourceExhausted, ReasonStoreFull,
		"idemgrpc: the idempotency store is full; retry later", 0, nil}
	answerRecordUnreadable = answer{codes.DataLoss, ReasonRecordUnreadable,
		"idemgrpc: the outcome stored for this idempotency key cannot be read", 0, nil}
	answerStoreUnavailable = answer{codes.Unavailable, ReasonStoreUnavailable,
		"idemgrpc: the idempotency store cannot be reached; retry later", 0, nil}
)
