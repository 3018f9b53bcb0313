package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/go-idempotency/idempotency/outbox"
)

// Enqueue checks every message against the grammar written beside Message
// before it writes any, so that a message no sink could publish is refused
// in the handler, with the rule it breaks, rather than failing at every
// publish of the relay.
func ExampleMessage_Validate() {
	for _, m := range []outbox.Message{
		{Topic: "payments.created", Payload: []byte(`{"id":"pay_1"}`)},
		{Topic: "payments created"},
		{Topic: "payments.created", Headers: map[string]string{"Trace Parent": "00-…"}},
	} {
		err := m.Validate()
		fmt.Println(errors.Is(err, outbox.ErrInvalidMessage), err != nil)
	}
	// Output:
	// false false
	// true true
	// true true
}

// A message's ID is the storage key of the record that enqueued it and
// its place among the record's messages: the same on every attempt, for a
// consumer to deduplicate on.
func ExampleParseID() {
	id := outbox.ID("payments:9f86d081", 2)
	key, seq, err := outbox.ParseID(id)
	fmt.Println(id)
	fmt.Println(key, seq, err)
	// Output:
	// payments:9f86d081/2
	// payments:9f86d081 2 <nil>
}

// A Sink tells the relay what became of each message: nil when the broker
// confirmed it, Permanent for a message that can never be published (it
// goes dead at once, with its reason), Suspend for one that must wait for
// an operator's resume (no attempt counted), any other error for a retry
// after a backoff. AsBatchSink presents a batch through Publish from a few
// goroutines at once; each envelope keeps its own outcome.
func ExampleAsBatchSink() {
	sink := outbox.SinkFunc(func(ctx context.Context, e outbox.Envelope) error {
		switch {
		case strings.HasPrefix(e.Topic, "legacy."):
			return outbox.Permanent(fmt.Errorf("topic %s was retired", e.Topic))
		case e.Topic == "ledger.posted":
			return outbox.Suspend("the ledger is closed for the night")
		}
		return nil // a broker's confirm
	})
	errs := outbox.AsBatchSink(sink, 4).PublishBatch(context.Background(), []outbox.Envelope{
		{ID: "k/1", Topic: "payments.created"},
		{ID: "k/2", Topic: "legacy.payments"},
		{ID: "k/3", Topic: "ledger.posted"},
	})
	for i, err := range errs {
		switch {
		case err == nil:
			fmt.Printf("%d confirmed\n", i+1)
		case errors.Is(err, outbox.ErrPermanent):
			fmt.Printf("%d refused: %v\n", i+1, err)
		case errors.Is(err, outbox.ErrSuspend):
			fmt.Printf("%d suspended: %s\n", i+1, outbox.SuspendReason(err))
		}
	}
	// Output:
	// 1 confirmed
	// 2 refused: topic legacy.payments was retired
	// 3 suspended: the ledger is closed for the night
}
