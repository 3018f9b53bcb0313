// Package local runs a Go function as the work of an outbox message,
// exactly once: Sink is an outbox.Sink for the relay (package
// outbox/relay) that, instead of publishing a message to a broker, runs a
// function with it under idempotency.Do, keyed by the message's ID, on a
// transactional Runner over the outbox's own database
// (idempotency.WithTransaction(true) on a pgstore.Store, or on the
// sqlitestore.Store whose Relay presents the messages). The function
// writes through the call's transaction (pgstore.TxFromContext,
// sqlitestore.TxFromContext), and the
// message's done mark is taken in that same transaction, fenced by the
// relay's claim: the function's writes, the call's idempotency record and
// the done mark commit together, or none of them does.
//
// A message enqueued with a NotBefore is a durable timer: a delayed
// capture, a reminder, a follow-up that an API can cancel until it runs
// (outbox.Cancel).
//
//	runner := idempotency.NewRunner(store, idempotency.WithTransaction(true))
//	sink := local.Sink(runner, func(ctx context.Context, e outbox.Envelope) error {
//		tx, _ := pgstore.TxFromContext(ctx)
//		_, err := tx.Exec(ctx, `UPDATE payments SET status = 'captured' WHERE id = $1`, string(e.Payload))
//		return err
//	})
//	go relay.New(pool, sink).Run(ctx)
//
// # Exactly once
//
// The done mark changes the message's row only while the relay's claim on
// it stands (status claimed, under the claim's token). When the claim was
// lost while the function ran (an operator canceled or suspended the
// message, or the relay stalled past its lease and another relay took the
// message back), the mark changes nothing, the function's transaction
// rolls back, and the run reports a lost claim: a run whose claim was
// taken back never commits. The relay cancels the function's context as
// soon as it finds its claim lost, and before the claim could be taken
// back; return soon after it ends.
//
// The idempotency record makes the run's key the message's: a second run
// of the message while the first still works (a relay that took it back
// from a stalled one) waits for the first to end, then runs when the
// first rolled back. A message an operator requeues after its run
// committed is not run again while its record lasts (idempotency.WithTTL):
// the record is replayed and the relay marks the message done.
//
// The function may enqueue further messages in its transaction
// (outbox.Enqueue): they commit with its work.
//
// # Outcomes
//
// The function's error is the relay's to settle, as a sink's: an error is
// retried after a backoff, counting an attempt, until the attempt cap
// (relay.WithMaxAttempts) makes the message dead; an error wrapping
// outbox.ErrPermanent or idempotency.ErrPermanent (outbox.Permanent,
// idempotency.Permanent) makes it dead at once; an error wrapping
// outbox.ErrSuspend (outbox.Suspend) suspends it, the attempt not
// counted. A panic rolls the transaction back, releases the key, and is
// retried with the panic as its error (the relay recovers it). Each way a
// call of Do ends (idempotency.Outcome) becomes what the sink tells the
// relay:
//
//	idempotency.Outcome      the sink returns                    the relay
//	Committed, Omitted       the run's own done mark committed   EventPublished, marks nothing
//	Replayed,                nil: an earlier run committed       marks it done, EventPublished
//	ReplayedOmitted
//	Released                 the function's error, as it is;     retry, refuse or sink-suspend
//	                         a lost claim (outbox.ErrClaimLost); (a lost claim's mark is refused:
//	                         outbox.Suspend without a            EventFenced or EventCanceled)
//	                         transaction over the store
//	InFlight, LeaseLost,     Do's error                          retry
//	CommitUnknown,
//	StoreUnavailable,
//	StoreFull, Canceled
//	Stored, Unrecorded,      Do's error (a run without its       retry
//	Unprotected              transaction never works)
//	Refused, Mismatch,       outbox.Permanent(Do's error)        refuse: dead at once
//	Corrupt, TooLarge,
//	Invalid
//
// The relay tells a local run's own done mark from a broker's confirm by
// the error the sink returns for it: an internal signal, never nil, so
// that the relay marks nothing after the run's transaction did. A sink
// that wraps this one must return its error as it is (or wrapped with
// %w), and tells it from a failure with Ran.
package local

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/internal/calltx"
	"github.com/go-idempotency/idempotency/outbox/internal/runclaim"
)

