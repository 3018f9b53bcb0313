package idemgrpc

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/go-idempotency/idempotency"
)

// send says where the answer to a call comes from.
type send uint8

const (
	sendHandler    send = iota + 1 // the handler's own answer, as it returned it
	sendReplay                     // the stored outcome (see outcome.replay)
	sendContext                    // the status of the caller's context, which ended
	sendKeyInvalid                 // INVALID_ARGUMENT KEY_INVALID, with Do's error
	sendAnswer                     // the reply's answer
)

// reply is what the caller of a call gets for one outcome of
// idempotency.Do.
type reply struct {
	send   send
	answer answer // for sendAnswer
	// retry: the answer asks for a retry after the Result's RetryAfter
	// (RetryInfo, and the pushback trailer).
	retry bool
}

// outcomeReplies is the server interceptor's translation of the core's
// outcomes: what the caller gets for each. Every idempotency.Outcome has a
// row.
var outcomeReplies = map[idempotency.Outcome]reply{
	// The handler ran in this call: its answer, whether or not it was
	// stored whole (Omitted), or at all (Unrecorded, Unprotected: its
	// effects stand; Released, Refused: its error released the key).
	idempotency.OutcomeStored:      {send: sendHandler},
	idempotency.OutcomeOmitted:     {send: sendHandler},
	idempotency.OutcomeCommitted:   {send: sendHandler},
	idempotency.OutcomeUnrecorded:  {send: sendHandler},
	idempotency.OutcomeUnprotected: {send: sendHandler},
	idempotency.OutcomeReleased:    {send: sendHandler},
	idempotency.OutcomeRefused:     {send: sendHandler}, // its error says why, for good

	// A duplicate: the stored outcome, or what survived of it.
	idempotency.OutcomeReplayed:        {send: sendReplay},
	idempotency.OutcomeReplayedOmitted: {send: sendReplay},

	idempotency.OutcomeCanceled: {send: sendContext},
	idempotency.OutcomeInvalid:  {send: sendKeyInvalid},

	idempotency.OutcomeInFlight:         {send: sendAnswer, answer: answerInFlight, retry: true},
	idempotency.OutcomeLeaseLost:        {send: sendAnswer, answer: answerLeaseLost, retry: true},
	idempotency.OutcomeCommitUnknown:    {send: sendAnswer, answer: answerOutcomeUnknown, retry: true},
	idempotency.OutcomeStoreUnavailable: {send: sendAnswer, answer: answerStoreUnavailable, retry: true},
	idempotency.OutcomeStoreFull:        {send: sendAnswer, answer: answerStoreFull, retry: true},
	idempotency.OutcomeMismatch:         {send: sendAnswer, answer: answerMismatch},
	idempotency.OutcomeCorrupt:          {send: sendAnswer, answer: answerRecordUnreadable},
	idempotency.OutcomeTooLarge:         {send: sendAnswer, answer: answerResponseTooLarge},
}

// give answers the caller as r says: res and err are what Do returned, ran
// the handler's answer when it ran in this call, and field where the key
// was found.
func (r reply) give(ctx context.Context, res idempotency.Result[*idempotency.Response], err error, ran *answered, field string) (any, error) {
	switch {
	case r.send == sendHandler && ran != nil:
		return ran.send(ctx)
	case r.send == sendReplay:
		o, err := readRecord(res.Value)
		if err != nil {
			return nil, answerRecordUnreadable.err(ctx)
		}
		return o.replay(ctx)
	case r.send == sendContext:
		if ctx.Err() != nil {
			err = ctx.Err() // the cause Do returns may be any error
		}
		return nil, status.FromContextError(err).Err()
	case r.send == sendKeyInvalid && err != nil:
		return nil, keyInvalid(field, err).err(ctx)
	case r.send == sendAnswer:
		a := r.answer
		if r.retry {
			a.retry = res.RetryAfter
		}
		return nil, a.err(ctx)
	}
	return nil, status.Errorf(codes.Internal, "idemgrpc: the outcome %v has no answer here (%v)", res.Outcome, err)
}
