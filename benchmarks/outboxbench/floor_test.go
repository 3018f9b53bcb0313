package outboxbench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
	"github.com/go-idempotency/idempotency/pgstore"
)

// defaultBatch is the relay's default batch size (relay.WithBatchSize),
// the floor's batch: relayUntil checks that the relay's claims take as
// many.
const defaultBatch = 500

// floorBatch is a batch of the floor on its way: its claim's token, and
// its messages' rows and envelopes.
type floorBatch struct {
	token string
	rows  []int64
	es    []outbox.Envelope
}

// floor drains n committed messages by hand, the relay's work and nothing
// else: the claim and done statements of package outbox/lifecycle (the
// relay's), and the sink's PublishBatch with its window, in the relay's
// pipeline: while the sink publishes batch N, batch N+1 is claimed and
// the done marks of batch N-1 are written, each stage handing its batch
// to the next once the next is free. It checks nothing the relay checks
// (no claim kept or extended, no events, no outcome but a confirm: any
// other fails the benchmark), and returns once the n messages are marked
// done.
func floor(b testing.TB, pool *pgxpool.Pool, sink outbox.BatchSink, n int) {
	b.Helper()
	table, err := outbox.Table(pgstore.DefaultOutboxTable)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	failed := make(chan error, 2)
	toPublish := make(chan floorBatch)
	toMark := make(chan floorBatch)
	marked := make(chan int, 3) // a batch's count, never holding the marks up
	go func() {
		defer close(toMark)
		for fb := range toPublish {
			for i, err := range sink.PublishBatch(ctx, fb.es) {
				if err != nil {
					failed <- fmt.Errorf("%s: %w", fb.es[i].ID, err)
					return
				}
			}
			toMark <- fb
		}
	}()
	go func() {
		for fb := range toMark {
			got, err := table.Done(ctx, lifecycle.Pgx(pool), fb.token, fb.rows)
			if err == nil && len(got) != len(fb.rows) {
				err = fmt.Errorf("%d of %d marked done", len(got), len(fb.rows))
			}
			if err != nil {
				failed <- err
				return
			}
			marked <- len(got)
		}
	}()
	defer close(toPublish)

	done, inFlight := 0, 0
	for done < n {
		var tok [16]byte
		rand.Read(tok[:])
		fb := floorBatch{token: hex.EncodeToString(tok[:])}
		msgs, err := table.Claim(ctx, lifecycle.Pgx(pool), fb.token, "floor", 30*time.Second, defaultBatch)
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range msgs {
			if m.Err != nil {
				b.Fatal(m.Err)
			}
			fb.rows = append(fb.rows, m.RowID)
			fb.es = append(fb.es, outbox.Envelope{ID: m.ID, Topic: m.Topic, Payload: m.Payload, Headers: m.Headers,
				OrderingKey: m.OrderingKey, Attempt: m.Attempts + 1, EnqueuedAt: m.EnqueuedAt})
		}
		if len(msgs) == 0 {
			if inFlight == 0 {
				b.Fatalf("nothing to claim, %d of %d messages done", done, n)
			}
			// As the relay: claim again once the batches in flight are
			// marked.
			for ; inFlight > 0; inFlight-- {
				select {
				case k := <-marked:
					done += k
				case err := <-failed:
					b.Fatal(err)
				}
			}
			continue
		}
		inFlight++
		for handed := false; !handed; {
			select {
			case toPublish <- fb:
				handed = true
			case k := <-marked:
				done += k
				inFlight--
			case err := <-failed:
				b.Fatal(err)
			}
		}
	}
	for ; inFlight > 0; inFlight-- {
		select {
		case k := <-marked:
			done += k
		case err := <-failed:
			b.Fatal(err)
		}
	}
}