// Scope is the idempotency scope (idempotency.Call.Scope) of every local
// run's call: a message's ID never meets the key of a request or of
// another call of the same store.
const Scope = "outbox"

// Func is the work of a message, run with the call's context: it holds
// the call's Info (idempotency.FromContext; its Key is the message's ID)
// and its transaction (pgstore.TxFromContext, sqlitestore.TxFromContext),
// and is cancelled when the relay's claim on the message, or the call's
// lease, is lost.
type Func func(ctx context.Context, e outbox.Envelope) error

// Option configures the Sink.
type Option func(*sink)

// WithName sets the Name of the runs' calls (idempotency.Call.Name), part
// of each record's identity with the message's payload: the same message
// run under another name (a requeue after a rename) is refused as a
// mismatch, never run twice. It panics when name is empty.
//
// Default: the message's topic.
func WithName(name string) Option {
	if name == "" {
		panic("local: WithName needs a name")
	}
	return func(s *sink) { s.name = name }
}

// Sink returns the sink that runs fn as the work of each message the relay
// presents to it, exactly once (see the package documentation), under
// runner, which must be a transactional Runner
// (idempotency.WithTransaction(true)) over a store of the relay's database
// (a pgstore.Store, a sqlitestore.Store). A Runner without one never runs
// fn: the message is suspended with the reason, until an operator resumes
// it. Sink panics when runner or fn is nil.
//
// Each run holds one of the store's pool connections, for its
// transaction, while fn works: size that pool for the relay's concurrency
// (relay.WithConcurrency) plus the statements of the store and of the
// relay, which must reach the database while runs work (a claim not
// extended runs out).
func Sink(runner *idempotency.Runner, fn Func, opts ...Option) outbox.Sink {
	if runner == nil {
		panic("local: Sink needs a Runner")
	}
	if fn == nil {
		panic("local: Sink needs a function")
	}
	s := &sink{runner: runner, fn: fn}
	for _, o := range opts {
		if o == nil {
			panic("local: Sink: nil Option")
		}
		o(s)
	}
	return s
}

// sink is the Sink of a function.
type sink struct {
	runner *idempotency.Runner
	fn     Func
	name   string
}

// Why a sink suspends a message it cannot run: what an operator fixes
// before resuming it (idemctl outbox resume).
const (
	noClaim       = "local run: the message was presented without a relay's claim, which its done mark needs"
	noTransaction = "local run: the Runner has no transaction over a store that keeps an outbox (idempotency.WithTransaction(true) on a pgstore.Store or a sqlitestore.Store)"
)

// errUnprotected is the error of a run that Do would have run without a
// record (idempotency.WithFailOpen, the store unreachable): a local run's
// done mark needs the record's transaction, so it is retried.
var errUnprotected = errors.New("local: the store could not be reached, and a local run never works without its record")

// Publish runs the function as e's work, and tells the relay how it
// ended (see the package documentation).
func (s *sink) Publish(ctx context.Context, e outbox.Envelope) error {
	claim, ok := runclaim.Find(ctx, e.ID)
	if !ok {
		return outbox.Suspend(noClaim)
	}
	call := idempotency.Call{
		Name:    s.name,
		Key:     e.ID,
		Scope:   Scope,
		Payload: e.Payload,
		// A call holding the key is an earlier run of this message, whose
		// claim was taken back: it ends soon (its relay cancels it), and
		// this run then replays its commit or runs. The wait lasts while
		// this relay's claim does.
		Wait: idempotency.WaitForHolder,
	}
	if call.Name == "" {
		call.Name = e.Topic
	}
	res, err := idempotency.Do(ctx, s.runner, call, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, s.run(ctx, claim, e)
	})
	return tell(res.Outcome, err)
}

