package outboxproof_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/outbox"
	"github.com/go-idempotency/idempotency/outbox/lifecycle"
)

// poison is a kind of row no relay can read, written by hand as another
// producer could write it.
type poison struct {
	name string
	// headers is the row's headers column, JSON text.
	headers string
	// infinite: its enqueued_at is 'infinity'.
	infinite bool
	// column is the column the relay's error must name.
	column string
}

var poisons = []poison{
	{name: "headers-number", headers: `42`, column: "headers"},
	{name: "enqueued-infinity", headers: `{}`, infinite: true, column: "enqueued_at"},
}

// TestPoisonedRows: rows the relay cannot read (headers that are a JSON
// number, an enqueued_at of 'infinity'), inserted with SQL among 1,000
// healthy messages, each followed by a healthy message of its ordering
// key, while three relay processes publish the table in batches of 50:
// every healthy message is in the stream exactly once (as many distinct
// Nats-Msg-Ids as messages, each with its payload) and done; each poisoned
// row is dead after its one attempt, its last_error the real error
// ("unreadable: ..." naming the column), and never in the stream; the
// message after it on its key is published after it went dead.
func TestPoisonedRows(t *testing.T) {
	healthy, perKind, deadline := 1000, 1, 90*time.Second
	if os.Getenv(longEnv) == "1" {
		healthy, perKind, deadline = 10000, 10, 5*time.Minute
	}
	r := newRig(t, relayConfig{processes: 3, lease: 2 * time.Second, poll: 200 * time.Millisecond})
	ctx := context.Background()

	// Half the healthy messages, the poisoned rows each with a healthy
	// message after it on its ordering key, and the other half, all
	// committed before the relays start: the poisoned rows fall due in the
	// middle, in batches of healthy ones.
	followers := perKind * len(poisons)
	rest := healthy - followers
	mk := func(i int) outbox.Message {
		return outbox.Message{Payload: fmt.Appendf(nil, "h-%d", i), OrderingKey: fmt.Sprint("h-", i)}
	}
	want := r.enqueueMany("first-", rest/2, 10, mk)
	poisoned := map[string]poison{} // message ID -> its poison
	after := map[string]string{}    // poisoned message ID -> the ID of the healthy message after it
	for _, p := range poisons {
		for n := range perKind {
			key := fmt.Sprintf("poison-%s-%d", p.name, n)
			if _, err := r.pool.Exec(ctx, `
				INSERT INTO idempotency_outbox (storage_key, seq, topic, payload, headers, ordering_key, status, enqueued_at, due_at)
				VALUES ($1, 1, $2, $3, $4::text::jsonb, $1, 'ready',
					CASE WHEN $5 THEN 'infinity'::timestamptz ELSE clock_timestamp() END, clock_timestamp())`,
				key, r.subject, []byte("poisoned"), p.headers, p.infinite); err != nil {
				t.Fatal(err)
			}
			id := outbox.ID(key, 1)
			poisoned[id] = p
			payload := "after-" + key
			ids := r.enqueue("after-"+key, outbox.Message{Payload: []byte(payload), OrderingKey: key})
			want[ids[0]] = payload
			after[id] = ids[0]
		}
	}
	for id, payload := range r.enqueueMany("second-", rest-rest/2, 10, func(i int) outbox.Message { return mk(rest/2 + i) }) {
		want[id] = payload
	}
	if len(want) != healthy {
		t.Fatalf("%d healthy messages enqueued, want %d", len(want), healthy)
	}

	start := time.Now()
	r.startRelays()
	r.awaitFinished(deadline)
	took := time.Since(start)
	r.stopRelays()

	rows := r.rows()
	got := r.storedMessages()
	copies, reclaimedHealthy := 0, 0
	for id, cs := range got {
		copies += len(cs)
		if _, ok := poisoned[id]; ok {
			t.Errorf("the poisoned row %s is in the stream", id)
			continue
		}
		payload, ok := want[id]
		if !ok {
			t.Errorf("the stream holds %s, which was never enqueued", id)
			continue
		}
		if len(cs) != 1 {
			t.Errorf("%s is in the stream %d times", id, len(cs))
		}
		for _, c := range cs {
			if c.payload != payload {
				t.Errorf("%s holds %q, enqueued %q", id, c.payload, payload)
			}
		}
	}
	for id := range want {
		w := rows[id]
		if w.Status != lifecycle.Done {
			t.Errorf("healthy message %s is %s (%s)", id, w.Status, w.LastError)
		}
		if len(got[id]) == 0 {
			t.Errorf("healthy message %s never reached the stream", id)
		}
		if w.Attempts > 1 {
			reclaimedHealthy++
		}
	}
	for id, p := range poisoned {
		w := rows[id]
		if w.Status != lifecycle.Dead || w.Attempts != 1 {
			t.Errorf("poisoned row %s (%s) is %s after %d attempts, want dead after 1", id, p.name, w.Status, w.Attempts)
		}
		if !strings.HasPrefix(w.LastError, lifecycle.CodeUnreadable+": ") || !strings.Contains(w.LastError, p.column) {
			t.Errorf("poisoned row %s (%s): last_error %q, want %q naming column %s", id, p.name, w.LastError, lifecycle.CodeUnreadable+": ...", p.column)
		}
		follower := got[after[id]]
		if len(follower) > 0 && follower[0].at.Before(w.FinishedAt) {
			t.Errorf("%s, after the poisoned %s on its key, was stored at %v, before the poisoned row went dead at %v",
				after[id], id, follower[0].at, w.FinishedAt)
		}
	}
	if len(got) != healthy {
		t.Errorf("%d distinct Nats-Msg-Ids in the stream, want %d", len(got), healthy)
	}
	n := r.lineCounts()
	t.Logf("%d healthy messages and %d poisoned rows, 3 relays, in %v: %d copies in the stream, %d distinct Nats-Msg-Ids; "+
		"%d confirmed publications (%d duplicates), %d unreadable events, %d reclaimed, %d healthy messages presented more than once; last errors: %s",
		healthy, len(poisoned), took.Round(time.Millisecond), copies, len(got),
		n["PUBLISHED"], countDuplicates(r), n["event unreadable"], n["event reclaimed"], reclaimedHealthy, poisonErrors(rows, poisoned))
}

// countDuplicates counts the publications JetStream acknowledged as
// duplicates.
func countDuplicates(r *rig) int {
	n := 0
	for _, l := range r.lines {
		if l.Kind == "PUBLISHED" && field(l, 1) == "true" {
			n++
		}
	}
	return n
}

// poisonErrors returns the last_error of one poisoned row of each kind.
func poisonErrors(rows map[string]row, poisoned map[string]poison) string {
	seen := map[string]string{}
	for id, p := range poisoned {
		if _, ok := seen[p.name]; !ok {
			seen[p.name] = fmt.Sprintf("%s: %q", p.name, rows[id].LastError)
		}
	}
	var out []string
	for _, p := range poisons {
		out = append(out, seen[p.name])
	}
	return strings.Join(out, "; ")
}
