package outboxtest

import (
	"time"

	"github.com/go-idempotency/idempotency/outbox/relay"
)

// RelayEvents is what two relays report, for the metrics adapters' tests:
// relay a, publishing two topics, and relay b, with every kind of event
// between them.
// The events of one message carry id, and those of a failure err: values
// that no metric may carry.
func RelayEvents(id string, err error) []relay.Event {
	msg := func(kind relay.EventKind, name, topic string) relay.Event {
		return relay.Event{Kind: kind, Relay: name, ID: id, Topic: topic, Attempt: 2}
	}
	published := func(name, topic string, took, age time.Duration) relay.Event {
		e := msg(relay.EventPublished, name, topic)
		e.Duration, e.Age = took, age
		return e
	}
	retried := msg(relay.EventRetried, "a", "payments.captured")
	retried.Err, retried.Backoff, retried.Duration = err, time.Second, 5*time.Second
	dead := msg(relay.EventDead, "a", "payments.captured")
	dead.Err = err
	reclaimedDead := msg(relay.EventDead, "b", "orders.created")
	reclaimedDead.Reclaimed, reclaimedDead.Err = true, err
	fenced := msg(relay.EventFenced, "a", "orders.created")
	fenced.Published = true
	lost := msg(relay.EventClaimLost, "b", "orders.created")
	lost.Err, lost.State = err, "canceled"
	refused := msg(relay.EventRefused, "a", "payments.captured")
	refused.Err = err
	unreadable := msg(relay.EventUnreadable, "b", "orders.created")
	unreadable.Err = err
	suspended := msg(relay.EventSuspended, "a", "payments.captured")
	suspended.Err, suspended.Reason = err, "budget exhausted"
	canceled := msg(relay.EventCanceled, "b", "orders.created")
	canceled.Published = true
	return []relay.Event{
		{Kind: relay.EventLag, Relay: "a", Lag: 3 * time.Second},
		{Kind: relay.EventLag, Relay: "b", Lag: 250 * time.Millisecond},
		{Kind: relay.EventClaimed, Relay: "a", Count: 4},
		{Kind: relay.EventClaimed, Relay: "a", Count: 2},
		{Kind: relay.EventClaimed, Relay: "b", Count: 1},
		published("a", "payments.captured", 20*time.Millisecond, 30*time.Millisecond),
		published("a", "payments.captured", 80*time.Millisecond, 2*time.Second),
		published("a", "orders.created", 3*time.Millisecond, -time.Second), // the relay's clock behind the server's
		published("b", "orders.created", 40*time.Millisecond, 7*time.Minute),
		retried,
		retried,
		dead,
		reclaimedDead,
		msg(relay.EventReclaimed, "b", "orders.created"),
		fenced,
		{Kind: relay.EventPurged, Relay: "b", Count: 1000},
		{Kind: relay.EventPurged, Relay: "b", Count: 17},
		{Kind: relay.EventError, Relay: "a", Err: err},
		{Kind: relay.EventExtended, Relay: "a", Count: 3},
		{Kind: relay.EventExtended, Relay: "a", Count: 2},
		{Kind: relay.EventReleased, Relay: "b", Count: 4},
		lost,
		refused,
		unreadable,
		suspended,
		canceled,
		{Kind: relay.EventLag, Relay: "a", Lag: 0}, // caught up: the gauge follows the last report
	}
}