// run runs the function in the call's transaction, and then takes the
// done edge in it, fenced by the claim.
func (s *sink) run(ctx context.Context, claim runclaim.Claim, e outbox.Envelope) error {
	_, tx, _, err := calltx.Of(ctx)
	if err != nil {
		if _, leased := idempotency.FromContext(ctx); !leased {
			// Do ran the function unprotected (WithFailOpen): the store
			// is unreachable, and so, probably, is the database.
			return errUnprotected
		}
		return outbox.Suspend(noTransaction)
	}
	if err := s.fn(ctx, e); err != nil {
		return err
	}
	claim.Marking()
	marked, err := claim.Table.Done(ctx, tx, claim.Token, []int64{claim.RowID})
	if err != nil {
		return fmt.Errorf("local: mark %s done: %w", e.ID, err)
	}
	if len(marked) == 0 {
		return fmt.Errorf("local: %s: %w: its done mark changed nothing (canceled, suspended, or taken back after the claim ran out); the run's writes are rolled back",
			e.ID, outbox.ErrClaimLost)
	}
	return nil
}

// A verdict is what the sink tells the relay of a call that ended with
// an outcome.
type verdict uint8

const (
	// ran: the run's transaction committed the work and the done mark;
	// the relay marks nothing.
	ran verdict = iota + 1
	// replayed: an earlier run committed (the message was requeued); the
	// relay marks the message done.
	replayed
	// retry: Do's error as it is; the relay retries, or refuses or
	// suspends the message when the function's error says so.
	retry
	// refuse: the same call will never succeed; the message is dead.
	refuse
)

// verdicts translates every outcome of Do (a test checks that none is
// missing).
var verdicts = map[idempotency.Outcome]verdict{
	idempotency.OutcomeCommitted:        ran,
	idempotency.OutcomeOmitted:          ran, // committed too: the result (none) marked omitted
	idempotency.OutcomeReplayed:         replayed,
	idempotency.OutcomeReplayedOmitted:  replayed,
	idempotency.OutcomeReleased:         retry, // the function's error, or the run's: a lost claim, no transaction
	idempotency.OutcomeInFlight:         retry,
	idempotency.OutcomeLeaseLost:        retry,
	idempotency.OutcomeCommitUnknown:    retry, // a retry replays the commit, or runs: the relay's mark then says which
	idempotency.OutcomeStoreUnavailable: retry,
	idempotency.OutcomeStoreFull:        retry,
	idempotency.OutcomeCanceled:         retry, // the claim was lost while the call waited
	// The function never works without its transaction, so these, which
	// say it ran without one, cannot happen; were they to, nothing was
	// marked done.
	idempotency.OutcomeStored:      retry,
	idempotency.OutcomeUnrecorded:  retry,
	idempotency.OutcomeUnprotected: retry,
	idempotency.OutcomeRefused:     refuse, // the function's error wraps idempotency.ErrPermanent
	idempotency.OutcomeMismatch:    refuse, // the message's ID run before under another name or payload
	idempotency.OutcomeCorrupt:     refuse,
	idempotency.OutcomeTooLarge:    refuse,
	idempotency.OutcomeInvalid:     refuse,
}

// Ran reports whether err, returned by the Publish of a Sink of this
// package, says that the run committed the message's work with its done
// mark: the run succeeded, and the error is only the relay's signal to
// mark nothing. A sink that wraps this one (for traces or metrics) counts
// it as a success, and returns it to the relay as it is.
func Ran(err error) bool { return errors.Is(err, runclaim.ErrRan) }

// tell returns what the sink tells the relay of a call of Do that ended
// with outcome o and err.
func tell(o idempotency.Outcome, err error) error {
	v := verdicts[o]
	switch v {
	case ran:
		return runclaim.ErrRan
	case replayed:
		return nil
	}
	if err == nil { // an outcome without an error that marked nothing
		err = fmt.Errorf("local: the run ended %v without marking the message done", o)
	}
	if v == refuse {
		return outbox.Permanent(err)
	}
	return err
}
