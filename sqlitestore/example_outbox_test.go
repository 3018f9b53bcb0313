package sqlitestore_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/sqlitestore"
	"github.com/go-idempotency/idempotency/state"
)

// printSink publishes a message by printing it, and tells when it did.
type printSink chan struct{}

func (s printSink) Publish(_ context.Context, e outbox.Envelope) error {
	fmt.Printf("published %s: %s\n", e.Topic, e.Payload)
	s <- struct{}{}
	return nil
}

// A state record moved in a transactional call, its event and a message
// committed with it in the same file, and the Store's relay publishing
// both. A second call with the same key replays the first's result and
// enqueues nothing.
func ExampleStore_Relay() {
	dir, err := os.MkdirTemp("", "sqlitestore-outbox-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	store, err := sqlitestore.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	ctx := context.Background()
	payments := store.States(state.WithTopicPrefix("events"))
	ref := state.Ref{Scope: "acme", Machine: "payment", ID: "pay_1"}
	if _, err := payments.Create(ctx, ref, "authorized", nil); err != nil {
		log.Fatal(err)
	}

	runner := idempotency.NewRunner(store, idempotency.WithTransaction(true))
	capture := func() {
		res, err := idempotency.Do(ctx, runner, idempotency.Call{Name: "capture", Key: "capture-pay_1"}, func(ctx context.Context) (int64, error) {
			rec, err := payments.Transition(ctx, ref, state.Change{From: "authorized", To: "captured", ExpectedVersion: 1})
			if err != nil {
				return 0, err
			}
			_, err = outbox.Enqueue(ctx, outbox.Message{Topic: "receipts.send", Payload: []byte(ref.ID)})
			return rec.Version, err
		})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("captured at version %d, outcome %v\n", res.Value, res.Outcome)
	}
	capture()
	capture()

	sink := make(printSink)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- store.Relay(sink).Run(rctx) }()
	<-sink // the transition's event
	<-sink // the message
	stop()
	<-done
	// Output:
	// captured at version 2, outcome committed
	// captured at version 2, outcome replayed
	// published events.payment: {"event_id":"24b6450a759b103e7c357a4e5e39f94791b294ffafe5fff5f88cb8be23665e0e/2","scope":"acme","machine":"payment","id":"pay_1","from":"authorized","to":"captured","version":2,"cause":{"key":"capture-pay_1","storage_key":"d1657731e14ee4a867db9f22f7fa7bd66056d74f8b56b15f22285ce7bbb829ad","epoch":1}}
	// published receipts.send: pay_1
}
