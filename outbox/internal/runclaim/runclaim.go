// Package runclaim is what the relay (package outbox/relay) and the local
// runs (package outbox/local) share, out of users' reach: the relay's claim
// on the messages it presents, carried by the sink's context, and the
// signal by which a local run tells the relay that it marked its message
// done itself, in its own transaction.
//
// A local run needs the claim's token and the message's row to take the
// done edge fenced by the claim; nothing else should take the relay's
// edges under its token, so neither is on outbox.Envelope.
package runclaim

import (
	"context"
	"errors"

	"github.com/go-idempotency/idempotency/outbox/lifecycle"
)

// Claim is a relay's claim on one message it presents.
type Claim struct {
	// Table is the outbox table the relay claimed the message from.
	Table *lifecycle.Table
	// Token is the claim's token: the done edge changes the message's row
	// only while it is still claimed under it.
	Token string
	// RowID is the message's row.
	RowID int64
	// Marking tells the relay that the run is about to mark the message
	// done in its transaction, so that the relay stops extending the claim
	// on it: an extend that waited for that transaction's row lock would
	// then find the message done and take it for a lost claim.
	Marking func()
}

// Finder returns the claim on the message of an envelope's ID, and false
// when it holds none.
type Finder func(id string) (Claim, bool)

type finderKey struct{}

// With returns ctx carrying f: the relay gives it to the sink's context.
func With(ctx context.Context, f Finder) context.Context {
	return context.WithValue(ctx, finderKey{}, f)
}

// Find returns the claim that the relay presenting with ctx holds on the
// message of id, and false when ctx is not a relay's sink context or the
// relay holds no claim on that message.
func Find(ctx context.Context, id string) (Claim, bool) {
	f, ok := ctx.Value(finderKey{}).(Finder)
	if !ok {
		return Claim{}, false
	}
	return f(id)
}

// ErrRan is the error a local run's sink returns once its transaction
// committed the message's work together with its done mark: not a
// failure, but the relay's signal that the message is done already, so
// that it reports it (EventPublished) and marks nothing.
var ErrRan = errors.New("outbox: the local run committed the message's work with its done mark")
